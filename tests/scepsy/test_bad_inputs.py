"""Every bad input to the ``scepsy`` command line: exit 2, one line naming file and field.

A table over every input kind (workflow, workload, cluster in both formats, allocation, plan.json,
trace, measurements, MuxServe grid, curves, catalog, openb CSVs) and the ways a file goes wrong
(empty, wrong type, missing field, negative/zero/NaN/inf/huge numbers, unknown names, duplicate
keys or names, shell metacharacters and newlines in names, truncated lines, a directory instead
of a file, a missing path, an unwritable output). Each case runs the real CLI in-process and
checks the contract of docs/cli.md: exit status 2, exactly one line on stderr that starts with
``scepsy: error:`` and names the file and the field, no traceback, and nothing written: every
file under the case's folder (inputs and an existing output file) is byte-identical afterwards
and no file is added.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scepsy.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "datasets"
RAG = DATA / "workflows" / "rag.yaml"
RAG_TEXT = RAG.read_text(encoding="utf-8")
ALLOC = DATA / "allocations" / "rag-4gpu.yaml"
ALLOC_TEXT = ALLOC.read_text(encoding="utf-8")
CLUSTER = DATA / "clusters" / "a100-4.yaml"
RACKS_TEXT = (DATA / "clusters" / "racks-a100-h100.yaml").read_text(encoding="utf-8")
TRACE_LINES = (DATA / "traces" / "rag-50.jsonl").read_text(encoding="utf-8").splitlines()
MEAS_LINES = (
    (DATA / "profiles" / "example-measurements.jsonl").read_text(encoding="utf-8").splitlines()
)
CURVES = DATA / "profiles" / "muxserve-a100-curves.json"
OLD_OUT = "previous output\n"  # an output file that exists before the command runs

DIR = object()  # a directory where a file is expected
MISSING = object()  # no file at that path


@dataclass(frozen=True)
class Case:
    """One bad input: ``files`` (name -> text, :data:`DIR` or :data:`MISSING`) written into the
    case's folder, the command (``{f}`` is the bad file ``bad``, ``{out}`` an output path that
    already holds :data:`OLD_OUT`, ``{d}`` the folder) and the texts the message must contain."""

    id: str
    argv: tuple[str, ...]
    files: dict[str, object]
    bad: str
    expect: tuple[str, ...] = ()
    out: str = "out.txt"
    xfail: str = ""
    extra: dict[str, str] = field(default_factory=dict)


CASES: list[Case] = []


def case(
    kind: str,
    name: str,
    argv: Callable[[str], tuple[str, ...]],
    bad: str,
    text: object,
    *expect: str,
    extra: dict[str, object] | None = None,
    xfail: str = "",
    out: str = "out.txt",
) -> None:
    CASES.append(
        Case(f"{kind}-{name}", argv(bad), {bad: text, **(extra or {})}, bad, expect, out, xfail)
    )


def option_case(
    id: str, argv: tuple[str, ...], *expect: str, files: dict[str, object] | None = None,
    out: str = "out.txt",
) -> None:
    """A case whose bad input is an option or an output path, not a file (``bad`` is empty)."""
    CASES.append(Case(id, argv, files or {}, "", expect, out))


# --- commands per input kind ---------------------------------------------------------------------


BAD = "<bad file>"  # where a command template takes the bad file's name


def command(*template: str) -> Callable[[str], tuple[str, ...]]:
    """A command builder: ``template`` with :data:`BAD` replaced by the bad file's name."""
    return lambda f: tuple(f if a == BAD else a for a in template)


PLAN_LIMITS = ("--trace-requests", "20", "--time-limit", "20", "--out", "{out}")
SHOW = ("profile", "show", "--model", "llama-13b", "--gpu", "A100-80GB", "--tp", "1")

trace_gen = command("trace", "generate", "--workflow", BAD, "--requests", "3", "--out", "{out}")
plan_cluster = command("plan", "--workflow", str(RAG), "--cluster", BAD, "--target", "1",
                       *PLAN_LIMITS)
plan_current = command("plan", "--workflow", str(RAG), "--cluster", str(CLUSTER), "--target",
                       "1", "--current", BAD, *PLAN_LIMITS)
ALLOC_ARGS = ("--workflow", str(RAG), "--allocation", BAD, "--rate", "1", "--trace-requests", "20")
predict_alloc = command("predict", *ALLOC_ARGS)
simulate_alloc = command("simulate", *ALLOC_ARGS, "--requests", "20")
stats = command("stats", BAD)
predict_trace = command("predict", "--workflow", str(RAG), "--allocation", str(ALLOC), "--rate",
                        "1", "--trace", BAD)
fit = command("profile", "fit", "--measurements", BAD, "--out", "{out}")
fit_muxserve = command("profile", "fit", "--muxserve", BAD, "--out", "{out}")
show_curves = command(*SHOW, "--curves", BAD)
show_catalog = command(*SHOW, "--catalog", BAD)


NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
GOOD_NODES = NODES_HEADER + "n0,8000,1000,2,T4\n"
GOOD_PODS = PODS_HEADER + "p0,1000,100,1,500\n"


