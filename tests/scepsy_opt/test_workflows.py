"""Workflow YAMLs, distributions, trace generators and Mooncake lengths."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, shared_file
from scepsy_common.errors import InputError
from scepsy_opt.ingest.mooncake import load_mooncake_lengths
from scepsy_opt.traces import CallRecord, read_trace, validate_calls, write_trace
from scepsy_opt.workflows import (
    PROGRAMS,
    Distribution,
    WorkflowSpec,
    generate_trace,
    load_workflow,
    load_workload,
    parse_distribution,
    reference_timer,
)
from scepsy_profile.roofline import roofline_model
from scepsy_profile.serving import serving_curve

WORKFLOWS = REPO / "datasets" / "workflows"
FILES = {"rag": "rag.yaml", "beam_search": "beam-search.yaml", "coding_agent": "coding-agent.yaml"}
N_REQUESTS = {"rag": 2000, "beam_search": 2000, "coding_agent": 2000}


def spec_of(name: str) -> WorkflowSpec:
    return load_workflow(WORKFLOWS / FILES[name])


@pytest.fixture(scope="module")
def traces() -> dict[str, tuple[CallRecord, ...]]:
    return {name: generate_trace(spec_of(name), N_REQUESTS[name], seed=11) for name in FILES}


def by_request(calls) -> dict[str, list[CallRecord]]:
    out: dict[str, list[CallRecord]] = defaultdict(list)
    for c in calls:
        out[c.request_id].append(c)
    return out


def assert_mean(samples, expected: float, what: str, k: float = 4.0) -> None:
    x = np.asarray(samples, dtype=float)
    se = x.std(ddof=1) / math.sqrt(len(x))
    assert abs(x.mean() - expected) <= k * se + 1e-9, (
        f"{what}: sample mean {x.mean():.4g} vs analytic {expected:.4g} (se {se:.3g})")


# ------------------------------------------------------------------------------ bundled files


def test_bundled_workflows_load():
    rag, beam, coding = (spec_of(n) for n in FILES)
    assert dict(rag.llms) == {"rewriter": "qwen2.5-1.5b", "reranker": "bge-reranker-large",
                              "generator": "qwen2.5-7b"}
    assert dict(beam.llms) == {"generator": "qwen2.5-7b", "prm": "qwen2.5-math-prm-7b"}
    assert dict(coding.llms) == {"coder": "qwen2.5-14b", "reviewer": "qwen2.5-7b"}
    for spec in (rag, beam, coding):
        prog = PROGRAMS[spec.program]
        assert set(spec.llms) == set(prog.required_llms)
        assert set(spec.tools) == set(prog.required_tools)
        assert set(spec.params) == set(prog.required_params)
        assert spec.reference_gpu == "A100-80GB"


def test_bundled_workload_shares_generator():
    specs = load_workload(WORKFLOWS / "rag-beam.yaml")
    assert [s.name for s in specs] == ["rag", "beam_search"]
    assert [s.weight for s in specs] == [1.0, 1.0]
    assert specs[0].llms["generator"] == specs[1].llms["generator"] == "qwen2.5-7b"


# ------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("name", list(FILES))
def test_generation_is_deterministic_per_seed(tmp_path, name):
    spec = spec_of(name)
    paths = []
    for i, seed in enumerate((3, 3, 4)):
        paths.append(tmp_path / f"{i}.jsonl")
        write_trace(paths[-1], generate_trace(spec, 25, seed))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    back = read_trace(paths[0])  # the file format accepts what the generator writes
    assert len(back.requests) == 25 and back.workflows() == [spec.name]


@pytest.mark.parametrize("name", list(FILES))
def test_generated_traces_validate(traces, name):
    calls = traces[name]
    trace = validate_calls(calls)
    assert len(trace.requests) == N_REQUESTS[name]
    assert {c.workflow for c in calls} == {spec_of(name).name}
    reqs = by_request(calls)
    ordered = [reqs[f"r{i}"] for i in range(N_REQUESTS[name])]
    assert min(c.start_s for c in ordered[0]) == 0.0
    for prev, nxt in itertools.pairwise(ordered):  # laid out one after the other
        assert min(c.start_s for c in nxt) == pytest.approx(max(c.end_s for c in prev) + 1.0)
    for c in calls:
        assert c.end_s > c.start_s
        if c.is_llm:
            assert c.input_tokens >= 1 and c.output_tokens >= 1
            assert 0 <= c.prefix_tokens <= c.input_tokens
        else:
            assert c.input_tokens == c.output_tokens == 0
    for rcalls in reqs.values():  # a call starts exactly when its last parent ends
        end = {c.call_id: c.end_s for c in rcalls}
        assert len(end) == len(rcalls)
        for c in rcalls:
            if c.parents:
                assert c.start_s == max(end[p] for p in c.parents)
            else:
                assert c.start_s == min(x.start_s for x in rcalls)


def test_rag_structure_and_means(traces):
    spec = spec_of("rag")
    m = spec.param_mean
    reqs = by_request(traces["rag"])
    k, rewrite_in, rewritten, docs, gen_in, answer = [], [], [], [], [], []
    for calls in reqs.values():
        names = Counter(c.name for c in calls)
        assert names["rewriter"] == names["retrieval"] == names["generator"] == 1
        rw = next(c for c in calls if c.llm == "rewriter")
        ret = next(c for c in calls if c.tool == "retrieval")
        ranks = [c for c in calls if c.llm == "reranker"]
        gen = next(c for c in calls if c.llm == "generator")
        assert ret.parents == (rw.call_id,)
        assert {c.parents for c in ranks} == {(ret.call_id,)}
        assert {c.start_s for c in ranks} == {ret.end_s}  # the fan-out starts together
        assert set(gen.parents) == {c.call_id for c in ranks}
        assert all(c.output_tokens == 1 for c in ranks)
        k.append(len(ranks))
        rewrite_in.append(rw.input_tokens)
        rewritten.append(rw.output_tokens)
        docs.extend(c.input_tokens - rw.output_tokens for c in ranks)
        gen_in.append(gen.input_tokens)
        answer.append(gen.output_tokens)
        assert rw.prefix_tokens == m("rewrite_prompt_tokens")
    assert_mean(k, m("rerank_k"), "rerank fan-out")
    assert_mean(rewrite_in, m("rewrite_prompt_tokens") + m("query_tokens"), "rewriter input")
    assert_mean(rewritten, m("rewritten_tokens"), "rewritten query")
    assert_mean(docs, m("doc_tokens"), "document tokens")
    assert min(k) >= m("top_n")  # so the generator always reads top_n documents
    assert_mean(gen_in, m("answer_prompt_tokens") + m("query_tokens") + m("top_n") * m("doc_tokens"),
                "generator input")
    assert_mean(answer, m("answer_tokens"), "answer tokens")
    assert max(docs) + max(rewritten) + 1 <= 512  # fits bge-reranker-large's window


def test_beam_search_structure_and_means(traces):
    spec = spec_of("beam_search")
    m = spec.param_mean
    width = int(m("beam_width"))
    gens_per_req, problem, step_out = [], [], []
    for calls in by_request(traces["beam_search"]).values():
        gens = [c for c in calls if c.llm == "generator"]
        prms = [c for c in calls if c.llm == "prm"]
        assert len(gens) == len(prms) and len(gens) % width == 0
        gens_per_req.append(len(gens))
        problem.extend(c.input_tokens for c in gens[:width])
        assert all(c.prefix_tokens == 0 and not c.parents for c in gens[:width])
        step_out.extend(c.output_tokens for c in gens)
        assert all(c.output_tokens == 1 for c in prms)
        # one step: B generator calls together, then B PRM calls waiting for all of them
        for s in range(len(gens) // width):
            g, p = gens[s * width:(s + 1) * width], prms[s * width:(s + 1) * width]
            assert len({c.start_s for c in g}) == 1 and len({c.start_s for c in p}) == 1
            assert {c.parents for c in p} == {tuple(c.call_id for c in g)}
            if s:
                prev = prms[(s - 1) * width:s * width]
                assert {c.parents for c in g} == {tuple(c.call_id for c in prev)}
                assert all(c.prefix_tokens == c.input_tokens for c in g)
    assert_mean(gens_per_req, width * m("steps"), "generator calls per request")
    assert_mean(problem, m("problem_tokens"), "problem tokens")
    assert_mean(step_out, m("step_tokens"), "step tokens")
    # heavy tail: tens to hundreds of generator calls per request (the paper reports 24-844)
    assert 24 <= min(gens_per_req) < 60
    assert 300 < max(gens_per_req) <= 844
    assert np.mean(np.array(gens_per_req) >= 100) > 0.05


def test_coding_agent_roles_and_means(traces):
    spec = spec_of("coding_agent")
    m = spec.param_mean
    rounds, plan_in, plan_out, code_in, code_out, review_out = [], [], [], [], [], []
    for calls in by_request(traces["coding_agent"]).values():
        planner = [c for c in calls if c.role == "planner"]
        coder = [c for c in calls if c.role == "coder"]
        reviews = [c for c in calls if c.llm == "reviewer"]
        tests = [c for c in calls if c.tool == "tests"]
        assert len(planner) == 1 and planner[0].llm == "coder" and not planner[0].parents
        assert all(c.llm == "coder" for c in coder)
        assert len(coder) == len(reviews) == len(tests) >= 1
        for code, test, review in zip(coder, tests, reviews, strict=True):
            assert test.parents == (code.call_id,)
            assert review.parents == (code.call_id, test.call_id)
        rounds.append(len(reviews))
        plan_in.append(planner[0].input_tokens)
        plan_out.append(planner[0].output_tokens)
        code_in.append(coder[0].input_tokens)
        code_out.extend(c.output_tokens for c in coder)
        review_out.extend(c.output_tokens for c in reviews)
        assert coder[0].input_tokens == m("coder_prompt_tokens") + planner[0].output_tokens
    assert_mean(rounds, m("rounds"), "rounds")
    assert max(rounds) <= 10
    assert_mean(plan_in, m("planner_prompt_tokens") + m("task_tokens"), "planner input")
    assert_mean(plan_out, m("plan_tokens"), "plan tokens")
    assert_mean(code_in, m("coder_prompt_tokens") + m("plan_tokens"), "first coder input")
    assert_mean(code_out, m("code_tokens"), "code tokens")
    assert_mean(review_out, m("review_tokens"), "review tokens")
    # one LLM, two clearly different loads: long-in/short-out vs short-in/long-out
    assert np.mean(plan_in) > 4 * np.mean(code_in)
    assert np.mean(code_out) > 3 * np.mean(plan_out)


def test_timer_is_the_zero_load_serving_latency():
    spec = spec_of("rag")
    timer = reference_timer(spec)
    for llm, i, o in [("generator", 900, 150), ("rewriter", 220, 24), ("reranker", 300, 1)]:
        curve = serving_curve(roofline_model(), spec.llms[llm], "A100-80GB", 1, 1.0, i, o)
        assert timer.zero_load_s(llm, i, o) == pytest.approx(curve.zero_load_latency_s, rel=1e-3)
        rng = np.random.default_rng(0)
        jitter = np.array([timer(llm, i, o, rng) for _ in range(4000)]) / curve.zero_load_latency_s
        assert jitter.mean() == pytest.approx(1.0, abs=0.01)
        assert jitter.std() / jitter.mean() == pytest.approx(0.1, rel=0.1)
    arr = timer("generator", np.array([100, 900]), np.array([10, 150]), np.random.default_rng(0))
    assert arr.shape == (2,) and np.all(arr > 0)


def test_custom_scalar_timer_and_token_source():
    spec = spec_of("rag")
    calls = generate_trace(spec, 5, seed=0, timer=lambda llm, i, o, rng: 0.001 * o,
                           token_source={"answer_tokens": 100, "rerank_k": Distribution.constant(7)})
    validate_calls(calls)
    gens = [c for c in calls if c.llm == "generator"]
    assert all(c.output_tokens == 100 and c.duration_s == pytest.approx(0.1) for c in gens)
    assert sum(c.llm == "reranker" for c in calls) == 35
    with pytest.raises(InputError, match="token_source: rerank_kk"):
        generate_trace(spec, 5, seed=0, token_source={"rerank_kk": 3})
    with pytest.raises(InputError, match="requests"):
        generate_trace(spec, 0, seed=0)


def test_python_built_spec_checks_itself():
    spec = spec_of("coding_agent")
    with pytest.raises(InputError, match=r"llms\.coder"):
        WorkflowSpec("x", "coding_agent", {"coder": "gpt-9", "reviewer": "qwen2.5-7b"},
                     spec.tools, spec.params)
    with pytest.raises(InputError, match=r"params\.rounds"):
        WorkflowSpec("x", "coding_agent", spec.llms, spec.tools,
                     {k: v for k, v in spec.params.items() if k != "rounds"})
    ok = WorkflowSpec("x", "coding_agent", {"coder": "Qwen2.5-14B", "reviewer": "qwen2.5-7b"},
                      {"tests": 5.0}, spec.params)
    assert ok.llms["coder"] == "qwen2.5-14b" and ok.tools["tests"] == Distribution.constant(5.0)


# ------------------------------------------------------------------------------ distributions


@pytest.mark.parametrize("dist", [
    Distribution.constant(3.5),
    Distribution.lognormal(20, 1.0, min=6, max=211),
    Distribution.lognormal(1.0, 0.5, max=0.8),
    Distribution.lognormal(7, 0.0),
    Distribution.exponential(128),
    Distribution.exponential(128, min=1, max=512),
    Distribution.exponential(2.0, min=2.5, max=4),
    Distribution.poisson(20, min=5, max=40),
    Distribution.poisson(2.5, min=1.5, max=3.5),
    Distribution.geometric(2.5, max=10),
    Distribution.geometric(4, min=2.5, max=6.5),
    Distribution.uniform(0, 10, min=2, max=7),
    Distribution.choice([1, 5, 9], [1, 2, 3], max=6),
    Distribution.empirical([1, 2, 3, 100], min=2, max=50),
])
def test_distribution_mean_matches_samples(dist):
    x = dist.sample(np.random.default_rng(5), 200_000)
    assert x.shape == (200_000,)
    assert_mean(x, dist.mean(), repr(dist))
    lo, hi = dist.support()
    assert lo <= x.min() and x.max() <= hi
    one = dist.sample(np.random.default_rng(5))
    assert isinstance(one, float) and one == x[0]


@pytest.mark.parametrize(("raw", "field"), [
    ({"kind": "lognormal", "mean": 0, "cv": 1}, "d.mean"),
    ({"kind": "lognormal", "mean": 3, "cv": -1}, "d.cv"),
    ({"kind": "lognormal", "mean": 3}, "d.cv"),
    ({"kind": "poisson", "mean": -1}, "d.mean"),
    ({"kind": "exponential", "mean": 0}, "d.mean"),
    ({"kind": "exponential", "mean": 5, "cv": 1}, "d.cv"),
    ({"kind": "exponential"}, "d.mean"),
    ({"kind": "geometric", "mean": 0.5}, "d.mean"),
    ({"kind": "uniform", "low": 3, "high": 1}, "d.high"),
    ({"kind": "choice", "values": []}, "d.values"),
    ({"kind": "choice", "values": [1, 2], "weights": [1, -1]}, "d.weights"),
    ({"kind": "choice", "values": [1, 2], "weights": [1]}, "d.weights"),
    ({"kind": "constant", "value": 1, "min": 3, "max": 2}, "d.max"),
    ({"kind": "constant", "value": True}, "d.value"),
    ({"kind": "constant", "value": float("nan")}, "d.value"),
    ({"kind": "normal", "mean": 1}, "d.kind"),
    ({"mean": 1}, "d.kind"),
    ({"kind": ["lognormal"]}, "d.kind"),
    ({"kind": "poisson", "mean": 1, "sd": 2}, "d.sd"),
    ("many", "d"),
])
def test_bad_distributions_name_the_field(raw, field):
    with pytest.raises(InputError) as info:
        parse_distribution(raw, "f.yaml", "d")
    assert (info.value.source, info.value.field) == ("f.yaml", field), str(info.value)


def test_python_distribution_errors_and_identity():
    with pytest.raises(InputError, match="distribution: cv"):
        Distribution.lognormal(5, -1)
    with pytest.raises(InputError, match="unknown field"):
        Distribution("poisson", {"mean": 1, "cv": 2})
    a = Distribution.choice([1, 2])
    assert a == Distribution.choice([1.0, 2.0], [1, 1]) and hash(a) == hash(Distribution.choice([1, 2]))
    assert parse_distribution(4) == Distribution.constant(4)
    assert "lognormal(mean=5, cv=0.5, min=1)" in repr(Distribution.lognormal(5, 0.5, min=1))


# ------------------------------------------------------------------------------ bad YAML files


def _edit(tmp_path: Path, change, name: str = "rag.yaml") -> Path:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    change(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d.pop("program"), "program"),
    (lambda d: d.update(program="ragged"), "program"),
    (lambda d: d.update(reference_gpu="A200"), "reference_gpu"),
    (lambda d: d["llms"].update(generator="qwen2.5-7bb"), "llms.generator"),
    (lambda d: d["llms"].pop("reranker"), "llms.reranker"),
    (lambda d: d["llms"].update(judge="qwen2.5-7b"), "llms.judge"),
    (lambda d: d.update(llms=["qwen2.5-7b"]), "llms"),
    (lambda d: d["tools"].pop("retrieval"), "tools.retrieval"),
    (lambda d: d["tools"].update(retrieval="fast"), "tools.retrieval"),
    (lambda d: d["tools"].update(retrieval={"kind": "uniform", "low": -1, "high": 1}),
     "tools.retrieval"),
    (lambda d: d["params"].pop("rerank_k"), "params.rerank_k"),
    (lambda d: d["params"].update(rerank_K=3), "params.rerank_K"),
    (lambda d: d["params"].update(top_n=-2), "params.top_n"),
    (lambda d: d["params"].update(top_n=[1, 2]), "params.top_n"),
    (lambda d: d["params"]["doc_tokens"].update(cv=-0.3), "params.doc_tokens.cv"),
    (lambda d: d["params"]["doc_tokens"].update(kind="gauss"), "params.doc_tokens.kind"),
    (lambda d: d["params"]["doc_tokens"].update(mean="big"), "params.doc_tokens.mean"),
    (lambda d: d["params"]["doc_tokens"].update(median=3), "params.doc_tokens.median"),
    (lambda d: d["params"]["rerank_k"].update(min=50), "params.rerank_k.max"),
])
def test_malformed_workflow_names_file_and_field(tmp_path, change, field):
    path = _edit(tmp_path, change)
    with pytest.raises(InputError) as info:
        load_workflow(path)
    assert (info.value.source, info.value.field) == (str(path), field), str(info.value)


@pytest.mark.parametrize(("text", "field"), [
    ("name: [unclosed", "line 1"),
    ("- a list", ""),
    ("", ""),
    ("name: a\nname: b\n", "line 2: name"),
])
def test_unreadable_workflow_files(tmp_path, text, field):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_workflow(path)
    assert (info.value.source, info.value.field) == (str(path), field)


def _workload(tmp_path: Path, doc: dict, beam_model: str = "qwen2.5-7b") -> Path:
    for name in ("rag.yaml", "beam-search.yaml"):
        text = (WORKFLOWS / name).read_text()
        if name == "beam-search.yaml":
            text = text.replace("generator: qwen2.5-7b", f"generator: {beam_model}")
        (tmp_path / name).write_text(text)
    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_workload_weights_and_errors(tmp_path):
    both = ["rag.yaml", "beam-search.yaml"]
    specs = load_workload(_workload(tmp_path, {"workflows": both, "weights": [3, 1]}))
    assert [s.weight for s in specs] == [3.0, 1.0]
    cases = [
        ({"workflows": both}, "qwen2.5-14b", "workflows[1]: llms.generator"),
        ({"workflows": both, "weights": [1]}, "qwen2.5-7b", "weights"),
        ({"workflows": both, "weights": [1, 0]}, "qwen2.5-7b", "weights[1]"),
        ({"workflows": ["rag.yaml", "rag.yaml"]}, "qwen2.5-7b", "workflows[1]"),
        ({"workflows": both, "rates": [1, 1]}, "qwen2.5-7b", "rates"),
        ({"workflows": []}, "qwen2.5-7b", "workflows"),
    ]
    for doc, model, field in cases:
        path = _workload(tmp_path, doc, model)
        with pytest.raises(InputError) as info:
            load_workload(path)
        assert (info.value.source, info.value.field) == (str(path), field), str(info.value)
    path = _workload(tmp_path, {"workflows": ["rag.yaml", "missing.yaml"]})
    with pytest.raises(InputError) as info:
        load_workload(path)
    # the workload file and the entry that names the missing workflow file
    assert (info.value.source, info.value.field) == (str(path), "workflows[1]")
    assert "missing.yaml" in str(info.value)


# ------------------------------------------------------------------------------ Mooncake


def _mooncake(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "mc.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_mooncake_lengths_feed_a_workflow(tmp_path):
    rng = np.random.default_rng(0)
    rows = [{"timestamp": 10 * i, "input_length": int(n), "output_length": int(m),
             "hash_ids": list(range(-(-int(n) // 512)))}
            for i, (n, m) in enumerate(zip(rng.integers(500, 9000, 300),
                                           rng.integers(1, 900, 300), strict=True))]
    lengths = load_mooncake_lengths(_mooncake(tmp_path, rows))
    assert len(lengths) == 300 and lengths.timestamps_ms[-1] == 2990
    assert lengths.prefix_blocks[0] == len(rows[0]["hash_ids"])
    with pytest.raises(ValueError):
        lengths.input_lengths[0] = 1  # read-only
    dist = lengths.distribution("input", max=4000)
    assert dist.mean() == pytest.approx(np.minimum(lengths.input_lengths, 4000).mean())
    assert lengths.distribution("output", scale=0.5).mean() == pytest.approx(
        lengths.output_lengths.mean() / 2)
    spec = spec_of("coding_agent")
    calls = generate_trace(spec, 400, seed=1, token_source={"task_tokens": dist})
    validate_calls(calls)
    plan_in = [c.input_tokens for c in calls if c.role == "planner"]
    assert_mean(plan_in, spec.param_mean("planner_prompt_tokens") + dist.mean(), "planner input")


@pytest.mark.parametrize(("row", "field"), [
    ("{broken", "line 2"),
    ("[1]", "line 2"),
    ({"timestamp": 0, "input_length": 0, "output_length": 5}, "line 2: input_length"),
    ({"timestamp": 0, "input_length": 5, "output_length": "5"}, "line 2: output_length"),
    ({"timestamp": -1, "input_length": 5, "output_length": 5}, "line 2: timestamp"),
    ({"timestamp": 0, "input_length": 5, "output_length": 5, "extra": 1}, "line 2: extra"),
    ({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [-3]},
     "line 2: hash_ids"),
])
def test_mooncake_errors_name_line_and_field(tmp_path, row, field):
    good = {"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [0]}
    path = _mooncake(tmp_path, [good, row])
    with pytest.raises(InputError) as info:
        load_mooncake_lengths(path)
    assert (info.value.source, info.value.field) == (str(path), field), str(info.value)


@pytest.mark.shared_data
def test_real_mooncake_conversation_trace():
    lengths = load_mooncake_lengths(
        shared_file("request-traces/mooncake/conversation_trace.jsonl"))
    assert len(lengths) == 12031
    blocks = -(-lengths.input_lengths // 512)  # hash_ids are 512-token blocks
    assert np.array_equal(blocks, lengths.prefix_blocks)
