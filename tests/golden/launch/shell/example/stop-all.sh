#!/usr/bin/env bash
# Stop every node of the plan of cluster a100-16: each node's stop.sh on that node.
# A node whose address is this host runs here; any other over ssh ($SCEPSY_SSH, default
# ssh), which needs this folder at the same path there (a shared file system or a copy):
#   ssh A100-80GB-0 bash /path/to/this/folder/A100-80GB-0/stop.sh
#   ssh A100-80GB-1 bash /path/to/this/folder/A100-80GB-1/stop.sh
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

failed=()
run_on A100-80GB-0 A100-80GB-0/stop.sh || failed+=(A100-80GB-0)
run_on A100-80GB-1 A100-80GB-1/stop.sh || failed+=(A100-80GB-1)
if ((${#failed[@]})); then
  echo "stop-all.sh: could not stop every server of: ${failed[*]}" >&2
  exit 1
fi
echo "stop-all.sh: every node stopped"