openb_nodes = command("bench", "openb", "--nodes", BAD, "--pods", "{d}/pods.csv", "--json")
openb_pods = command("bench", "openb", "--nodes", "{d}/nodes.csv", "--pods", BAD, "--json")


def sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# --- workflow YAML (trace generate) --------------------------------------------------------------

W = "wf.yaml"
for name, text, *exp in [
    ("empty", "", "mapping"),
    ("comments-only", "# nothing\n", "mapping"),
    ("list", "- rag\n- beam\n", "mapping"),
    ("scalar", "rag\n", "mapping"),
    ("llms-list", sub(RAG_TEXT, "  rewriter: qwen2.5-1.5b ", "  - qwen2.5-1.5b\n#"), "line"),
    ("llms-number", RAG_TEXT.split("llms:")[0] + "llms: 3\n", "llms"),
    ("missing-program", sub(RAG_TEXT, "program: rag\n", ""), "program"),
    ("missing-llm", sub(RAG_TEXT, "  rewriter: qwen2.5-1.5b ", "  # "), "llms.rewriter"),
    ("unknown-program", sub(RAG_TEXT, "program: rag", "program: ragg"), "program"),
    ("unknown-model", sub(RAG_TEXT, "rewriter: qwen2.5-1.5b", "rewriter: gpt-9"), "llms.rewriter"),
    (
        "unknown-gpu",
        sub(RAG_TEXT, "reference_gpu: A100-80GB", "reference_gpu: B300"),
        "reference_gpu",
    ),
    ("unknown-field", RAG_TEXT + "colour: blue\n", "colour"),
    ("unknown-param", RAG_TEXT + "  extra_tokens: 3\n", "params.extra_tokens"),
    ("negative-param", sub(RAG_TEXT, "top_n: 5", "top_n: -1"), "params.top_n"),
    ("nan-param", sub(RAG_TEXT, "top_n: 5", "top_n: .nan"), "params.top_n"),
    ("inf-param", sub(RAG_TEXT, "top_n: 5", "top_n: .inf"), "params.top_n"),
    ("huge-param", sub(RAG_TEXT, "top_n: 5", "top_n: 1.0e+12"), "params.top_n"),
    ("string-param", sub(RAG_TEXT, "top_n: 5", "top_n: five"), "params.top_n"),
    (
        "huge-poisson-mean",
        sub(
            RAG_TEXT, "{kind: poisson, mean: 20, min: 5, max: 40}", "{kind: poisson, mean: 1.0e+9}"
        ),
        "params.rerank_k",
    ),
    (
        "huge-lognormal-mean",
        sub(
            RAG_TEXT,
            "{kind: lognormal, mean: 180, cv: 0.7, min: 8, max: 1024}",
            "{kind: lognormal, mean: 1.0e+300, cv: 0.7}",
        ),
        "params.answer_tokens",
    ),
    (
        "zero-lognormal-mean",
        sub(
            RAG_TEXT,
            "{kind: lognormal, mean: 180, cv: 0.7, min: 8, max: 1024}",
            "{kind: lognormal, mean: 0, cv: 0.7}",
        ),
        "params.answer_tokens",
    ),
    (
        "nan-distribution",
        sub(RAG_TEXT, "mean: 220, cv: 0.35", "mean: .nan, cv: 0.35"),
        "params.doc_tokens",
    ),
    (
        "negative-tool",
        sub(
            RAG_TEXT,
            "{kind: lognormal, mean: 0.06, cv: 0.5, min: 0.005, max: 1.0}",
            "{kind: uniform, low: -1, high: 1}",
        ),
        "tools.retrieval",
    ),
    ("unknown-kind", sub(RAG_TEXT, "kind: poisson", "kind: zipf"), "params.rerank_k.kind"),
    ("max-below-min", sub(RAG_TEXT, "min: 5, max: 40", "min: 40, max: 5"), "params.rerank_k.max"),
    (
        "duplicate-key",
        sub(RAG_TEXT, "program: rag\n", "program: rag\nname: rag2\n"),
        "line 6",
        "name",
    ),
    ("duplicate-param", RAG_TEXT + "  top_n: 6\n", "top_n", "duplicate"),
    (
        "duplicate-llm",
        sub(
            RAG_TEXT, "  generator: qwen2.5-7b", "  generator: qwen2.5-7b\n  generator: qwen2.5-3b"
        ),
        "generator",
        "duplicate",
    ),
    ("shell-name", sub(RAG_TEXT, "name: rag", "name: 'rag; rm -rf ~'"), "name"),
    ("newline-name", sub(RAG_TEXT, "name: rag", 'name: "rag\\nx"'), "name"),
    (
        "dollar-llm-name",
        sub(RAG_TEXT, "  rewriter: qwen2.5-1.5b", "  re$(id)writer: qwen2.5-1.5b"),
        "llms",
    ),
    ("space-tool-name", sub(RAG_TEXT, "  retrieval: {kind", "  'retrieval x': {kind"), "tools"),
    ("truncated", RAG_TEXT[: RAG_TEXT.index("retrieval: {") + 30], "line"),
    ("tab-indent", sub(RAG_TEXT, "  rewriter:", "\trewriter:"), "line"),
    ("binary", "\udcff", "UTF-8"),
    ("directory", DIR, W),
    ("missing", MISSING, W),
]:
    case("workflow", name, trace_gen, W, text, *exp)

