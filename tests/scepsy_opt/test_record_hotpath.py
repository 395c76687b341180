"""The recording proxy's per-call shortcuts agree with the general functions they stand for:
:func:`~scepsy_opt.ingest.record.client_gap` writes what
:func:`~scepsy_opt.traces.with_client_time` writes for a call after its parents."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_opt.ingest.record import client_gap
from scepsy_opt.traces import (
    CLIENT_MIN_GAP_S,
    CallRecord,
    CompletedCalls,
    with_client_time,
)

_TIMES = st.floats(min_value=0.0, max_value=0.05, allow_nan=False)
"""Times around CLIENT_MIN_GAP_S (5 ms), so that gaps fall on both sides of it."""


@st.composite
def _request(draw: st.DrawFn) -> tuple[list[CallRecord], CallRecord]:
    """Completed calls of one request and a new call of it (ids that may collide with the
    ``.client`` id the gap would take)."""
    n = draw(st.integers(0, 6))
    ids = draw(st.lists(st.sampled_from(["c0", "c1", "c2", "c9.client", "c9.client_", "c3"]),
                        min_size=n, max_size=n, unique=True))
    done = []
    for cid in ids:
        start = draw(_TIMES)
        done.append(CallRecord("w", "r", cid, start, start + draw(_TIMES), llm="m",
                               error=draw(st.sampled_from([None, None, "upstream_500"]))))
    start = draw(_TIMES)
    rec = CallRecord("w", "r", "c9", start, start + draw(_TIMES), llm="m", input_tokens=3,
                     error=draw(st.sampled_from([None, None, "upstream_503"])))
    return done, rec


@settings(max_examples=400, deadline=None)
@given(_request())
def test_client_gap_writes_what_with_client_time_writes(req: tuple[list[CallRecord],
                                                                    CallRecord]) -> None:
    done_calls, rec = req
    done = CompletedCalls(done_calls)
    rec = replace(rec, parents=done.parents_of(rec))
    parents = [replace(done.by_id[p], parents=()) for p in rec.parents]
    expected = with_client_time([*parents, rec])[len(parents):]
    assert client_gap(rec, done.by_id) == expected


def test_a_long_gap_becomes_a_client_call_and_a_short_one_does_not() -> None:
    parent = CallRecord("w", "r", "c0", 0.0, 1.0, llm="m")
    done = CompletedCalls([parent])
    late = CallRecord("w", "r", "c1", 1.0 + 2 * CLIENT_MIN_GAP_S, 2.0, llm="m", parents=("c0",))
    gap, call = client_gap(late, done.by_id)
    assert (gap.tool, gap.start_s, gap.end_s, gap.parents) == ("client", 1.0, late.start_s,
                                                                 ("c0",))
    assert call.parents == (gap.call_id,)
    soon = replace(late, start_s=1.0 + CLIENT_MIN_GAP_S / 2)
    assert client_gap(soon, done.by_id) == (soon,)
