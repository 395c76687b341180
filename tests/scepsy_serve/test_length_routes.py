"""Length routing at launch (docs/gateway.md, "Routing by prompt length"): plan.json's
``lengths`` reach every target's routes.json as each endpoint's ``tokens`` range, and the
gateway sends each call to an endpoint whose range holds its estimated prompt tokens.

Oracles: the prompt estimate against counts made by hand; the gateway's choice against
:func:`scepsy_opt.stats.in_range` of the estimate, call by call."""

from __future__ import annotations

import asyncio
import json
import math
import random

import aiohttp
import pytest
from test_control_gateway import Upstream, gateway

from scepsy_common.errors import InputError
from scepsy_opt.stats import in_range
from scepsy_serve.gateway import CHARS_PER_TOKEN, prompt_tokens
from scepsy_serve.launch.routes import parse_routes


@pytest.mark.parametrize(("body", "tokens"), [
    ({"prompt": [5, 6, 7]}, 3),
    ({"prompt": [[1, 2], [3]]}, 3),
    ({"prompt": "x" * 10}, math.ceil(10 / CHARS_PER_TOKEN)),
    ({"prompt": ["abcd", "efgh"]}, 2),
    ({"messages": [{"role": "system", "content": "a" * 7},
                   {"role": "user", "content": [{"type": "text", "text": "b" * 9},
                                                {"type": "image_url", "image_url": {}}]}]},
     math.ceil(16 / CHARS_PER_TOKEN)),
    ({"messages": []}, 1), ({}, 1), ({"prompt": ""}, 1),
])
def test_prompt_tokens_counts_ids_or_characters(body, tokens):
    assert prompt_tokens(body) == tokens


def _doc(short, long, cut: int) -> dict:
    return {"version": 1, "workflows": {"rag": {"gen": [
        {"url": short.v1, "model": "gen-l4", "weight": 0.75, "replica": 0, "tokens": [0, cut]},
        {"url": long.v1, "model": "gen-a10", "weight": 0.25, "replica": 0,
         "tokens": [cut, None]}]}}}


def test_the_gateway_sends_each_call_to_the_range_of_its_prompt(tmp_path):
    """Random prompt lengths around the cut, chat and token-id prompts: every call reaches the
    endpoint whose range holds its estimate (not the 3:1 weights), named as that group."""
    rnd = random.Random(0)
    cut = 40
    with Upstream() as short, Upstream() as long, \
            gateway(tmp_path, _doc(short, long, cut)) as url:
        bodies = []
        for i in range(60):
            n = rnd.randint(1, 2 * cut)
            if i % 2:
                bodies.append({"model": "gen", "prompt": list(range(n)), "max_tokens": 2})
            else:
                bodies.append({"model": "gen", "max_tokens": 2, "messages": [
                    {"role": "user", "content": "y" * (n * CHARS_PER_TOKEN)}]})

        async def run() -> None:
            async with aiohttp.ClientSession() as s:
                for i, b in enumerate(bodies):
                    path = "/v1/completions" if "prompt" in b else "/v1/chat/completions"
                    async with s.post(url + path, json=b,
                                      headers={"X-Scepsy-Request": f"r{i}",
                                               "X-Scepsy-Workflow": "rag"}) as r:
                        assert r.status == 200
        asyncio.run(run())
    want_short = [b for b in bodies if in_range(prompt_tokens(b), (0, cut))]
    assert 0 < len(want_short) < len(bodies)
    assert len(short.bodies) == len(want_short)
    assert len(long.bodies) == len(bodies) - len(want_short)
    assert all(prompt_tokens(b) < cut and b["model"] == "gen-l4" for b in short.bodies)
    assert all(prompt_tokens(b) >= cut and b["model"] == "gen-a10" for b in long.bodies)


@pytest.mark.parametrize(("tokens", "field"), [
    ([[0, 40], [50, None]], "workflows.rag.gen.tokens"),
    ([[0, 40], None], "workflows.rag.gen[1].tokens"),
    ([[0, 40], [40, 80]], "workflows.rag.gen.tokens"),
    ([[1, 40], [40, None]], "workflows.rag.gen.tokens"),
])
def test_bad_token_ranges_name_the_field(tokens, field):
    doc = {"version": 1, "workflows": {"rag": {"gen": [
        {"url": f"http://h{i}:8000/v1", "model": "gen", "weight": 0.5, "replica": 0,
         "tokens": t} for i, t in enumerate(tokens)]}}}
    with pytest.raises(InputError) as exc:
        parse_routes(doc, "routes.json")
    assert exc.value.field.startswith(field)