GEN_RAG = ("trace", "generate", "--workflow", str(RAG))
option_case(
    "workflow-requests-huge", (*GEN_RAG, "--requests", "1000000000", "--out", "{out}"), "requests"
)
option_case("workflow-requests-zero", (*GEN_RAG, "--requests", "0", "--out", "{out}"), "requests")
CASES.append(
    Case(
        "workflow-fanout-per-request",
        ("trace", "generate", "--workflow", "{d}/" + W, "--requests", "2", "--out", "{out}"),
        {
            W: sub(
                RAG_TEXT,
                "{kind: poisson, mean: 20, min: 5, max: 40}",
                "{kind: poisson, mean: 500000, min: 5}",
            )
        },
        W,
        ("params",),
    )
)
option_case(
    "workflow-seed-negative",
    (*GEN_RAG, "--requests", "3", "--seed", "-1", "--out", "{out}"),
    "--seed",
)
option_case(
    "workflow-out-directory",
    (*GEN_RAG, "--requests", "3", "--out", "{d}/outdir"),
    "outdir",
    files={"outdir": DIR},
)
option_case(
    "workflow-out-under-file", (*GEN_RAG, "--requests", "3", "--out", "{out}/x.jsonl"), "x.jsonl"
)
option_case("workflow-out-empty", (*GEN_RAG, "--requests", "3", "--out", ""), "--out")
option_case(
    "workflow-out-proc",
    (*GEN_RAG, "--requests", "3", "--out", "/proc/scepsy-trace.jsonl"),
    "/proc/scepsy-trace.jsonl",
)

# --- workload YAML --------------------------------------------------------------------------------

L = "load.yaml"
RAG_COPY = {"rag.yaml": RAG_TEXT}
for name, text, *exp in [
    ("empty-list", "workflows: []\n", "workflows"),
    ("wrong-type", "workflows: rag.yaml\n", "workflows"),
    ("missing-workflows", "workflows:\nweights: [1]\n", "workflows"),
    ("missing-file", "workflows: [nope.yaml]\n", "workflows[0]", "nope.yaml"),
    ("negative-weight", "workflows: [rag.yaml]\nweights: [-1]\n", "weights"),
    ("zero-weight", "workflows: [rag.yaml]\nweights: [0]\n", "weights"),
    ("nan-weight", "workflows: [rag.yaml]\nweights: [.nan]\n", "weights"),
    ("inf-weight", "workflows: [rag.yaml]\nweights: [.inf]\n", "weights"),
    ("weights-count", "workflows: [rag.yaml]\nweights: [1, 2]\n", "weights"),
    ("duplicate-workflow", "workflows: [rag.yaml, rag.yaml]\n", "workflows[1]"),
    ("duplicate-key", "workflows: [rag.yaml]\nworkflows: [rag.yaml]\n", "line 2", "workflows"),
    ("unknown-field", "workflows: [rag.yaml]\nrates: [1]\n", "rates"),
    ("truncated", "workflows: [rag.yaml\n", "line"),
]:
    case("workload", name, trace_gen, L, text, *exp, extra=RAG_COPY)

# --- cluster YAML: pools and racks (plan --cluster) -----------------------------------------------

C = "cluster.yaml"
POOLS = "name: c\npools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n"
for name, text, *exp in [
    ("empty", "", "top level"),
    ("list", "- a\n", "top level"),
    ("missing-pools", "name: c\n", "racks"),
    ("pools-empty", "name: c\npools: []\n", "pools"),
    ("pools-wrong-type", "name: c\npools: {gpu: A100-80GB}\n", "pools"),
    ("missing-name", "pools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n", "name"),
    ("zero-nodes", sub(POOLS, "nodes: 1", "nodes: 0"), "pools[0].nodes"),
    ("negative-nodes", sub(POOLS, "nodes: 1", "nodes: -1"), "pools[0].nodes"),
    ("huge-nodes", sub(POOLS, "nodes: 1", "nodes: 1000000000"), "pools[0].nodes"),
    ("nan-nodes", sub(POOLS, "nodes: 1", "nodes: .nan"), "pools[0].nodes"),
    ("float-nodes", sub(POOLS, "nodes: 1", "nodes: 1.5"), "pools[0].nodes"),
    ("huge-gpus", sub(POOLS, "gpus_per_node: 4", "gpus_per_node: 100000"), "pools[0].gpus_per_node"),
    (
        "total-nodes",
        POOLS + "  - {gpu: A100-80GB, nodes: 9000, gpus_per_node: 8}\n"
        "  - {gpu: A100-80GB, nodes: 9000, gpus_per_node: 8}\n",
        "pools",
        "nodes",
    ),
    ("unknown-gpu", sub(POOLS, "gpu: A100-80GB", "gpu: B300"), "pools[0].gpu"),
    ("unknown-field", sub(POOLS, "nodes: 1,", "nodes: 1, nvlink: 4,"), "pools[0].nvlink"),
    ("duplicate-key", POOLS + "name: d\n", "line 4", "name"),
    ("duplicate-pool-key", sub(POOLS, "nodes: 1,", "nodes: 1, nodes: 2,"), "nodes", "duplicate"),
    (
        "newline-name",
        'name: "c\\nd"\npools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n',
        "name",
    ),
    (
        "shell-name",
        "name: 'c|rm'\npools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n",
        "name",
    ),
    ("truncated", POOLS[:-12], "line"),
    ("directory", DIR, C),
    ("missing", MISSING, C),
]:
    case("cluster", name, plan_cluster, C, text, *exp, out="plan.json")

