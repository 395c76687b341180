"""vLLM measurement worker: run with the interpreter of vLLM's own environment, never imported.

Standalone on purpose (standard library, ``vllm`` and ``torch`` only): scepsy is not installed in
vLLM's environment. :mod:`scepsy_profile.profiling.vllm_backend` starts it as a script in its own
process group and talks to it in JSON lines, one object per line:

* stdin ← ``{"op": "setup", "model_dir", "tp", "dtype", "max_model_len", "max_num_seqs",
  "max_num_batched_tokens", "repeats", "warmup", "seed", "decode_tokens", "method",
  "gpu_memory_utilization", "owned_dir"}``; stdout → ``{"ok": true, "op": "ready", "vllm_version",
  "device": {...}, "limits": {...}}`` or ``{"ok": false, "error", "fatal": true}``;
* stdin ← ``{"op": "measure", "id", "phase", "batch", "tokens"}``; stdout → ``{"ok": true,
  "id", "samples_ms", "method", "detail"}`` or ``{"ok": false, "id", "error", "fatal"}``; after a
  fatal error the worker exits (the engine is gone);
* stdin ← ``{"op": "exit"}``, or end of input (the parent died or closed): the worker stops the
  engine, ends what is left of its process group, and exits; when its parent died (end of input,
  or a new parent process) it also removes the setup's ``owned_dir`` (the session's folder).

Only protocol lines go to the real stdout; everything else written to stdout (vLLM's log, its
child processes) is sent to stderr. ``--probe`` prints one JSON object (versions, device) and exits.

Timing (one sample per ``generate`` call, ``repeats`` calls after ``warmup`` untimed ones; fresh
random token ids every call, prefix caching off):

* ``method="metrics"`` (default), from the engine's own histograms (``LLM.get_metrics()``),
  as deltas of their ``sum``/``count`` over one call:

  - prefill of ``batch × tokens``: ``batch`` prompts of ``tokens`` ids, ``max_tokens=1``; the
    sample is the mean ``vllm:request_prefill_time_seconds`` (engine-core time from a request
    being scheduled to its first token). ``max_num_batched_tokens`` is at least
    ``batch·tokens``, so the whole batch is prefilled in one engine step: chunked prefill stays
    enabled (vLLM v1 always schedules in token budgets) but never splits a measured batch, and
    ``vllm:iteration_tokens_total`` is checked to have seen exactly one step.
  - decode step at ``batch`` sequences of context ``tokens``: prompts of ``tokens − m/2`` ids and
    ``m = decode_tokens`` generated tokens (``ignore_eos``, ``min_tokens=m``); the sample is the
    mean ``vllm:inter_token_latency_seconds`` over the ``batch·(m−1)`` intervals, i.e. the step
    time at batch ``batch`` and a mean context of ``tokens`` (decode time is linear in context).
  - a run with a preemption (KV cache too small) is an error, not a sample.

* ``method="paired"`` (a cross-check from outside the engine's clocks): wall-clock time of
  ``generate``. Prefill: one call with ``max_tokens=1`` (an upper bound: it adds the call's own
  overhead). Decode: the difference of a call generating ``1 + m`` tokens and one generating 1
  from the same prompts, divided by ``m``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any

PROTOCOL = 1
PHASES = ("prefill", "decode")
SETUP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model_dir": str, "tp": int, "dtype": str, "max_model_len": int, "max_num_seqs": int,
    "max_num_batched_tokens": int, "repeats": int, "warmup": int, "seed": int,
    "decode_tokens": int,
}
METHODS = ("metrics", "paired")


class ProtocolError(ValueError):
    """A request line that is not a valid message."""


class PointError(RuntimeError):
    """A point that cannot be measured (the engine stays usable)."""


# ------------------------------------------------------------------------------------- protocol
def parse_request(line: str) -> dict[str, Any]:
    """One request line as a dict, checked; :class:`ProtocolError` says what is wrong."""
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not a JSON object: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("not a JSON object")
    op = msg.get("op")
    if op == "setup":
        for name, kind in SETUP_FIELDS.items():
            if not isinstance(msg.get(name), kind) or isinstance(msg.get(name), bool):
                raise ProtocolError(f"setup: field {name!r} missing or not {_kind(kind)}")
        if msg.get("method", "metrics") not in METHODS:
            raise ProtocolError(f"setup: method must be one of {METHODS}")
        if msg["tp"] < 1 or msg["repeats"] < 1 or msg["warmup"] < 0 or msg["decode_tokens"] < 2:
            raise ProtocolError("setup: tp >= 1, repeats >= 1, warmup >= 0, decode_tokens >= 2")
    elif op == "measure":
        if msg.get("phase") not in PHASES:
            raise ProtocolError("measure: phase must be prefill or decode")
        for name in ("batch", "tokens"):
            v = msg.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ProtocolError(f"measure: {name} must be an integer >= 1")
    elif op != "exit":
        raise ProtocolError(f"unknown op {op!r} (setup, measure or exit)")
    return msg


def _kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


# ------------------------------------------------------------------------------------- engine
def _metric_totals(llm: Any) -> dict[str, tuple[float, float]]:
    """(count, sum) of every vllm histogram, and (value, value) of every counter, summed over
    label sets (engines, TP ranks report under one frontend)."""
    from vllm.v1.metrics.reader import Counter, Histogram

    out: dict[str, tuple[float, float]] = {}
    for m in llm.get_metrics():
        if isinstance(m, Histogram):
            c, s = out.get(m.name, (0.0, 0.0))
            out[m.name] = (c + m.count, s + m.sum)
        elif isinstance(m, Counter):
            c, s = out.get(m.name, (0.0, 0.0))
            out[m.name] = (c + m.value, s + m.value)
    return out


def _delta(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
           name: str) -> tuple[float, float]:
    c0, s0 = before.get(name, (0.0, 0.0))
    c1, s1 = after.get(name, (0.0, 0.0))
    return c1 - c0, s1 - s0


class Engine:
    """One vLLM offline engine holding one model."""

    def __init__(self, setup: dict[str, Any], device_type: str) -> None:
        # The engine core in this process: ``generate`` hands it the whole batch before the first
        # step (a separate core process starts stepping on the first request to arrive).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        self.setup = setup
        with open(os.path.join(setup["model_dir"], "config.json"), encoding="utf-8") as f:
            self.vocab = int(json.load(f)["vocab_size"])
        self.method = setup.get("method", "metrics")
        kwargs: dict[str, Any] = dict(
            model=setup["model_dir"], load_format="dummy", skip_tokenizer_init=True,
            tensor_parallel_size=setup["tp"], dtype=setup["dtype"], enforce_eager=True,
            max_model_len=setup["max_model_len"], max_num_seqs=setup["max_num_seqs"],
            max_num_batched_tokens=setup["max_num_batched_tokens"],
            enable_prefix_caching=False, disable_log_stats=False, seed=setup["seed"],
        )
        if device_type == "cpu" and setup["tp"] > 1:
            # OMP pinning of several ranks needs them in their own processes; one rank runs in
            # this process, which its start confined to the rank's cores (``taskset``), as a
            # launched server's (engine_env.cpu_one_process)
            kwargs["distributed_executor_backend"] = "mp"
        if setup.get("gpu_memory_utilization"):
            kwargs["gpu_memory_utilization"] = float(setup["gpu_memory_utilization"])
        self.llm = LLM(**kwargs)
        self.rng = random.Random(setup["seed"])

    def _prompts(self, batch: int, tokens: int) -> list[dict[str, list[int]]]:
        hi = self.vocab - 1
        return [{"prompt_token_ids": [self.rng.randint(3, hi) for _ in range(tokens)]}
                for _ in range(batch)]

    def _generate(self, prompts: list[dict[str, list[int]]], n: int) -> float:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False,
                                temperature=0.0)
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        for o in outs:
            got = len(o.outputs[0].token_ids)
            if got != n:
                raise PointError(f"a request generated {got} tokens, {n} were asked")
        return wall

    def _check_fits(self, phase: str, batch: int, tokens: int) -> int:
        """The prompt length of one request; :class:`PointError` for a batch the engine would
        not run in one step."""
        s = self.setup
        prompt = tokens if phase == "prefill" else max(1, tokens - s["decode_tokens"] // 2)
        if batch > s["max_num_seqs"]:
            raise PointError(f"batch {batch} is above the engine's max_num_seqs "
                             f"{s['max_num_seqs']}")
        if batch * prompt > s["max_num_batched_tokens"]:
            raise PointError(f"{batch}x{prompt} prompt tokens do not fit one engine step "
                             f"(max_num_batched_tokens {s['max_num_batched_tokens']})")
        return prompt

    def sample_ms(self, phase: str, batch: int, tokens: int) -> tuple[float, dict[str, Any]]:
        """One timed run of the point: its latency in ms and what the engine saw."""
        prompt = self._check_fits(phase, batch, tokens)
        m = self.setup["decode_tokens"]
        if self.method == "paired":
            prompts = self._prompts(batch, prompt)
            one = self._generate(prompts, 1)
            if phase == "prefill":
                return one * 1e3, {"wall_ms": one * 1e3}
            more = self._generate(prompts, 1 + m)
            return (more - one) / m * 1e3, {"wall_ms": [one * 1e3, more * 1e3]}
        before = _metric_totals(self.llm)
        wall = self._generate(self._prompts(batch, prompt), 1 if phase == "prefill" else m)
        after = _metric_totals(self.llm)
        preempted = _delta(before, after, "vllm:num_preemptions")[1]
        if preempted > 0:
            raise PointError(f"{int(preempted)} preemptions: the KV cache does not hold "
                             f"{batch} sequences of {tokens} tokens")
        steps, step_tokens = _delta(before, after, "vllm:iteration_tokens_total")
        detail = {"wall_ms": wall * 1e3, "engine_steps": steps, "step_tokens": step_tokens}
        if phase == "prefill":
            if steps and steps != 1:
                raise PointError(f"the batch took {steps:g} engine steps, not one")
            name = "vllm:request_prefill_time_seconds"
        else:
            name = "vllm:inter_token_latency_seconds"
        count, total = _delta(before, after, name)
        want = batch if phase == "prefill" else batch * (m - 1)
        if count != want:
            raise PointError(f"{name} saw {count:g} observations, {want} expected")
        return total / count * 1e3, detail

    def measure(self, phase: str, batch: int, tokens: int) -> dict[str, Any]:
        for _ in range(self.setup["warmup"]):
            self.sample_ms(phase, batch, tokens)
        samples, details = [], []
        for _ in range(self.setup["repeats"]):
            ms, detail = self.sample_ms(phase, batch, tokens)
            samples.append(ms)
            details.append(detail)
        method = ("vllm metrics: " + ("request_prefill_time" if phase == "prefill"
                                      else "inter_token_latency")
                  if self.method == "metrics" else "paired wall-clock generate()")
        return {"samples_ms": samples, "method": method,
                "detail": {"runs": details, "median_ms": statistics.median(samples)}}

    def shutdown(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


# ------------------------------------------------------------------------------------- device
def _cpu_detail() -> dict[str, Any]:
    detail: dict[str, Any] = {"cores": len(os.sched_getaffinity(0))}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    detail["model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    detail["memory_gib"] = round(int(line.split()[1]) / 2**20, 2)
                    break
    except OSError:
        pass
    for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE"):
        detail[var] = os.environ.get(var, "")
    return detail


def probe() -> dict[str, Any]:
    """Versions and the device vLLM would use here."""
    import torch
    import vllm
    from vllm.platforms import current_platform

    kind = "cuda" if current_platform.device_type == "cuda" else current_platform.device_type
    out: dict[str, Any] = {"protocol": PROTOCOL, "vllm_version": vllm.__version__,
                           "torch_version": torch.__version__, "device_type": kind}
    if kind == "cuda" and torch.cuda.is_available():
        n = torch.cuda.device_count()
        out["devices"] = [{"name": torch.cuda.get_device_name(i),
                           "memory_gib": round(torch.cuda.get_device_properties(i).total_memory
                                               / 2**30, 2)} for i in range(n)]
        out["cuda_version"] = torch.version.cuda
    else:
        out["cpu"] = _cpu_detail()
    return out


# ------------------------------------------------------------------------------------- main loop
class Worker:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.engine: Engine | None = None

    def reply(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def handle(self, line: str) -> bool:
        """Answer one request; False when the worker must stop."""
        try:
            msg = parse_request(line)
        except ProtocolError as exc:
            self.reply({"ok": False, "error": f"protocol: {exc}", "fatal": False})
            return True
        op = msg["op"]
        if op == "exit":
            return False
        if op == "setup":
            return self._setup(msg)
        return self._measure(msg)

    def _setup(self, msg: dict[str, Any]) -> bool:
        if self.engine is not None:
            self.reply({"ok": False, "error": "protocol: setup twice", "fatal": False})
            return True
        try:
            info = probe()
            self.engine = Engine(msg, info["device_type"])
        except Exception as exc:
            self.reply({"ok": False, "error": f"engine start failed: {_one_line(exc)}",
                        "fatal": True})
            traceback.print_exc(file=sys.stderr)
            return False
        if isinstance(msg.get("owned_dir"), str):
            _OWNED.append(msg["owned_dir"])
        limits = {k: msg[k] for k in ("max_model_len", "max_num_seqs", "max_num_batched_tokens")}
        self.reply({"ok": True, "op": "ready", "protocol": PROTOCOL,
                    "vllm_version": info["vllm_version"], "device": info, "limits": limits})
        return True

    def _measure(self, msg: dict[str, Any]) -> bool:
        rid = msg.get("id")
        if self.engine is None:
            self.reply({"ok": False, "id": rid, "error": "protocol: measure before setup",
                        "fatal": False})
            return True
        try:
            res = self.engine.measure(msg["phase"], msg["batch"], msg["tokens"])
        # the engine stays usable (ignore: mypy does not take a starred tuple of exception
        # types in an except clause)
        except (PointError, *_request_errors()) as exc:  # type: ignore[misc]
            self.reply({"ok": False, "id": rid, "error": _one_line(exc), "fatal": False})
            return True
        except Exception as exc:  # the engine itself failed: it cannot be trusted any more
            traceback.print_exc(file=sys.stderr)
            self.reply({"ok": False, "id": rid, "fatal": True,
                        "error": f"{type(exc).__name__}: {_one_line(exc)}"})
            return False
        self.reply({"ok": True, "id": rid, **res})
        return True

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.shutdown()
            except Exception:
                traceback.print_exc(file=sys.stderr)
            self.engine = None


def _request_errors() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it refuses (prompt too long...), before running it."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())[:2000] or type(exc).__name__


def _end_group(grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every other process of this worker's process group (what is left of
    vLLM's engine-core and rank processes)."""
    if os.getpgid(0) != os.getpid():
        return  # not a group leader: the group is not ours to end
    me = os.getpid()

    import psutil  # a dependency of vLLM itself

    def others() -> list[int]:
        pids = []
        for proc in psutil.process_iter():
            try:
                if (proc.pid != me and proc.status() != psutil.STATUS_ZOMBIE
                        and os.getpgid(proc.pid) == me):
                    pids.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in others():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while others() and time.monotonic() < deadline:
            time.sleep(0.05)


