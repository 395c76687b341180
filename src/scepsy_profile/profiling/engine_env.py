"""Setting up a vLLM engine from scepsy: its interpreter, its model folder and its environment.

vLLM lives in its own virtual environment (:mod:`scepsy_profile.profiling.vllm_install`), so
scepsy starts it as a child process with that environment's interpreter. This module holds what
every such start needs, whether it is the offline engine of the ``vllm`` profiler backend or a
``vllm serve`` behind the serving-curve measurement:

* :func:`vllm_python` finds the interpreter. Search order (the first hit wins):

  1. ``options.engine_python`` (``--engine-python``);
  2. ``$SCEPSY_VLLM_PYTHON``;
  3. the environment scepsy installs (:func:`~scepsy_profile.profiling.vllm_install.default_venv`:
     ``$SCEPSY_VLLM_VENV`` or the user cache folder);
  4. ``./.venv-vllm/bin/python`` in the current directory;
  5. ``.venv-vllm/bin/python`` in the checkout scepsy runs from, then in the folder above it.

  The first two are explicit: when one is set but is not a file, the search stops there and says
  so (a typo must not silently pick another engine). Whether the interpreter imports ``vllm`` is
  checked by whoever starts it (the backend's probe).
* :func:`write_model_dir` writes ``config.json`` (and ``generation_config.json``) for an
  :class:`~scepsy_profile.profiling.models.EngineModel`: with ``load_format="dummy"`` and
  ``skip_tokenizer_init=True`` that is all vLLM needs, no weights, no tokenizer, no download.
* :func:`engine_environment` builds the variables the engine must see: on a CPU the KV-cache
  size (``VLLM_CPU_KVCACHE_SPACE``, whole GiB: vLLM would otherwise size it from NUMA node 0) and
  the cores each TP rank is pinned to (``VLLM_CPU_OMP_THREADS_BIND``: a share of the machine is
  applied as whole cores, some left to the scheduler process, see :func:`cpu_binding`; TP=2 on
  two cores is ``"0|1"``); on an NVIDIA GPU a share below 1 as
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (meaningful only under a running MPS daemon, see
  :func:`mps_daemon_running`; nothing here starts one or changes a device setting); everywhere
  ``TMPDIR`` and ``VLLM_CACHE_ROOT`` in a folder of the caller's (each start leaves socket files)
  and no usage reporting or hub access.
* :func:`cpu_one_process` and :func:`pinned`: a TP=1 engine on a CPU runs as one process
  confined to its cores (docs/launch.md, "A CPU as the device"). vLLM's CPU build otherwise runs the
  model in a worker process that, after every message, polls its queue without sleeping for one
  second (``shm_broadcast``'s ``busy_loop_s``): an idle server sharing a core with a busy one
  took that core from it, and a 30-token call ran 10x slower than alone. With the engine in
  one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the uniprocess executor) and the server's
  processes pinned (``taskset -c``), servers sharing a core take turns: 1.4-2.1x slower while
  both run, as the time-sliced share assumes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scepsy_common.errors import InputError
from scepsy_profile.profiling.backend import BackendOptions, BackendUnavailable
from scepsy_profile.profiling.devices import mps_status
from scepsy_profile.profiling.models import EngineModel
from scepsy_profile.profiling.vllm_install import default_venv, venv_python

DeviceKind = Literal["cpu", "cuda"]

ONE_PROCESS_ENV: Mapping[str, str] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""What runs a TP=1 CPU engine's model in its engine process (:func:`cpu_one_process`)."""

VENV_NAME = ".venv-vllm"
"""The folder name looked for in the current directory and around the checkout."""

_REPO = Path(__file__).resolve().parents[3]
"""The checkout this module runs from (``src/scepsy_profile/profiling/`` is three levels down)."""

_OFFLINE_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True, slots=True)
class EnginePython:
    """The interpreter that runs vLLM, and which rule of the search found it."""

    path: Path
    found_by: str


def python_candidates(options: BackendOptions | None = None, *,
                      environ: Mapping[str, str] | None = None,
                      cwd: Path | None = None) -> tuple[EnginePython, ...]:
    """Every place :func:`vllm_python` looks, in its order (explicit settings first)."""
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else cwd
    found: list[EnginePython] = []
    if options is not None and options.engine_python:
        found.append(EnginePython(Path(options.engine_python).expanduser(), "--engine-python"))
    if env.get("SCEPSY_VLLM_PYTHON"):
        found.append(EnginePython(Path(env["SCEPSY_VLLM_PYTHON"]).expanduser(),
                                  "$SCEPSY_VLLM_PYTHON"))
    venv = Path(env["SCEPSY_VLLM_VENV"]).expanduser() if env.get("SCEPSY_VLLM_VENV") \
        else default_venv()
    found.append(EnginePython(venv_python(venv), "scepsy's vLLM environment"))
    for folder, what in ((here, "the current directory"), (_REPO, "the checkout"),
                         (_REPO.parent, "the folder above the checkout")):
        found.append(EnginePython(venv_python(folder / VENV_NAME), f"{VENV_NAME} in {what}"))
    return tuple(found)