RACK = "name: r\nracks:\n  - name: a\n    nodes:\n      - {name: n, gpu: A100-80GB, gpus: 8}\n"
for name, text, *exp in [
    ("racks-empty", "name: r\nracks: []\n", "racks"),
    ("nodes-empty", "name: r\nracks:\n  - {name: a, nodes: []}\n", "racks[0].nodes"),
    ("rack-wrong-type", "name: r\nracks: [3]\n", "racks[0]"),
    ("zero-gpus", sub(RACK, "gpus: 8", "gpus: 0"), "racks[0].nodes[0].gpus"),
    ("huge-count", sub(RACK, "gpus: 8", "gpus: 8, count: 1000000000"), "racks[0].nodes[0].count"),
    (
        "total-count",
        sub(RACK, "gpus: 8", "gpus: 8, count: 6000")
        + "      - {name: m, gpu: A100-80GB, gpus: 8, count: 6000}\n",
        "racks",
        "nodes",
    ),
    ("bad-domain", sub(RACK, "gpus: 8", "gpus: 8, nvlink_domain: 3"), "nvlink_domain"),
    ("in-use-index", sub(RACK, "gpus: 8", "gpus: 8, in_use: [{gpu: 9, share: 0.5}]"), "in_use"),
    ("in-use-share", sub(RACK, "gpus: 8", "gpus: 8, in_use: [{gpu: 0, share: 1.5}]"), "share"),
    ("in-use-nan", sub(RACK, "gpus: 8", "gpus: 8, in_use: [{gpu: 0, share: .nan}]"), "share"),
    ("unknown-gpu", sub(RACK, "gpu: A100-80GB", "gpu: B300"), "racks[0].nodes[0].gpu"),
    (
        "duplicate-rack",
        RACK + "  - name: a\n    nodes:\n      - {name: m, gpu: A100-80GB, gpus: 8}\n",
        "racks[1].name",
    ),
    (
        "duplicate-node",
        sub(RACK, "gpus: 8}", "gpus: 8}\n      - {name: n, gpu: A100-80GB, gpus: 4}"),
        "racks[0].nodes[1].name",
    ),
    ("duplicate-key", sub(RACK, "gpus: 8}", "gpus: 8, gpus: 4}"), "gpus", "duplicate"),
    ("shell-node-name", sub(RACK, "name: n,", "name: 'n`id`',"), "racks[0].nodes[0].name"),
    ("newline-rack-name", sub(RACK, "  - name: a\n", '  - name: "a\\nb"\n'), "racks[0].name"),
]:
    case("racks", name, plan_cluster, C, text, *exp, out="plan.json")

# --- allocation YAML/JSON (predict, simulate) -----------------------------------------------------

A = "alloc.yaml"
GEN = "generator: {gpu: A100-80GB, tp: 1, share: 0.5, replicas: 5}"


def gen(fields: str) -> str:
    """The allocation with the generator's A100-80GB instance given ``fields``."""
    return sub(ALLOC_TEXT, GEN, "generator: {gpu: A100-80GB, " + fields + "}")


