"""The third bad-input campaign (issue 44, item 6), written from the docs alone (docs/*.md,
``scepsy --help``, ``scepsy CMD --help``): for each command and each input the docs describe
(workflow, cluster and allocation YAML, plan.json, routes.json, recorded arrivals, traces,
curves and overheads, flags), the inputs a user gets wrong: negative, zero, NaN/inf, out of
range, wrong type, duplicate key, unknown field, empty, not UTF-8, a directory, and outputs that
exist, lie in a missing folder, are not writable or are an input of the same command.

Each case runs the real CLI in-process in a fresh folder of valid inputs, every declared output
already holding an earlier result, and is classified as :mod:`benchmarks/bad_input.py` does:

* ``ok``: exit 2, one line ``scepsy...: error: ...`` naming what the case says (file, field or
  flag), no traceback, and every file of the folder byte for byte as it was, no file added
  (no temp file left behind);
* ``silent`` (exit 0), ``traceback`` (an exception or a traceback), ``clobbered`` (the folder
  changed), ``unclear`` (another status, several lines, or the message names none of it),
  ``hang`` (still running after :data:`LIMIT_S`).

Commands that plan or serve get small limits (``--time-limit``, ``--duration``) so that an input
wrongly accepted still ends quickly; a refused input must be refused before any solve or server.
The before/after counts are in docs/cli.md ("Bad input, third round").
"""

from __future__ import annotations

import contextlib
import io
import shutil
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from conftest import REPO
from scepsy.cli import main

DATA = REPO / "datasets"
OLD = b"an earlier good result\n"
LIMIT_S = 60
DIR = object()  # a directory where the case names a file


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8")


WF = _text(DATA / "workflows" / "rag.yaml")
RB = _text(DATA / "workflows" / "rag-beam.yaml")
ALLOC = _text(DATA / "allocations" / "rag-4gpu.yaml")
CLUSTER = _text(DATA / "clusters" / "a100-4.yaml")
ARR = _text(DATA / "arrivals" / "bursty-10min.txt")
TRACE = _text(DATA / "traces" / "rag-50.jsonl")
PLAN = _text(DATA / "plans" / "rag-beam-a100-16.json")
OVERHEADS = _text(DATA / "overheads" / "vllm-cpu-0.32.0.yaml")
MEAS = _text(DATA / "profiles" / "example-measurements.jsonl")
MUX = str(DATA / "e2e" / "muxserve-example")

BASE: dict[str, object] = {
    "wf.yaml": WF, "rb.yaml": RB, "alloc.yaml": ALLOC, "cluster.yaml": CLUSTER,
    "arr.txt": ARR, "trace.jsonl": TRACE, "plan.json": PLAN, "overheads.yaml": OVERHEADS,
    "meas.jsonl": MEAS, "rag.yaml": WF, "beam-search.yaml": _text(DATA / "workflows" /
                                                                 "beam-search.yaml"),
    "out.json": OLD, "out.txt": OLD, "blocker": OLD,
}
"""Every case's folder: valid inputs, and outputs that already hold an earlier result."""


def sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


@dataclass(frozen=True)
class Case:
    """``argv`` runs in the case's folder; ``files`` replace or add to :data:`BASE`; the refusal
    must contain every text of ``names`` (case-insensitive)."""

    id: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    files: tuple[tuple[str, object], ...] = ()
    either: bool = False  # accepted (exit 0) is fine too: not bad input, only an odd one


CASES: list[Case] = []


def case(id: str, argv: str | tuple[str, ...], *names: str, either: bool = False,
         **files: object) -> None:
    args = tuple(argv.split()) if isinstance(argv, str) else argv
    CASES.append(Case(id, args, names, tuple((k.replace("__", "."), v)
                                             for k, v in files.items()), either))


# --- the commands, each with valid inputs, the bad part appended or substituted -----------------

SIM = "simulate --workflow wf.yaml --allocation alloc.yaml --trace-requests 20 --requests 20"
PRED = "predict --workflow wf.yaml --allocation alloc.yaml --trace-requests 20"
PLAN_ = ("plan --workflow wf.yaml --cluster cluster.yaml --trace-requests 20 --time-limit 5 "
         "--quiet --no-timings --out out.json")
GATEWAY = "gateway --listen 127.0.0.1:0 --routes routes.json --out gw.jsonl --duration 0.3"
RECORD = "record --listen 127.0.0.1:0 --upstream http://127.0.0.1:9 --out rec.jsonl --duration 0.3"
RECEIVE = "trace receive --listen 127.0.0.1:0 --out spans.jsonl --duration 0.3"
CONTROL = ("control --plan plan.json --workflow rb.yaml --gateway http://127.0.0.1:9 --dry-run "
           "--duration 0.5 --trace-requests 20 --log log.jsonl")
DRIVE = ("drive --workflow rb.yaml --routes routes.json --rate 1 --requests 1 --timeout 1 "
         "--connect-timeout 0.5 --deadline 1")
