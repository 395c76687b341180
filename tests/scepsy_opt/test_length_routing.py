"""Length routing (docs/min-cost.md, "Routing by request length"): an LLM's calls split by
prompt length into groups, each with the statistics of its own calls.

Oracles: the statistics of a group are checked against figures computed directly from the
trace's calls (calls per request, token means, critical-path time), and sums over the groups
against the LLM's own statistics. Floats compared with a relative tolerance of 1e-9."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scepsy_common.errors import InputError
from scepsy_opt.stats import (
    critical_path,
    in_range,
    length_edges,
    length_key,
    length_split,
    split_stats,
    workflow_stats,
)
from scepsy_opt.traces import CallRecord, Trace

REL = 1e-9


def _trace(seed: int, requests: int = 30) -> Trace:
    """Requests of a workflow ``w`` with calls of LLMs ``a`` and ``b`` and a tool: a random
    chain with some calls in parallel, random prompt and output lengths."""
    rnd = random.Random(seed)
    calls = []
    for r in range(requests):
        t, prev, k = 0.0, (), 0
        for _ in range(rnd.randint(1, 5)):
            fan = rnd.randint(1, 3)
            ids = []
            for _ in range(fan):
                llm = rnd.choice(["a", "a", "b", None])
                d = rnd.uniform(0.1, 2.0)
                cid = f"c{k}"
                k += 1
                calls.append(CallRecord(
                    "w", f"r{r}", cid, t + rnd.uniform(0, 0.2), t + d, llm=llm,
                    tool=None if llm else "search", parents=prev,
                    input_tokens=rnd.choice([0, 1, 5, 50, 120, 400, 2000]) if llm else 0,
                    output_tokens=rnd.randint(1, 300) if llm else 0))
                ids.append(cid)
            t += 2.1
            prev = tuple(ids)
    return Trace(tuple(calls))


RANGES = {"a-short": (0, 50), "a-mid": (50, 400), "a-long": (400, None)}


@pytest.mark.parametrize("seed", range(5))
def test_each_group_has_the_statistics_of_its_own_calls(seed):
    tr = _trace(seed)
    st = workflow_stats(tr, "w")
    groups, cols = length_split(st, "a", RANGES)
    R = st.requests
    mine = [c for c in tr.calls if c.llm == "a"]
    paths = {k: critical_path(v) for k, v in tr.requests.items()}
    for g, rng in RANGES.items():
        own = [c for c in mine if in_range(c.input_tokens, rng)]
        if not own:
            assert g not in groups
            continue
        s = groups[g]
        assert s.n == pytest.approx(len(own) / R, rel=REL)
        assert s.input_mean == pytest.approx(np.mean([c.input_tokens for c in own]), rel=REL)
        assert s.output_mean == pytest.approx(np.mean([c.output_tokens for c in own]), rel=REL)
        assert s.mean_call_s == pytest.approx(np.mean([c.duration_s for c in own]), rel=REL)
        on_path = [c for p in paths.values() for c in p if c.llm == "a"
                   and in_range(c.input_tokens, rng)]
        assert s.critical_calls == pytest.approx(len(on_path) / R, rel=REL)
        assert s.critical_s == pytest.approx(sum(c.duration_s for c in on_path) / R, rel=REL)
        # the path column, in units of the group's mean call, gives its critical time back
        assert np.mean(cols[g]) * s.mean_call_s == pytest.approx(s.critical_s, rel=REL)
    # the groups together are the LLM
    a = st.llms["a"]
    assert math.fsum(s.n for s in groups.values()) == pytest.approx(a.n, rel=REL)
    assert math.fsum(s.critical_s for s in groups.values()) == pytest.approx(a.critical_s, rel=REL)
    per_req = sum(cols[g] * groups[g].mean_call_s for g in groups)
    i = st.paths.llms.index("a")
    assert np.allclose(per_req, st.paths.weights[:, i] * a.mean_call_s, rtol=REL, atol=1e-12)


def test_one_range_over_every_length_is_the_llm_itself():
    st = workflow_stats(_trace(7), "w", bootstrap=0)
    groups, cols = length_split(st, "a", {"all": (0, None)})
    a, g = st.llms["a"], groups["all"]
    for f in ("n", "p", "rounds", "critical_calls", "critical_s", "input_mean", "input_std",
              "output_mean", "output_std", "time_share", "mean_call_s", "longest_tokens"):
        assert getattr(g, f) == pytest.approx(getattr(a, f), rel=REL), f
    assert np.allclose(cols["all"], st.paths.weights[:, st.paths.llms.index("a")], rtol=REL)


def test_split_stats_routes_by_length_and_leaves_other_llms_alone():
    st = workflow_stats(_trace(3), "w")
    out = split_stats(st, {"a": {g: 1 / 3 for g in RANGES}}, {"a": RANGES})
    assert "a" not in out.llms and out.llms["b"] == st.llms["b"]
    assert set(out.paths.llms) == {"b", *(g for g in RANGES if g in out.llms)}
    assert np.array_equal(out.paths.weights[:, out.paths.llms.index("b")],
                          st.paths.weights[:, st.paths.llms.index("b")])


@pytest.mark.parametrize(("buckets", "seed"), [(1, 0), (2, 1), (4, 2), (8, 3), (50, 4)])
def test_length_edges_make_nonempty_buckets_of_about_equal_size(buckets, seed):
    st = workflow_stats(_trace(seed, 60), "w")
    edges = length_edges({"w": st}, "a", buckets)
    keys = sorted(length_key(c.input_tokens) for c in st.calls if c.llm == "a")
    assert list(edges) == sorted(set(edges)) and len(edges) <= buckets - 1
    bounds = [0, *edges, None]
    counts = [sum(in_range(k, (lo, hi)) for k in keys) for lo, hi in zip(bounds, bounds[1:])]
    assert all(c > 0 for c in counts) and sum(counts) == len(keys)
    # every edge is a recorded length at its quantile: below it, at least k/B of the calls
    # when no two edges merged (distinct lengths are few here, so they often do)
    for e in edges:
        assert e in keys


def test_ranges_must_cover_every_length_once_and_need_a_trace():
    st = workflow_stats(_trace(1), "w")
    for bad in ({"x": (0, 50), "y": (60, None)}, {"x": (0, 50)}, {"x": (1, None)},
                {"x": (0, None), "y": (5, None)}):
        with pytest.raises(InputError, match="length routing"):
            length_split(st, "a", bad)
    from dataclasses import replace
    with pytest.raises(InputError, match="computed from a trace"):
        length_split(replace(st, calls=()), "a", RANGES)