ALLOC_CASES = [
    ("empty", "", "top level"),
    ("list", "- a\n", "top level"),
    ("no-llms", "llms: {}\n", "llms"),
    ("missing-llms", "replicas: 2\n", "llms"),
    ("missing-tp", gen("share: 0.5"), "llms.generator.tp"),
    ("zero-share", gen("tp: 1, share: 0"), "llms.generator.share"),
    ("big-share", gen("tp: 1, share: 1.5"), "llms.generator.share"),
    ("nan-share", gen("tp: 1, share: .nan"), "llms.generator.share"),
    ("inf-share", gen("tp: 1, share: .inf"), "llms.generator.share"),
    ("zero-replicas", sub(ALLOC_TEXT, "replicas: 5", "replicas: 0"), "llms.generator.replicas"),
    (
        "huge-replicas",
        sub(ALLOC_TEXT, "replicas: 5", "replicas: 1000000000000"),
        "llms.generator.replicas",
    ),
    ("string-tp", gen("tp: two, share: 0.5"), "llms.generator.tp"),
    ("tp-unsupported", gen("tp: 3, share: 1.0"), "llms.generator.tp"),
    ("tp-beyond-domain", gen("tp: 16, share: 1.0"), "llms.generator.tp"),
    (
        "unknown-gpu",
        sub(ALLOC_TEXT, "generator: {gpu: A100-80GB", "generator: {gpu: B300"),
        "llms.generator.gpu",
    ),
    ("does-not-fit", gen("tp: 1, share: 0.05"), "llms.generator.share"),
    ("missing-llm", sub(ALLOC_TEXT, "  " + GEN + "\n", ""), "llms.generator"),
    (
        "unknown-field",
        sub(ALLOC_TEXT, "replicas: 5", "replicas: 5, colour: red"),
        "llms.generator.colour",
    ),
    (
        "duplicate-key",
        ALLOC_TEXT + "  generator: {gpu: A100-80GB, tp: 1, share: 0.6}\n",
        "line 6",
        "generator",
    ),
    (
        "duplicate-field",
        sub(ALLOC_TEXT, "replicas: 5", "replicas: 5, replicas: 6"),
        "replicas",
        "duplicate",
    ),
    ("newline-llm", ALLOC_TEXT + '  "gen\\nerator": {gpu: A100-80GB, tp: 1, share: 0.5}\n', "llms"),
    ("shell-llm", ALLOC_TEXT + "  'gen;ls': {gpu: A100-80GB, tp: 1, share: 0.5}\n", "llms"),
    ("json-truncated", '{"llms": {"generator": {"gpu": "A100-80GB", "tp": 1', "line"),
    ("json-duplicate", '{"llms": {}, "llms": {}}', "llms", "duplicate"),
    ("directory", DIR, A),
    ("missing", MISSING, A),
]
for name, text, *exp in ALLOC_CASES:
    case("allocation", name, predict_alloc, A, text, *exp)
ALLOC_ROWS = {row[0]: row for row in ALLOC_CASES}
for name in ("does-not-fit", "tp-unsupported", "unknown-gpu"):  # checked by simulate too
    _, text, *exp = ALLOC_ROWS[name]
    case("simulate-allocation", name, simulate_alloc, A, text, *exp)
option_case(
    "simulate-requests-huge",
    command("simulate", *ALLOC_ARGS, "--requests", "1000000000")(str(ALLOC)),
    "requests",
)

# --- plan.json as --current -----------------------------------------------------------------------

P = "plan.json"
PLAN = {
    "optimiser": "milp",
    "status": "optimal",
    "allocation": {
        "llms": {"generator": {"gpu": "A100-80GB", "tp": 1, "share": 0.5, "replicas": 1}}
    },
}
for name, text, *exp in [
    ("empty", "", "top level"),
    (
        "no-allocation",
        json.dumps({**PLAN, "status": "infeasible", "allocation": None}),
        "allocation",
    ),
    ("unknown-gpu", json.dumps(PLAN).replace("A100-80GB", "B300"), "allocation.llms.generator.gpu"),
    (
        "bad-share",
        json.dumps(PLAN).replace('"share": 0.5', '"share": -1'),
        "allocation.llms.generator.share",
    ),
    ("truncated", json.dumps(PLAN)[:40], "line"),
    ("duplicate-key", json.dumps(PLAN)[:-1] + ', "status": "x"}', "status", "duplicate"),
    ("directory", DIR, P),
    ("missing", MISSING, P),
]:
    case("plan-json", name, plan_current, P, text, *exp, out="new-plan.json")

# --- trace JSON lines (stats, predict --trace) -----------------------------------------------------

T = "trace.jsonl"
T0 = json.loads(TRACE_LINES[0])
T1 = TRACE_LINES[1:6]


def trace_with(first: object) -> str:
    line = first if isinstance(first, str) else json.dumps(first)
    return "\n".join([line, *T1]) + "\n"


for name, text, *exp in [
    ("empty", "", "at least one call"),
    ("blank-lines", "\n\n", "at least one call"),
    ("list-line", trace_with("[1, 2]"), "line 1"),
    ("truncated-line", trace_with(TRACE_LINES[0][:50]), "line 1"),
    (
        "missing-start",
        trace_with({k: v for k, v in T0.items() if k != "start_s"}),
        "line 1: start_s",
    ),
    ("negative-start", trace_with({**T0, "start_s": -1.0}), "line 1: start_s"),
    (
        "nan-end",
        trace_with(TRACE_LINES[0].replace('"end_s": 0.2002466350008479', '"end_s": NaN')),
        "line 1: end_s",
    ),
    (
        "inf-end",
        trace_with(TRACE_LINES[0].replace('"end_s": 0.2002466350008479', '"end_s": Infinity')),
        "line 1: end_s",
    ),
    ("string-tokens", trace_with({**T0, "input_tokens": "many"}), "line 1: input_tokens"),
    ("huge-tokens", trace_with({**T0, "input_tokens": 10**12}), "line 1: input_tokens"),
    ("end-before-start", trace_with({**T0, "end_s": 0.0, "start_s": 1.0}), "line 1: end_s"),
    ("duplicate-key", trace_with(TRACE_LINES[0][:-1] + ', "llm": "reranker"}'), "line 1", "llm"),
    ("duplicate-call-id", "\n".join([TRACE_LINES[0], TRACE_LINES[0]]) + "\n", "line 2: call_id"),
    ("dangling-parent", trace_with({**T0, "parents": ["c99"]}), "line 1: parents"),
    ("llm-and-tool", trace_with({**T0, "tool": "retrieval"}), "line 1"),
    ("newline-workflow", trace_with({**T0, "workflow": "rag\nx"}), "line 1: workflow"),
    ("shell-llm", trace_with({**T0, "llm": "rewriter;rm"}), "line 1: llm"),
    ("unknown-field", trace_with({**T0, "colour": "red"}), "line 1: colour"),
    ("directory", DIR, T),
    ("missing", MISSING, T),
]:
    case("trace", name, stats, T, text, *exp)