def test_routes_round_trip_keeps_the_ranges():
    doc = {"version": 1, "workflows": {"rag": {"gen": [
        {"url": "http://a:8000/v1", "model": "gen-l4", "weight": 0.75, "replica": 0,
         "tokens": [0, 40]},
        {"url": "http://b:8000/v1", "model": "gen-a10", "weight": 0.25, "replica": 0,
         "tokens": [40, None]}]}}}
    r = parse_routes(doc, "routes.json")
    assert [e.tokens for e in r.endpoints("rag", "gen")] == [(0, 40), (40, None)]
    assert json.loads(r.dumps()) == doc


def test_a_length_routed_plan_reaches_every_targets_routes(tmp_path):
    """scepsy plan's min-cost with length routing on, 16 req/s of 8B with long prompts on L4
    and A10: the cheapest placed plan routes the LLM by length (a weight split costs more);
    plan.json carries the ranges; every launch target's routes.json gives each endpoint its
    group's range and its group's fraction of the weight."""
    from scepsy_opt.cluster import Cluster, GPUPool
    from scepsy_opt.planning.problem import PlanningProblem, PlanOptions
    from scepsy_opt.ratework import models, parse_rate_workload, rate_stats, rates
    from scepsy_place.formulations.loop import plan_and_place, plan_document
    from scepsy_place.packing.topology import from_cluster
    from scepsy_profile.roofline import roofline_model
    from scepsy_serve.launch.planfile import launch_plan, parse_plan
    from scepsy_serve.launch.renderers import get_renderer, renderer_names

    wl = parse_rate_workload({"kind": "rates", "name": "one", "llms": {"chat": {
        "model": "llama-3-8b", "rate": 16.0,
        "input": {"kind": "lognormal", "mean": 800, "cv": 2.0, "min": 4, "max": 7000},
        "output": {"kind": "exponential", "mean": 180, "min": 1, "max": 512}}}})
    cl = Cluster("two", (GPUPool("L4", 8, 1), GPUPool("A10", 8, 1)))
    p = PlanningProblem(rate_stats(wl, 200, seed=0), models(wl), rates(wl), cl,
                        roofline_model(), PlanOptions(objective="min-cost", time_limit_s=60,
                                                      length_routing=True))
    res = plan_and_place(p, from_cluster(cl))
    assert res.placed and res.formulation == "mixed"
    rep = res.plan.stats["length_routing"]
    assert rep["used"] and rep["with_length_cost_per_hour"] < rep["by_weight_cost_per_hour"]
    alloc = res.plan.allocation
    assert set(alloc.lengths) == {"chat"}
    doc = json.loads(json.dumps(plan_document(p, res, timings=False)))
    assert doc["allocation"]["lengths"] == {
        "chat": {g: list(r) for g, r in alloc.lengths["chat"].items()}}
    lp = launch_plan(parse_plan(doc, "plan.json"), "plan.json")
    for name in renderer_names():
        files = get_renderer(name).render(lp)
        routes = parse_routes(json.loads(files["routes.json"]), f"{name}/routes.json")
        eps = routes.endpoints("chat", "chat")
        assert {e.model for e in eps} == set(alloc.lengths["chat"]), name
        for e in eps:
            assert e.tokens == alloc.lengths["chat"][e.model], name
        for g, f in alloc.splits["chat"].items():
            assert math.isclose(sum(e.weight for e in eps if e.model == g), f,
                                rel_tol=1e-9), name


def test_the_driver_sends_each_call_to_the_range_of_its_prompt():
    """The workflow driver, without a gateway, draws each call's endpoint among those whose
    range holds its input tokens (the token ids it sends); an LLM without ranges keeps its
    weights."""
    from scepsy_opt.workflows import load_workflow
    from scepsy_serve.launch.drive import plan_drive
    from scepsy_serve.launch.routes import Endpoint, Routes

    spec = load_workflow("datasets/workflows/rag.yaml")
    llm = sorted(spec.llms)[-1]
    cut = 200
    eps = {m: (Endpoint("http://a:8000/v1", m, 1.0, 0),) for m in spec.llms}
    eps[llm] = (Endpoint("http://s:8000/v1", llm, 0.9, 0, (0, cut)),
                Endpoint("http://l:8000/v1", llm, 0.1, 0, (cut, None)))
    plan = plan_drive([spec], Routes({spec.name: eps}), rate=2.0, requests=40, seed=3)
    seen = {"s": 0, "l": 0}
    for req in plan.requests:
        for c, e in zip(req.calls, req.endpoints, strict=True):
            if c.llm == llm:
                assert e.tokens is not None and in_range(c.input_tokens, e.tokens)
                seen[e.url[7]] += 1
    assert seen["s"] and seen["l"]