def check_engine_python(value: str | os.PathLike[str] | None, source: str,
                        field: str = "engine_python") -> None:
    """An :class:`InputError` when an explicit interpreter of vLLM's environment (``value``;
    None: search for one) is not an executable file: checked before any work starts."""
    if value is None:
        return
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise InputError(source, field, "the python of vLLM's environment, an executable file "
                         "(scepsy profile install-vllm --print-python)", str(value))


def vllm_python(options: BackendOptions | None = None, *,
                environ: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> EnginePython:
    """The interpreter of vLLM's environment (search order in the module docstring).

    Raises :class:`BackendUnavailable` naming the places searched when none exists, or naming the
    explicit setting (``--engine-python``, ``$SCEPSY_VLLM_PYTHON``) that points at no file."""
    candidates = python_candidates(options, environ=environ, cwd=cwd)
    for cand in candidates:
        if cand.path.is_file() and os.access(cand.path, os.X_OK):
            return cand
        if cand.found_by.startswith(("--", "$")):
            raise BackendUnavailable(f"{cand.found_by} is {str(cand.path)!r}, which is not an "
                                     "executable file")
    searched = ", ".join(str(c.path) for c in candidates)
    raise BackendUnavailable("no Python environment with vLLM found (searched: " + searched
                             + "); install one with `scepsy profile install-vllm` or set "
                             "SCEPSY_VLLM_PYTHON")


def write_model_dir(model: EngineModel, folder: Path) -> Path:
    """Write ``model``'s ``config.json`` and ``generation_config.json`` into ``folder`` (created
    when missing) and return the folder: what ``LLM(model=folder, load_format="dummy",
    skip_tokenizer_init=True)`` and ``vllm serve folder --load-format dummy`` load."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(model.hf_config())
    config.setdefault("dtype", model.dtype)  # transformers 5 reads ``dtype``, 4 ``torch_dtype``
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "pad_token_id": config["pad_token_id"], "do_sample": False}
    for name, obj in (("config.json", config), ("generation_config.json", generation)):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(folder / name)
    return folder


def share_cores(share: float, cores: int, threads: int | None = None) -> int:
    """Whole cores a share of a ``cores``-core CPU gets: ``threads`` when given (capped at
    ``cores``), else ``floor(share·cores)``, at least 1."""
    _check_share(share)
    if threads is not None:
        return max(1, min(int(threads), cores))
    return max(1, math.floor(share * cores + 1e-9))


def cpu_binding(tp: int, share: float, cores: Sequence[int], threads: int | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tp`` ranks on a share of ``cores`` (core ids).

    The share takes :func:`share_cores` whole cores from the front of ``cores``. Unless
    ``threads`` fixes the ranks' cores, ``tp`` of them stay unpinned for vLLM's scheduler process
    (it polls the ranks without sleeping; vLLM's own automatic binding reserves as many) when
    that leaves each rank a core: the ranks get ``max(tp, k − tp)`` of the ``k`` cores, in
    equal runs (``"0"`` for TP 1 on two cores, ``"0|1"`` for TP 2 on two, ``"0-2|3-5"`` for TP 2
    on eight). With two OpenMP threads on two busy cores every parallel region waits for the
    slower thread: on this project's 2-core machine a TP=1 step ran 2-5x slower and far
    noisier pinned to both cores than to one. :class:`InputError` when there are fewer cores
    than ranks."""
    ids = sorted(set(cores))
    if not (isinstance(tp, int) and tp >= 1):
        raise InputError("engine", "tp", "an integer >= 1", tp)
    if len(ids) < tp:
        raise InputError("engine", "tp", f"at most {len(ids)} (the cores this process may use)",
                         tp)
    k = share_cores(share, len(ids), threads)
    usable = max(tp, k if threads is not None else k - tp)
    per_rank = usable // tp
    ranks = [ids[i * per_rank:(i + 1) * per_rank] for i in range(tp)]
    return "|".join(_core_list(r) for r in ranks)


def cpu_one_process(tp: int) -> bool:
    """Whether a CPU engine of ``tp`` ranks runs as one process pinned to its cores (TP 1): its
    model runs in the engine process (:data:`ONE_PROCESS_ENV`) and every process of it is
    confined to the rank's cores (:func:`pinned`). With more ranks vLLM needs a worker process
    per rank, each pinned by ``VLLM_CPU_OMP_THREADS_BIND``."""
    return tp == 1


def one_process_env(tp: int) -> dict[str, str]:
    """The variables that run a CPU engine of ``tp`` ranks as one process
    (:data:`ONE_PROCESS_ENV` for one rank, none for more: :func:`cpu_one_process`)."""
    return dict(ONE_PROCESS_ENV) if cpu_one_process(tp) else {}


def pinned(command: Sequence[str], binding: str) -> tuple[str, ...]:
    """``command`` confined to the cores of a one-rank ``binding`` (``taskset -c CORES``, so
    that the server's HTTP process and engine process stay on them too); ``command`` unchanged
    for a binding of several ranks (:func:`cpu_one_process`)."""
    ranks = bound_cores(binding)
    if not cpu_one_process(len(ranks)):
        return tuple(command)
    return ("taskset", "-c", _core_list(list(ranks[0])), *command)


def pinned_by(command: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """``command`` :func:`pinned` to the CPU binding of an engine environment
    (:func:`engine_environment`'s ``VLLM_CPU_OMP_THREADS_BIND``); unchanged without one (a
    GPU)."""
    binding = env.get("VLLM_CPU_OMP_THREADS_BIND")
    return tuple(command) if binding is None else pinned(command, binding)


def bound_cores(binding: str) -> tuple[tuple[int, ...], ...]:
    """The core ids of each rank in a ``VLLM_CPU_OMP_THREADS_BIND`` value (``"0-1|2,4"`` →
    ``((0, 1), (2, 4))``); the inverse of :func:`cpu_binding`."""
    ranks = []
    for group in binding.split("|"):
        ids: list[int] = []
        for part in group.split(","):
            lo, _, hi = part.partition("-")
            ids.extend(range(int(lo), int(hi or lo) + 1))
        ranks.append(tuple(ids))
    return tuple(ranks)


def _core_list(ids: Sequence[int]) -> str:
    """``0-3`` for a contiguous run, ``0,2,5`` otherwise."""
    if list(ids) == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(str(i) for i in ids)


def usable_cores() -> tuple[int, ...]:
    """The core ids this process may run on."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return tuple(range(os.cpu_count() or 1))


def engine_environment(tp: int, share: float, device_kind: DeviceKind, kv_gib: float | None,
                       tmp: Path, *, cores: Sequence[int] | None = None,
                       threads: int | None = None) -> dict[str, str]:
    """The variables to add to the engine process's environment (not a full environment: start
    it with ``{**os.environ, **engine_environment(...)}``).

    ``tmp`` receives ``TMPDIR`` and ``VLLM_CACHE_ROOT`` (created). On a CPU, ``kv_gib`` (rounded up
    to whole GiB, at least 1; default 1) is the KV-cache size and the engine's ranks are pinned
    to :func:`cpu_binding` of ``cores`` (default: the cores this process may use). On a GPU a
    share below 1 sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (``share·100``, rounded, at least 1);
    its memory limit is an engine argument (``gpu_memory_utilization``), not a variable."""
    _check_share(share)
    if device_kind not in ("cpu", "cuda"):
        raise InputError("engine", "device kind", "cpu or cuda", device_kind)
    cache = tmp / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(_OFFLINE_ENV)
    env["TMPDIR"] = str(tmp)
    env["VLLM_CACHE_ROOT"] = str(cache)
    if device_kind == "cpu":
        if kv_gib is not None and not (math.isfinite(kv_gib) and kv_gib > 0):
            raise InputError("engine", "kv_gib", "a number of GiB > 0", kv_gib)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_gib or 1.0)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(
            tp, share, usable_cores() if cores is None else cores, threads)
        env.update(one_process_env(tp))
    elif share < 1.0:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps_percentage(share))
    return env


def mps_percentage(share: float) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of a share below 1: ``round(share·100)``, >= 1."""
    return max(1, round(share * 100))


def _check_share(share: float) -> None:
    if not (isinstance(share, (int, float)) and math.isfinite(share) and 0 < share <= 1):
        raise InputError("engine", "share", "a number in (0, 1]", share)


def mps_daemon_running(environ: Mapping[str, str] | None = None,
                       proc: Path = Path("/proc")) -> bool:
    """Whether an NVIDIA MPS control daemon runs here
    (:func:`~scepsy_profile.profiling.devices.mps_status`). Only looks; never starts one."""
    return mps_status(proc, dict(os.environ if environ is None else environ)).running