case(
    "trace-predict",
    "other-workflow",
    predict_trace,
    T,
    "\n".join(line.replace('"workflow": "rag"', '"workflow": "other"') for line in TRACE_LINES[:6]),
    "workflow",
)
case("trace-predict", "truncated", predict_trace, T, trace_with(TRACE_LINES[0][:30]), "line 1")

# --- measurements JSON lines (profile fit) ---------------------------------------------------------

M = "meas.jsonl"
M0 = json.loads(MEAS_LINES[0])


def meas_with(first: object) -> str:
    line = first if isinstance(first, str) else json.dumps(first)
    return "\n".join([*MEAS_LINES[1:], line]) + "\n"


LAST = f"line {len(MEAS_LINES)}"
for name, text, *exp in [
    ("empty", "", "at least one measurement"),
    ("list-line", meas_with("[1]"), LAST),
    ("truncated-line", meas_with(MEAS_LINES[0][:40]), LAST),
    (
        "missing-latency",
        meas_with({k: v for k, v in M0.items() if k != "latency_ms"}),
        f"{LAST}: latency_ms",
    ),
    ("negative-latency", meas_with({**M0, "latency_ms": -3.0}), f"{LAST}: latency_ms"),
    ("zero-latency", meas_with({**M0, "latency_ms": 0}), f"{LAST}: latency_ms"),
    (
        "nan-latency",
        meas_with(MEAS_LINES[0].replace('"latency_ms": 16.811485', '"latency_ms": NaN')),
        f"{LAST}: latency_ms",
    ),
    (
        "inf-latency",
        meas_with(MEAS_LINES[0].replace('"latency_ms": 16.811485', '"latency_ms": Infinity')),
        f"{LAST}: latency_ms",
    ),
    ("huge-batch", meas_with({**M0, "batch": 10**12}), f"{LAST}: batch"),
    ("zero-tokens", meas_with({**M0, "tokens": 0}), f"{LAST}: tokens"),
    ("share-above-one", meas_with({**M0, "share": 2}), f"{LAST}: share"),
    ("tp-3", meas_with({**M0, "tp": 3}), f"{LAST}: tp"),
    ("tp-16", meas_with({**M0, "tp": 16}), f"{LAST}: tp"),
    ("unknown-model", meas_with({**M0, "model": "gpt-9"}), f"{LAST}: model"),
    ("unknown-gpu", meas_with({**M0, "gpu": "B300"}), f"{LAST}: gpu"),
    ("shell-model", meas_with({**M0, "model": "llama;id"}), f"{LAST}: model"),
    ("newline-gpu", meas_with({**M0, "gpu": "H100\n80GB"}), f"{LAST}: gpu"),
    ("bad-phase", meas_with({**M0, "phase": "generate"}), f"{LAST}: phase"),
    ("duplicate-key", meas_with(MEAS_LINES[0][:-1] + ', "tp": 2}'), LAST, "tp"),
    ("too-few-points", "\n".join(MEAS_LINES[:2]) + "\n", "curve llama-3-8b@H100-80GB tp=1"),
    ("directory", DIR, M),
    ("missing", MISSING, M),
]:
    case("measurements", name, fit, M, text, *exp, out="curves.json")
EXAMPLE_MEAS = str(DATA / "profiles" / "example-measurements.jsonl")
FIT_EXAMPLE = ("profile", "fit", "--measurements", EXAMPLE_MEAS)
option_case("measurements-out-directory", (*FIT_EXAMPLE, "--out", "{d}/outdir"), "outdir",
            files={"outdir": DIR})
option_case("measurements-jobs-zero", (*FIT_EXAMPLE, "--jobs", "0", "--out", "{out}"), "--jobs")

# --- MuxServe grid JSON (profile fit --muxserve) ---------------------------------------------------

X = "grid.json"


def grid(latency: object = 10.0, tp: str = "1", model: str = "llama-7b") -> str:
    cells = {
        str(b): {str(s): {"prefill": latency, "decoding": latency} for s in (64, 128, 256)}
        for b in (1, 2, 4)
    }
    return json.dumps({model: {tp: {"50": cells, "100": cells}}})


