"""What a profiler runs on: the CPU (model, cores, memory), a CUDA device mapped to its catalog GPU
name, and whether an NVIDIA MPS control daemon is running.

Everything here only reads (``/proc``, ``/sys``, the MPS pipe directory, the CUDA runtime through
torch); nothing changes a device's settings. Importing this module imports no engine: the CUDA
functions import torch when called.

Use::

    cpu = cpu_info()                          # CpuInfo(model='AMD EPYC', cores=2, ...)
    cpu_device(threads=2)                     # DeviceInfo(name='cpu', kind='cpu', count=2, ...)
    catalog_gpu_name("NVIDIA A100-SXM4-80GB") # 'A100-80GB'
    mps_status().running                      # False unless nvidia-cuda-mps-control -d runs
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.profiling.backend import DeviceInfo

GIB = 2**30

_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO", "RTX"})
"""Words of a CUDA device name that never name the GPU model itself."""

_MEMORY_TOLERANCE = 0.15
"""How far (relative) a device's memory may be from a catalog GPU's to be taken for it."""

MPS_DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
"""Where ``nvidia-cuda-mps-control`` puts its pipes unless ``CUDA_MPS_PIPE_DIRECTORY`` says."""


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """The CPU this process may run on."""

    model: str
    """``model name`` from ``/proc/cpuinfo`` (``unknown`` when absent)."""
    cores: int
    """Logical CPUs this process may use (its affinity mask, capped by a cgroup CPU quota)."""
    memory_gib: float
    """Memory this process may use: ``MemTotal``, capped by a cgroup memory limit."""
    available_gib: float
    """``MemAvailable`` now (capped like :attr:`memory_gib`)."""


@dataclass(frozen=True, slots=True)
class MpsStatus:
    """Whether an NVIDIA MPS control daemon serves this machine, and how that was seen."""

    running: bool
    pipe_dir: str
    evidence: str
    """What showed it (``control pipe ...``, ``process ...``) or why it is taken as absent."""


# -- CPU ------------------------------------------------------------------------------------------


def cpu_info(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> CpuInfo:
    """The CPU model, usable cores and memory, read from ``proc`` and ``cgroup`` (v2 or v1)."""
    meminfo = _meminfo(proc / "meminfo")
    limit = _cgroup_memory_limit(cgroup)
    total = meminfo.get("MemTotal", 0.0)
    available = meminfo.get("MemAvailable", total)
    if limit is not None:
        total, available = min(total, limit), min(available, limit)
    return CpuInfo(model=_cpu_model(proc / "cpuinfo"), cores=usable_cores(cgroup),
                   memory_gib=round(total / GIB, 3), available_gib=round(available / GIB, 3))


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Logical CPUs in this process's affinity mask, capped by a cgroup CPU quota (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def threads_for_share(share: float, cores: int) -> int:
    """Whole threads that a ``share`` of ``cores`` stands for: ``share·cores`` rounded half up.

    0 means the share is less than half a core: it cannot be applied as a thread count."""
    return math.floor(share * cores + 0.5)


def cpu_device(threads: int, info: CpuInfo | None = None, **detail: Any) -> DeviceInfo:
    """The CPU as a session's device: ``count`` is the threads the session uses; ``detail`` holds
    the CPU model, its cores and memory, plus ``detail``'s extra entries (engine version...)."""
    cpu = info or cpu_info()
    return DeviceInfo(name="cpu", kind="cpu", memory_gib=cpu.memory_gib, count=threads,
                      detail={"cpu_model": cpu.model, "cores": cpu.cores, "threads": threads,
                              "memory_gib": cpu.memory_gib, **detail})


def _cpu_model(path: Path) -> str:
    try:
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return "unknown"


