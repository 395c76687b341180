"""The whole loop on a real engine, on this CPU: ``scepsy bench loop`` (docs/quickstart.md).

One call of :func:`run_loop` profiles, plans, launches, drives, stops and compares:

0. **profile** (unless ``curves`` names a curves file): the step profile of every model the
   workflows use, measured on this machine with the profiler backend ``scepsy profile run
   --backend vllm`` uses, at the TP degrees the plan may use (``tps``) and share 1, in a compact
   sweep (:func:`profile_spec`, :func:`profile_backend_options`) bounded by
   ``profile_budget_s``, into ``OUT/profile/store.jsonl`` (resumable: a rerun with the same
   ``out`` measures only what is missing, and starts no engine when nothing is); then the curves
   fitted to it as ``scepsy profile fit --measurements STORE`` fits them (:func:`fit_store`),
   ``OUT/profile/curves.json``, which the plan and the prediction use (:class:`CurvesUsed`);
1. **plan**: the workflows (default: the CPU-scale RAG and beam-search workload,
   ``datasets/workflows/cpu-rag-beam.yaml``) on this host as a cluster of two ``cpu`` devices
   (``datasets/clusters/cpu-host.yaml``: a core is the unit the plan shares; the device and the
   shrunk model come from ``datasets/catalogs/cpu-host.yaml``) with those curves. The target: ``rate`` when given, else ``load`` times the
   largest total throughput the cluster carries by the same prediction (a ``max-throughput``
   plan); the plan then minimises the workflows' latencies at that target;
2. **launch**: a model folder per catalog model (``config.json`` only: random weights,
   :func:`~scepsy_profile.profiling.engine_env.write_model_dir`), plan.json's ``launch``
   section for vLLM's CPU server (:func:`cpu_launch_section`), the shell target rendered from the
   written plan and applied on this host (one ``vllm.entrypoints.openai.api_server`` per
   replica, pinned to its core, waited for on ``/health``);
3. **drive**: ``requests`` workflow requests at the target rate (Poisson) against the routing
   table (:mod:`scepsy_serve.launch.drive`), the executed calls kept as a measured trace;
4. **stop**: always, on success, on an exception and on Ctrl-C or SIGTERM (the servers' stop
   script, then every process still carrying this run's marker variable is killed); the loop
   then checks that no process of the run is alive and every port is free (:class:`Leftovers`);
5. **compare**: the Aggregate LLM Pipeline's prediction at the driven rate on the placed
   allocation, from the statistics of a generated trace (what the planner used) and from those
   of the measured trace, against the measured throughput and mean latency per workflow and
   the calls and call latency per LLM (:func:`comparison`).

The planning functions come from :mod:`scepsy.api` (:class:`Planning`), which the layers below
it cannot import; ``scepsy.api.bench_loop`` wires them in.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from scepsy_common.errors import InputError
from scepsy_common.files import atomic_write_text, read_json
from scepsy_opt.allocation import Allocation
from scepsy_opt.traces import write_trace
from scepsy_opt.workload import load_specs
from scepsy_place.packing.topology import load_topology
from scepsy_profile.catalog import Catalog
from scepsy_profile.fitted import FittedLatencyModel, load_curves, save_curves
from scepsy_profile.profiling import planner, processes
from scepsy_profile.profiling.backend import BackendOptions
from scepsy_profile.profiling.engine_env import (
    ONE_PROCESS_ENV,
    check_engine_python,
    engine_environment,
    vllm_python,
    write_model_dir,
)
from scepsy_profile.profiling.models import EngineModel, engine_model, parse_scaled
from scepsy_profile.profiling.planner import SweepSpec
from scepsy_profile.profiling.records import ProfileRecord
from scepsy_profile.profiling.registry import get_backend
from scepsy_profile.profiling.replay import ReplayTimeouts
from scepsy_profile.profiling.server import (
    MetricsSnapshot,
    fetch_metrics,
    histogram_delta,
)
from scepsy_profile.profiling.store import checked_store, read_store
from scepsy_profile.profiling.store import fit_store as fit_profile_store
from scepsy_profile.profiling.sweep import run_sweep
from scepsy_profile.profiling.vllm_backend import GPU_MEMORY_FRACTION
from scepsy_profile.serving import MemoryPolicy
from scepsy_serve.launch import host
from scepsy_serve.launch.drive import DriveProgress, DriveResult, drive
from scepsy_serve.launch.launchplan import LaunchPlan
from scepsy_serve.launch.planfile import load_plan, write_plan_file
from scepsy_serve.launch.renderers import get_renderer, write_rendered
from scepsy_serve.launch.routes import ROUTES_FILE, load_routes
from scepsy_serve.launch.time_sliced import running_allocation
from scepsy_serve.loop.realloop import ControlLoop, drive_under_control, running_controller

__all__ = [
    "BUNDLED_CURVES",
    "CHECKOUT",
    "DEFAULT_REQUESTS",
    "FLAGS",
    "MARKER",
    "MIN_REQUESTS",
    "PROFILE_SPREAD_LIMIT",
    "CurvesUsed",
    "Leftovers",
    "LoopOptions",
    "LoopResult",
    "Planning",
    "comparison",
    "cpu_engine_args",
    "cpu_launch_section",
    "curves_line",
    "drive_requests",
    "fit_store",
    "free_port_range",
    "given_curves",
    "gpu_engine_args",
    "gpu_memory_args",
    "host_cpu",
    "leftovers",
    "loop_models",
    "marked_processes",
    "partial_drive",
    "port_free",
    "prediction_dict",
    "profile_backend_options",
    "profile_here",
    "profile_spec",
    "profile_spread",
    "read_results",
    "report_lines",
    "run_loop",
    "sent_rates",
    "server_metrics",
    "server_terms",
    "spread_warning",
    "with_default_files",
]

SOURCE = "bench loop"
MARKER = "SCEPSY_LOOP_RUN"
"""The variable every server of a run carries (its value: the run's id): what finds a process
the stop script missed, and what proves none is left."""
SERVER_MODULE = ("-m", "vllm.entrypoints.openai.api_server", "--model")
TARGET = "shell"
CHECKOUT = Path(__file__).resolve().parents[3]
"""The checkout this module runs from: where the default files live when the current directory
is elsewhere."""
BUNDLED_CURVES = "datasets/profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json"
"""Curves fitted to a vLLM-CPU step profile measured on another machine (a 2-core AMD EPYC,
datasets/profiles/README.md): ``--curves`` with this file skips the profiling stage."""
PROFILE_POINTS_PER_TP = 24
"""The compact sweep's most points per TP degree, both phases together: the planner's coarse
design (9 per curve, every curve its 5 first), then refinement where a curve is predicted
worst until it meets the planner's target error. On this project's 2-core machine a point takes
0.05-2 s and an engine's start 30-45 s (115 s on a busy machine): the two TP degrees take about
2 minutes."""
PROFILE_SPREAD_LIMIT = 1.0
"""The spread of a sweep's timed runs (:func:`profile_spread`, a fraction of their median)
above which the loop warns that the machine was busy while it measured."""
DEFAULT_REQUESTS = 200
"""Requests the loop drives when ``requests`` is not given, fewer where they would take more
than ``max_drive_s`` at the target rate (:func:`drive_requests`)."""
MIN_REQUESTS = 30
"""The fewest requests a default drive sends (a comparison needs a few per workflow)."""
PROGRESS_EVERY_S = 15.0
"""Seconds between the progress lines of a long stage (profile, launch, drive)."""
PROFILE_MIN_TOKENS = 32
PROFILE_MAX_BATCH_TOKENS = 16384
"""Cells above 16k tokens per step are left out (a decode step of 32 sequences at context 1024
takes seconds per timed run here, and the loop's batches stay far below it)."""
PROFILE_REPEATS = 5
PROFILE_DECODE_TOKENS = 16
"""The vllm backend's decode span (its ``decode_tokens`` default): a sweep's longest context is
``max_model_len`` minus this, so that its engine has the servers' model length."""

FLAGS = {"requests": "--requests", "rate": "--rate", "load": "--load", "tps": "--tp",
         "shares": "--shares", "max_model_len": "--max-model-len", "seed": "--seed",
         "call_timeout_s": "--timeout-s", "out": "--out", "targets": "--rate",
         "engine_python": "--engine-python", "trace_requests": "--requests",
         "curves": "--curves", "profile_budget_s": "--profile-budget",
         "overheads": "--overheads", "max_drive_s": "--max-drive-s",
         "step_at_s": "--step-at", "step_factor": "--step-factor", "window_s": "--window",
         "startup_s": "--startup-s", "priority": "--priority"}
"""Library fields and sources of the loop's errors, and the options of ``scepsy bench loop``
that set them."""


@dataclass(frozen=True)
class LoopOptions:
    """What :func:`run_loop` runs; the defaults are ``scepsy bench loop``'s.

    ``load``: the target as a fraction of the largest predicted throughput (ignored when
    ``rate`` is given). The default 0.05 keeps the servers off saturation, so that the measured
    latency is a steady state rather than a queue that grows with the run's length: the
    serving model overestimates vLLM's saturation throughput on this 2-core machine (by about
    45% for one server, docs/benchmarks.md, and much more with four servers sharing two cores:
    their per-call front-end work is not modelled); measured, the default workload fell
    behind its arrivals (throughput 15-30% under the rate) at 0.2 and 0.4 of the predicted
    maximum.
    ``requests``: the requests to drive; None (the default): :data:`DEFAULT_REQUESTS`, fewer
    where they would take longer than ``max_drive_s`` at the target rate (at least
    :data:`MIN_REQUESTS`; :func:`drive_requests`). A given number is driven as given (a line
    says when it is predicted to take longer).
    ``curves``: a curves file to plan with (e.g. :data:`BUNDLED_CURVES`); None (the default)
    profiles here first (the module docstring, step 0) with ``profile_backend`` (a name of
    :mod:`scepsy_profile.profiling.registry`, ``vllm``; tests register a fake), the sweeps
    together bounded by ``profile_budget_s`` seconds of measuring (no point is started that
    would overrun it; the engines' start-up is not counted: it is reported instead).
    ``engine_command``: the command before the model folder (default: vLLM's OpenAI server
    run by :func:`~scepsy_profile.profiling.engine_env.vllm_python`); ``engine_args``: the
    arguments after it (default :func:`cpu_engine_args`); both for tests with a fake engine.
    """

    requests: int | None = None
    rate: float | None = None
    load: float = 0.05
    workflow: str = "datasets/workflows/cpu-rag-beam.yaml"
    cluster: str = "datasets/clusters/cpu-host.yaml"
    catalog: str | None = "datasets/catalogs/cpu-host.yaml"  # None: the bundled catalog
    curves: str | None = None
    profile_budget_s: float = 150.0
    profile_backend: str = "vllm"
    tps: tuple[int, ...] = (1, 2)
    shares: tuple[float, ...] = (0.5, 1.0)
    engine_python: str | None = None
    max_model_len: int = 1040
    max_num_seqs: int = 32
    call_timeout_s: float = 120.0
    health_timeout_s: float = 600.0
    seed: int = 0
    out: str = "bench-loop"
    keep: bool = False
    trace_requests: int = 2000
    max_in_flight: int = 64
    engine_command: tuple[str, ...] | None = None
    engine_args: tuple[str, ...] | None = None
    device: str = "cpu"
    """The engines' device kind: ``cpu`` (a core is the unit shared) or ``cuda`` (a GPU shared
    under MPS; the servers get :func:`gpu_engine_args` and a ``--gpu-memory-utilization`` of
    their share)."""
    profile_shares: tuple[float, ...] = (1.0,)
    """The shares the profiling stage measures at (on a GPU: MPS thread percentages)."""
    overheads: str | None = None
    """An engine-overheads calibration (``scepsy profile calibrate``) the plan and the
    predictions add to the curves (None: none, the optimistic default)."""
    max_drive_s: float = 300.0
    """The longest the default drive may take (its requests' arrivals at the target rate):
    with ``requests`` None, fewer requests where :data:`DEFAULT_REQUESTS` would take longer."""
    control: ControlLoop | None = None
    """Run the controller (:mod:`scepsy_serve.loop.realloop`): the plan is the cheapest
    that keeps each workflow within ``BOUND_FACTOR`` times its minimum-latency prediction at
    the target rate (so that there is room to add capacity), the servers run behind a gateway,
    the load steps up mid-run and ``scepsy control``'s loop changes the deployment."""

    def __post_init__(self) -> None:
        if self.requests is not None and not (_is_int(self.requests) and self.requests >= 1):
            raise InputError(SOURCE, "requests", "an integer >= 1", self.requests)
        if self.rate is not None and not (_is_number(self.rate) and self.rate > 0):
            raise InputError(SOURCE, "rate", "a rate > 0 req/s", self.rate)
        if not (_is_number(self.load) and 0 < self.load <= 1):
            raise InputError(SOURCE, "load", "a fraction in (0, 1]", self.load)
        for name in ("max_model_len", "max_num_seqs", "max_in_flight", "trace_requests"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 1):
                raise InputError(SOURCE, name, "an integer >= 1", getattr(self, name))
        for name in ("call_timeout_s", "health_timeout_s", "profile_budget_s", "max_drive_s"):
            if not (_is_number(getattr(self, name)) and getattr(self, name) > 0):
                raise InputError(SOURCE, name, "a number of seconds > 0", getattr(self, name))
        if not (_is_int(self.seed) and self.seed >= 0):
            raise InputError(SOURCE, "seed", "an integer >= 0", self.seed)
        if self.curves is not None and not str(self.curves).strip():
            raise InputError(SOURCE, "curves", "a curves file (or None: profile here)",
                             self.curves)
        if not str(self.out).strip():
            raise InputError(SOURCE, "out", "a folder path", self.out)
        check_engine_python(self.engine_python, SOURCE)
        if self.device not in DEVICES:
            raise InputError(SOURCE, "device", f"one of {list(DEVICES)}", self.device)
        if not self.profile_shares or any(not (_is_number(x) and 0 < x <= 1)
                                          for x in self.profile_shares):
            raise InputError(SOURCE, "profile_shares", "shares in (0, 1]", self.profile_shares)


DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Planning:
    """The planning functions the loop calls: :func:`scepsy.api.plan`,
    :func:`scepsy.api.predict` and :func:`scepsy.api.using_catalog` (the loop runs in
    ``scepsy_place``, below the package that holds them)."""

    plan: Callable[..., Any]
    predict: Callable[..., Any]
    using_catalog: Callable[[Any], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Leftovers:
    """What a run left behind after its stop: live processes carrying its marker, and ports of
    its servers that still accept connections (both empty for a clean run)."""

    pids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    """Processes the stop script missed, killed by the loop (a clean stop kills none)."""

    @property
    def clean(self) -> bool:
        return not self.pids and not self.ports and not self.killed


@dataclass(frozen=True)
class CurvesUsed:
    """Which latency curves a loop planned with, and where they were measured."""

    path: str
    measured_here: bool
    """True when this loop's profiling stage measured them on this machine (this run, or an
    earlier run with the same ``out`` whose store it resumed); False for a ``curves`` file."""
    host_cpu: str
    """This machine's CPU model (:func:`host_cpu`)."""
    device: str | None = None
    """The device the store's records name (``cpu``): the catalog device the curves are for."""
    device_detail: str | None = None
    """The device model the store's records were measured on (the CPU model the engine
    reported); None for a ``curves`` file (a curves file does not say)."""
    store: str | None = None
    backend: str | None = None
    engine_version: str | None = None
    points: int = 0
    """Measured points the curves were fitted to (``ok`` records of the loop's models)."""
    measured: int = 0
    """Points this run measured (failed ones included); the rest came from the store."""
    failed: int = 0
    sweeps: Mapping[str, str] = field(default_factory=dict)
    """Per model and TP degree, how its sweep ended: ``done``, ``budget`` (the budget ran out
    first), ``interrupted``, or ``reused`` (the store already held it; no engine started)."""
    engine_start_s: Mapping[str, float] = field(default_factory=dict)
    """Per sweep that started an engine this run, the seconds its start took (not counted in
    the profile budget)."""
    spread_pct: Mapping[str, float] = field(default_factory=dict)
    """Per sweep, the spread of its points' timed runs in % of their median
    (:func:`profile_spread`, 90th percentile)."""
    warnings: tuple[str, ...] = ()
    """A line per sweep whose spread is over :data:`PROFILE_SPREAD_LIMIT` (a busy machine)."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "measured_here": self.measured_here,
                "host_cpu": self.host_cpu, "device": self.device,
                "device_detail": self.device_detail, "store": self.store,
                "backend": self.backend, "engine_version": self.engine_version,
                "points": self.points, "measured": self.measured, "failed": self.failed,
                "sweeps": dict(self.sweeps), "engine_start_s": dict(self.engine_start_s),
                "spread_pct": dict(self.spread_pct), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class LoopResult:
    """Everything one loop did and measured (:meth:`to_dict` is ``results.json``)."""

    options: LoopOptions
    run_id: str
    rate: float
    max_throughput: float | None
    """The largest total throughput predicted (the max-throughput plan), req/s."""
    allocation: Mapping[str, Any]
    servers: int
    timings: Mapping[str, float]
    drive: Mapping[str, Any] | None
    predicted: Mapping[str, Any] | None
    """The prediction from a generated trace's statistics (what the planner used), of the
    plan as it runs (:attr:`predicted_as`)."""
    predicted_measured: Mapping[str, Any] | None
    """The prediction from the measured trace's statistics."""
    comparison: Mapping[str, Any] | None
    leftovers: Leftovers
    error: str | None = None
    interrupted: bool = False
    out: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    curves: CurvesUsed | None = None
    """The curves the plan and the prediction used (None when the loop stopped before)."""
    requests: int | None = None
    """The requests the drive was planned with (:func:`drive_requests`; None before)."""
    predicted_drive_s: float | None = None
    """How long the requests' arrivals take at the target rate (``requests / rate``)."""
    predicted_as: Mapping[str, Any] | None = None
    """The allocation the predictions are of when it is not the plan's (an allocation file's
    ``{"llms": ...}``, which ``scepsy predict`` reads): on a CPU, the servers as they run,
    taking turns on shared cores (:func:`~scepsy_serve.launch.time_sliced.running_allocation`);
    None: the plan's."""
    control: Mapping[str, Any] | None = None
    """With ``LoopOptions.control``: what the controller did
    (:meth:`~scepsy_serve.loop.realloop.ControlRun.to_dict`)."""

    @property
    def clean(self) -> bool:
        """No error, no interruption, nothing left running, every request accounted for."""
        accounted = self.drive is None or (
            self.drive["completed"] + self.drive["failed"] == self.drive["sent"])
        return (self.error is None and not self.interrupted and self.leftovers.clean
                and accounted)

    def to_dict(self) -> dict[str, Any]:
        opts = asdict(self.options)
        return {"version": 1, "run_id": self.run_id, "options": opts, "rate": self.rate,
                "max_throughput": self.max_throughput, "allocation": dict(self.allocation),
                "servers": self.servers, "timings": dict(self.timings), "drive": self.drive,
                "predicted": self.predicted, "predicted_from_measured_trace":
                self.predicted_measured, "comparison": self.comparison,
                "leftovers": {"pids": list(self.leftovers.pids),
                              "ports": list(self.leftovers.ports),
                              "killed": list(self.leftovers.killed)},
                "clean": self.clean, "error": self.error, "interrupted": self.interrupted,
                "out": self.out, "files": dict(self.files),
                "curves": None if self.curves is None else self.curves.to_dict(),
                "predicted_as": None if self.predicted_as is None else dict(self.predicted_as),
                "requests": self.requests, "predicted_drive_s": self.predicted_drive_s,
                "control": None if self.control is None else dict(self.control)}


# ---------------------------------------------------------------------------------- pieces


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _engine_model(model: str, catalog: Catalog | None) -> EngineModel:
    """The engine model catalog model ``model`` (``NAME`` or a shrunk ``NAME:xS``) is served
    and profiled with."""
    name, scale = parse_scaled(model)
    return engine_model(name, scale, catalog=catalog, source=SOURCE)


def cpu_engine_args(max_model_len: int, max_num_seqs: int, dtype: str = "bfloat16"
                    ) -> tuple[str, ...]:
    """The arguments of vLLM's OpenAI server on a CPU with random weights and token-id
    prompts (DESIGN: the server dies without ``--skip-tokenizer-init`` when there is no
    tokenizer; ``--enforce-eager`` starts 20 s sooner and runs tiny models faster)."""
    return _server_args(max_model_len, max_num_seqs, dtype, "--enforce-eager")


def gpu_engine_args(max_model_len: int, max_num_seqs: int, dtype: str = "bfloat16"
                    ) -> tuple[str, ...]:
    """The arguments of vLLM's OpenAI server on a GPU with random weights and token-id prompts
    (as :func:`cpu_engine_args`, with CUDA graphs: no ``--enforce-eager``); each server's
    memory is its own argument (:func:`gpu_memory_args`)."""
    return _server_args(max_model_len, max_num_seqs, dtype)


def _server_args(max_model_len: int, max_num_seqs: int, dtype: str, *extra: str
                 ) -> tuple[str, ...]:
    return ("--load-format", "dummy", "--skip-tokenizer-init", *extra, "--dtype", dtype,
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--disable-uvicorn-access-log")


def gpu_memory_args(allocation: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per LLM of plan.json's ``allocation.llms``, ``--gpu-memory-utilization`` of its memory
    share (its compute share unless ``memory`` is planned): vLLM's default fraction of it
    (:data:`~scepsy_profile.profiling.vllm_backend.GPU_MEMORY_FRACTION`, as the profile's
    engines get), so that servers sharing a GPU together stay within it."""
    out = {}
    for m, inst in sorted(allocation.items()):
        share = float(inst.get("memory") or inst["share"])
        out[m] = ["--gpu-memory-utilization", f"{GPU_MEMORY_FRACTION * share:.4g}"]
    return out


def cpu_launch_section(command: Sequence[str], args: Sequence[str], model_dirs: Mapping[str, str],
                       nodes: Sequence[str], *, base_port: int, health_timeout_s: float,
                       env: Mapping[str, str],
                       model_args: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """plan.json's ``launch`` section for servers on this host: ``command`` then each LLM's
    model folder (``model_dirs``: LLM -> folder), ``args`` and its ``model_args``; every node
    at 127.0.0.1."""
    extra = model_args or {}
    return {"command": list(command), "args": list(args), "env": dict(sorted(env.items())),
            "base_port": int(base_port), "health_timeout_s": float(health_timeout_s),
            "addresses": dict.fromkeys(sorted(nodes), "127.0.0.1"),
            "models": {m: {"serve": d, "args": list(extra.get(m, ())), "env": {}}
                       for m, d in sorted(model_dirs.items())}}


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` on every interface now: nothing listens there
    (connections of a stopped server waiting out TIME_WAIT do not count, as servers bind with
    ``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000  # the ranges handed out start here (below: well-known and registered)


def ephemeral_ports() -> tuple[int, int]:
    """The OS's range of ephemeral ports (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_PORTS.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def free_port_range(n: int, *, tries: int = 100) -> int:
    """A first port ``p`` such that ``p .. p+n-1`` are all free now, outside the OS's
    ephemeral range: outgoing connections (a health check's, a client's) take their source
    ports there, so a port picked from it can be taken before the server binds it. Drawn at
    random (ports are not part of any result), from below the range or, without room there,
    above it."""
    lo, hi = ephemeral_ports()
    spans = [(a, b - n + 1) for a, b in ((LOWEST_PORT, lo - 1), (hi + 1, 65535))
             if b - n + 1 >= a]
    if not spans:
        raise RuntimeError(f"no range of {n} ports outside the ephemeral ports {lo}-{hi}")
    draw = random.Random()
    for _ in range(tries):
        a, b = spans[0]
        base = draw.randint(a, b)
        if all(port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no range of {n} free ports found")


def marked_processes(run_id: str) -> tuple[int, ...]:
    """Live processes (not zombies) whose environment holds ``MARKER=run_id``."""
    return processes.marked_processes(MARKER, run_id)


def _busy(ports: Sequence[int]) -> tuple[int, ...]:
    return tuple(p for p in ports if not port_free(p))


def leftovers(run_id: str, ports: Sequence[int], *, wait_s: float = 10.0,
              kill: bool = True) -> Leftovers:
    """What is left of run ``run_id`` (waiting up to ``wait_s`` for exits and ports): with
    ``kill``, processes still alive are SIGKILLed (and reported as killed)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = marked_processes(run_id)
        busy = _busy(ports)
        if (not pids and not busy) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    killed: list[int] = []
    if kill and pids:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        end = time.monotonic() + 5.0
        while marked_processes(run_id) and time.monotonic() < end:
            time.sleep(0.1)
        pids = marked_processes(run_id)
        end = time.monotonic() + 5.0
        while _busy(ports) and time.monotonic() < end:
            time.sleep(0.1)
        busy = _busy(ports)
    return Leftovers(pids=pids, ports=busy, killed=tuple(killed))


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`KeyboardInterrupt` like Ctrl-C does, so that
    the loop's ``finally`` stops the servers (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            raise KeyboardInterrupt(f"signal {signum}")
        # handled as Ctrl-C is: inside asyncio.run its handler cancels the running task, so the
        # interrupt never lands in a finaliser that would swallow it (an async generator's)
        signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored within the block (the teardown runs to its end)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or not math.isfinite(pred) or meas <= 0:
        return None
    return 100.0 * (pred - meas) / meas


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def prediction_dict(pred: Any) -> dict[str, Any]:
    """A :class:`~scepsy_opt.prediction.pipeline.Prediction` as JSON-ready values (infinite latencies of
    a saturated prediction as None)."""
    return {
        "workflows": {w: {"rate": p.rate, "throughput": min(p.rate, p.max_throughput),
                          "max_throughput": _finite(p.max_throughput),
                          "bottleneck": p.bottleneck,
                          "mean_latency_s": _finite(p.mean_latency_s)}
                      for w, p in pred.workflows.items()},
        "llms": {m: {"rate": ld.rate, "replicas": ld.replicas, "mu": ld.mu,
                     "utilisation": ld.utilisation, "call_latency_s": _finite(ld.call_latency_s),
                     "input_mean": ld.input_mean, "output_mean": ld.output_mean}
                 for m, ld in pred.llms.items()}}


def comparison(predicted: Mapping[str, Any], predicted_measured: Mapping[str, Any] | None,
               measured: Mapping[str, Any],
               server: Mapping[str, Mapping[str, float | None]] | None = None
               ) -> dict[str, Any]:
    """Side by side per workflow (throughput, mean latency) and per LLM (calls/s, mean call
    latency): predicted (from the generated trace's statistics), predicted from the measured
    trace's statistics, measured, and the error of each prediction in % of the measured value.
    ``measured`` is :meth:`DriveResult.to_dict`; ``server`` (:func:`server_terms`) adds each
    LLM's server-side means (end to end, queue, prefill, inter-token), which say how much of a
    call's measured latency the engine saw."""
    window = measured.get("window_s") or 0.0
    pm = predicted_measured or {"workflows": {}, "llms": {}}
    workflows = {}
    for w, p in predicted["workflows"].items():
        m = measured["workflows"].get(w, {})
        lat = (m.get("latency") or {}).get("mean_s")
        q = pm["workflows"].get(w, {})
        workflows[w] = {
            "rate": p["rate"], "sent": m.get("sent", 0), "completed": m.get("completed", 0),
            "failed": m.get("failed", 0),
            "throughput_predicted": p["throughput"],
            "max_throughput_predicted": p["max_throughput"],
            "throughput_measured": m.get("throughput_rps"),
            "throughput_error_pct": _pct(p["throughput"], m.get("throughput_rps")),
            "latency_predicted_s": p["mean_latency_s"],
            "latency_predicted_measured_trace_s": q.get("mean_latency_s"),
            "latency_measured_s": lat,
            "latency_measured_p90_s": (m.get("latency") or {}).get("p90_s"),
            "latency_measured_ci95_s": (m.get("latency") or {}).get("ci95_s"),
            "latency_error_pct": _pct(p["mean_latency_s"], lat),
            "latency_error_measured_trace_pct": _pct(q.get("mean_latency_s"), lat)}
    llms = {}
    for name, p in predicted["llms"].items():
        m = measured["llms"].get(name, {})
        q = pm["llms"].get(name, {})
        ok = m.get("ok", 0)
        rate = ok / window if window > 0 else None
        lat = (m.get("latency") or {}).get("mean_s")
        llms[name] = {
            "calls": m.get("calls", 0), "ok": ok, "failed": m.get("failed", 0),
            "calls_s_predicted": p["rate"], "calls_s_measured": rate,
            "calls_s_error_pct": _pct(p["rate"], rate),
            "utilisation_predicted": p["utilisation"],
            "call_latency_predicted_s": p["call_latency_s"],
            "call_latency_predicted_measured_trace_s": q.get("call_latency_s"),
            "call_latency_measured_s": lat,
            "call_latency_error_pct": _pct(p["call_latency_s"], lat),
            "call_latency_error_measured_trace_pct": _pct(q.get("call_latency_s"), lat),
            **{f"server_{k}": v for k, v in (server or {}).get(name, {}).items()}}
    return {"workflows": workflows, "llms": llms}


SERVER_TERMS = {"e2e_s": "vllm:e2e_request_latency_seconds",
                "queue_s": "vllm:request_queue_time_seconds",
                "prefill_s": "vllm:request_prefill_time_seconds",
                "itl_s": "vllm:inter_token_latency_seconds"}
"""The server-side histograms read per LLM (their means over the drive)."""


def server_metrics(plan: LaunchPlan) -> dict[str, list[MetricsSnapshot | None]]:
    """``/metrics`` of every replica now, per LLM (None where a server does not answer)."""
    out: dict[str, list[MetricsSnapshot | None]] = {}
    for r in plan.replicas:
        try:
            snap: MetricsSnapshot | None = fetch_metrics(
                f"http://{plan.url_host(r.node)}:{r.port}", timeout_s=10.0)
        except (httpx.HTTPError, OSError):
            snap = None
        out.setdefault(r.llm, []).append(snap)
    return out


def server_terms(before: Mapping[str, Sequence[MetricsSnapshot | None]],
                 after: Mapping[str, Sequence[MetricsSnapshot | None]]
                 ) -> dict[str, dict[str, float | None]]:
    """Per LLM, the mean of each :data:`SERVER_TERMS` histogram over the observations between
    the two reads, pooled over its replicas (None without observations)."""
    out: dict[str, dict[str, float | None]] = {}
    for llm, snaps in after.items():
        terms: dict[str, float | None] = {}
        for key, name in SERVER_TERMS.items():
            count = total = 0.0
            for b, a in zip(before.get(llm, ()), snaps, strict=False):
                if a is None or b is None:
                    continue
                try:
                    d = histogram_delta(b, a, name)
                except ValueError:
                    continue
                count, total = count + d.count, total + d.total
            terms[key] = total / count if count > 0 else None
        out[llm] = terms
    return out


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0f}%"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(wd) for c, wd in zip(r, widths, strict=True)) for r in rows]


def curves_line(c: CurvesUsed) -> str:
    """One line on the curves a loop used (printed by ``scepsy bench loop``)."""
    if not c.measured_here:
        return (f"curves: {c.path} (given; not measured by this run; this host: {c.host_cpu})")
    sweeps = ", ".join(
        f"{k} {v}" + (f" (engine start {c.engine_start_s[k]:.0f} s)" if k in c.engine_start_s
                      else "") + (f", spread {c.spread_pct[k]:.0f}%" if k in c.spread_pct
                                  else "")
        for k, v in c.sweeps.items())
    return (f"curves: {c.path}, measured here on {c.device} ({c.device_detail or c.host_cpu}) "
            f"with {c.backend} {c.engine_version or ''}: {c.points} points, {c.measured} "
            f"measured by this run ({c.failed} failed); sweeps: {sweeps}")


def report_lines(result: LoopResult) -> list[str]:
    """The side-by-side tables and the run's summary, as printed by ``scepsy bench loop``."""
    lines: list[str] = []
    t = result.timings
    cmp_ = result.comparison
    if cmp_ is not None:
        rows = [["workflow", "rate", "sent", "done", "failed", "thr_pred", "thr_meas", "err",
                 "lat_pred_s", "lat_pred_mtrace_s", "lat_meas_s", "err", "err_mtrace"]]
        for w, r in cmp_["workflows"].items():
            rows.append([w, _num(r["rate"]), str(r["sent"]), str(r["completed"]),
                         str(r["failed"]), _num(r["throughput_predicted"]),
                         _num(r["throughput_measured"]), _err(r["throughput_error_pct"]),
                         _num(r["latency_predicted_s"]),
                         _num(r["latency_predicted_measured_trace_s"]),
                         _num(r["latency_measured_s"]), _err(r["latency_error_pct"]),
                         _err(r["latency_error_measured_trace_pct"])])
        lines += [*_table(rows), ""]
        rows = [["llm", "calls", "failed", "calls_s_pred", "calls_s_meas", "util_pred",
                 "call_lat_pred_s", "call_lat_pred_mtrace_s", "call_lat_meas_s", "err",
                 "err_mtrace", "srv_e2e_s", "srv_queue_s", "srv_prefill_s", "srv_itl_ms"]]
        for m, r in cmp_["llms"].items():
            itl = r.get("server_itl_s")
            rows.append([m, str(r["calls"]), str(r["failed"]), _num(r["calls_s_predicted"]),
                         _num(r["calls_s_measured"]), _num(r["utilisation_predicted"], 2),
                         _num(r["call_latency_predicted_s"]),
                         _num(r["call_latency_predicted_measured_trace_s"]),
                         _num(r["call_latency_measured_s"]), _err(r["call_latency_error_pct"]),
                         _err(r["call_latency_error_measured_trace_pct"]),
                         _num(r.get("server_e2e_s")), _num(r.get("server_queue_s")),
                         _num(r.get("server_prefill_s")),
                         _num(None if itl is None else 1000 * itl)])
        lines += [*_table(rows), ""]
    alloc = ", ".join(f"{m} tp{a['tp']}×{a['share']:g}×{a['replicas']}"
                      for m, a in result.allocation.items())
    mx = (f" ({result.options.load:g} of the predicted maximum {result.max_throughput:.3g})"
          if result.max_throughput is not None and result.options.rate is None else "")
    lines.append(f"rate {result.rate:.3g} req/s{mx}; allocation: {alloc or '-'}; "
                 f"{result.servers} server(s)")
    if result.predicted_as is not None:
        shared = sorted({i["mesh"] for i in result.predicted_as["llms"].values()
                         if i.get("mesh")})
        lines.append("predicted as the servers run on the CPU: every LLM at the speed of its "
                     "cores, " + (f"taking turns on {', '.join(shared)}" if shared
                                  else "none sharing cores"))
    lines.append("wall: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))
    if result.curves is not None:
        lines.append(curves_line(result.curves))
        lines += list(result.curves.warnings)
    lo = result.leftovers
    lines.append("left running: nothing (no process of the run alive, every port free)"
                 if lo.clean else
                 f"left running: processes {list(lo.pids)}, busy ports {list(lo.ports)}, "
                 f"killed after the stop script {list(lo.killed)}")
    if result.drive is not None:
        d = result.drive
        lines.append(f"requests: {d['sent']} sent = {d['completed']} completed + "
                     f"{d['failed']} failed ({d['failures']}); {d['not_sent']} not sent"
                     + ("; the drive was interrupted" if d.get("interrupted") else ""))
    if result.control is not None:
        lines += control_lines(result.control)
    if result.error:
        lines.append(f"error: {result.error}")
    if result.interrupted:
        lines.append("interrupted: the servers were stopped")
    lines.append(f"results: {result.files.get('results', '-')}")
    return lines


def control_lines(c: Mapping[str, Any]) -> list[str]:
    """The controlled run in the report: the step, the changes, the latency per window."""
    lines = ["", f"control: the load stepped from {c['rate']:.3g} to {c['stepped_rate']:.3g} "
             f"req/s at {c['step_at_s']:g} s; start-up planned with {c['startup_s']:.0f} s; "
             f"{c['applied']} change(s) applied, {c['failed_changes']} failed, {c['moves']} "
             f"move(s), {c['servers_started']} server(s) started by the controller, "
             f"{c.get('retried', 0)} call(s) sent again after a lost connection; log "
             f"{c['log']}"]
    for d in c["decisions"]:
        if d.get("action") != "keep":
            lines.append(f"  {d['at_s']:6.0f} s  {d['action']}: {d['reason']}")
    rows = [["arrived_s", "requests", "failed", "p50_s", "p90_s"]]
    for w in c["windows"]:
        rows.append([f"{w['start_s']:.0f}-{w['end_s']:.0f}", str(w["requests"]),
                     str(w["failed"]), _num(w["p50_s"]), _num(w["p90_s"])])
    return [*lines, "", *_table(rows)]


# ------------------------------------------------------------------------------------ loop


def _model_dirs(plan_doc: Mapping[str, Any], folder: Path, catalog: Any) -> dict[str, str]:
    """LLM -> the model folder its servers load (one folder per catalog model)."""
    out: dict[str, str] = {}
    made: dict[str, str] = {}
    for m, row in sorted(plan_doc["llms"].items()):
        model = row["model"]
        if model not in made:
            em = _engine_model(model, catalog)
            made[model] = str(write_model_dir(em, folder / em.profiled_name.replace("/", "_"))
                              .resolve())
        out[m] = made[model]
    return out


def with_default_files(options: LoopOptions, checkout: Path = CHECKOUT) -> LoopOptions:
    """``options`` with each input file left at its default (``datasets/...``, relative) and
    missing from the current directory taken from the checkout instead, so that ``scepsy bench
    loop`` runs from any directory of a source checkout; so is ``curves`` when it is
    :data:`BUNDLED_CURVES`. Other files the user named are kept."""
    changes: dict[str, Any] = {}
    for name, default in (("workflow", LoopOptions.workflow), ("cluster", LoopOptions.cluster),
                          ("catalog", LoopOptions.catalog), ("curves", BUNDLED_CURVES)):
        value = getattr(options, name)
        if value is not None and value == default and not Path(value).exists() \
                and (checkout / value).exists():
            changes[name] = str(checkout / value)
    return replace(options, **changes) if changes else options


# ------------------------------------------------------------------------------- profile


def host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's CPU model (``model name`` of /proc/cpuinfo; ``unknown`` without one)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return "unknown"


def loop_models(specs: Sequence[Any], catalog: Catalog | None) -> tuple[EngineModel, ...]:
    """The engine models the workflows' LLMs are served with, once each (a shrunk catalog
    model ``NAME:xS`` is ``engine_model(NAME, S)``, the model ``scepsy profile run --model
    NAME --scale S`` measures and the servers load)."""
    out: dict[str, EngineModel] = {}
    for spec in specs:
        for model in spec.llms.values():
            if model not in out:
                out[model] = _engine_model(model, catalog)
    return tuple(out[m] for m in sorted(out))


def _profile_max_tokens(options: LoopOptions) -> int:
    """The sweep's longest context: the servers' model length less the decode span."""
    return max(PROFILE_MIN_TOKENS, options.max_model_len - PROFILE_DECODE_TOKENS)


def profile_spec(tp: int, options: LoopOptions) -> SweepSpec:
    """The compact sweep of one TP degree at ``options.profile_shares`` (share 1 unless the
    options say otherwise): batches 1 .. ``max_num_seqs``, tokens
    :data:`PROFILE_MIN_TOKENS` .. the servers' longest context, at most
    :data:`PROFILE_POINTS_PER_TP` points, chosen by the sweep planner."""
    return SweepSpec(tps=(tp,), shares=tuple(options.profile_shares),
                     max_batch=options.max_num_seqs,
                     min_tokens=PROFILE_MIN_TOKENS,
                     max_tokens=_profile_max_tokens(options),
                     max_points=PROFILE_POINTS_PER_TP,
                     max_batch_tokens=PROFILE_MAX_BATCH_TOKENS)


def profile_backend_options(options: LoopOptions) -> BackendOptions:
    """The engine the sweep times: the servers' limits (``max_num_seqs``, ``max_model_len``)
    and 1 GiB of KV cache (what the bundled store used), :data:`PROFILE_REPEATS` timed runs
    after one warm-up, the cores of a share as ``scepsy profile run`` pins them (TP 1 on one
    core, TP 2 a core per rank)."""
    return BackendOptions(
        repeats=PROFILE_REPEATS, warmup=1, point_timeout_s=120.0, seed=options.seed,
        engine_python=options.engine_python, memory_gib=1.0,
        extra=(("max_tokens", str(_profile_max_tokens(options))),
               ("max_batch", str(options.max_num_seqs))))


def _sweep_records(records: Sequence[ProfileRecord], engine: str,
                   model: EngineModel) -> list[ProfileRecord]:
    return [r for r in records if r.engine == engine and r.model == model.name
            and round(r.scale, 9) == round(model.scale, 9)]


def _sweep_left(records: Sequence[ProfileRecord] | None, engine: str, model: EngineModel,
                spec: SweepSpec) -> bool:
    """Whether the sweep of ``spec`` still has points to measure among the store's
    ``records`` (None: no store yet), as its planner
    (:func:`~scepsy_profile.profiling.planner.next_points`) sees the records of one device (a
    store of several devices of this model: True, :func:`run_sweep` decides)."""
    if records is None:
        return True
    mine = _sweep_records(records, engine, model)
    if len({r.device for r in mine}) != 1:
        return True
    return bool(planner.next_points(spec, mine, budget_points=1))


def fit_store(store: str | os.PathLike[str], out: str | os.PathLike[str]
              ) -> FittedLatencyModel:
    """The curves ``scepsy profile fit --measurements STORE --out OUT`` writes (its defaults:
    seed 0, one process): every curve of the store's ``ok`` records, fitted, saved to ``out``."""
    model = fit_profile_store(store)
    save_curves(model, out)
    return model


def profile_here(options: LoopOptions, models: Sequence[EngineModel], folder: Path,
                 catalog: Catalog | None = None,
                 say: Callable[[str], None] | None = None) -> CurvesUsed:
    """Step 0 of the loop: measure ``models`` at every TP degree of ``options.tps`` (share 1)
    into ``folder/store.jsonl`` and fit ``folder/curves.json`` (module docstring). The sweeps
    that still have points share ``options.profile_budget_s`` (each gets the time left over
    the sweeps left). Raises :class:`KeyboardInterrupt` when a sweep was interrupted, and
    :class:`InputError` when the backend cannot run here, when a TP degree cannot, when the budget left a curve with
    too few points to fit (a rerun with the same ``out`` continues the sweep), or when the
    measured device is not a device of ``catalog``."""
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store.jsonl"
    curves_path = folder / "curves.json"
    inner = get_backend(options.profile_backend)
    bopts = profile_backend_options(options)
    reason = inner.unavailable(bopts)
    if reason is not None:
        raise InputError(SOURCE, "engine_python", f"an environment where the {inner.name} "
                         f"profiler runs ({reason}); or pass --curves FILE",
                         options.engine_python)
    backend = _TimedStarts(inner)
    stored = read_store(store).records if store.exists() else None
    todo = [(m, tp) for m in models for tp in options.tps
            if _sweep_left(stored, backend.name, m, profile_spec(tp, options))]
    sweeps = {_sweep_name(m, tp): "reused" for m in models for tp in options.tps}
    sweep_s: dict[str, float] = {}
    measured = failed = 0
    spent = 0.0  # measuring time, engine start-ups left out
    for i, (model, tp) in enumerate(todo):
        name = _sweep_name(model, tp)
        budget = max(0.0, (options.profile_budget_s - spent) / (len(todo) - i))
        _say(say, f"profiling {model.profiled_name} at TP {tp} with {backend.name}: "
             f"{budget:.0f} s of measuring (the engine's start-up not counted) into {store}")
        starts_before = len(backend.starts)
        ticker = _PointTicker(say, name)
        res = run_sweep(backend, model, profile_spec(tp, options), store, bopts,
                        budget_s=budget, clock=backend.clock, on_progress=ticker)
        start_s = sum(backend.starts[starts_before:])
        if len(backend.starts) > starts_before:
            backend.started[name] = start_s
        sweep_s[name] = max(0.0, res.elapsed_s)
        spent += sweep_s[name]
        measured += len(res.records)
        failed += len(res.failed)
        sweeps[name] = res.stopped
        _say(say, f"profiled {name}: {len(res.ok)} point(s) in {sweep_s[name]:.0f} s of "
             f"measuring" + (f" after an engine start of {start_s:.0f} s"
                             if name in backend.started else "") + f" ({res.stopped})")
        if res.stopped == "interrupted":
            raise KeyboardInterrupt
        if res.skipped:
            why = "; ".join(f"tp={s.tp}: {s.reason}" for s in res.skipped)
            raise InputError(SOURCE, "tps", f"TP degrees that {backend.name} can run here "
                             f"({why}); or pass --curves FILE", tp)
    all_records = checked_store(store).records if store.exists() else ()
    mine = {_sweep_name(m, tp): [r for r in _sweep_records(all_records, backend.name, m)
                                 if r.status == "ok" and r.tp == tp and r.share == 1.0]
            for m in models for tp in options.tps}
    try:
        fitted = fit_store(store, curves_path)
    except InputError as exc:
        raise _budget_error(options, mine, sweep_s, backend.started, str(exc)) from None
    records = [r for rs in mine.values() for r in rs]
    devices = sorted({r.device for r in records})
    for device in devices:
        if catalog is not None and not catalog.has_gpu(device):
            raise InputError(SOURCE, "catalog", f"a catalog with the measured device {device!r}",
                             options.catalog)
        for m in models:
            for tp in options.tps:
                if not fitted.covers(m.profiled_name, device, tp):
                    raise _budget_error(options, mine, sweep_s, backend.started,
                                        f"no curve of {m.profiled_name} at TP {tp}")
    spread = {name: profile_spread(rs) for name, rs in mine.items() if rs}
    warnings = tuple(spread_warning(name, sp) for name, sp in spread.items()
                     if sp[0] > PROFILE_SPREAD_LIMIT)
    for w in warnings:
        _say(say, w)
    details = sorted({str(r.device_detail.get("model", "")) for r in records} - {""})
    version = ", ".join(sorted({r.engine_version for r in records})) or None
    return CurvesUsed(path=str(curves_path), measured_here=True, host_cpu=host_cpu(),
                      device=", ".join(devices) or None,
                      device_detail=", ".join(details) or None, store=str(store),
                      backend=backend.name, engine_version=version, points=len(records),
                      measured=measured, failed=failed, sweeps=sweeps,
                      engine_start_s={k: round(v, 1) for k, v in backend.started.items()},
                      spread_pct={k: round(100 * v[0], 1) for k, v in spread.items()},
                      warnings=warnings)


def _sweep_name(model: EngineModel, tp: int) -> str:
    return f"{model.profiled_name} tp{tp}"


def profile_spread(records: Sequence[ProfileRecord]) -> tuple[float, float]:
    """How much the timed runs of a sweep's points disagree: per point, the range of its
    timed runs over their median ((max − min) / median); over the points, the 90th
    percentile (nearest rank, so that one odd point does not count) and the largest. On a
    machine to itself both stay low (the bundled store, measured so: 31% and 51%); a busy
    machine stretches some runs of a step and not others."""
    per = sorted((max(r.samples_ms) - min(r.samples_ms)) / r.latency_ms for r in records
                 if r.samples_ms and r.latency_ms and r.latency_ms > 0)
    if not per:
        return 0.0, 0.0
    return per[max(0, math.ceil(0.9 * len(per)) - 1)], per[-1]


def spread_warning(name: str, spread: tuple[float, float]) -> str:
    """The one line :func:`profile_here` prints for a sweep whose spread is over
    :data:`PROFILE_SPREAD_LIMIT`."""
    model, _, tp = name.rpartition(" tp")
    return (f"warning: the profile of {model} at TP {tp} is noisy: its points' timed runs "
            f"spread {100 * spread[0]:.0f}% of their median (90th percentile; up to "
            f"{100 * spread[1]:.0f}%), over the {100 * PROFILE_SPREAD_LIMIT:.0f}% a machine "
            "to itself stays under: something else was running. Its curves, and the rate the "
            "plan derives from them, are off; rerun on a quieter machine with a new --out (or "
            "delete OUT/profile), or pass --curves FILE")


def _budget_error(options: LoopOptions, mine: Mapping[str, Sequence[ProfileRecord]],
                  sweep_s: Mapping[str, float], started: Mapping[str, float],
                  why: str) -> InputError:
    """The error of a budget that left a curve without the points a fit needs: per sweep, its
    points, its measuring time and its engine's start-up, and the flag that raises it."""
    parts = []
    for name, rs in mine.items():
        took = f" in {sweep_s[name]:.0f} s of measuring" if name in sweep_s else ""
        start = (f", its engine started in {started[name]:.0f} s (not counted)"
                 if name in started else "")
        parts.append(f"{name}: {len(rs)} point(s){took}{start}")
    return InputError(SOURCE, "profile_budget_s",
                      f"a budget that measures the 5 points a curve needs ({why}; "
                      f"{'; '.join(parts)}): raise --profile-budget (now "
                      f"{options.profile_budget_s:g} s of measuring), or rerun with the same "
                      "--out to continue the sweep, or pass --curves FILE",
                      options.profile_budget_s)


class _TimedStarts:
    """A profiler backend that times each session's start (the engine's start-up) and a clock
    without them: the sweeps' budget counts measuring only."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.starts: list[float] = []
        self.started: dict[str, float] = {}
        """Per sweep name, the seconds its engine took to start (sweeps that started one)."""

    @property
    def name(self) -> str:
        return str(self.backend.name)

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        return self.backend.unavailable(options)

    def version(self, options: BackendOptions | None = None) -> str:
        return str(self.backend.version(options))

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        return self.backend.unsupported(model, tp, share, options)

    @contextlib.contextmanager
    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> Iterator[Any]:
        t0 = time.monotonic()
        up = False
        try:
            with self.backend.session(model, tp, share, options) as session:
                self.starts.append(time.monotonic() - t0)
                up = True
                yield session
        finally:
            if not up:  # a start that failed counts as a start too
                self.starts.append(time.monotonic() - t0)

    def clock(self) -> float:
        """``time.monotonic()`` less every engine start so far."""
        return time.monotonic() - sum(self.starts)


class _PointTicker:
    """``on_progress`` of a sweep: a line at most every :data:`PROGRESS_EVERY_S` seconds."""

    def __init__(self, say: Callable[[str], None] | None, name: str) -> None:
        self.say, self.name = say, name
        self.last = time.monotonic()

    def __call__(self, done: int, total: int, record: ProfileRecord) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            _say(self.say, f"  profiling {self.name}: {done} point(s) of about {total}")


def given_curves(path: str, models: Sequence[EngineModel] = (), devices: Sequence[str] = (),
                 tps: Sequence[int] = ()) -> CurvesUsed:
    """:class:`CurvesUsed` for a curves file passed in (not measured by this loop); an
    :class:`InputError` on ``curves`` when the file has no curve for one of ``models`` on one
    of ``devices`` at the smallest of ``tps`` it supports (curves of other models or another
    device: the loop would plan with the roofline alone, and its servers would not be what the
    curves measured). Larger TP degrees without curves fall back to the roofline, as in
    ``plan``."""
    fitted = load_curves(path)
    for m in models:
        tp = min((t for t in tps if m.model_spec().supports_tp(t)), default=None)
        for device in devices:  # (a degree the model cannot use: --tp's own check says so)
            if tp is not None and not fitted.covers(m.profiled_name, device, tp):
                raise InputError(SOURCE, "curves", f"curves of every LLM of the workflows: "
                                 f"{path} has none of {m.profiled_name} on {device} at TP {tp} "
                                 "(profile it with `scepsy profile run`, or leave --curves "
                                 "out to profile here)", str(path))
    return CurvesUsed(path=str(path), measured_here=False, host_cpu=host_cpu())


def _say(say: Callable[[str], None] | None, line: str) -> None:
    if say is not None:
        say(line)


def drive_requests(options: LoopOptions, rate: float) -> int:
    """The requests a loop drives at ``rate``: ``options.requests`` when given, else
    :data:`DEFAULT_REQUESTS`, cut to what arrives within ``options.max_drive_s`` (at least
    :data:`MIN_REQUESTS`)."""
    if options.requests is not None:
        return options.requests
    fit = math.floor(rate * options.max_drive_s) if rate > 0 else MIN_REQUESTS
    return max(MIN_REQUESTS, min(DEFAULT_REQUESTS, fit))


class _Clocked:
    """``say`` with the seconds since the loop started before each line, and stage lines."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.say = say
        self.t0 = time.monotonic()

    def __call__(self, line: str) -> None:
        _say(self.say, f"[{time.monotonic() - self.t0:6.1f} s] {line}")

    @contextlib.contextmanager
    def stage(self, name: str, status: Callable[[], str] | None = None) -> Iterator[None]:
        """A line at the stage's start and at its end (with its time), and with ``status``
        one every :data:`PROGRESS_EVERY_S` seconds while it runs."""
        t0 = time.monotonic()
        self(f"{name}: started")
        stop = threading.Event()
        beat = None
        if status is not None and self.say is not None:
            def tick() -> None:
                while not stop.wait(PROGRESS_EVERY_S):
                    with contextlib.suppress(Exception):
                        self(f"  {name}: {status()} ({time.monotonic() - t0:.0f} s)")
            beat = threading.Thread(target=tick, name=f"loop-{name}", daemon=True)
            beat.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if beat is not None:
                beat.join(timeout=5)
            self(f"{name}: {'done' if ok else 'stopped'} after {time.monotonic() - t0:.1f} s")


BOUND_FACTOR = 2.5
"""With the controller: each workflow's latency bound, times its minimum-latency prediction at
the target rate (the controller keeps the plan within it, :class:`ControlConfig`)."""


def _control_plan(planning: Planning, specs: Sequence[Any], topology: Any, rate: float,
                  fastest: Any, options: LoopOptions, common: Mapping[str, Any],
                  tell: Callable[[str], None]) -> Any:
    """The controlled run's first plan: the cheapest that keeps every workflow within
    :data:`BOUND_FACTOR` times its latency in ``fastest`` (the minimum-latency plan) at
    ``rate``, so that the cluster has room for the controller to add capacity."""
    pred = planning.predict(specs, fastest.placed.plan.allocation, rate, **common)
    bounds = {w: BOUND_FACTOR * p.mean_latency_s for w, p in pred.workflows.items()}
    tell("planning: the cheapest plan within "
         + ", ".join(f"{w} {b:.2f} s" for w, b in sorted(bounds.items())))
    res = planning.plan(specs, topology, rate, objective="min-cost", latency_bound_s=bounds,
                        tps=options.tps, shares=options.shares, **common)
    if res.allocation is None:
        raise InputError(SOURCE, "plan", f"a placed min-cost plan at {rate:.3g} req/s "
                         f"(status {res.plan.status})")
    return res


def make_out_folder(path: str | Path) -> Path:
    """``path`` as a folder, made with its parents if need be: an :class:`InputError` on the
    ``out`` field when it is a file or cannot be made (a system folder such as ``/proc``, no
    permission), before any work starts."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(SOURCE, "out", "a folder (or a path that does not exist)", str(out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(SOURCE, "out", f"a folder that can be made ({exc.strerror or exc})",
                         str(out)) from None
    return out


@dataclass
class _Run:
    """What one run of the loop knows so far: each stage fills its part, and
    :class:`LoopResult` (results.json) is made of it whatever stage the run ended in."""

    options: LoopOptions
    out: Path
    work: Path
    run_id: str
    tell: _Clocked
    progress: DriveProgress = field(default_factory=DriveProgress)
    timings: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    common: dict[str, Any] = field(default_factory=dict)  # plan and predict options
    rate: float = 0.0
    max_throughput: float | None = None
    allocation: dict[str, Any] = field(default_factory=dict)
    running: Allocation | None = None  # what the predictions are of (None: the plan's)
    predicted_as: dict[str, Any] | None = None
    curves: Any = None
    requests: int | None = None
    servers: int = 0
    ports: tuple[int, ...] = ()
    started: bool = False  # servers were started: stop them
    up_s: float = 0.0  # how long the servers took to answer /health
    drive: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    predicted: dict[str, Any] | None = None
    predicted_measured: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None
    leftovers: Leftovers = field(default_factory=Leftovers)
    error: str | None = None
    interrupted: bool = False

    @property
    def launch_dir(self) -> Path:
        return self.work / "launch"

    def result(self) -> LoopResult:
        return LoopResult(
            options=self.options, run_id=self.run_id, rate=self.rate,
            max_throughput=self.max_throughput, allocation=self.allocation,
            servers=self.servers, timings=self.timings, drive=self.drive,
            predicted=self.predicted, predicted_measured=self.predicted_measured,
            comparison=self.comparison, leftovers=self.leftovers, error=self.error,
            interrupted=self.interrupted, out=str(self.out), files=self.files,
            curves=self.curves, predicted_as=self.predicted_as, requests=self.requests,
            predicted_drive_s=None if self.requests is None or not self.rate
            else self.requests / self.rate, control=self.control)


def run_loop(options: LoopOptions, planning: Planning,
             say: Callable[[str], None] | None = None) -> LoopResult:
    """Plan, launch, drive, stop and compare (module docstring); ``say`` gets a line at the
    start and the end of each stage (with the seconds since the start), and one every
    :data:`PROGRESS_EVERY_S` seconds during the long ones. The servers are stopped whatever
    happens; a :class:`KeyboardInterrupt` (Ctrl-C, or SIGTERM in the main thread) is raised
    again after the stop, other exceptions too, with ``results.json`` written first
    (``error``/``interrupted`` set)."""
    options = with_default_files(options)
    out = make_out_folder(options.out)
    work = out / "run"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    run = _Run(options, out, work, uuid.uuid4().hex[:16], _Clocked(say))
    t_start = time.monotonic()
    raised: BaseException | None = None
    with planning.using_catalog(options.catalog) as catalog, _terminate_as_interrupt():
        try:
            specs = load_specs(options.workflow)
            topology = load_topology(options.cluster, catalog)  # before any profiling
            _profile_stage(run, specs, topology, catalog)
            res, doc = _plan_stage(run, planning, specs, topology)
            plan = _launch_stage(run, doc, catalog)
            _drive_stage(run, specs, plan, res, topology)
        except KeyboardInterrupt as exc:
            run.interrupted = True
            raised = exc
        except BaseException as exc:
            run.error = f"{type(exc).__name__}: {exc}"
            raised = exc
        finally:
            with _shielded():
                _stop_stage(run)
        if raised is None and run.drive is not None:
            _predict_stage(run, planning, specs)
    run.timings["total_s"] = time.monotonic() - t_start
    return _finish(run, raised)


def _profile_stage(run: _Run, specs: Any, topology: Any, catalog: Any) -> None:
    """The latency curves: measured here (``OUT/profile``) or the given ones."""
    options, t0 = run.options, time.monotonic()
    if options.curves is None:
        with run.tell.stage("profile"):
            used = profile_here(options, loop_models(specs, catalog), run.out / "profile",
                                catalog, run.tell)
        run.files["curves"] = used.path
        run.files["profile_store"] = str(used.store)
    else:
        used = given_curves(options.curves, loop_models(specs, catalog),
                            sorted({n.gpu for n in topology.nodes}), options.tps)
    run.curves = used
    run.timings["profile_s"] = time.monotonic() - t0
    # plan and predict for the engines the loop starts (their max_num_seqs)
    run.common = {"catalog": options.catalog, "curves": used.path, "seed": options.seed,
                  "trace_requests": options.trace_requests,
                  "engine": MemoryPolicy(max_batch=options.max_num_seqs),
                  "overheads": options.overheads}


def _plan_stage(run: _Run, planning: Planning, specs: Any, topology: Any
                ) -> tuple[Any, dict[str, Any]]:
    """The rate (given, or ``load`` x the largest throughput), the placed plan at it (the
    controller's plan with ``control``) and its plan.json document; the drive's size."""
    options, tell, common, t0 = run.options, run.tell, run.common, time.monotonic()
    if options.rate is None:
        tell("planning: the largest throughput the cluster carries")
        top = planning.plan(specs, topology, 1.0, objective="max-throughput", tps=options.tps,
                            shares=options.shares, **common)
        if top.allocation is None:
            raise InputError(SOURCE, "plan", "a cluster that carries the workflows "
                             f"(status {top.plan.status})")
        run.max_throughput = float(top.plan.scale)
        rate = options.load * run.max_throughput
    else:
        rate = float(options.rate)
    run.rate = rate
    tell(f"planning: minimum latency at {rate:.3g} req/s")
    res = planning.plan(specs, topology, rate, tps=options.tps, shares=options.shares, **common)
    if res.allocation is None:
        raise InputError(SOURCE, "plan", f"a placed allocation at {rate:.3g} req/s "
                         f"(status {res.plan.status}); lower --rate or --load")
    if options.control is not None:
        res = _control_plan(planning, specs, topology, rate, res, options, common, tell)
    doc = res.to_dict(timings=False)
    run.allocation = doc["allocation"]["llms"]
    run.running = running_allocation(doc, options.device)
    run.predicted_as = None if run.running is None else run.running.to_dict()
    run.timings["plan_s"] = time.monotonic() - t0
    tell(f"plan: done after {run.timings['plan_s']:.1f} s")
    run.requests = n = drive_requests(options, rate)
    span = n / rate
    limit = (f"over --max-drive-s {options.max_drive_s:g} s: fewer --requests or a "
             "higher --rate would bound it" if span > options.max_drive_s
             else f"limit --max-drive-s {options.max_drive_s:g} s")
    tell(f"the drive: {n} requests at {rate:.3g} req/s, arriving over about {span:.0f} s "
         f"({limit})")
    return res, doc


def _launch_stage(run: _Run, doc: dict[str, Any], catalog: Any) -> LaunchPlan:
    """The plan's launch section (this machine's engine, free ports, the run's marker),
    plan.json and the shell launch folder written, every server started and healthy."""
    options, t0 = run.options, time.monotonic()
    model_dirs = _model_dirs(doc, run.work / "models", catalog)
    if options.engine_command is not None:
        command = tuple(options.engine_command)
    else:
        python = vllm_python(BackendOptions(engine_python=options.engine_python))
        command = (str(python.path), *SERVER_MODULE)
    cuda = options.device == "cuda"
    make_args = gpu_engine_args if cuda else cpu_engine_args
    args = options.engine_args if options.engine_args is not None else make_args(
        options.max_model_len, options.max_num_seqs)
    if options.control is not None and options.control.priority == "las":
        # the gateway's per-call priorities are read only under this policy
        args = (*args, "--scheduling-policy", "priority")
    nodes = sorted({i["node"] for i in doc["placement"]["instances"]})
    n_servers = len(doc["placement"]["instances"])
    env = {k: v for k, v in engine_environment(
        1, 1.0, "cuda" if cuda else "cpu", None, run.work / "tmp").items()
        if k not in ("TMPDIR", "VLLM_CACHE_ROOT", "VLLM_CPU_KVCACHE_SPACE",
                     "VLLM_CPU_OMP_THREADS_BIND", *ONE_PROCESS_ENV)}
    env[MARKER] = run.run_id
    doc["launch"] = cpu_launch_section(
        command, args, model_dirs, nodes, base_port=free_port_range(n_servers),
        health_timeout_s=options.health_timeout_s, env=env,
        model_args=gpu_memory_args(doc["allocation"]["llms"]) if cuda else None)
    plan_path = run.work / "plan.json"
    write_plan_file(plan_path, doc)
    run.files["plan"] = str(plan_path)
    plan: LaunchPlan = load_plan(plan_path)
    run.ports = tuple(r.port for r in plan.replicas)
    run.servers = len(plan.replicas)
    launch_dir = run.launch_dir
    write_rendered(get_renderer(TARGET).render(plan), launch_dir, TARGET)
    run.files["launch"] = str(launch_dir)
    run.tell(f"launching {len(plan.replicas)} server(s) (ports {min(run.ports)}-"
             f"{max(run.ports)}), waiting for /health")
    run.started = True
    with run.tell.stage("launch", lambda: f"waiting for {len(plan.replicas)} server(s) "
                        "to answer /health"):
        t_up = time.monotonic()
        for node in plan.node_names():
            host.apply(launch_dir, node)
        run.up_s = time.monotonic() - t_up
    run.timings["launch_s"] = time.monotonic() - t0
    return plan


def _drive_stage(run: _Run, specs: Any, plan: LaunchPlan, res: Any, topology: Any) -> None:
    """The requests driven through the routes (under the controller with ``control``); the
    drive's figures, the servers' own and the measured trace."""
    options, tell, rate, t0 = run.options, run.tell, run.rate, time.monotonic()
    n = run.requests
    assert n is not None
    before = server_metrics(plan)
    routes = load_routes(run.launch_dir / ROUTES_FILE)
    tell(f"driving {n} requests at {rate:.3g} req/s")
    timeout = ReplayTimeouts(connect_s=10.0, stall_s=min(60.0, options.call_timeout_s),
                             call_s=options.call_timeout_s)
    with tell.stage("drive", run.progress.line):
        if options.control is None:
            result: DriveResult = drive(
                specs, routes, rate=rate, requests=n, seed=options.seed,
                max_in_flight=options.max_in_flight, timeouts=timeout,
                deadline_s=n / rate * 3 + 120, progress=run.progress)
        else:
            startup = (options.control.startup_s if options.control.startup_s is not None
                       else run.up_s)
            result, ctl = drive_under_control(
                control=options.control, specs=specs, plan=plan, launch_dir=run.launch_dir,
                work=run.work, startup_s=startup,
                controller=running_controller(res.problem, res.topology or topology,
                                              res.placed, options.control, startup),
                rate=rate, requests=n, seed=options.seed,
                max_in_flight=options.max_in_flight, timeouts=timeout,
                health_timeout_s=options.health_timeout_s, progress=run.progress, say=tell)
            run.control = ctl.to_dict()
    run.drive = result.to_dict()
    run.timings["drive_s"] = time.monotonic() - t0
    run.server = server_terms(before, server_metrics(plan))
    _write_measured(result, run.out, run.files)


def _stop_stage(run: _Run) -> None:
    """Whatever happened: keep what an interrupted drive measured, stop the servers, and
    look for anything of the run still running."""
    t0 = time.monotonic()
    progress = run.progress
    if run.drive is None and (progress.result is not None or progress.sent):
        # interrupted or failed while driving: keep what the drive measured
        run.drive = partial_drive(progress)
        with contextlib.suppress(Exception):
            if progress.result is not None:
                _write_measured(progress.result, run.out, run.files)
    if run.started:
        run.tell("stopping the servers")
        try:
            host.stop(run.launch_dir)
        except Exception as exc:
            run.error = run.error or f"stop: {type(exc).__name__}: {exc}"
    run.leftovers = leftovers(run.run_id, run.ports)
    run.timings["stop_s"] = time.monotonic() - t0


def _predict_stage(run: _Run, planning: Planning, specs: Any) -> None:
    """The prediction at the rates the drive sent, from the generated trace and from the
    measured one, compared with the measurements (none under the controller: the
    allocation changed mid-run)."""
    if run.options.control is not None:
        run.tell("no prediction compared: the controller changed the allocation mid-run (the "
                 "control section has the latency per window)")
        return
    run.tell("predicting at the rates the drive sent")
    t0 = time.monotonic()
    assert run.drive is not None
    try:
        at = sent_rates(run.drive, run.rate)
        what = run.files["plan"] if run.running is None else run.running
        run.predicted = prediction_dict(planning.predict(specs, what, at, **run.common))
        if "trace" in run.files:
            pm = planning.predict(specs, what, at, trace=run.files["trace"],
                                  **{k: v for k, v in run.common.items()
                                     if k != "trace_requests"})
            run.predicted_measured = prediction_dict(pm)
        run.comparison = comparison(run.predicted, run.predicted_measured, run.drive,
                                    run.server)
    except Exception as exc:
        run.error = f"predict: {type(exc).__name__}: {exc}"
    run.timings["predict_s"] = time.monotonic() - t0


def _finish(run: _Run, raised: BaseException | None) -> LoopResult:
    """results.json written (the run folder removed unless ``keep`` or it failed); the
    result, or the exception that ended the run raised again."""
    results = run.out / "results.json"
    loop = replace(run.result(), files={**run.files, "results": str(results)})
    if not run.options.keep and raised is None and run.error is None:
        shutil.rmtree(run.work, ignore_errors=True)
        loop = replace(loop, files={k: v for k, v in loop.files.items()
                                    if k not in ("plan", "launch")})
    atomic_write_text(results, json.dumps(loop.to_dict(), indent=2, sort_keys=True) + "\n")
    if raised is not None:
        raise raised
    return loop


def _write_measured(result: DriveResult, out: Path, files: dict[str, str]) -> None:
    """The measured trace of a drive's completed requests (none without one)."""
    if result.calls:
        trace_path = out / "measured-trace.jsonl"
        write_trace(trace_path, result.trace().calls)
        files["trace"] = str(trace_path)


def partial_drive(progress: DriveProgress) -> dict[str, Any]:
    """results.json's ``drive`` of a drive that did not return (interrupted, or failed): its
    result when it got to make one (``interrupted`` set when it was cancelled), else its
    counts so far (``partial``: requests in flight then counted failed as ``interrupted``)."""
    if progress.result is not None:
        return progress.result.to_dict()
    in_flight = progress.sent - progress.completed - progress.failed
    return {"planned": progress.planned, "sent": progress.sent,
            "completed": progress.completed, "failed": progress.failed + in_flight,
            "not_sent": progress.planned - progress.sent,
            "failures": {"interrupted": in_flight} if in_flight else {},
            "interrupted": True, "partial": True, "workflows": {}, "llms": {}}


def sent_rates(drive: Mapping[str, Any], target: float) -> dict[str, float] | float:
    """The per-workflow rates the drive sent at (its workflows' ``offered_rps``: a Poisson
    stream's realised rate differs from its target by about ``1/√N``), or the ``target`` total
    where a workflow has none (fewer than two arrivals)."""
    got = {w: r.get("offered_rps") for w, r in drive.get("workflows", {}).items()}
    if got and all(isinstance(v, int | float) and v > 0 for v in got.values()):
        return {w: float(v) for w, v in sorted(got.items())}
    return target


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ``results.json`` written by :func:`run_loop`."""
    raw = read_json(path, "results.json of scepsy bench loop")
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise InputError(str(path), "version", "results of scepsy bench loop (version 1)",
                         raw.get("version") if isinstance(raw, dict) else None)
    return raw
