#!/usr/bin/env bash
# Start the 3 vLLM server(s) of node node-b (plan of cluster two-nodes).
# Written by `scepsy launch --target shell` (docs/launch.md): run it on that node.
# Logs go to RUN/logs/NAME.log, process ids to RUN/pids/NAME.pid; RUN is run/ beside this folder, or $SCEPSY_RUN_DIR.
# Refuses a port in use; then waits for every server's /health (up to $SCEPSY_HEALTH_TIMEOUT_S, default 900 s);
# on a failure or a timeout it stops what it started and exits 1. Stop with stop.sh.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
node='node-b'
node_folder='node-b'
run_dir=${SCEPSY_RUN_DIR:-$here/../run}
health_timeout_s=${SCEPSY_HEALTH_TIMEOUT_S:-900}
# where start.sh checks the servers' ports and /health: the address they listen on
probe_host='node-b'
probe_url_host='node-b'
if [[ ! $health_timeout_s =~ ^[0-9]+$ ]]; then
  echo "start.sh ($node): SCEPSY_HEALTH_TIMEOUT_S must be whole seconds (got $health_timeout_s)" >&2
  exit 2
fi
mkdir -p -- "$run_dir/logs" "$run_dir/pids" "$run_dir/state/$node_folder"
run_dir=$(cd -- "$run_dir" && pwd -P)
state=$run_dir/state/$node_folder

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

