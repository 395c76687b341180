"""Replay calls against an OpenAI-compatible ``/v1/completions`` endpoint, streaming.

The serving-curve measurement (:mod:`scepsy_profile.profiling.servecurve`) offers calls at a
Poisson rate and records what each one saw. This module is its client:

* :class:`LengthDist`: a token-length distribution (constant, exponential, lognormal or an
  empirical list), sampled with a seeded :class:`numpy.random.Generator`;
* :func:`poisson_schedule`: the calls to send, with their send offsets and lengths; a pure
  function of its arguments (same seed, same schedule);
* :func:`replay` / :func:`run_replay`: send them with httpx (async, one connection pool), each at
  its offset, and record per call the send time, time to first token, per-token time, end-to-end
  time, tokens received and, for a call that went wrong, its :data:`FailureKind`. Failures are
  recorded, never raised.

Prompts are token ids (``"prompt": [ids]``), so the server needs no tokenizer (vLLM's
``--skip-tokenizer-init``); ``ignore_eos`` with ``min_tokens = max_tokens`` makes every call
generate exactly its output length, and ``return_token_ids`` makes each streamed chunk carry its
token ids (with no tokenizer the text is empty), which is how tokens are counted.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import httpx
import numpy as np
from numpy.typing import NDArray

from scepsy_common.errors import InputError
from scepsy_common.net import CLIENT_KEEPALIVE_S

FailureKind = Literal["timeout", "http_5xx", "http_4xx", "malformed", "connection", "short_stream"]
"""Why a call failed: no complete answer in time (``timeout``: the whole call, or a stall between
chunks), an HTTP error status, a body that is not the SSE stream of JSON chunks it should be
(``malformed``), no connection or a connection lost before the answer began (``connection``), or a
stream that ended (closed, or ``[DONE]``) with fewer tokens than asked (``short_stream``)."""

FAILURE_KINDS: tuple[FailureKind, ...] = ("timeout", "http_5xx", "http_4xx", "malformed",
                                          "connection", "short_stream")

DistKind = Literal["constant", "exponential", "lognormal", "empirical"]

_SOURCE = "length distribution"


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Token lengths of calls: ``constant`` (always ``mean``), ``exponential`` (mean ``mean``),
    ``lognormal`` (mean ``mean``, log-space standard deviation ``sigma``) or ``empirical`` (drawn
    uniformly from ``values``). Samples are rounded and clipped to ``[minimum, maximum]``."""

    kind: DistKind
    mean: float = 0.0
    sigma: float = 0.0
    values: tuple[int, ...] = ()
    minimum: int = 1
    maximum: int = 1_000_000

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "exponential", "lognormal", "empirical"):
            raise InputError(_SOURCE, "kind", "constant, exponential, lognormal or empirical",
                             self.kind)
        for name in ("minimum", "maximum"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise InputError(_SOURCE, name, "an integer >= 1", v)
        if self.maximum < self.minimum:
            raise InputError(_SOURCE, "maximum", f"an integer >= minimum ({self.minimum})",
                             self.maximum)
        if self.kind == "empirical":
            vals = tuple(self.values)
            if not vals or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                   for v in vals):
                raise InputError(_SOURCE, "values", "a non-empty list of integers >= 1",
                                 self.values)
            object.__setattr__(self, "values", vals)
            return
        if not (isinstance(self.mean, (int, float)) and math.isfinite(self.mean)
                and self.mean >= 1):
            raise InputError(_SOURCE, "mean", "a number of tokens >= 1", self.mean)
        if self.kind == "lognormal" and not (math.isfinite(self.sigma) and 0 < self.sigma <= 5):
            raise InputError(_SOURCE, "sigma", "a log-space standard deviation in (0, 5]",
                             self.sigma)

    @classmethod
    def constant(cls, tokens: int) -> LengthDist:
        return cls("constant", mean=float(tokens))

    @classmethod
    def exponential(cls, mean: float, *, maximum: int = 1_000_000) -> LengthDist:
        return cls("exponential", mean=float(mean), maximum=maximum)

    @classmethod
    def lognormal(cls, mean: float, sigma: float, *, maximum: int = 1_000_000) -> LengthDist:
        return cls("lognormal", mean=float(mean), sigma=float(sigma), maximum=maximum)

    @classmethod
    def empirical(cls, values: Sequence[int]) -> LengthDist:
        return cls("empirical", values=tuple(values))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        """``n`` lengths drawn with ``rng``."""
        if self.kind == "constant":
            raw = np.full(n, self.mean)
        elif self.kind == "exponential":
            raw = rng.exponential(self.mean, n)
        elif self.kind == "lognormal":  # E[X] = exp(m + s²/2) = mean
            raw = rng.lognormal(math.log(self.mean) - self.sigma**2 / 2.0, self.sigma, n)
        else:
            raw = rng.choice(np.asarray(self.values, dtype=float), n)
        return np.clip(np.rint(raw), self.minimum, self.maximum).astype(np.int64)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "mean": self.mean, "sigma": self.sigma,
                "values": list(self.values), "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One call to send: ``offset_s`` after the start, a prompt of token ids, and the number of
    output tokens to generate."""

    index: int
    offset_s: float
    prompt: tuple[int, ...]
    output_tokens: int

    @property
    def input_tokens(self) -> int:
        return len(self.prompt)


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """``n`` arrival times of a Poisson process of ``rate`` per second, the first at 0
    (exponential gaps of mean ``1 / rate``)."""
    gaps = rng.exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def stepped_poisson_arrivals(rate: float, steps: Sequence[tuple[float, float]], n: int,
                             rng: np.random.Generator) -> NDArray[np.float64]:
    """``n`` arrival times of a Poisson process whose rate is ``rate`` from 0 and then each
    ``(at_s, rate)`` of ``steps`` from ``at_s`` on (``at_s`` increasing, > 0), the first arrival
    at 0: the unit-rate process of :func:`poisson_arrivals` mapped through the inverse of the
    cumulative rate (time rescaling): without steps, the times of :func:`poisson_arrivals` for the same
    generator state, up to rounding."""
    unit = poisson_arrivals(1.0, n, rng)
    starts = np.array([0.0, *(float(a) for a, _ in steps)])
    rates = np.array([float(rate), *(float(r) for _, r in steps)])
    # cumulative rate at each piece's start
    cum = np.concatenate(([0.0], np.cumsum(rates[:-1] * np.diff(starts))))
    piece = np.searchsorted(cum, unit, side="right") - 1
    return starts[piece] + (unit - cum[piece]) / rates[piece]


def async_client(timeouts: ReplayTimeouts, max_connections: int) -> httpx.AsyncClient:
    """The HTTP client of a replay or a drive: ``max_connections`` pooled connections and the
    ``timeouts`` (connect; stall for reads and writes; the whole call for a pool slot); idle
    connections kept for :data:`~scepsy_common.net.CLIENT_KEEPALIVE_S`."""
    limits = httpx.Limits(max_connections=max_connections,
                          max_keepalive_connections=max_connections,
                          keepalive_expiry=CLIENT_KEEPALIVE_S)
    timeout = httpx.Timeout(connect=timeouts.connect_s, read=timeouts.stall_s,
                            write=timeouts.stall_s, pool=timeouts.call_s)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


def poisson_schedule(rate: float, inputs: LengthDist, outputs: LengthDist, *, seed: int,
                     n_calls: int | None = None, duration_s: float | None = None,
                     vocab: int = 1000, first_token: int = 3) -> tuple[CallSpec, ...]:
    """Calls arriving as a Poisson process of ``rate`` calls/s, for ``n_calls`` calls or for
    ``duration_s`` seconds (whichever are given; both: the first reached). Prompt token ids are
    drawn uniformly from ``[first_token, vocab)`` (ids below ``first_token`` are left to special
    tokens). Deterministic in ``seed``."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise InputError("replay", "rate", "a number of calls/s > 0", rate)
    if n_calls is None and duration_s is None:
        raise InputError("replay", "n_calls/duration_s", "a number of calls or a duration", None)
    if n_calls is not None and not (isinstance(n_calls, int) and n_calls >= 1):
        raise InputError("replay", "n_calls", "an integer >= 1", n_calls)
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise InputError("replay", "duration_s", "a number of seconds > 0", duration_s)
    if not (isinstance(vocab, int) and vocab > first_token >= 0):
        raise InputError("replay", "vocab", f"an integer > first_token ({first_token})", vocab)
    rng = np.random.default_rng(seed)
    # without n_calls, duration_s is given (checked above)
    cap = n_calls if n_calls is not None else max(
        16, math.ceil(rate * cast(float, duration_s) * 2 + 50))
    offsets = poisson_arrivals(rate, cap, rng)
    if duration_s is not None:
        offsets = offsets[offsets < duration_s]
    n = len(offsets)
    ins, outs = inputs.sample(rng, n), outputs.sample(rng, n)
    return tuple(
        CallSpec(index=i, offset_s=float(offsets[i]),
                 prompt=tuple(int(t) for t in rng.integers(first_token, vocab, int(ins[i]))),
                 output_tokens=int(outs[i]))
        for i in range(n))


