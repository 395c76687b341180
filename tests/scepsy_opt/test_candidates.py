"""Candidates: every way to serve each LLM, priced (:mod:`scepsy_opt.planning.candidates`)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("seed, blocks, current", [(0, False, False), (3, False, True),
                                                   (5, True, False), (8, True, True)])
def test_every_scanned_candidate_is_priced_like_price(seed: int, blocks: bool, current: bool) -> None:
    """The per-shape scan (named rows, batched over shares and replica counts) prices every
    candidate as :func:`price` prices that candidate's instance alone (one code path per
    candidate, no batching), within 1e-9 relative; with a current allocation, the change
    penalty too. Unpruned, so every scanned row is checked."""
    from dataclasses import replace

    from scepsy_opt.allocation import Allocation
    from scepsy_opt.planning.candidates import generate_candidates, price
    from scepsy_opt.planning.instances import random_problem
    from scepsy_profile import roofline_model

    p = random_problem(3, 4, roofline_model(), seed=seed, workflows=2, gpus_per_node=4)
    if current:
        first = {m: c[0] for m, c in generate_candidates(p).by_llm.items() if c}
        if len(first) == len(p.llms):
            p = replace(p, options=replace(p.options, change_penalty_s=0.25, current=Allocation(
                {m: c.instance for m, c in first.items()})))
    cset = generate_candidates(p, prune=False, blocks=blocks)
    any_ = {m: c[0] for m, c in cset.by_llm.items() if c}
    assert len(any_) == len(p.llms) and cset.generated == cset.kept > len(p.llms)
    checked = 0
    for m, cands in cset.by_llm.items():
        for c in cands[:: max(1, len(cands) // 25)]:
            alone = price(p, Allocation({**{k: v.instance for k, v in any_.items()},
                                         m: c.instance}))[m]
            assert (alone.gpu, alone.tp, alone.share, alone.replicas) == (c.gpu, c.tp, c.share,
                                                                          c.replicas)
            if not blocks:  # blocks count whole GPUs: units of full blocks, not of the shares
                assert alone.units == c.units
            assert alone.mu == pytest.approx(c.mu, rel=1e-12)
            for a, b in ((alone.call_latency_s, c.call_latency_s), (alone.latency_s, c.latency_s),
                         (alone.change_s, c.change_s)):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
            assert dict(alone.workflow_latency_s) == pytest.approx(dict(c.workflow_latency_s),
                                                                   rel=1e-9)
            checked += 1
    assert checked > 10