proc_alive() {  # whether process $1 runs (not a zombie)
  local line
  if [[ ! -r /proc/self/stat ]]; then
    kill -0 "$1" 2>/dev/null
    return
  fi
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  line=${line##*) }
  [[ ${line%% *} != Z ]]
}

port_busy() {  # whether something accepts connections on port $1 of the servers' address
  (: <>"/dev/tcp/$probe_host/$1") 2>/dev/null
}

healthy() {  # whether http://$probe_url_host:$1/health answers 2xx
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --noproxy '*' -o /dev/null --max-time 5 "http://$probe_url_host:$1/health" 2>/dev/null
  else
    python3 -c 'import sys, urllib.request as u
u.build_opener(u.ProxyHandler({})).open(
    "http://%s:%s/health" % (sys.argv[1], sys.argv[2]), timeout=5)' "$probe_url_host" "$1" >/dev/null 2>&1
  fi
}

short_dir() {  # PATH: PATH, or a new folder under /tmp where PATH leaves no room for sockets
  local dir
  if (( ${#1} + 60 <= 107 )); then
    mkdir -p -- "$1"
    printf '%s\n' "$1"
    return
  fi
  dir=$(mktemp -d /tmp/scepsy-XXXXXXXX)
  printf '%s\n' "$dir" >>"$state/cleanup"
  printf '%s\n' "$dir"
}

fail() {  # MESSAGE [NAME...]: say why, show the NAMEs' log tails, stop what started, exit 1
  local msg=$1 name
  shift
  trap - INT TERM
  echo "start.sh ($node): $msg" >&2
  for name in "$@"; do
    echo "--- last lines of $run_dir/logs/$name.log ---" >&2
    tail -n 40 -- "$run_dir/logs/$name.log" >&2 2>/dev/null || true
  done
  echo "start.sh ($node): stopping what this script started" >&2
  SCEPSY_RUN_DIR=$run_dir bash "$here/stop.sh" >&2 || true
  exit 1
}

launching=
interrupted=
on_signal() {
  interrupted=1
  if [[ -z $launching ]]; then
    fail "interrupted"
  fi
}
trap on_signal INT TERM

check_free() {  # NAME PORT: refuse to start where NAME already runs or PORT is taken
  local pid_file=$run_dir/pids/$1.pid
  if [[ -f $pid_file ]]; then
    if ours "$(<"$pid_file")" "$1"; then
      echo "start.sh ($node): $1 already runs (pid $(<"$pid_file")); run stop.sh first" >&2
      exit 1
    fi
    rm -f -- "$pid_file"
  fi
  if port_busy "$2"; then
    echo "start.sh ($node): port $2 of $1 is in use; nothing started" >&2
    exit 1
  fi
}

start_server() {  # NAME COMMAND...: COMMAND in a new session (its own process group), logged
  local name=$1
  shift
  launching=1
  echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) start.sh ($node) starts $name" \
    >>"$run_dir/logs/$name.log"
  # the marker stop.sh checks before it signals: this server of this run folder
  SCEPSY_SERVER="$run_dir/pids/$name" setsid "$@" >>"$run_dir/logs/$name.log" 2>&1 </dev/null &
  printf '%s\n' "$!" >"$run_dir/pids/$name.pid"
  launching=
  if [[ -n $interrupted ]]; then
    fail "interrupted"
  fi
  echo "start.sh ($node): started $name (pid $!, log $run_dir/logs/$name.log)"
}

wait_healthy() {  # NAME PORT...: poll each server's /health until all answer or time runs out
  local deadline=$((SECONDS + health_timeout_s)) i pid waiting
  local -a names=() ports=() ok=() late=()
  while (($#)); do
    names+=("$1")
    ports+=("$2")
    shift 2
  done
  while :; do
    waiting=0
    late=()
    for i in "${!names[@]}"; do
      if [[ -n ${ok[i]:-} ]]; then
        continue
      fi
      if healthy "${ports[i]}"; then
        ok[i]=1
        echo "start.sh ($node): ${names[i]} is healthy on port ${ports[i]}"
        continue
      fi
      pid=$(<"$run_dir/pids/${names[i]}.pid")
      if ! proc_alive "$pid"; then
        fail "${names[i]} exited before /health answered" "${names[i]}"
      fi
      waiting=1
      late+=("${names[i]}")
    done
    if ((waiting == 0)); then
      return 0
    fi
    if ((SECONDS >= deadline)); then
      fail "not healthy after ${health_timeout_s} s: ${late[*]}" "${late[@]}"
    fi
    sleep 1
  done
}

# refuse before anything starts
check_free big-0 8000
check_free gen-1 8001
check_free small-2 8002

# MPS: shares below 1 run as clients of an MPS control daemon (started unless one runs).
mps_running() {  # whether an MPS control daemon or server runs on this host
  local comm name
  for comm in /proc/[0-9]*/comm; do
    { read -r name <"$comm"; } 2>/dev/null || continue
    if [[ $name == nvidia-cuda-mps* ]]; then
      return 0
    fi
  done
  return 1
}
if [[ -f $state/mps-pipe ]] && mps_running; then
  mps_pipe=$(<"$state/mps-pipe")
  echo "start.sh ($node): using the MPS control daemon an earlier start.sh started"
elif mps_running; then
  mps_pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
  echo "start.sh ($node): an MPS control daemon already runs; using it (pipe directory $mps_pipe)"
else
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "start.sh ($node): nvidia-cuda-mps-control not found (needed for shares below 1)" >&2
    exit 1
  fi
  mps_pipe=$(short_dir "$run_dir/mps/$node_folder/pipe")
  mkdir -p -- "$run_dir/mps/$node_folder/log"
  # without CUDA_VISIBLE_DEVICES: the daemon must see every GPU by its own index; its output
  # to a file: a daemon must not hold the output of whoever runs this script
  if ! env -u CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY="$mps_pipe" \
      CUDA_MPS_LOG_DIRECTORY="$run_dir/mps/$node_folder/log" nvidia-cuda-mps-control -d \
      >>"$run_dir/mps/$node_folder/log/start.log" 2>&1 </dev/null; then
    echo "start.sh ($node): could not start the MPS control daemon" \
      "(see $run_dir/mps/$node_folder/log)" >&2
    exit 1
  fi
  printf '%s\n' "$mps_pipe" >"$state/mps-pipe"
  echo "start.sh ($node): started an MPS control daemon (pipe directory $mps_pipe)"
fi

# big-0: big replica 0 on GPUs 4,5,6,7 (share 1, 80 GiB each), port 8000
# scepsy-replica: {"device": "cuda", "gpus": [4, 5, 6, 7], "llm": "big", "memory_gib": 80.0, "node": "node-b", "port": 8000, "replica": 0, "share": 1.0}
cmd=(
  env
  VLLM_ATTENTION_BACKEND=FLASH_ATTN
  'CUDA_VISIBLE_DEVICES=4,5,6,7'
  vllm serve meta-llama/Llama-2-70b-hf
  --served-model-name big
  --tensor-parallel-size 4
  --gpu-memory-utilization 1
  --host node-b
  --port 8000
)
start_server big-0 "${cmd[@]}"

# gen-1: gen replica 1 on GPUs 0,1 (share 0.5, 40 GiB each), port 8001
# scepsy-replica: {"device": "cuda", "gpus": [0, 1], "llm": "gen", "memory_gib": 40.0, "node": "node-b", "port": 8001, "replica": 1, "share": 0.5}
cmd=(
  env
  'CUDA_VISIBLE_DEVICES=0,1'
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
  'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40G,1=40G'
  "CUDA_MPS_PIPE_DIRECTORY=$mps_pipe"
  vllm serve Qwen/Qwen2.5-7B-Instruct
  --served-model-name gen
  --tensor-parallel-size 2
  --gpu-memory-utilization 0.5
  --host node-b
  --port 8001
)
start_server gen-1 "${cmd[@]}"

# small-2: small replica 2 on GPU 2 (share 0.3, 24 GiB each), port 8002
# scepsy-replica: {"device": "cuda", "gpus": [2], "llm": "small", "memory_gib": 24.0, "node": "node-b", "port": 8002, "replica": 2, "share": 0.3}
cmd=(
  env
  CUDA_VISIBLE_DEVICES=2
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=24G
  "CUDA_MPS_PIPE_DIRECTORY=$mps_pipe"
  vllm serve Qwen/Qwen2.5-1.5B
  --max-num-seqs 64
  --served-model-name small
  --tensor-parallel-size 1
  --gpu-memory-utilization 0.3
  --host node-b
  --port 8002
)
start_server small-2 "${cmd[@]}"

wait_healthy big-0 8000 gen-1 8001 small-2 8002
echo "start.sh ($node): all 3 server(s) healthy"
