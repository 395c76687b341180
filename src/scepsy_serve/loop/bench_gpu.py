"""The GPU kit: ``scepsy bench gpu`` (docs/bench-gpu.md).

On a machine with an NVIDIA GPU and vLLM's CUDA build, one command measures what the predictor
rests on: two small LLMs sharing one GPU under MPS. It is the loop of ``scepsy bench loop``
(:func:`~scepsy_serve.loop.bench_loop.run_loop`) with a kit chosen for the device:

* **the device**: the first GPU ``nvidia-smi`` lists (:func:`nvidia_gpus`), mapped to its
  catalog type (``NVIDIA A100-SXM4-80GB`` -> ``A100-80GB``,
  :func:`~scepsy_profile.profiling.devices.catalog_gpu_name`); the cluster is one node with
  that one GPU (:func:`one_device_cluster`, written to ``OUT/cluster.yaml``);
* **the workflow**: beam search whose generator and process reward model are two small LLMs
  (:data:`KITS`: Qwen2.5-1.5B and Qwen2.5-0.5B with random weights on a GPU);
* **profile**: both models at the MPS shares of the kit (thread percentages, under an MPS
  control daemon :func:`mps_daemon` starts when none runs, with its pipes under ``OUT/mps``,
  and stops afterwards), fitted into curves;
* **plan** both onto the one GPU at a fraction of the largest throughput it predicts,
  **launch** them with the shell target (each server ``--gpu-memory-utilization`` of its
  share, under MPS), **drive** the workflow, **stop**, and write the measurement record
  ``OUT/results.json`` in the loop's format.

``--cpu`` runs the same code path on this machine's CPU with the CPU kit (the CPU-scale beam
search, both LLMs on one core: shares of a core instead of MPS), which is how the kit is tested
without a GPU. Without a GPU and without ``--cpu`` the kit refuses to start (exit 2) and says
so; nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scepsy_common.errors import InputError
from scepsy_common.files import atomic_write_text, dump_yaml
from scepsy_profile.profiling.devices import catalog_gpu_name
from scepsy_profile.profiling.engine_env import check_engine_python, mps_daemon_running
from scepsy_serve.loop.bench_loop import (
    CHECKOUT,
    LoopOptions,
    LoopResult,
    Planning,
    make_out_folder,
    run_loop,
)

SOURCE = "bench gpu"
Runner = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Kit:
    """What the kit runs on one kind of device."""

    workflow: str
    catalog: str | None  # None: the bundled catalog
    shares: tuple[float, ...]  # the plan's share grid, and the profile's


KITS: Mapping[str, Kit] = {
    "cuda": Kit("datasets/workflows/gpu-beam-pair.yaml", None, (0.3, 0.5, 0.7, 1.0)),
    "cpu": Kit("datasets/workflows/cpu-beam-search.yaml", "datasets/catalogs/cpu-host.yaml",
               (0.5, 1.0)),
}


@dataclass(frozen=True)
class SeenGPU:
    """One GPU ``nvidia-smi`` lists: its name, memory and catalog type (None: not in it)."""

    name: str
    memory_gib: float
    gpu: str | None


def parse_nvidia_smi(text: str) -> tuple[SeenGPU, ...]:
    """The GPUs of ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``
    (memory in MiB); lines that do not parse are skipped."""
    out = []
    for line in text.splitlines():
        name, _, mem = line.rpartition(",")
        try:
            gib = float(mem.strip()) / 1024.0
        except ValueError:
            continue
        if name.strip() and gib > 0:
            out.append(SeenGPU(name.strip(), gib, catalog_gpu_name(name.strip(), gib)))
    return tuple(out)


def nvidia_gpus(run: Runner = subprocess.run) -> tuple[SeenGPU, ...]:
    """The NVIDIA GPUs of this machine (none when ``nvidia-smi`` is missing or fails)."""
    try:
        done = run(["nvidia-smi", "--query-gpu=name,memory.total",
                    "--format=csv,noheader,nounits"], capture_output=True, text=True,
                   timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else ()


def one_device_cluster(gpu: str) -> dict[str, Any]:
    """A cluster of one node with one device of catalog type ``gpu`` (racks format)."""
    return {"name": f"one-{gpu}", "racks": [{"name": "local", "nodes": [
        {"name": "host", "gpu": gpu, "gpus": 1, "nvlink_domain": 1}]}]}


@dataclass(frozen=True)
class KitOptions:
    """``scepsy bench gpu``'s options: ``device`` ``auto`` (the GPU when there is one, else a
    refusal), ``cuda`` or ``cpu``; the others as for ``scepsy bench loop``."""

    device: str = "auto"
    out: str = "bench-gpu"
    requests: int = 200
    rate: float | None = None
    load: float = 0.1
    profile_budget_s: float = 600.0
    engine_python: str | None = None
    curves: str | None = None
    seed: int = 0
    keep: bool = False
    overheads: str | None = None

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cuda", "cpu"):
            raise InputError(SOURCE, "device", "auto, cuda or cpu", self.device)
        check_engine_python(self.engine_python, SOURCE)


def choose_device(options: KitOptions, gpus: tuple[SeenGPU, ...]) -> tuple[str, str]:
    """``(device kind, catalog type)`` the kit runs on: the first GPU for ``auto`` and
    ``cuda``, the CPU for ``cpu``; an :class:`InputError` when a GPU is asked for and there is
    none, or its type is not in the catalog."""
    if options.device == "cpu":
        return "cpu", "cpu"
    if not gpus:
        raise InputError(SOURCE, "device", "an NVIDIA GPU that nvidia-smi lists (none here; "
                         "--cpu runs the same kit on this CPU)")
    first = gpus[0]
    if first.gpu is None:
        raise InputError(SOURCE, "device", f"a GPU of the catalog (nvidia-smi lists "
                         f"{first.name!r}, {first.memory_gib:.0f} GiB; add it with --catalog "
                         "in scepsy bench loop)")
    return "cuda", first.gpu


def loop_options(options: KitOptions, device: str, gpu: str, out: Path) -> LoopOptions:
    """The loop the kit runs on ``device`` (the module docstring); writes the one-device
    cluster to ``out/cluster.yaml``."""
    kit = KITS[device]
    cluster = out / "cluster.yaml"
    atomic_write_text(cluster, dump_yaml(one_device_cluster(gpu), sort_keys=False))
    base = LoopOptions()
    return replace(base, requests=options.requests, rate=options.rate, load=options.load,
                   workflow=_kit_file(kit.workflow), cluster=str(cluster),
                   catalog=None if kit.catalog is None else _kit_file(kit.catalog),
                   curves=options.curves, profile_budget_s=options.profile_budget_s,
                   tps=(1,), shares=kit.shares, engine_python=options.engine_python,
                   seed=options.seed, out=str(out), keep=options.keep, device=device,
                   overheads=options.overheads,
                   profile_shares=kit.shares if device == "cuda" else (1.0,))


def _kit_file(path: str) -> str:
    """A kit file (``datasets/...``): from the current directory, else from the checkout."""
    return path if Path(path).exists() or not (CHECKOUT / path).exists() else str(CHECKOUT / path)


@contextlib.contextmanager
def mps_daemon(folder: Path, run: Runner = subprocess.run,
               running: Callable[[], bool] = mps_daemon_running) -> Iterator[bool]:
    """An NVIDIA MPS control daemon for the block: the one running (yields False), or one
    started here with its pipes and logs under ``folder`` (``CUDA_MPS_PIPE_DIRECTORY`` and
    ``CUDA_MPS_LOG_DIRECTORY`` set for the block, so that the engines and the launch's
    start.sh use it; yields True) and told to quit afterwards."""
    if running():
        yield False
        return
    pipes, logs = folder / "pipe", folder / "log"
    pipes.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    done = run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **env},
               capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise InputError(SOURCE, "mps", "an MPS control daemon this user may start "
                         "(nvidia-cuda-mps-control -d failed: "
                         f"{(done.stderr or done.stdout).strip()[:200]})")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield True
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **env},
            capture_output=True, text=True, timeout=60, check=False)


def run_kit(options: KitOptions, planning: Planning, say: Callable[[str], None] | None = None,
            *, gpus: Callable[[], tuple[SeenGPU, ...]] = nvidia_gpus,
            mps: Callable[[Path], contextlib.AbstractContextManager[bool]] = mps_daemon,
            loop: Callable[..., LoopResult] = run_loop) -> LoopResult:
    """The kit on the device :func:`choose_device` picks (the module docstring)."""
    device, gpu = choose_device(options, gpus() if options.device != "cpu" else ())
    out = make_out_folder(options.out)
    lo = loop_options(options, device, gpu, out)
    if say is not None:
        say(f"kit: {device} ({gpu}), {lo.workflow}, shares {', '.join(map(str, lo.shares))}")
    if device == "cuda":
        with mps(out / "mps"):
            return loop(lo, planning, say)
    return loop(lo, planning, say)