BENCH = "bench control --quick --json out.json"
SHOW = "profile show --model llama-13b --gpu A100-80GB --tp 1 --shares 1"
VALIDATE = f"validate muxserve {MUX} --no-simulate"
REPORT = "report plan.json --out rep"
LAUNCH = "launch plan.json --target routes --out L"
REPLAN = ("replan --plan plan.json --workflow rb.yaml --event load=rag*1.1 --trace-requests 20 "
          "--time-limit 5 --out out.json")

# --- recorded arrivals (docs/arrivals.md): simulate, predict, plan ----------------------------

ARR_BAD = {
    "empty": "", "comment-only": "# nothing\n", "negative": "0\n-1\n2\n", "nan": "0\nnan\n2\n",
    "inf": "0\ninf\n", "word": "0\nsoon\n", "huge": "0\n1e400\n", "nonutf8": b"0\n\xff\xfe\n",
}
for name, text in ARR_BAD.items():
    case(f"simulate-arrivals-{name}", f"{SIM} --arrivals bad.txt", "bad.txt", bad__txt=text)
for name in ("negative", "nan", "word"):
    case(f"predict-arrivals-{name}", f"{PRED} --arrivals bad.txt", "bad.txt",
         bad__txt=ARR_BAD[name])
    case(f"plan-arrivals-{name}", f"{PLAN_} --arrivals bad.txt", "bad.txt",
         bad__txt=ARR_BAD[name])
case("simulate-arrivals-dir", f"{SIM} --arrivals adir", "adir", adir=DIR)
case("simulate-arrivals-missing", f"{SIM} --arrivals nope.txt", "nope.txt")
JL = {"no-timestamp": '{"input_length": 5}\n', "string-ts": '{"timestamp": "soon"}\n',
      "negative-ts": '{"timestamp": 0}\n{"timestamp": -5}\n', "not-json": "{oops\n",
      "nan-ts": '{"timestamp": 0}\n{"timestamp": NaN}\n', "list": "[1, 2]\n",
      "duplicate-key": '{"timestamp": 0, "timestamp": 5}\n{"timestamp": 10}\n',
      "bool-ts": '{"timestamp": 0}\n{"timestamp": true}\n'}
for name, text in JL.items():
    case(f"simulate-arrivals-jsonl-{name}", f"{SIM} --arrivals bad.jsonl", "bad.jsonl",
         bad__jsonl=text)
for flag in ("0", "-1", "nan", "inf"):
    case(f"simulate-time-scale-{flag}", f"{SIM} --arrivals arr.txt --time-scale {flag}",
         "--time-scale")
    case(f"predict-time-scale-{flag}", f"{PRED} --arrivals arr.txt --time-scale {flag}",
         "--time-scale")
    case(f"plan-peak-window-{flag}", f"{PLAN_} --arrivals arr.txt --peak-window {flag}",
         "--peak-window")
for q in ("0", "1.5", "-0.5", "nan"):
    case(f"plan-peak-quantile-{q}", f"{PLAN_} --arrivals arr.txt --peak-quantile {q}",
         "--peak-quantile")
case("plan-peak-window-longer-than-trace", f"{PLAN_} --arrivals arr.txt --peak-window 100000",
     "--peak-window")
case("plan-arrivals-one-time", f"{PLAN_} --arrivals one.txt", "one.txt", one__txt="5\n")
case("simulate-time-scale-without-arrivals", f"{SIM} --rate 1 --time-scale 2", "--time-scale")
case("simulate-requests-0-with-arrivals", f"{SIM.replace('--requests 20', '--requests 0')} "
     "--arrivals arr.txt", "--requests")

# --- flags of predict / simulate / plan (docs/cli.md) -----------------------------------------

for flag, values in {"--max-num-seqs": ("0", "65537", "-1"), "--block-size": ("0", "1025"),
                     "--max-num-batched-tokens": ("0", "10000001")}.items():
    for v in values:
        case(f"predict{flag}-{v}", f"{PRED} --rate 1 {flag} {v}", flag)
for v in ("0", "-1", "nan", "inf", "2e6"):
    case(f"predict-rate-{v}", f"{PRED} --rate {v}", "--rate")
    case(f"plan-target-{v}", f"{PLAN_} --target {v}", "--target")
case("simulate-requests-0", f"{SIM} --rate 1".replace("--requests 20", "--requests 0"),
     "--requests")
case("simulate-trace-requests-neg", f"{SIM} --rate 1".replace("--trace-requests 20",
                                                               "--trace-requests -5"),
     "--trace-requests")
case("predict-seed-neg", f"{PRED} --rate 1 --seed -1", "--seed")
for flag, v in [("--max-utilisation", "0"), ("--max-utilisation", "1.5"),
                ("--max-utilisation", "nan"), ("--gap", "-0.1"), ("--gap", "nan"),
                ("--time-limit", "0"), ("--time-limit", "-1"), ("--time-limit", "inf"),
                ("--max-rounds", "0"), ("--repack", "-1"), ("--tp", "3"), ("--tp", "0"),
                ("--shares", "0"), ("--shares", "1.5"), ("--shares", "nan"),
                ("--memory-shares", "1.5"), ("--ttft-slo", "0"), ("--ttft-slo", "-1"),
                ("--ttft-slo", "nan"), ("--ttft-slo", "100:0.5"), ("--ttft-slo", "0:0.5"),
                ("--ttft-slo", "90:-1"), ("--ttft-slo", "nope=0.5"), ("--tpot-slo", "0"),
                ("--tpot-slo", "inf"), ("--tpot-slo", "90:0.1"),
                ("--latency-bound", "rag=100:2"), ("--latency-bound", "rag=90:nan")]:
    case(f"plan{flag}-{v}", f"{PLAN_} --target 1 {flag} {v}", flag)
