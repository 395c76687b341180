"""Live telemetry for ``scepsy control`` (docs/control.md): what the gateway and the replicas'
vLLM servers say, read over HTTP and turned into one
:class:`~scepsy_serve.control.core.WindowStats` per window.

Sources (Prometheus text, read with ``prometheus_client``'s parser):

* the gateway's ``/metrics``: ``scepsy_gateway_requests_total{workflow}`` (new workflow
  requests; its increase over a window divided by the window is the workflow's rate) and
  ``scepsy_gateway_call_latency_seconds{workflow,llm}`` (a histogram; its increase over the
  window gives each LLM's p90 call latency, Prometheus's ``histogram_quantile``);
* every replica's vLLM ``/metrics``: ``vllm:num_requests_waiting`` (a gauge, read at every poll;
  an LLM's queue is the sum over its replicas, averaged over the window's polls).

Counters only grow, except when their process restarts: an ``after`` below ``before`` counts
from 0 (the increase is ``after``), as Prometheus's ``increase()`` does. The arithmetic is in pure
functions (:func:`counter_increase`, :func:`window_stats`), tested without HTTP; :class:`Telemetry`
does the reads (``httpx``, asynchronous, every source at once).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from scepsy_profile.profiling.server import HistogramDelta
from scepsy_serve.control.core import WindowStats

REQUESTS = "scepsy_gateway_requests_total"
CALL_LATENCY = "scepsy_gateway_call_latency_seconds"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
QUANTILE = 0.9


@dataclass(frozen=True)
class GatewaySample:
    """One read of the gateway's ``/metrics``: requests per workflow, and per LLM its call
    latency histogram (summed over workflows): ``le -> cumulative count``, with count and sum."""

    requests: Mapping[str, float]
    latency_buckets: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    latency_count: Mapping[str, float] = field(default_factory=dict)
    latency_sum: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Scrape:
    """Every source read once, at ``at_s`` (seconds on the controller's clock). ``gateway`` is
    None when the gateway did not answer; ``waiting`` holds the LLMs whose every replica
    answered (sum of ``vllm:num_requests_waiting`` over its replicas)."""

    at_s: float
    gateway: GatewaySample | None
    waiting: Mapping[str, float] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


def parse_gateway(text: str) -> GatewaySample:
    """The gateway's ``/metrics`` text as a :class:`GatewaySample` (label sets kept apart where
    they matter: workflow for requests, LLM for the latency histogram)."""
    requests: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    count: dict[str, float] = {}
    total: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == REQUESTS:
                wf = s.labels.get("workflow", "")
                requests[wf] = requests.get(wf, 0.0) + float(s.value)
            elif s.name == CALL_LATENCY + "_bucket":
                llm = s.labels.get("llm", "")
                le = float(s.labels["le"])
                b = buckets.setdefault(llm, {})
                b[le] = b.get(le, 0.0) + float(s.value)
            elif s.name == CALL_LATENCY + "_count":
                llm = s.labels.get("llm", "")
                count[llm] = count.get(llm, 0.0) + float(s.value)
            elif s.name == CALL_LATENCY + "_sum":
                llm = s.labels.get("llm", "")
                total[llm] = total.get(llm, 0.0) + float(s.value)
    return GatewaySample(requests, buckets, count, total)


def parse_waiting(text: str) -> float:
    """``vllm:num_requests_waiting`` of one replica's ``/metrics`` (summed over its engines)."""
    out = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == WAITING:
                out += float(s.value)
    return out


def counter_increase(before: float, after: float) -> float:
    """A counter's increase from ``before`` to ``after``: ``after - before``, or ``after`` when
    it went down (its process restarted and counted from 0 again)."""
    return after - before if after >= before else after