for name, text, *exp in [
    ("empty", "", "JSON"),
    ("list", "[1, 2]", "top level"),
    ("negative-latency", grid(-5.0), "llama-7b.1", "prefill"),
    ("zero-latency", grid(0), "llama-7b.1", "prefill"),
    ("string-latency", grid("fast"), "llama-7b.1", "prefill"),
    ("tp-3", grid(tp="3"), "llama-7b.3: tp"),
    ("unknown-model", grid(model="gpt-9"), "gpt-9.1: model"),
    ("truncated", grid()[:60], "line 1"),
    ("duplicate-key", grid()[:-1] + ', "llama-7b": {}}', "llama-7b", "duplicate"),
    ("directory", DIR, X),
    ("missing", MISSING, X),
]:
    case("muxserve", name, fit_muxserve, X, text, *exp, out="curves.json")

# --- curves JSON (profile show --curves) -----------------------------------------------------------

V = "curves.json"
CURVES_DOC = json.loads(CURVES.read_text(encoding="utf-8"))
ONE = {**CURVES_DOC, "curves": CURVES_DOC["curves"][:1]}


def curves_with(**change: object) -> str:
    return json.dumps({**ONE, "curves": [{**ONE["curves"][0], **change}]})


for name, text, *exp in [
    ("empty", "", "JSON"),
    ("list", "[]", "top level"),
    ("missing-curves", json.dumps({"format": ONE.get("format")}), "curves"),
    ("wrong-format", json.dumps({**ONE, "format": "other"}), "format"),
    ("negative-values", curves_with(values=[[[-1.0]]]), "curves[0]"),
    (
        "decreasing-nodes",
        curves_with(batch_nodes=[2.0, 1.0, *ONE["curves"][0]["batch_nodes"][2:]]),
        "curves[0]",
    ),
    ("truncated", json.dumps(ONE)[:100], "line 1"),
    ("duplicate-key", json.dumps(ONE)[:-1] + ', "curves": []}', "curves", "duplicate"),
    ("directory", DIR, V),
    ("missing", MISSING, V),
]:
    case("curves", name, show_curves, V, text, *exp)

# --- catalog YAML (profile show --catalog) ---------------------------------------------------------

K = "catalog.yaml"
for name, text, *exp in [
    ("list", "- a\n", "mapping"),
    (
        "negative-memory",
        "gpus:\n  X1: {memory_gib: -80, tflops_fp16: 100, hbm_gbs: 1000, nvlink_domain: 8}\n",
        "gpus.X1",
    ),
    ("duplicate-key", "gpus: {}\ngpus: {}\n", "line 2", "gpus"),
    ("unknown-field", "gpu: {}\n", "gpu"),
    ("missing", MISSING, K),
]:
    case("catalog", name, show_catalog, K, text, *exp)

# --- openb CSVs (bench openb) ----------------------------------------------------------------------

N, Q = "nodes.csv", "pods.csv"
for name, text, *exp in [
    ("empty", "", "header"),
    ("missing-column", "sn,cpu_milli,memory_mib\nn0,1,1\n", "column gpu"),
    ("no-rows", NODES_HEADER, "data row"),
    ("string-gpu", NODES_HEADER + "n0,8000,100,two,T4\n", "row 1 (line 2): gpu"),
    ("negative-cpu", NODES_HEADER + "n0,-5,100,2,T4\n", "row 1 (line 2): cpu_milli"),
    ("huge-gpu", NODES_HEADER + "n0,8000,100,1000000,T4\n", "row 1 (line 2): gpu"),
    ("nan-memory", NODES_HEADER + "n0,8000,nan,2,T4\n", "row 1 (line 2): memory_mib"),
    ("duplicate-name", GOOD_NODES + "n0,8000,1000,2,T4\n", "row 2 (line 3): sn"),
    ("shell-name", NODES_HEADER + "n0;id,8000,1000,2,T4\n", "row 1 (line 2): sn"),
    ("no-gpus", NODES_HEADER + "n0,8000,1000,0,\n", "gpu"),
    ("truncated-row", GOOD_NODES + "n1,8000\n", "row 2 (line 3)"),
    ("directory", DIR, N),
    ("missing", MISSING, N),
]:
    case("openb-nodes", name, openb_nodes, N, text, *exp, extra={Q: GOOD_PODS})
for name, text, *exp in [
    ("missing-column", "name,cpu_milli\np0,1\n", "column memory_mib"),
    ("negative-gpus", PODS_HEADER + "p0,1000,100,-1,500\n", "row 1 (line 2): num_gpu"),
    ("big-milli", PODS_HEADER + "p0,1000,100,1,1500\n", "row 1 (line 2): gpu_milli"),
    ("multi-gpu-share", PODS_HEADER + "p0,1000,100,2,500\n", "row 1 (line 2): gpu_milli"),
    ("newline-name", PODS_HEADER + '"p\n0",1000,100,1,500\n', "row 1", "name"),
    ("truncated-row", PODS_HEADER + "p0,1000,100\n", "row 1 (line 2)"),
    ("missing", MISSING, Q),
]:
    case("openb-pods", name, openb_pods, Q, text, *exp, extra={N: GOOD_NODES})
