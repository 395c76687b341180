"""The shell target: bash scripts that start and stop a plan's ``vllm serve`` processes on bare
metal, the one target that honours per-GPU placement exactly (docs/launch.md).

:class:`ShellRenderer` (registered as ``shell``) turns a plan into, per node, ``NODE/start.sh``
and ``NODE/stop.sh``; at the top ``start-all.sh`` and ``stop-all.sh`` (each node's script on its
node, over ssh where the node is not this host) and ``routes.json``. ``NODE`` is the node's name
with ``/`` written ``%2F`` (and ``%`` added to a name that is a top-level file or ``run``).

Each replica's server is one bash array in ``start.sh``: ``env``, the variables, the command::

    # scepsy-replica: {"device": "cuda", "gpus": [0, 1], "llm": "gen", ...}
    cmd=(
      env
      CUDA_VISIBLE_DEVICES=0,1
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
      ...
      vllm serve Qwen/Qwen2.5-7B-Instruct
      --tensor-parallel-size 2
      --port 8000
    )
    start_server gen-0 "${cmd[@]}"

Every value that comes from the plan is quoted with :func:`shlex.quote`, so the array is exactly
the argv the server receives; :meth:`ShellRenderer.parse` reads these arrays back (with
:mod:`shlex`, as bash reads them) and checks them against the ``# scepsy-replica:`` record above
each, so a round trip tests what runs.

The rules, in one place: on a GPU ``--gpu-memory-utilization`` is the replica's memory over the
device's, rounded down to 3 decimals (:func:`gpu_memory_utilization`); a share below 1 runs
under an MPS control daemon with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (:func:`mps_percentage`)
and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (:func:`mps_memory_limit`). On a CPU (a core is the
unit the plan shares) the ranks are pinned with ``VLLM_CPU_OMP_THREADS_BIND``
(:func:`~scepsy_profile.profiling.engine_env.cpu_binding` of the placed cores) and the KV cache
is what the plan's memory leaves after the weights and a reserve (:func:`cpu_kv_cache_gib`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Any

from scepsy_common.errors import InputError
from scepsy_profile.profiling.engine_env import (
    ONE_PROCESS_ENV,
    cpu_binding,
    mps_percentage,
    one_process_env,
    pinned,
)
from scepsy_profile.profiling.server import IPC_PATH_ROOM
from scepsy_serve.launch.launchplan import (
    ENV_NAME_PATTERN,
    Assignment,
    LaunchPlan,
    ReplicaLaunch,
    check_env_name,
    check_text,
    file_name,
    server_name,
)
from scepsy_serve.launch.renderers import register_renderer
from scepsy_serve.launch.routes import ROUTES_FILE, plan_routes

NAME = "shell"
RUN_DIR_ENV = "SCEPSY_RUN_DIR"
"""Where start.sh writes logs, pid files and state (default: ``run/`` beside the node folders)."""
HEALTH_TIMEOUT_ENV = "SCEPSY_HEALTH_TIMEOUT_S"
"""Overrides the plan's health timeout (whole seconds) for one start."""
STOP_GRACE_ENV = "SCEPSY_STOP_GRACE_S"
"""Seconds stop.sh waits after SIGTERM before SIGKILL (default :data:`STOP_GRACE_S`)."""
STOP_GRACE_S = 10
SERVER_ENV = "SCEPSY_SERVER"
"""Set by start.sh in each server's environment to ``RUN/pids/NAME`` (RUN: the run folder's
physical path): stop.sh (and :func:`scepsy_serve.launch.host.stop`) signal a pid file's
process group only when a process of it carries this marker, so a stale pid file (the server
gone, its pid reused) never stops an unrelated process."""
REPLICA_TAG = "# scepsy-replica: "
KV_RESERVE_GIB = 1.0
"""GiB of a CPU replica's memory left out of its KV cache (activations, the runtime)."""
ALL_INTERFACES = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""Addresses that bind every interface, and the loopback address start.sh checks them at."""
TOP_FILES = (ROUTES_FILE, "start-all.sh", "stop-all.sh", "run")
"""Top-level names of a rendered folder (``run/`` appears when it is applied)."""
SOCKET_PATH_MAX = 107
ENV_NAME = re.compile(ENV_NAME_PATTERN)
_TOL = 1e-9


# -- the rules ------------------------------------------------------------------------------------

def node_folder(node: str) -> str:
    """The folder of ``node``'s scripts: its name, ``/`` written ``%2F`` (``%`` is not a name
    character, so no two nodes share a folder), ``%`` added to a name that is a top-level file."""
    folder = file_name(node)
    return folder + "%" if folder in TOP_FILES else folder


def gpu_memory_utilization(memory_gib: float, device_gib: float) -> float:
    """``--gpu-memory-utilization``: ``memory_gib / device_gib`` rounded down to 3 decimals (it
    never exceeds the plan); :class:`InputError` when that is 0 or above 1."""
    ratio = memory_gib / device_gib
    thousandths = math.floor(ratio * 1000 + _TOL)
    if not 1 <= thousandths <= 1000 or ratio > 1 + _TOL:  # floor would hide a bit above 1
        raise InputError("plan", "memory_gib", f"a replica memory in (0, {device_gib:g}] GiB "
                         "(the device's)", memory_gib)
    return thousandths / 1000


def mps_memory_limit(memory_gib: float, tp: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``memory_gib`` on each of the ``tp`` devices the
    replica sees (ordinals 0..tp-1 after ``CUDA_VISIBLE_DEVICES``), as ``NG`` when whole GiB,
    else whole MiB rounded down (``0=40G,1=40G``, ``0=24371MB``)."""
    if abs(memory_gib - round(memory_gib)) < _TOL:
        each = f"{round(memory_gib)}G"
    else:
        each = f"{math.floor(memory_gib * 1024 + _TOL)}MB"
    return ",".join(f"{i}={each}" for i in range(tp))


