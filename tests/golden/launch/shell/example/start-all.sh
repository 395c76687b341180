#!/usr/bin/env bash
# Start every node of the plan of cluster a100-16: each node's start.sh on that node.
# A node whose address is this host runs here; any other over ssh ($SCEPSY_SSH, default
# ssh), which needs this folder at the same path there (a shared file system or a copy):
#   ssh A100-80GB-0 bash /path/to/this/folder/A100-80GB-0/start.sh
#   ssh A100-80GB-1 bash /path/to/this/folder/A100-80GB-1/start.sh
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
read -r -a ssh_cmd <<<"${SCEPSY_SSH:-ssh}"

is_local() {  # whether address $1 is this host
  case $1 in
    localhost | 127.* | ::1) return 0 ;;
  esac
  [[ $1 == "$(uname -n)" ]]
}

run_on() {  # ADDRESS SCRIPT: bash SCRIPT (a path in this folder) on the node at ADDRESS
  if is_local "$1"; then
    bash "$here/$2"
  else
    "${ssh_cmd[@]}" "$1" "bash $(printf '%q' "$here/$2")"
  fi
}

folders=()
addresses=()
start_node() {  # FOLDER ADDRESS
  echo "start-all.sh: node $1 ($2)"
  if run_on "$2" "$1/start.sh"; then
    folders+=("$1")
    addresses+=("$2")
    return
  fi
  echo "start-all.sh: node $1 failed; stopping the nodes started" >&2
  local i
  for i in "${!folders[@]}"; do
    run_on "${addresses[i]}" "${folders[i]}/stop.sh" || true
  done
  exit 1
}

start_node A100-80GB-0 A100-80GB-0
start_node A100-80GB-1 A100-80GB-1
echo "start-all.sh: every node started"