OPENB_GOOD = ("bench", "openb", "--nodes", "{d}/nodes.csv", "--pods", "{d}/pods.csv")
option_case("openb-until-negative", (*OPENB_GOOD, "--until", "-1"), "--until",
            files={N: GOOD_NODES, Q: GOOD_PODS})
option_case("openb-policy-empty", (*OPENB_GOOD, "--policy", ""), "--policy",
            files={N: GOOD_NODES, Q: GOOD_PODS})

# --- CLI options that name no file (validated by the CLI) ------------------------------------------

for name, extra_args, flag in [
    ("tp-3", ("--tp", "3"), "--tp"),
    ("tp-16", ("--tp", "16"), "--tp"),
    ("shares-tiny", ("--shares", "0.01"), "--shares"),
    ("seed-negative", ("--seed", "-1"), "--seed"),
    ("change-penalty-without-current", ("--change-penalty", "1"), "--change-penalty"),
    ("out-directory", ("--out", "{d}"), "--out"),  # the last --out wins
    ("out-under-file", ("--out", "{out}/plan.json"), "--out"),
    ("out-in-sys", ("--out", "/sys/plan.json"), "--out"),
    ("latency-bound-min-latency", ("--latency-bound", "1"), "--latency-bound"),
]:
    option_case(
        f"plan-option-{name}", (*plan_cluster(str(CLUSTER)), *extra_args), flag, out="plan.json"
    )

RUN_TORCH = ("profile", "run", "--backend", "torch", "--model", "llama-3-8b", "--out", "{out}")
option_case("profile-run-scale-zero", (*RUN_TORCH, "--scale", "0"), "--scale", "(0, 1]")
option_case("profile-run-encoder", (*RUN_TORCH, "--model", "bge-reranker-large"), "--model")
option_case("profile-run-phases", (*RUN_TORCH, "--phases", "foo"), "--phases")
option_case("serve-curve-input-exp-zero", ("profile", "serve-curve", "--model", "llama-3-8b",
                                           "--input", "exp:0", "--out", "{out}"), "--input")

# cases known to fail, with the reason (strict: they fail the suite once they pass)
XFAIL: dict[str, str] = {}


# --- the test ---------------------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def _write(folder: Path, files: dict[str, object]) -> None:
    for name, text in files.items():
        p = folder / name
        if text is DIR:
            p.mkdir()
        elif text is MISSING:
            continue
        elif isinstance(text, str):
            p.write_bytes(text.encode("utf-8", "surrogateescape"))


def test_the_table_is_large_and_ids_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 120


@pytest.mark.parametrize(
    "c",
    [
        pytest.param(
            c,
            id=c.id,
            marks=[pytest.mark.xfail(strict=True, reason=XFAIL[c.id])] if c.id in XFAIL else [],
        )
        for c in CASES
    ],
)
def test_bad_input_exits_2_with_one_line_naming_file_and_field(
    c: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, c.files)
    out = tmp_path / c.out
    out.write_text(OLD_OUT, encoding="utf-8")
    argv = [
        a.replace("{f}", str(tmp_path / c.bad))
        .replace("{out}", str(out))
        .replace("{d}", str(tmp_path))
        for a in c.argv
    ]
    if c.bad:
        argv = [str(tmp_path / c.bad) if a == c.bad else a for a in argv]
    before = _snapshot(tmp_path)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2, (rc, captured.err[-2000:])
    assert "Traceback" not in captured.err + captured.out
    assert len(lines) == 1, lines
    msg = lines[0]
    if c.bad:
        assert msg.startswith("scepsy: error: "), msg
    else:  # an option: argparse's form, naming the command and the flag
        assert re.match(r"scepsy( [a-z]+)*: error: ", msg), msg
    if c.bad:
        assert c.bad in msg, msg  # the file
    for text in c.expect:
        assert text in msg, (text, msg)  # the field, line or flag
    assert _snapshot(tmp_path) == before  # nothing written, nothing clobbered


@pytest.mark.parametrize(
    "case_id", ["workflow-huge-poisson-mean", "cluster-huge-nodes", "openb-nodes-string-gpu"]
)
def test_the_installed_command_exits_2_too(case_id: str, tmp_path: Path) -> None:
    """End to end through a new interpreter: the exit status the shell sees."""
    import subprocess
    import sys

    c = next(x for x in CASES if x.id == case_id)
    _write(tmp_path, c.files)
    argv = [
        a.replace("{out}", str(tmp_path / c.out)).replace("{d}", str(tmp_path)) for a in c.argv
    ]
    argv = [str(tmp_path / c.bad) if a == c.bad else a for a in argv]
    run = subprocess.run(
        [sys.executable, "-m", "scepsy.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("scepsy: error: ") and run.stderr.count("\n") == 1
    assert c.bad in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / c.out).exists()