def cpu_kv_cache_gib(memory_gib: float, tp: int, weights_gib: float) -> int:
    """``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) of a CPU replica: what the plan gives it
    (``memory_gib`` per core it holds, ``tp`` of them) less the weights and
    :data:`KV_RESERVE_GIB`, rounded down, at least 1."""
    return max(1, math.floor(memory_gib * tp - weights_gib - KV_RESERVE_GIB + _TOL))


def plan_env(plan: LaunchPlan, llm: str) -> dict[str, str]:
    """The plan's environment for ``llm``'s servers: the engine's, then the model's (which
    wins). Names and values are checked here as well as by the plan loader, since a
    :class:`LaunchPlan` can also be built by hand."""
    out: dict[str, str] = {}
    for where, env in (("engine.env", plan.engine.env), (f"models.{llm}.env",
                                                         plan.models[llm].env)):
        for k, v in env.items():
            out[check_env_name(k, "plan", where)] = check_text(v, "plan", f"{where}.{k}")
    return out


# -- one replica ----------------------------------------------------------------------------------

RUNTIME_VALUES = {"CUDA_MPS_PIPE_DIRECTORY": "$mps_pipe", "TMPDIR": "$engine_tmp",
                  "VLLM_CACHE_ROOT": "$run_dir/vllm-cache"}
"""Variables whose value start.sh fills in when it runs (a folder it chooses): when the plan
sets them, they are written in double quotes so that bash expands the script's variable. No
value from the plan's ``env`` is ever written this way."""


def replica_env(plan: LaunchPlan, r: ReplicaLaunch) -> dict[str, str]:
    """The variables of ``r``'s server, in the order written: the engine's and the model's own
    (sorted; the model's win), then the plan's (which win over both). The plan's
    :data:`RUNTIME_VALUES` name a folder start.sh chooses (``$mps_pipe``, ...)."""
    return _replica_env(plan, r)[0]