def histogram_increase(before: Mapping[float, float], after: Mapping[float, float],
                       before_count: float, after_count: float) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The observations of a histogram between two reads: ``(count, ((le, cumulative), ...))``
    in ``le`` order; after a restart (the count went down) everything ``after`` holds."""
    if after_count < before_count:
        return after_count, tuple(sorted(after.items()))
    rows = tuple((le, max(0.0, c - before.get(le, 0.0))) for le, c in sorted(after.items()))
    return after_count - before_count, rows


def window_stats(first: Scrape, last: Scrape, polls: Sequence[Scrape] = (), *,
                 workflows: Sequence[str] = (), q: float = QUANTILE) -> WindowStats:
    """The :class:`~scepsy_serve.control.core.WindowStats` of the window from ``first`` to
    ``last``: each workflow's rate (its requests' increase over the window's length; every one of
    ``workflows`` appears, 0 where the gateway has not seen it), each LLM's ``q`` call latency
    (Prometheus's ``histogram_quantile`` of the increase; left out where no call finished) and
    its mean queue over ``polls`` (default: ``first`` and ``last``). A window without both
    gateway reads has no rates (:class:`ValueError`: it cannot be judged)."""
    if first.gateway is None or last.gateway is None:
        raise ValueError("the gateway's /metrics did not answer at both ends of the window")
    span = last.at_s - first.at_s
    if not span > 0:
        raise ValueError(f"a window of {span} s")
    g0, g1 = first.gateway, last.gateway
    names = sorted(set(workflows) | set(g1.requests))
    rates = {w: counter_increase(g0.requests.get(w, 0.0), g1.requests.get(w, 0.0)) / span
             for w in names}
    latency: dict[str, float] = {}
    for llm, after in g1.latency_buckets.items():
        n, rows = histogram_increase(g0.latency_buckets.get(llm, {}), after,
                                     g0.latency_count.get(llm, 0.0),
                                     g1.latency_count.get(llm, 0.0))
        if n <= 0:
            continue
        value = HistogramDelta(llm, n, 0.0, rows).quantile(q)
        if value is not None and math.isfinite(value):
            latency[llm] = value
    reads = list(polls) or [first, last]
    queue: dict[str, float] = {}
    for llm in sorted({m for s in reads for m in s.waiting}):
        seen = [s.waiting[llm] for s in reads if llm in s.waiting]
        queue[llm] = sum(seen) / len(seen)
    return WindowStats(start_s=first.at_s, end_s=last.at_s,
                       workflow_rates=MappingProxyType(rates),
                       llm_queue=MappingProxyType(queue), llm_latency_s=MappingProxyType(latency))


class Telemetry:
    """Reads the gateway's and the replicas' ``/metrics`` (:meth:`scrape`). ``replicas``: LLM ->
    the base URLs of its servers (``http://host:port``, with or without ``/v1``); change it with
    :meth:`set_replicas` when the plan changes. Times are seconds since ``t0`` (monotonic)."""

    def __init__(self, gateway_url: str, replicas: Mapping[str, Sequence[str]], *,
                 client: httpx.AsyncClient, timeout_s: float = 5.0,
                 t0: float | None = None) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self.client = client
        self.timeout_s = timeout_s
        self.t0 = time.monotonic() if t0 is None else t0
        self.set_replicas(replicas)

    def set_replicas(self, replicas: Mapping[str, Sequence[str]]) -> None:
        self.replicas = {m: tuple(server_root(u) for u in urls) for m, urls in replicas.items()}

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def _text(self, url: str) -> str:
        resp = await self.client.get(url + "/metrics", timeout=self.timeout_s)
        resp.raise_for_status()
        return resp.text

    async def scrape(self) -> Scrape:
        """Every source at once; a source that fails is named in ``errors`` (its LLM's queue, or
        the gateway sample, left out), never raised."""
        at = self.now()
        urls = [(m, u) for m, us in self.replicas.items() for u in us]
        results = await asyncio.gather(self._text(self.gateway_url),
                                       *(self._text(u) for _, u in urls),
                                       return_exceptions=True)
        errors: list[str] = []
        gateway: GatewaySample | None = None
        head = results[0]
        if isinstance(head, BaseException):
            errors.append(f"{self.gateway_url}/metrics: {_why(head)}")
        else:
            try:
                gateway = parse_gateway(head)
            except ValueError as exc:
                errors.append(f"{self.gateway_url}/metrics: {exc}")
        waiting: dict[str, float] = {}
        failed: set[str] = set()
        for (m, u), res in zip(urls, results[1:], strict=True):
            try:
                if isinstance(res, BaseException):
                    raise res
                waiting[m] = waiting.get(m, 0.0) + parse_waiting(res)
            except (httpx.HTTPError, ValueError, OSError) as exc:
                errors.append(f"{u}/metrics: {_why(exc)}")
                failed.add(m)
        for m in failed:
            waiting.pop(m, None)
        return Scrape(at, gateway, MappingProxyType(waiting), tuple(errors))


def server_root(url: str) -> str:
    """A server's root URL from its OpenAI base URL (``.../v1`` dropped)."""
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
