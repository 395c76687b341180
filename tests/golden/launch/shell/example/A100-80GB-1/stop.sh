#!/usr/bin/env bash
# Stop the vLLM servers of node A100-80GB-1 that start.sh started (plan of cluster a100-16).
# SIGTERM to each server's process group, SIGKILL after $SCEPSY_STOP_GRACE_S (default 10) s;
# removes the pid files, quits the MPS control daemon if start.sh started it.
# Succeeds when nothing of this node runs; running it again is harmless.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
node='A100-80GB-1'
node_folder='A100-80GB-1'
run_dir=${SCEPSY_RUN_DIR:-$here/../run}
grace_s=${SCEPSY_STOP_GRACE_S:-10}
if [[ ! $grace_s =~ ^[0-9]+$ ]]; then
  echo "stop.sh ($node): SCEPSY_STOP_GRACE_S must be whole seconds (got $grace_s)" >&2
  exit 2
fi
if [[ ! -d $run_dir ]]; then
  echo "stop.sh ($node): nothing of this node runs (no $run_dir)"
  exit 0
fi
run_dir=$(cd -- "$run_dir" && pwd -P)
state=$run_dir/state/$node_folder
left=()

group_alive() {  # whether a live process (not a zombie) of process group $1 remains
  local stat line
  local -a fields
  if [[ ! -r /proc/self/stat ]]; then
    kill -0 -- "-$1" 2>/dev/null
    return
  fi
  for stat in /proc/[0-9]*/stat; do
    { read -r line <"$stat"; } 2>/dev/null || continue
    read -r -a fields <<<"${line##*) }"
    if [[ ${fields[2]:-} == "$1" && ${fields[0]:-} != Z ]]; then
      return 0
    fi
  done
  return 1
}

ours() {  # PID NAME: whether a live process of group PID is server NAME of this run folder
  local stat line var
  local -a fields
  if [[ ! -r /proc/self/stat ]]; then
    group_alive "$1"  # no /proc: the pid file is all there is to go by
    return
  fi
  for stat in /proc/[0-9]*/stat; do
    { read -r line <"$stat"; } 2>/dev/null || continue
    read -r -a fields <<<"${line##*) }"
    if [[ ${fields[2]:-} == "$1" && ${fields[0]:-} != Z ]]; then
      while IFS= read -r -d '' var; do
        if [[ $var == "SCEPSY_SERVER=$run_dir/pids/$2" ]]; then
          return 0
        fi
      done 2>/dev/null <"${stat%/stat}/environ" || true
    fi
  done
  return 1
}

wait_gone() {  # SECONDS: wait until none of the groups in $pids runs, at most SECONDS
  local deadline=$((SECONDS + $1)) i alive
  while :; do
    alive=0
    for i in "${!pids[@]}"; do
      if group_alive "${pids[i]}"; then
        alive=1
      fi
    done
    if ((alive == 0 || SECONDS >= deadline)); then
      return 0
    fi
    sleep 0.2
  done
}

stop_all() {  # NAME...: SIGTERM each running group, SIGKILL after the grace period
  local name pid_file pid i
  local -a names=() pids=()
  for name in "$@"; do
    pid_file=$run_dir/pids/$name.pid
    if [[ ! -f $pid_file ]]; then
      continue
    fi
    pid=$(<"$pid_file")
    if [[ $pid =~ ^[0-9]+$ ]] && ours "$pid" "$name"; then
      echo "stop.sh ($node): stopping $name (process group $pid)"
      kill -TERM -- "-$pid" 2>/dev/null || true
      names+=("$name")
      pids+=("$pid")
    else
      if [[ $pid =~ ^[0-9]+$ ]] && group_alive "$pid"; then
        echo "stop.sh ($node): stale pid file, process group $pid is not $name: not signalled" >&2
      fi
      rm -f -- "$pid_file"
    fi
  done
  wait_gone "$grace_s"
  for i in "${!pids[@]}"; do
    if group_alive "${pids[i]}"; then
      echo "stop.sh ($node): ${names[i]} still runs after ${grace_s} s; sending SIGKILL" >&2
      kill -KILL -- "-${pids[i]}" 2>/dev/null || true
    fi
  done
  wait_gone 5
  for i in "${!pids[@]}"; do
    if group_alive "${pids[i]}"; then
      left+=("${names[i]}")
    else
      rm -f -- "$run_dir/pids/${names[i]}.pid"
    fi
  done
}

stop_all generator-2 generator-3 generator-4 prm-2 reranker-0 reranker-1
if ((${#left[@]})); then
  # the MPS daemon and the temporary folders stay while a server may still use them
  echo "stop.sh ($node): still running: ${left[*]}" >&2
  exit 1
fi
if [[ -f $state/mps-pipe ]]; then
  # the MPS control daemon start.sh started
  if CUDA_MPS_PIPE_DIRECTORY=$(<"$state/mps-pipe") \
      nvidia-cuda-mps-control <<<quit >/dev/null 2>&1; then
    echo "stop.sh ($node): stopped the MPS control daemon"
  else
    echo "stop.sh ($node): the MPS control daemon did not answer quit (already gone?)" >&2
  fi
  rm -f -- "$state/mps-pipe"
fi
if [[ -f $state/cleanup ]]; then
  while read -r dir; do
    case $dir in
      /tmp/scepsy-*) rm -rf -- "$dir" ;;
    esac
  done <"$state/cleanup"
  rm -f -- "$state/cleanup"
fi
echo "stop.sh ($node): nothing of this node runs"