@dataclass(frozen=True, slots=True)
class CallResult:
    """What one call saw. Times are seconds; ``send_s`` is from the replay's start, the others
    from the call's own send. ``failure`` is None for a complete answer."""

    index: int
    send_s: float
    input_tokens: int
    output_tokens: int
    """Tokens asked for."""
    tokens: int = 0
    """Tokens received."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_times_s: tuple[float, ...] = ()
    """Arrival time of each token received (a chunk's tokens share its time)."""
    failure: FailureKind | None = None
    detail: str = ""
    status: int | None = None
    """HTTP status (None when no response came)."""

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: ``(last − first) / (tokens − 1)``."""
        if len(self.token_times_s) < 2:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (len(self.token_times_s) - 1)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "send_s": self.send_s, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "tokens": self.tokens,
                "ttft_s": self.ttft_s, "e2e_s": self.e2e_s, "tpot_s": self.tpot_s,
                "failure": self.failure, "detail": self.detail, "status": self.status}


@dataclass(frozen=True, slots=True)
class ReplayTimeouts:
    """``connect_s``: to open a connection; ``stall_s``: the longest wait for the next bytes;
    ``call_s``: the whole call. Beyond any, the call is a ``timeout`` failure."""

    connect_s: float = 10.0
    stall_s: float = 60.0
    call_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "stall_s", "call_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError("replay", f"timeouts.{name}", "a number of seconds > 0", v)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Every call's result (in schedule order) and the replay's wall time."""

    calls: tuple[CallResult, ...]
    started_at: float
    """``time.time()`` at the start."""
    wall_s: float
    """From the first send to the last call's end."""
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def ok_calls(self) -> tuple[CallResult, ...]:
        return tuple(c for c in self.calls if c.ok)


class _Failed(Exception):
    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def completion_body(call: CallSpec, model: str) -> dict[str, Any]:
    """The ``/v1/completions`` request of one call (token-id prompt, exact output length)."""
    return {"model": model, "prompt": list(call.prompt), "max_tokens": call.output_tokens,
            "min_tokens": call.output_tokens, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}


def _chunk_tokens(line: str) -> int | None:
    """Tokens carried by one SSE ``data:`` payload; None for ``[DONE]``."""
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _Failed("malformed", f"not JSON: {payload[:80]!r}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        raise _Failed("malformed", f"no choices list: {payload[:80]!r}")
    n = 0
    for ch in obj["choices"]:
        if not isinstance(ch, dict):
            raise _Failed("malformed", f"choice is not an object: {payload[:80]!r}")
        ids = ch.get("token_ids")
        if isinstance(ids, list):
            n += len(ids)
        elif ch.get("text"):
            n += 1
    return n


async def _stream_call(client: httpx.AsyncClient, url: str, body: dict[str, Any], t0: float,
                       times: list[float], status: list[int],
                       headers: Mapping[str, str] | None = None) -> bool:
    """Send one call and read its stream; fills ``times`` with token arrival times (from
    ``t0``); True when the stream ended with ``[DONE]``."""
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        status.append(resp.status_code)
        if resp.status_code >= 400:
            text = (await resp.aread())[:200].decode(errors="replace")
            kind: FailureKind = "http_5xx" if resp.status_code >= 500 else "http_4xx"
            raise _Failed(kind, f"HTTP {resp.status_code}: {text}")
        async for line in resp.aiter_lines():
            if not line or line.startswith(":"):
                continue
            if not line.startswith("data:"):
                raise _Failed("malformed", f"not an SSE data line: {line[:80]!r}")
            n = _chunk_tokens(line)
            if n is None:
                return True
            now = time.perf_counter() - t0
            times.extend([now] * n)
    return False


async def replay_call(client: httpx.AsyncClient, url: str, call: CallSpec, model: str,
                      timeouts: ReplayTimeouts, send_s: float,
                      headers: Mapping[str, str] | None = None) -> CallResult:
    """Send one call now and return what it saw (never raises for a failed call); ``headers``
    go with it (the driver's ``X-Scepsy-Request`` and ``X-Scepsy-Workflow``, which a gateway
    reads)."""
    t0 = time.perf_counter()
    times: list[float] = []
    status: list[int] = []
    failure: FailureKind | None = None
    detail = ""
    try:
        async with asyncio.timeout(timeouts.call_s):
            done = await _stream_call(client, url, completion_body(call, model), t0, times,
                                      status, headers)
        if len(times) < call.output_tokens:
            failure = "short_stream"
            detail = (f"{len(times)} of {call.output_tokens} tokens, "
                      f"{'[DONE]' if done else 'no [DONE]'}")
    except _Failed as exc:
        failure, detail = exc.kind, exc.detail
    except (TimeoutError, httpx.TimeoutException) as exc:
        failure, detail = "timeout", f"{type(exc).__name__} after {len(times)} tokens"
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        # the connection broke: before the answer began it is a connection failure, after, the
        # stream was cut short
        failure = "short_stream" if status else "connection"
        detail = f"{type(exc).__name__}: {exc} after {len(times)} tokens"
    except httpx.TransportError as exc:
        failure, detail = "connection", f"{type(exc).__name__}: {exc}"
    except httpx.DecodingError as exc:
        failure, detail = "malformed", f"{type(exc).__name__}: {exc}"
    e2e = time.perf_counter() - t0
    return CallResult(
        index=call.index, send_s=send_s, input_tokens=call.input_tokens,
        output_tokens=call.output_tokens, tokens=len(times),
        ttft_s=times[0] if times else None, e2e_s=e2e if failure is None else None,
        token_times_s=tuple(times), failure=failure, detail=detail,
        status=status[0] if status else None)


async def replay(base_url: str, calls: Sequence[CallSpec], *, model: str,
                 timeouts: ReplayTimeouts = ReplayTimeouts(),
                 max_connections: int = 1024) -> ReplayResult:
    """Send ``calls`` to ``base_url``'s ``/v1/completions``, each at its offset from now (an
    open loop: a slow server does not slow the arrivals), and wait for all of them."""
    url = base_url.rstrip("/") + "/v1/completions"
    started_at = time.time()
    async with async_client(timeouts, max_connections) as client:
        t0 = time.perf_counter()

        async def one(call: CallSpec) -> CallResult:
            delay = call.offset_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            return await replay_call(client, url, call, model, timeouts,
                                     time.perf_counter() - t0)

        results = await asyncio.gather(*(one(c) for c in calls))
        wall = time.perf_counter() - t0
    failures: dict[str, int] = {}
    for r in results:
        if r.failure:
            failures[r.failure] = failures.get(r.failure, 0) + 1
    return ReplayResult(calls=tuple(results), started_at=started_at, wall_s=wall,
                        failures=failures)


def run_replay(base_url: str, calls: Sequence[CallSpec], *, model: str,
               timeouts: ReplayTimeouts = ReplayTimeouts()) -> ReplayResult:
    """:func:`replay` from synchronous code (its own event loop)."""
    return asyncio.run(replay(base_url, calls, model=model, timeouts=timeouts))