_OWNED: list[str] = []
"""The folder of a setup's ``owned_dir``: removed when the worker outlives its parent."""


def _orphaned() -> None:
    _end_group(grace_s=2.0)
    for folder in _OWNED:
        shutil.rmtree(folder, ignore_errors=True)


def _watch_parent(grace_s: float = 1.0) -> None:
    """End the worker (and its process group) as soon as its parent is gone, even in the middle
    of a measurement (end of input is only seen between requests)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(grace_s)
        _orphaned()
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # from here on, anything written to stdout (vLLM's log) lands on stderr
    sys.stdout = sys.stderr
    if "--probe" in argv:
        try:
            info: dict[str, Any] = {"ok": True, **probe()}
        except Exception as exc:  # vllm missing or broken: say why
            info = {"ok": False, "error": f"{type(exc).__name__}: {_one_line(exc)}"}
        out.write(json.dumps(info) + "\n")
        out.flush()
        return 0
    _watch_parent()
    worker = Worker(out)
    asked_to_exit = False
    try:
        for line in sys.stdin:
            if line.strip() and not worker.handle(line):
                asked_to_exit = True
                break
    finally:
        worker.close()
        if asked_to_exit:
            _end_group()
        else:  # end of input: the parent is gone or gave up on us
            _orphaned()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (vLLM's atexit hooks can hang without an engine)