case("plan-price-neg", f"{PLAN_} --target 1 --objective min-cost --price A100-80GB=-1",
     "--price")
case("plan-price-nan", f"{PLAN_} --target 1 --objective min-cost --price A100-80GB=nan",
     "--price")

# --- workflow / cluster / allocation files ----------------------------------------------------

for name, text, names in [
    ("duplicate-key", WF + "name: rag2\n", ("wf2.yaml", "name")),
    ("unknown-field", WF + "colour: blue\n", ("wf2.yaml", "colour")),
    ("nonutf8", WF.encode() + b"# \xff\n", ("wf2.yaml",)),
    ("empty", "", ("wf2.yaml",)),
]:
    case(f"predict-workflow-{name}", f"{PRED} --rate 1".replace("wf.yaml", "wf2.yaml"),
         *names, wf2__yaml=text)
for name, new, names in [
    ("nodes-0", "nodes: 0", ("nodes",)), ("nodes-neg", "nodes: -1", ("nodes",)),
    ("gpus-nan", "gpus_per_node: .nan", ("gpus_per_node",)),
    ("price-neg", "nodes: 1, price_per_hour: -3", ("price_per_hour",)),
    ("price-nan", "nodes: 1, price_per_hour: .nan", ("price_per_hour",)),
    ("price-huge", "nodes: 1, price_per_hour: 2000000", ("price_per_hour",)),
    ("unknown", "nodes: 1, colour: blue", ("colour",)),
]:
    old = "gpus_per_node: 4" if name == "gpus-nan" else "nodes: 1"
    case(f"plan-cluster-{name}", f"{PLAN_} --target 1".replace("cluster.yaml", "c2.yaml"),
         "c2.yaml", *names, c2__yaml=sub(CLUSTER, old, new))
case("plan-cluster-duplicate-key", f"{PLAN_} --target 1".replace("cluster.yaml", "c2.yaml"),
     "c2.yaml", "name", c2__yaml=CLUSTER + "name: again\n")
for name, old, new, field in [
    ("share-0", "share: 0.3", "share: 0", "share"), ("share-1.5", "share: 0.3", "share: 1.5",
                                                      "share"),
    ("share-nan", "share: 0.3", "share: .nan", "share"),
    ("replicas-0", "replicas: 5", "replicas: 0", "replicas"),
    ("replicas-neg", "replicas: 5", "replicas: -2", "replicas"),
    ("tp-0", "tp: 1, share: 0.3", "tp: 0, share: 0.3", "tp"),
    ("unknown", "replicas: 1}", "replicas: 1, colour: blue}", "colour"),
]:
    case(f"simulate-allocation-{name}", f"{SIM} --rate 1".replace("alloc.yaml", "a2.yaml"),
         "a2.yaml", field, a2__yaml=sub(ALLOC, old, new))
case("simulate-allocation-duplicate-llm",
     f"{SIM} --rate 1".replace("alloc.yaml", "a2.yaml"), "a2.yaml", "rewriter",
     a2__yaml=ALLOC + "  rewriter: {gpu: A100-80GB, tp: 1, share: 0.3, replicas: 1}\n")

# --- plan.json (docs/plan-format.md): report, launch, predict, control, replan --------------

