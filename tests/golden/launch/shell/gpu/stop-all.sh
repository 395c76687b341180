#!/usr/bin/env bash
# Stop every node of the plan of cluster two-nodes: each node's stop.sh on that node.
# A node whose address is this host runs here; any other over ssh ($SCEPSY_SSH, default
# ssh), which needs this folder at the same path there (a shared file system or a copy):
#   ssh 10.0.0.1 bash /path/to/this/folder/node-a/stop.sh
#   ssh node-b bash /path/to/this/folder/node-b/stop.sh
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
run_on 10.0.0.1 node-a/stop.sh || failed+=(node-a)
run_on node-b node-b/stop.sh || failed+=(node-b)
if ((${#failed[@]})); then
  echo "stop-all.sh: could not stop every server of: ${failed[*]}" >&2
  exit 1
fi
echo "stop-all.sh: every node stopped"