def _replica_env(plan: LaunchPlan, r: ReplicaLaunch) -> tuple[dict[str, str], frozenset[str]]:
    """:func:`replica_env` and the names whose values start.sh fills in."""
    model = plan.models[r.llm]
    device = plan.device_of(r.node)
    user = plan_env(plan, r.llm)
    ours: dict[str, str] = {}
    if device.kind == "cuda":
        ours["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in r.gpus)
        if r.share < 1.0:
            ours["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_percentage(r.share))
            ours["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = mps_memory_limit(r.memory_gib, r.tp)
            ours["CUDA_MPS_PIPE_DIRECTORY"] = RUNTIME_VALUES["CUDA_MPS_PIPE_DIRECTORY"]
    else:
        ours["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(r.tp, r.share, r.gpus)
        ours.update(one_process_env(r.tp))
        ours["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_cache_gib(r.memory_gib, r.tp,
                                                              model.weights_gib))
        ours["TMPDIR"] = RUNTIME_VALUES["TMPDIR"]
        ours["VLLM_CACHE_ROOT"] = RUNTIME_VALUES["VLLM_CACHE_ROOT"]
    out = {k: v for k, v in sorted(user.items()) if k not in ours}
    out.update(ours)
    return out, frozenset(k for k in ours if k in RUNTIME_VALUES)


def bind_address(plan: LaunchPlan, node: str) -> str:
    """The address ``node``'s servers listen on (``--host``): the node's address in the plan's
    launch section (its name where the plan gives none), the one address clients reach it at
    (routes.json). A server listens on every interface only where the plan says ``0.0.0.0``
    (or ``::``): an unauthenticated server is not exposed to a network the plan did not name.
    An address that is no host name or IP address is an :class:`InputError`."""
    plan.url_host(node)
    return plan.address(node)


def probe_address(address: str) -> str:
    """Where start.sh checks a server bound at ``address`` (port in use, ``/health``): the
    address itself, or loopback for one that binds every interface."""
    return ALL_INTERFACES.get(address, address)


def replica_command(plan: LaunchPlan, r: ReplicaLaunch, *, host: str | None = None
                    ) -> tuple[str, ...]:
    """``r``'s server command: the engine's command, the model it serves, the engine's and the
    model's arguments, then the plan's (which win where an argument repeats), listening on
    ``host`` (default: :func:`bind_address` of its node)."""
    model = plan.models[r.llm]
    device = plan.device_of(r.node)
    command = plan.engine.command
    if not command:
        raise InputError("plan", "engine.command", "a command (e.g. vllm serve)", list(command))
    if "=" in command[0] or command[0].startswith("-"):
        raise InputError("plan", "engine.command", "a program first (no '=', not an option)",
                         command[0])
    ours = ["--served-model-name", r.llm, "--tensor-parallel-size", str(r.tp)]
    if device.kind == "cuda":
        ours += ["--gpu-memory-utilization",
                 f"{gpu_memory_utilization(r.memory_gib, device.memory_gib):g}"]
    ours += ["--host", bind_address(plan, r.node) if host is None else host,
             "--port", str(r.port)]
    argv = (*command, model.serve, *plan.engine.args, *model.args, *ours)
    for i, a in enumerate(argv):
        check_text(a, "plan", f"command argument {i}")
    return argv


def start_command(plan: LaunchPlan, r: ReplicaLaunch) -> tuple[str, ...]:
    """What start.sh runs for ``r``: :func:`replica_command`, on a CPU with one rank confined
    to the replica's cores (``taskset -c``:
    :func:`~scepsy_profile.profiling.engine_env.pinned`), so that the server's processes share
    only the cores the plan gives it."""
    argv = replica_command(plan, r)
    if plan.device_of(r.node).kind != "cpu":
        return argv
    return pinned(argv, cpu_binding(r.tp, r.share, r.gpus))


def _word(value: str) -> str:
    """``value`` as one bash word (shellcheck reads an unquoted comma in an array, or a word
    that starts with ``=``, as a mistake: those are quoted too)."""
    q = shlex.quote(value)
    return f"'{q}'" if q == value and ("," in value or value.startswith("=")) else q


def _assigned(value: str) -> str:
    """``value`` quoted after ``NAME=`` (always: shellcheck reads ``a-b`` as arithmetic)."""
    q = shlex.quote(value)
    return f"'{q}'" if q == value else q


def _env_word(name: str, value: str, runtime: bool) -> str:
    return f'"{name}={value}"' if runtime else _word(f"{name}={value}")


def _arg_lines(argv: tuple[str, ...], head: int) -> list[str]:
    """The command on lines: the first ``head`` words (program and model) on one, then an
    option per line with the value that follows it."""
    lines = [" ".join(_word(a) for a in argv[:head])]
    for a in argv[head:]:
        if a.startswith("-") or len(lines) == 1:
            lines.append(_word(a))
        else:
            lines[-1] += " " + _word(a)
    return lines


def _replica_record(plan: LaunchPlan, r: ReplicaLaunch) -> str:
    rec = {"llm": r.llm, "replica": r.replica, "node": r.node, "gpus": list(r.gpus),
           "share": r.share, "memory_gib": r.memory_gib, "port": r.port,
           "device": plan.device_of(r.node).kind}
    return json.dumps(rec, sort_keys=True)


def _replica_block(plan: LaunchPlan, r: ReplicaLaunch, env: Mapping[str, str],
                   runtime: frozenset[str], argv: tuple[str, ...]) -> str:
    """``r``'s lines of start.sh, from its :func:`_replica_env` and :func:`replica_command`."""
    device = plan.device_of(r.node)
    unit = ("GPU" if device.kind == "cuda" else "core") + ("s" if r.tp > 1 else "")
    units = ",".join(str(g) for g in r.gpus)
    lines = [f"# {r.name}: {r.llm} replica {r.replica} on {unit} {units} (share {r.share:g}, "
             f"{r.memory_gib:g} GiB each), port {r.port}",
             REPLICA_TAG + _replica_record(plan, r),
             "cmd=(", "  env"]
    lines += [f"  {_env_word(k, v, k in runtime)}" for k, v in env.items()]
    # program and model on one line, after any pin prefix (start_command)
    head = argv.index(plan.models[r.llm].serve, len(plan.engine.command)) + 1
    lines += [f"  {ln}" for ln in _arg_lines(argv, head)]
    lines += [")", f'start_server {_word(r.name)} "${{cmd[@]}}"']
    return "\n".join(lines)


# -- the scripts ----------------------------------------------------------------------------------

_GROUP_ALIVE = r'''group_alive() {  # whether a live process (not a zombie) of process group $1 remains
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
}'''

_OURS = r'''ours() {  # PID NAME: whether a live process of group PID is server NAME of this run folder
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
        if [[ $var == "__MARKER__=$run_dir/pids/$2" ]]; then
          return 0
        fi
      done 2>/dev/null <"${stat%/stat}/environ" || true
    fi
  done
  return 1
}'''

_PROC_ALIVE = r'''proc_alive() {  # whether process $1 runs (not a zombie)
  local line
  if [[ ! -r /proc/self/stat ]]; then
    kill -0 "$1" 2>/dev/null
    return
  fi
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  line=${line##*) }
  [[ ${line%% *} != Z ]]
}'''

_PREAMBLE = '''set -euo pipefail

here=$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" && pwd)
node={node}
node_folder={folder}
run_dir=${{{run_env}:-$here/../run}}'''

_START_FUNCS = r'''port_busy() {  # whether something accepts connections on port $1 of the servers' address
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
  if (( ${#1} + __ROOM__ <= __MAX__ )); then
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
  __RUN_ENV__=$run_dir bash "$here/stop.sh" >&2 || true
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
  __MARKER__="$run_dir/pids/$name" setsid "$@" >>"$run_dir/logs/$name.log" 2>&1 </dev/null &
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
}'''

_MPS = r'''# MPS: shares below 1 run as clients of an MPS control daemon (started unless one runs).
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
fi'''

_CPU = r'''# vLLM on a CPU: its temporary files (ZMQ sockets) and caches under the run folder
engine_tmp=$(short_dir "$run_dir/tmp/$node_folder")
mkdir -p -- "$run_dir/vllm-cache"'''

_STOP_BODY = r'''wait_gone() {  # SECONDS: wait until none of the groups in $pids runs, at most SECONDS
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
}'''

_STOP_TAIL = r'''if ((${#left[@]})); then
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
echo "stop.sh ($node): nothing of this node runs"'''


def _words(values: Iterable[str]) -> str:
    return " ".join(_word(v) for v in values)


def _header(lines: Iterable[str]) -> str:
    return "\n".join(["#!/usr/bin/env bash", *(f"# {ln}" if ln else "#" for ln in lines)])


def _start_script(plan: LaunchPlan, node: str) -> str:
    reps = plan.replicas_on(node)
    device = plan.device_of(node)
    timeout = max(1, math.ceil(plan.engine.health_timeout_s))
    shared = device.kind == "cuda" and any(r.share < 1.0 for r in reps)
    bind = bind_address(plan, node)
    probe = probe_address(bind)
    header = _header([
        f"Start the {len(reps)} vLLM server(s) of node {node} (plan of cluster {plan.name}).",
        "Written by `scepsy launch --target shell` (docs/launch.md): run it on that node.",
        f"Logs go to RUN/logs/NAME.log, process ids to RUN/pids/NAME.pid; RUN is run/ beside "
        f"this folder, or ${RUN_DIR_ENV}.",
        "Refuses a port in use; then waits for every server's /health (up to "
        f"${HEALTH_TIMEOUT_ENV}, default {timeout} s);",
        "on a failure or a timeout it stops what it started and exits 1. Stop with stop.sh.",
    ])
    blocks, words, pinned_any = [], [], False
    for r in reps:
        env, runtime = _replica_env(plan, r)
        argv = start_command(plan, r)
        pinned_any |= argv[:1] == ("taskset",)
        blocks.append(_replica_block(plan, r, env, runtime, argv))
        words += [*argv, *(v for k, v in env.items() if k not in runtime)]
    if any("$" in w or "`" in w for w in words):
        # a value from the plan holds $ or a backtick: quoted so that it stays text
        header += "\n# shellcheck disable=SC2016"
    parts = [header,
             _PREAMBLE.format(node=_assigned(node), folder=_assigned(node_folder(node)),
                              run_env=RUN_DIR_ENV),
             f"health_timeout_s=${{{HEALTH_TIMEOUT_ENV}:-{timeout}}}",
             "# where start.sh checks the servers' ports and /health: the address they listen on",
             f"probe_host={_assigned(probe)}",
             f"probe_url_host={_assigned(f'[{probe}]' if ':' in probe else probe)}",
             'if [[ ! $health_timeout_s =~ ^[0-9]+$ ]]; then\n'
             f'  echo "start.sh ($node): {HEALTH_TIMEOUT_ENV} must be whole seconds '
             '(got $health_timeout_s)" >&2\n  exit 2\nfi',
             'mkdir -p -- "$run_dir/logs" "$run_dir/pids" "$run_dir/state/$node_folder"',
             'run_dir=$(cd -- "$run_dir" && pwd -P)',
             'state=$run_dir/state/$node_folder',
             "",
             _GROUP_ALIVE, "", _OURS.replace("__MARKER__", SERVER_ENV), "", _PROC_ALIVE, "",
             _START_FUNCS.replace("__ROOM__", str(IPC_PATH_ROOM))
             .replace("__MAX__", str(SOCKET_PATH_MAX)).replace("__RUN_ENV__", RUN_DIR_ENV)
             .replace("__MARKER__", SERVER_ENV),
             "",
             "# refuse before anything starts",
             *(f"check_free {_word(r.name)} {r.port}" for r in reps), ""]
    if pinned_any:
        parts += ['if ! command -v taskset >/dev/null; then\n'
                  '  echo "start.sh ($node): taskset (util-linux) is needed to keep each CPU '
                  'server on its cores; nothing started" >&2\n  exit 1\nfi', ""]
    if shared:
        parts += [_MPS, ""]
    if device.kind == "cpu":
        parts += [_CPU, ""]
    for b in blocks:
        parts += [b, ""]
    parts += ["wait_healthy " + " ".join(f"{_word(r.name)} {r.port}" for r in reps),
              'echo "start.sh ($node): all ' + str(len(reps)) + ' server(s) healthy"']
    return "\n".join(parts) + "\n"


def _stop_script(plan: LaunchPlan, node: str) -> str:
    reps = plan.replicas_on(node)
    header = _header([
        f"Stop the vLLM servers of node {node} that start.sh started (plan of cluster "
        f"{plan.name}).",
        f"SIGTERM to each server's process group, SIGKILL after ${STOP_GRACE_ENV} (default "
        f"{STOP_GRACE_S}) s;",
        "removes the pid files, quits the MPS control daemon if start.sh started it.",
        "Succeeds when nothing of this node runs; running it again is harmless.",
    ])
    parts = [header,
             _PREAMBLE.format(node=_assigned(node), folder=_assigned(node_folder(node)),
                              run_env=RUN_DIR_ENV),
             f"grace_s=${{{STOP_GRACE_ENV}:-{STOP_GRACE_S}}}",
             'if [[ ! $grace_s =~ ^[0-9]+$ ]]; then\n'
             f'  echo "stop.sh ($node): {STOP_GRACE_ENV} must be whole seconds '
             '(got $grace_s)" >&2\n  exit 2\nfi',
             'if [[ ! -d $run_dir ]]; then\n'
             '  echo "stop.sh ($node): nothing of this node runs (no $run_dir)"\n  exit 0\nfi',
             'run_dir=$(cd -- "$run_dir" && pwd -P)',
             'state=$run_dir/state/$node_folder',
             "left=()",
             "",
             _GROUP_ALIVE, "", _OURS.replace("__MARKER__", SERVER_ENV), "", _STOP_BODY, "",
             "stop_all " + _words(r.name for r in reps),
             _STOP_TAIL]
    return "\n".join(parts) + "\n"


_ALL_FUNCS = r'''read -r -a ssh_cmd <<<"${SCEPSY_SSH:-ssh}"

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
}'''


def _all_script(plan: LaunchPlan, verb: str) -> str:
    nodes = plan.node_names()
    header = _header([
        f"{verb.capitalize()} every node of the plan of cluster {plan.name}: each node's "
        f"{verb}.sh on that node.",
        "A node whose address is this host runs here; any other over ssh ($SCEPSY_SSH, default",
        "ssh), which needs this folder at the same path there (a shared file system or a copy):",
        *(f"  ssh {plan.address(n)} bash /path/to/this/folder/{node_folder(n)}/{verb}.sh"
          for n in nodes),
    ])
    parts = [header, "set -euo pipefail", "",
             'here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)', _ALL_FUNCS, ""]
    if verb == "start":
        parts += [
            "folders=()", "addresses=()",
            "start_node() {  # FOLDER ADDRESS",
            '  echo "start-all.sh: node $1 ($2)"',
            '  if run_on "$2" "$1/start.sh"; then',
            '    folders+=("$1")', '    addresses+=("$2")', "    return", "  fi",
            '  echo "start-all.sh: node $1 failed; stopping the nodes started" >&2',
            "  local i",
            '  for i in "${!folders[@]}"; do',
            '    run_on "${addresses[i]}" "${folders[i]}/stop.sh" || true', "  done",
            "  exit 1", "}", "",
            *(f"start_node {_word(node_folder(n))} {_word(plan.address(n))}" for n in nodes),
            'echo "start-all.sh: every node started"']
    else:
        parts += [
            "failed=()",
            *(f"run_on {_word(plan.address(n))} {_word(node_folder(n) + '/stop.sh')} "
              f"|| failed+=({_word(n)})" for n in nodes),
            'if ((${#failed[@]})); then',
            '  echo "stop-all.sh: could not stop every server of: ${failed[*]}" >&2',
            "  exit 1", "fi",
            'echo "stop-all.sh: every node stopped"']
    return "\n".join(parts) + "\n"


# -- the renderer ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShellReplica:
    """One replica as its start.sh says: the ``# scepsy-replica:`` record, checked against the
    ``env`` variables and the command of its array."""

    name: str
    llm: str
    replica: int
    node: str
    device: str
    gpus: tuple[int, ...]
    share: float
    tp: int
    port: int
    env: Mapping[str, str]
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def assignment(self) -> Assignment:
        return Assignment(self.llm, self.replica, self.tp, self.share, self.node, self.gpus)

    @property
    def host(self) -> str:
        """The address its server listens on (the last ``--host`` of its command; vLLM's
        default, every interface, without one)."""
        hosts = [self.argv[i + 1] for i, a in enumerate(self.argv[:-1]) if a == "--host"]
        return hosts[-1] if hosts else "0.0.0.0"

    @property
    def url(self) -> str:
        """Its OpenAI-compatible base URL from its node (:func:`probe_address` of
        :attr:`host`)."""
        probe = probe_address(self.host)
        return f"http://{f'[{probe}]' if ':' in probe else probe}:{self.port}/v1"


class ShellRenderer:
    name = NAME
    description = ("bash scripts per node: vllm serve per replica with CUDA_VISIBLE_DEVICES, "
                   "MPS shares and memory limits, pid files, logs, health wait, stop")
    exact = frozenset({"node", "gpus", "share", "tp"})

    def render(self, plan: LaunchPlan) -> Mapping[str, str]:
        files: dict[str, str] = {}
        for node in plan.node_names():
            folder = node_folder(node)
            files[f"{folder}/start.sh"] = _start_script(plan, node)
            files[f"{folder}/stop.sh"] = _stop_script(plan, node)
        files["start-all.sh"] = _all_script(plan, "start")
        files["stop-all.sh"] = _all_script(plan, "stop")
        files[ROUTES_FILE] = plan_routes(plan).dumps()
        return files

    def parse(self, files: Mapping[str, str]) -> frozenset[Assignment]:
        return frozenset(r.assignment() for r in replica_records(files))


SHELL = register_renderer(ShellRenderer())


def replica_records(files: Mapping[str, str]) -> tuple[ShellReplica, ...]:
    """Every replica of the rendered ``files`` (path -> text), from the arrays of each
    ``NODE/start.sh``; :class:`InputError` where a script says something its record does not
    (an edited script) or where no script holds a replica."""
    out: list[ShellReplica] = []
    for path, text in sorted(files.items()):
        p = PurePosixPath(path)
        if len(p.parts) != 2 or p.name != "start.sh":
            continue
        for rec, words, start in _blocks(text, path):
            out.append(_check_replica(rec, words, start, p.parts[0], path))
    if not out:
        raise InputError("launch folder", "NODE/start.sh", "scripts written by "
                         "`scepsy launch --target shell` (no replica found)")
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise InputError("launch folder", "replicas", "each replica once", sorted(names))
    return tuple(sorted(out, key=lambda r: (r.llm, r.replica)))


def _blocks(text: str, path: str) -> list[tuple[dict[str, object], list[str], list[str]]]:
    """Each replica of one start.sh: its record, the words of its ``cmd=( ... )`` array (as
    bash reads them) and the words of the ``start_server`` line after it."""
    out = []
    pos = 0
    while (i := text.find("\n" + REPLICA_TAG, pos)) >= 0:
        eol = text.index("\n", i + 1)
        try:
            rec = json.loads(text[i + 1 + len(REPLICA_TAG):eol])
        except json.JSONDecodeError as exc:
            raise InputError(path, "scepsy-replica", "a JSON record", str(exc)) from None
        if not isinstance(rec, dict):
            raise InputError(path, "scepsy-replica", "a JSON object", rec)
        lex = shlex.shlex(text[eol + 1:], posix=True, punctuation_chars="();<>|&")
        lex.whitespace_split = True
        lex.commenters = ""
        head = [lex.get_token(), lex.get_token()]
        if head != ["cmd=", "("]:
            raise InputError(path, "scepsy-replica", "a cmd=( ... ) array after the record",
                             head)
        words: list[str] = []
        while (tok := lex.get_token()) != ")":
            if tok is None or tok == lex.eof:
                raise InputError(path, "scepsy-replica", "the array closed by )")
            words.append(tok)
        start = [lex.get_token() or "" for _ in range(3)]
        out.append((rec, words, start))
        pos = eol
    return out


def _check_replica(rec: dict[str, Any], words: list[str], start: list[str], folder: str,
                   path: str) -> ShellReplica:
    try:
        llm, replica, node = str(rec["llm"]), int(rec["replica"]), str(rec["node"])
        gpus = tuple(int(g) for g in rec["gpus"])
        share, port, device = float(rec["share"]), int(rec["port"]), str(rec["device"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(path, "scepsy-replica", "llm, replica, node, gpus, share, port and "
                         "device", str(exc)) from None
    name = server_name(llm, replica)

    def bad(what: str, expected: str, got: object) -> InputError:
        return InputError(path, f"{name}: {what}", expected, got)

    if start != ["start_server", name, "${cmd[@]}"]:
        raise bad("start_server", f'start_server {name} "${{cmd[@]}}"', start)
    if node_folder(node) != folder:
        raise bad("node", f"a replica of node folder {folder}", node)
    if not words or words[0] != "env":
        raise bad("cmd", "env first", words[:1])
    env: dict[str, str] = {}
    i = 1
    while i < len(words) and ENV_NAME.match(words[i].partition("=")[0]) and "=" in words[i]:
        k, _, v = words[i].partition("=")
        env[k] = v
        i += 1
    argv = tuple(words[i:])
    tp = last_option(argv, "--tensor-parallel-size")
    if tp != str(len(gpus)):
        raise bad("--tensor-parallel-size", f"{len(gpus)} (one rank per placed device)", tp)
    if last_option(argv, "--port") != str(port):
        raise bad("--port", str(port), last_option(argv, "--port"))
    if last_option(argv, "--served-model-name") != llm:
        raise bad("--served-model-name", llm, last_option(argv, "--served-model-name"))
    if device == "cuda":
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        if visible != ",".join(str(g) for g in gpus):
            raise bad("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in gpus), visible)
        pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        want = None if share >= 1.0 else str(mps_percentage(share))
        if pct != want:
            raise bad("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", want or "absent (share 1)", pct)
    elif device == "cpu":
        binding = env.get("VLLM_CPU_OMP_THREADS_BIND")
        want_b = cpu_binding(len(gpus), share, gpus)
        if binding != want_b:
            raise bad("VLLM_CPU_OMP_THREADS_BIND", want_b, binding)
        pin = pinned((), want_b)
        if argv[:len(pin)] != pin:
            raise bad("command", " ".join(pin) + " first (the replica's cores)", argv[:len(pin)])
        argv = argv[len(pin):]
        want_env = one_process_env(len(gpus))
        for k in ONE_PROCESS_ENV:
            if env.get(k) != want_env.get(k):
                raise bad(k, want_env.get(k) or "absent (TP > 1)", env.get(k))
    else:
        raise bad("device", "cuda or cpu", device)
    return ShellReplica(name, llm, replica, node, device, gpus, share, len(gpus), port, env,
                        argv)


def last_option(argv: Iterable[str], option: str) -> str | None:
    """The value after the last ``option`` in ``argv`` (None when absent)."""
    value = None
    for a, b in itertools.pairwise(argv):
        if a == option:
            value = b
    return value