PLAN_BAD = {
    "empty": ("", ()), "nonutf8": (b"{\xff}", ()), "truncated": (PLAN[: len(PLAN) // 2], ()),
    "duplicate-key": (sub(PLAN, "{", '{\n  "status": "optimal",'), ("status",)),
    "nan-share": (sub(PLAN, '"share": 0.5', '"share": NaN'), ("share",)),
    "share-2": (sub(PLAN, '"share": 0.5', '"share": 2'), ("share",)),
    "replicas-neg": (sub(PLAN, '"replicas": 5', '"replicas": -5'), ("replicas",)),
    "replicas-string": (sub(PLAN, '"replicas": 5', '"replicas": "5"'), ("replicas",)),
    "list": ("[]", ()),
}
for name, (text, fields) in PLAN_BAD.items():
    case(f"report-plan-{name}", REPORT.replace("plan.json", "p2.json"), "p2.json", *fields,
         p2__json=text)
    case(f"launch-plan-{name}", LAUNCH.replace("plan.json", "p2.json"), "p2.json", *fields,
         p2__json=text)
for name in ("duplicate-key", "nan-share", "replicas-neg"):
    text, fields = PLAN_BAD[name]
    case(f"predict-plan-{name}", ("predict --workflow rb.yaml --allocation p2.json --rate 1 "
                                  "--trace-requests 20"), "p2.json", *fields, p2__json=text)
    case(f"control-plan-{name}", CONTROL.replace("plan.json", "p2.json"), "p2.json", *fields,
         p2__json=text)
    case(f"replan-plan-{name}", REPLAN.replace("plan.json", "p2.json"), "p2.json", *fields,
         p2__json=text)
case("report-plan-dir", REPORT.replace("plan.json", "pdir"), "pdir", pdir=DIR)
case("replan-event-load-neg", REPLAN.replace("load=rag*1.1", "load=rag*-1"), "--event")
case("replan-event-load-nan", REPLAN.replace("load=rag*1.1", "load=rag=nan"), "--event")
case("replan-event-node-unknown", REPLAN.replace("load=rag*1.1", "node-failed=nope"), "nope")
case("replan-move-cost-neg", f"{REPLAN} --move-cost -1", "--move-cost")
case("replan-move-cost-nan", f"{REPLAN} --move-cost nan", "--move-cost")

# --- routes.json (docs/launch.md, docs/gateway.md): gateway, drive ---------------------------

ROUTES = ('{"version": 1, "workflows": {"rag": {"generator": [{"model": "generator", '
          '"replica": 0, "url": "http://127.0.0.1:9/v1", "weight": WEIGHT}]}}}')
for name, text, fields in [
    ("weight-neg", ROUTES.replace("WEIGHT", "-1"), ("weight",)),
    ("weight-nan", ROUTES.replace("WEIGHT", "NaN"), ("weight",)),
    ("weight-sum", ROUTES.replace("WEIGHT", "0.5"), ("weight",)),
    ("url-ftp", ROUTES.replace("WEIGHT", "1").replace("http://", "ftp://"), ("url",)),
    ("url-port", ROUTES.replace("WEIGHT", "1").replace(":9/", ":70000/"), ("url",)),
    ("duplicate-key", ROUTES.replace("WEIGHT", "1").replace('"version": 1,',
                                                            '"version": 1, "version": 1,'),
     ("version",)),
    ("unknown-field", ROUTES.replace("WEIGHT", '1, "colour": "blue"'), ("colour",)),
    ("empty", "", ()), ("nonutf8", b"\xff\xfe", ()),
]:
    case(f"gateway-routes-{name}", GATEWAY.replace("routes.json", "r2.json"), "r2.json",
         *fields, r2__json=text)
    case(f"drive-routes-{name}", DRIVE.replace("routes.json", "r2.json"), "r2.json", *fields,
         r2__json=text)
GOOD_ROUTES = ROUTES.replace("WEIGHT", "1")
for flag, v in [("--retries", "6"), ("--retries", "-1"), ("--timeout", "0"),
                ("--timeout", "nan"), ("--duration", "-1"), ("--max-body-bytes", "0"),
                ("--listen", "127.0.0.1:70000"), ("--listen", "nohost")]:
    case(f"gateway{flag}-{v}", f"{GATEWAY} {flag} {v}", flag, routes__json=GOOD_ROUTES)
    case(f"record{flag}-{v}", f"{RECORD} {flag} {v}", flag)
case("gateway-routes-dir", GATEWAY.replace("routes.json", "rdir"), "rdir", rdir=DIR)
case("record-upstream-ftp", RECORD.replace("http://127.0.0.1:9", "ftp://127.0.0.1:9"),
     "--upstream")
case("record-upstream-port-0", RECORD.replace("http://127.0.0.1:9", "http://127.0.0.1:0"),
     "--upstream")
case("receive-duration-nan", f"{RECEIVE} --duration nan", "--duration")
case("receive-max-body-neg", f"{RECEIVE} --max-body-bytes -1", "--max-body-bytes")
for flag, v in [("--rate", "0"), ("--rate", "nan"), ("--requests", "0"),
                ("--max-in-flight", "0"), ("--timeout", "0"), ("--stall-timeout", "-1"),
                ("--connect-timeout", "inf"), ("--deadline", "-1"), ("--vocab", "0"),
                ("--seed", "-1")]:
    case(f"drive{flag}-{v}", f"{DRIVE} {flag} {v}", flag, routes__json=GOOD_ROUTES)

# --- control (docs/control.md) ----------------------------------------------------------------

for flag, v in [("--window", "0"), ("--window", "nan"), ("--startup-s", "-1"),
                ("--health-timeout", "0"), ("--duration", "-1"), ("--max-utilisation", "2"),
                ("--gateway", "ftp://127.0.0.1:9"), ("--gateway", "http://127.0.0.1:70000"),
                ("--metrics-listen", "127.0.0.1:99999")]:
    case(f"control{flag}-{v}", f"{CONTROL} {flag} {v}", flag)

# --- bench control (docs/bench-control.md): refused before any plan ---------------------------

for flag, v in [("--gpus", "8"), ("--gpus", "65"), ("--gpus", "0"), ("--windows", "0"),
                ("--window", "0"), ("--window", "nan"), ("--startup", "-1"),
                ("--startup", "inf"), ("--seed", "-1"), ("--profiles", "weekly"),
                ("--profiles", ""), ("--workflow", "nope"), ("--gpu", "Z80")]:
    case(f"bench-control{flag}-{v or 'empty'}", (*BENCH.split(), flag, v), flag)

case("bench-control--windows-2", f"{BENCH} --windows 2", "--windows")
case("bench-control-figures-under-a-file", f"{BENCH} --figures blocker/figs", "--figures")
# a listen address another process holds: refused before the output file is made
for tag, cmd in [("gateway", GATEWAY), ("record", RECORD), ("receive", RECEIVE)]:
    case(f"{tag}-listen-busy", cmd.replace("127.0.0.1:0", "127.0.0.1:{busy}"), "--listen",
         routes__json=GOOD_ROUTES)

# --- trace import (docs/otel.md): spans and the trace map -------------------------------------

SPANS = str(REPO / "tests" / "golden" / "otel" / "openinference_openai.otlp.jsonl")
IMPORT = f"trace import {SPANS} --out out.json"
for name, text, names in [
    ("unknown-field", "workflow: w\ncolour: blue\n", ("m.yaml", "colour")),
    ("duplicate-key", "workflow: w\nworkflow: v\n", ("m.yaml", "workflow")),
    ("bad-name", "workflow: 'a b'\n", ("m.yaml", "workflow")),
    ("models-list", "models: [a, b]\n", ("m.yaml", "models")),
    ("empty", "", ("m.yaml",)), ("nonutf8", b"workflow: \xff\n", ("m.yaml",)),
]:
    case(f"trace-import-map-{name}", f"{IMPORT} --map m.yaml", *names, m__yaml=text)
for name, text in [("empty", ""), ("nonutf8", b"\xff\n"), ("not-json", "{oops\n"),
                   ("list", "[1]\n")]:
    case(f"trace-import-spans-{name}", "trace import s.jsonl --out out.json --strict",
         "s.jsonl", s__jsonl=text)
case("trace-import-spans-dir", "trace import sdir --out out.json", "sdir", sdir=DIR)
case("trace-import-model-bad", f"{IMPORT} --model =x", "--model")
case("trace-import-report-is-input", f"{IMPORT} --report {SPANS}", "--report")
case("trace-import-report-same-as-out", f"{IMPORT} --report out.json", "--report")
case("plan-launch-bogus", f"{PLAN_} --target 1 --launch bogus", "--launch")
case("plan-launch-out-file", f"{PLAN_} --target 1 --launch shell --launch-out blocker",
     "--launch-out")
case("validate-fit-overheads-under-a-file", f"{VALIDATE} --fit-overheads blocker/o.yaml",
     "--fit-overheads")
case("profile-fit-catalog-out-is-input",
     "profile fit --measurements meas.jsonl --out out.json --catalog-out meas.jsonl",
     "--catalog-out")

# --- options the docs say go together, or never together -----------------------------------

case("simulate-arrivals-and-rate", f"{SIM} --arrivals arr.txt --rate 1", "--rate")
case("plan-arrivals-and-target", f"{PLAN_} --arrivals arr.txt --target 1", "--arrivals")
case("plan-peak-window-without-arrivals", f"{PLAN_} --target 1 --peak-window 60",
     "--peak-window")
case("plan-change-penalty-without-current", f"{PLAN_} --target 1 --change-penalty 5",
     "--change-penalty")
case("plan-mean-bound-min-latency", f"{PLAN_} --target 1 --latency-bound 2", "--latency-bound")
case("predict-trace-and-trace-requests", f"{PRED} --rate 1 --trace trace.jsonl",
     "--trace")
case("plan-target-twice", f"{PLAN_} --target rag=1 --target rag=2", "--target")
case("launch-timeout-neg", "launch plan.json --target routes --out L2 --timeout-s -1",
     "--timeout-s")
case("report-out-holds-other-files", "report plan.json --out L", "L")
case("stop-a-routes-folder", "stop L --node nope", "L", "shell")

# --- rate workloads (docs/rate-workloads.md) and profile run's flags (docs/profiling.md) ------

RATES = _text(DATA / "workloads" / "chat-8b.yaml")
RALLOC = "llms:\n  chat: {gpu: A100-80GB, tp: 1, share: 1.0, replicas: 2}\n"
for name, old, new, field in [
    ("rate-neg", "rate: 12.0", "rate: -1", "rate"), ("rate-nan", "rate: 12.0", "rate: .nan",
                                                     "rate"),
    ("rate-huge", "rate: 12.0", "rate: 2000000", "rate"),
    ("rate-string", "rate: 12.0", "rate: fast", "rate"),
    ("rate-all-zero", "rate: 12.0", "rate: 0", "rate"),
    ("input-mean-neg", "mean: 300", "mean: -300", "input"),
    ("output-kind", "kind: exponential", "kind: zipf", "output"),
    ("input-min-over-max", "min: 4, max: 1536", "min: 2000, max: 1536", "input"),
    ("model-unknown", "model: llama-3-8b", "model: llama-99b", "llama-99b"),
    ("unknown-field", "rate: 12.0", "rate: 12.0\n    colour: blue", "colour"),
]:
    case(f"predict-rates-{name}", "predict --workflow rw.yaml --allocation ra.yaml "
         "--trace-requests 20", "rw.yaml", field, rw__yaml=sub(RATES, old, new),
         ra__yaml=RALLOC)
PROFILE_RUN = ("profile run --backend torch --model llama-3-8b --scale 0.0625 --max-points 1 "
               "--out store.jsonl --quiet")
for flag, v in [("--scale", "0"), ("--scale", "1.5"), ("--tp", "0"), ("--shares", "1.5"),
                ("--max-batch", "0"), ("--min-tokens", "0"), ("--target-error", "-1"),
                ("--target-error", "nan"), ("--error-quantile", "0"),
                ("--error-quantile", "1.5"), ("--max-points", "0"), ("--budget-s", "-1"),
                ("--repeats", "0"), ("--warmup", "-1"), ("--threads", "0"), ("--kv-gib", "0"),
                ("--engine-option", "junk"), ("--point-timeout-s", "0"),
                ("--backend", "bogus"), ("--phases", "bogus"), ("--max-batch-tokens", "0"),
                ("--model", "llama-99b")]:
    case(f"profile-run{flag}-{v}", f"{PROFILE_RUN} {flag} {v}", flag.lstrip("-")
         if flag in ("--model",) else flag)
case("profile-run-min-over-max-tokens", f"{PROFILE_RUN} --min-tokens 100 --max-tokens 10",
     "tokens")
case("profile-run-store-is-a-trace", PROFILE_RUN.replace("store.jsonl", "trace.jsonl"),
     "trace.jsonl")

# --- profile serve-curve's flags and calibrate's serve-curve file (docs/profiling.md,
# docs/overheads.md); refused before any engine is looked for -----------------------------------

SERVE = ("profile serve-curve --model llama-3-8b --scale 0.0625 --out out.json --quiet "
         "--engine-python /nonexistent/python")
for flag, v in [("--scale", "0"), ("--share", "1.5"), ("--tp", "0"), ("--input", "exp:-5"),
                ("--input", "lognormal:100:nan"), ("--output", "bogus"), ("--kv-gib", "-1"),
                ("--max-num-seqs", "0"), ("--max-model-len", "0"), ("--start-rate", "0"),
                ("--factor", "1"), ("--factor", "0.5"), ("--max-rates", "0"),
                ("--calls-per-rate", "0"), ("--seed", "-1")]:
    case(f"serve-curve{flag}-{v}", f"{SERVE} {flag} {v}", flag)
SC = _text(DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json")
CALIBRATE = ("profile calibrate --serve-curve sc.json --curves "
             f"{DATA}/profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json --catalog "
             f"{DATA}/catalogs/cpu-host.yaml --out out.json")
for name, text, field in [
    ("empty", "", ""), ("nonutf8", b"{\xff}", ""), ("list", "[]", ""),
    ("rate-neg", sub(SC, '"achieved_rate": 2.2346288017103255', '"achieved_rate": -2'),
     "achieved_rate"),
    ("rate-nan", sub(SC, '"achieved_rate": 2.2346288017103255', '"achieved_rate": NaN'),
     "achieved_rate"),
    ("kind", sub(SC, '"kind": "scepsy serve-curve"', '"kind": "something"'), "kind"),
    ("duplicate-key", sub(SC, '"device": "cpu",', '"device": "cpu", "device": "cpu",'),
     "device"),
]:
    case(f"calibrate-serve-curve-{name}", CALIBRATE, "sc.json", *([field] if field else []),
         sc__json=text)
case("validate-arrivals-not-json", f"{VALIDATE} --arrivals w.json", "w.json", w__json="{oops")
case("validate-arrivals-list", f"{VALIDATE} --arrivals w.json", "w.json", w__json="[]")

# --- profiles, calibration, validation, openb --------------------------------------------------

for flag, v in [("--batch", "0"), ("--seq", "-1"), ("--input", "0"), ("--output", "nan"),
                ("--shares", "1.5"), ("--shares", "0")]:
    case(f"profile-show{flag}-{v}", f"{SHOW} {flag} {v}".replace("--shares 1 --shares",
                                                                  "--shares"), flag)
case("profile-show-overheads-unused-calibration-dir", f"{SHOW} --calibration cdir",
     "cdir", cdir=DIR)
for v in ("0", "1.5", "nan", "-0.2"):
    case(f"calibrate-light-fraction-{v}",
         ("profile", "calibrate", "--serve-curve",
          str(DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"),
          "--curves", str(DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"),
          "--catalog", str(DATA / "catalogs" / "cpu-host.yaml"), "--light-fraction", v,
          "--out", "out.json"), "--light-fraction")
for name, old, new, field in [("iteration-neg", "iteration_ms: 0.394", "iteration_ms: -1",
                               "iteration_ms"),
                              ("http-nan", "http_ms: 18.65", "http_ms: .nan", "http_ms"),
                              ("unknown", "http_ms: 18.65", "http_ms: 18.65\ncolour: blue",
                               "colour")]:
    case(f"predict-overheads-{name}", f"{PRED} --rate 1 --overheads o2.yaml", "o2.yaml",
         field, o2__yaml=sub(OVERHEADS, old, new))
for flag, v in [("--output-cv", "-1"), ("--output-cv", "nan"), ("--ttft-slo", "100:1"),
                ("--tpot-slo", "-1"), ("--seed", "-1")]:
    case(f"validate{flag}-{v}", f"{VALIDATE} {flag} {v}", flag)
case("validate-arrivals-empty", f"{VALIDATE} --arrivals w.json", "w.json", w__json="")
for flag, v in [("--until", "0"), ("--until", "nan"), ("--cpu-share", "1.5"),
                ("--cpu-share", "-0.1"), ("--seed", "-1")]:
    case(f"openb{flag}-{v}", f"bench openb --nodes n.csv --pods p.csv --json {flag} {v}", flag,
         n__csv="sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1000,2,T4\n",
         p__csv="name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,100,1,500\n")
case("stats-seed-neg", "stats trace.jsonl --seed -1", "--seed")
for name, text, field in [
    ("tokens-neg", TRACE.replace('"input_tokens": 217', '"input_tokens": -217', 1),
     "input_tokens"),
    ("end-nan", TRACE.replace('"end_s": 0.2002466350008479', '"end_s": NaN', 1), "end_s"),
    ("duplicate-key", TRACE.replace('"call_id": "c0",', '"call_id": "c0", "call_id": "c9",', 1),
     "call_id"),
    ("nonutf8", TRACE.encode() + b"\xff\n", ""),
]:
    case(f"stats-trace-{name}", "stats t2.jsonl", "t2.jsonl", *([field] if field else []),
         t2__jsonl=text)
case("stop-grace-neg", "stop L --grace-s -1", "--grace-s")
case("stop-grace-nan", "stop L --grace-s nan", "--grace-s")

# --- outputs: equal to an input, in a missing folder, under a file, not writable ---------------

for tag, cmd, out_flag, inp, name in [
    ("plan", f"{PLAN_} --target 1", "--out", "wf.yaml", "wf.yaml"),
    ("trace-generate", "trace generate --workflow wf.yaml --requests 2 --out out.json", "--out",
     "wf.yaml", "wf.yaml"),
    ("profile-fit", "profile fit --measurements meas.jsonl --out out.json", "--out",
     "meas.jsonl", "meas.jsonl"),
    ("gateway", GATEWAY, "--out", "routes.json", "routes.json"),
    ("drive", f"{DRIVE} --json out.json", "--trace-out", "routes.json", "routes.json"),
    ("drive-json", f"{DRIVE} --trace-out t.jsonl", "--json", "rb.yaml", "rb.yaml"),
    ("control", CONTROL, "--log", "plan.json", "plan.json"),
    ("validate", f"{VALIDATE} --json out.json", "--json", f"{MUX}/yamls/x.json", "yamls"),
    ("bench-control", f"{BENCH} --figures figs", "--figures", "out.json", "out.json"),
    ("launch", LAUNCH, "--out", "plan.json", "plan.json"),
    ("report", REPORT, "--out", "plan.json", "plan.json"),
    ("replan", REPLAN, "--out", "rb.yaml", "rb.yaml"),
    ("calibrate", "profile calibrate --serve-curve sc.json --curves "
     f"{DATA}/profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json --catalog "
     f"{DATA}/catalogs/cpu-host.yaml --out out.json", "--out", "sc.json", "sc.json"),
]:
    argv = tuple(cmd.split())
    if out_flag in argv:
        i = argv.index(out_flag)
        argv = (*argv[:i + 1], inp, *argv[i + 2:])
    else:
        argv = (*argv, out_flag, inp)
    files = {"routes__json": GOOD_ROUTES} if "routes.json" in cmd else {}
    if tag == "calibrate":
        files["sc__json"] = _text(DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json")
    case(f"output-is-input-{tag}{out_flag}", argv, name, **files)
for where, path, names in [("under-a-file", "blocker/out.json", ("blocker",)),
                           ("proc", "/proc/out.json", ("/proc/out.json",)),
                           ("a-folder", "afolder", ("afolder",))]:
    extra: dict[str, object] = {"afolder": DIR} if where == "a-folder" else {}
    case(f"plan-out-{where}", f"{PLAN_} --target 1".replace("--out out.json", f"--out {path}"),
         *names, **extra)
    case(f"bench-control-json-{where}", f"bench control --quick --json {path}", *names, **extra)
    case(f"trace-generate-out-{where}",
         f"trace generate --workflow wf.yaml --requests 2 --out {path}", *names, **extra)
# an output in a folder that does not exist yet: made (docs/cli.md), or refused cleanly
case("plan-out-missing-folder", f"{PLAN_} --target 1".replace("--out out.json",
                                                              "--out new/x/out.json"),
     "new", either=True)
case("trace-generate-out-missing-folder",
     "trace generate --workflow wf.yaml --requests 2 --out new/x/out.json", "new", either=True)
# a failed run leaves a pre-existing output: a bad input after a good output flag
case("bench-control-json-kept-bad-figures", f"{BENCH} --figures blocker", "blocker")
case("plan-out-kept-bad-arrivals", f"{PLAN_} --arrivals bad.txt", "bad.txt",
     bad__txt="0\n-1\n")
case("trace-generate-out-kept-bad-requests",
     "trace generate --workflow wf.yaml --requests 0 --out out.json", "--requests")
case("profile-fit-out-kept-bad-seed",
     "profile fit --measurements meas.jsonl --out out.json --seed -1", "--seed")


# --- the runner ---------------------------------------------------------------------------------


def _write(folder: Path, files: dict[str, object]) -> None:
    for name, content in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            p.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            assert isinstance(content, str)
            p.write_text(content, encoding="utf-8")


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: int) -> Iterator[None]:
    def hang(signum: int, frame: object) -> None:
        raise _Hang()

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The valid inputs, the routes and the shell launch folder of the bundled plan."""
    d = tmp_path_factory.mktemp("base")
    _write(d, BASE)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["launch", str(d / "plan.json"), "--target", "routes", "--out",
                     str(d / "L")]) == 0
    shutil.copy(d / "L" / "routes.json", d / "routes.json")
    return d


@pytest.fixture(scope="module")
def busy() -> Iterator[int]:
    """A port this process listens on (a busy ``--listen``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def run_case(c: Case, base: Path, folder: Path, busy: int = 0) -> tuple[str, str]:
    """Runs ``c`` in ``folder`` (a copy of ``base`` with the case's files): (class, detail)."""
    c = replace(c, argv=tuple(a.replace("{busy}", str(busy)) for a in c.argv))
    shutil.copytree(base, folder, dirs_exist_ok=True)
    _write(folder, dict(c.files))
    before = _snapshot(folder)
    out, err = io.StringIO(), io.StringIO()
    code: object
    with contextlib.chdir(folder), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            with _limit(LIMIT_S):
                code = main(list(c.argv))
        except SystemExit as exc:
            code = exc.code
        except _Hang:
            return "hang", f"still running after {LIMIT_S} s"
        except BaseException as exc:  # what a user would see as a traceback
            return "traceback", f"{type(exc).__name__}: {exc}"[:300]
    text = out.getvalue() + err.getvalue()
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    after = _snapshot(folder)
    if "Traceback (most recent call last)" in text:
        return "traceback", text[-300:]
    if code == 0:
        return ("ok", "accepted") if c.either else ("silent", "exit 0")
    if after != before:
        changed = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
        return "clobbered", f"exit {code}, changed {changed[:5]}"
    if code != 2:
        return "unclear", f"exit {code}: {lines[-1:]}"
    if len(lines) != 1 or ": error: " not in lines[0]:
        return "unclear", f"{len(lines)} lines: {lines[:3]}"
    missing = [n for n in c.names if n.lower() not in lines[0].lower()]
    if missing:
        return "unclear", f"names none of {missing}: {lines[0]}"
    return "ok", lines[0]


def test_the_campaign_is_large_and_ids_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(ids) >= 200


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(c: Case, base: Path, busy: int, tmp_path: Path) -> None:
    cls, detail = run_case(c, base, tmp_path / "case", busy)
    assert cls == "ok", f"{cls}: {detail}"


@pytest.mark.parametrize("fail", [True, False])
def test_bench_control_writes_json_and_figures_all_or_none(
        fail: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures are drawn before anything is written: a drawing that fails leaves ``--json``
    and ``--figures`` as they were (no temp file beside them); one that succeeds writes both.
    (The bench itself is replaced by a stub: this is about the writing, not the results.)"""
    from scepsy_serve.control import bench

    result = {"profiles": {}, "forecast": {}, "priority": {}, "notes": [], "x": 1}

    def figures(res: object, folder: Path) -> list[Path]:
        (folder / "control-daily.png").write_bytes(b"png one")
        if fail:
            raise RuntimeError("matplotlib fell over")
        (folder / "control-ramp.png").write_bytes(b"png two")
        return [folder / "control-daily.png", folder / "control-ramp.png"]

    monkeypatch.setattr(bench, "run", lambda opts, say=None: result)
    monkeypatch.setattr(bench, "figures", figures)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.json").write_bytes(OLD)
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "control-daily.png").write_bytes(OLD)
    before = _snapshot(tmp_path)
    argv = ["bench", "control", "--quick", "--json", "out.json", "--figures", "figs"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if fail:
            with pytest.raises(RuntimeError):
                main(argv)
        else:
            assert main(argv) == 0
    if fail:
        assert _snapshot(tmp_path) == before
    else:
        assert sorted(_snapshot(tmp_path)) == ["figs", "figs/control-daily.png",
                                               "figs/control-ramp.png", "out.json"]
        assert (tmp_path / "figs" / "control-ramp.png").read_bytes() == b"png two"
        assert '"x": 1' in (tmp_path / "out.json").read_text()