def _meminfo(path: Path) -> dict[str, float]:
    """``/proc/meminfo`` in bytes."""
    out: dict[str, float] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        m = re.match(r"(\w+):\s+(\d+)\s*(kB)?", line)
        if m:
            out[m.group(1)] = float(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_memory_limit(cgroup: Path) -> float | None:
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        text = _read(cgroup / name)
        if text and text.isdigit() and int(text) < 2**60:
            return float(text)
    return None


def _cgroup_cpu_quota(cgroup: Path) -> float | None:
    text = _read(cgroup / "cpu.max")  # "max 100000" or "200000 100000"
    if text:
        quota, _, period = text.partition(" ")
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
        return None
    quota_v1, period_v1 = (_read(cgroup / "cpu" / n) for n in ("cpu.cfs_quota_us",
                                                              "cpu.cfs_period_us"))
    if quota_v1 and period_v1 and quota_v1.isdigit() and period_v1.isdigit() and int(period_v1):
        return int(quota_v1) / int(period_v1)
    return None


# -- CUDA -----------------------------------------------------------------------------------------


def catalog_gpu_name(device_name: str, memory_gib: float | None = None,
                     catalog: Catalog | None = None) -> str | None:
    """The catalog GPU that a CUDA device called ``device_name`` is, or None when none fits.

    A catalog name's first part is the GPU model (``A100`` of ``A100-80GB``) and must be a whole
    word of the device name (``NVIDIA A100-SXM4-80GB``: ``A100``, ``SXM4``, ``80GB``; ``A10``
    does not match ``A100``, nor ``B200`` ``GB200``). When several catalog GPUs share the model,
    the one whose other parts (``80GB``) are all words of the device name wins, else the one
    whose memory is within 15% of ``memory_gib``."""
    words = set(_words(device_name)) - _VENDOR_WORDS
    cat = catalog or default_catalog()
    candidates = [spec for name, spec in cat.gpus.items() if _words(name)[0] in words]
    if not candidates:
        return None
    exact = [s for s in candidates if set(_words(s.name)[1:]) <= words]
    if len(exact) == 1:
        return exact[0].name
    pool = exact or candidates
    if memory_gib is not None and memory_gib > 0:
        near = [s for s in pool if abs(s.memory_gib - memory_gib) <= _MEMORY_TOLERANCE * s.memory_gib]
        if near:
            return min(near, key=lambda s: abs(s.memory_gib - memory_gib)).name
        return None
    return pool[0].name if len(pool) == 1 else None


def device_label(device_name: str) -> str:
    """A device name without vendor words, as a store's device field (``NVIDIA L40S`` → ``L40S``)
    for a GPU the catalog does not know."""
    kept = [w for w in re.split(r"\s+", device_name.strip()) if w.upper() not in _VENDOR_WORDS]
    return "-".join(kept) or device_name.strip() or "unknown-gpu"


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[\s_\-/]+", name.upper()) if w]


def cuda_device(index: int = 0, catalog: Catalog | None = None, **detail: Any) -> DeviceInfo:
    """CUDA device ``index`` as a session's device (imports torch): ``name`` is its catalog GPU
    name when the catalog knows it, else its own name without vendor words."""
    import torch

    props = torch.cuda.get_device_properties(index)
    memory = round(props.total_memory / GIB, 2)
    known = catalog_gpu_name(props.name, memory, catalog)
    return DeviceInfo(
        name=known or device_label(props.name), kind="cuda", memory_gib=memory, count=1,
        detail={"device_name": props.name, "catalog_match": known is not None,
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
                "device_index": index, **detail})


# -- MPS ------------------------------------------------------------------------------------------


def mps_status(proc: Path = Path("/proc"), environ: dict[str, str] | None = None) -> MpsStatus:
    """Whether an MPS control daemon is running: its ``control`` pipe in the pipe directory
    (``CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``) or an ``nvidia-cuda-mps-control``
    process visible in ``proc``. Only looks; never starts or stops a daemon."""
    env = os.environ if environ is None else environ
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE_DIR
    control = Path(pipe_dir) / "control"
    if control.exists():
        return MpsStatus(True, pipe_dir, f"control pipe {control}")
    pid = _find_process(proc, "nvidia-cuda-mps-control")
    if pid is not None:
        return MpsStatus(True, pipe_dir, f"process nvidia-cuda-mps-control (pid {pid})")
    return MpsStatus(False, pipe_dir, f"no control pipe in {pipe_dir} and no "
                     "nvidia-cuda-mps-control process")


def _find_process(proc: Path, program: str) -> int | None:
    try:
        entries = list(proc.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        if _process_name(entry) in (program, program[:15]):  # comm keeps 15 characters
            return int(entry.name)
    return None


def _process_name(entry: Path) -> str:
    """The program of process folder ``entry``: its ``cmdline``'s first word, else ``comm``."""
    try:
        argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        if argv0:
            return os.path.basename(argv0)
    except OSError:
        pass
    try:
        return (entry / "comm").read_text().strip()
    except OSError:
        return ""


RATE_FIELDS = ("bf16_tflops", "hbm_gbps", "interconnect_gbps")
"""The compute and bandwidth fields of a catalog GPU, which measured curves never read."""


def host_device_spec(name: str, memory_gib: float, nvlink_domain: int,
                     **rates: float) -> GPUSpec:
    """The catalog entry of a device the catalog does not know (``cpu``): its memory and how
    many ranks one instance may span. :data:`RATE_FIELDS` not given are 1.0, placeholders that
    fitted (measured) curves do not read; only a roofline estimate would."""
    return GPUSpec(name=name, memory_gib=memory_gib, nvlink_domain=nvlink_domain,
                   **{k: rates.get(k, 1.0) for k in RATE_FIELDS})
