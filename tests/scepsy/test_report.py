"""``scepsy report`` and plan.json's per-workflow ``curve``: the curve is the predictor's answer
(an oracle recomputation), non-decreasing in throughput, deterministic, and current in the
bundled plan; the page names everything the plan holds, escapes every string of the file,
explains plans without an allocation and old plans without a curve; the folder is written
whole or not at all and never over anything but an earlier report; bad input exits 2 naming
the file and the field, with nothing written.

The page in a real browser: tests/scepsy/test_report_browser.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import scepsy
from scepsy.cli import main
from scepsy.report import (
    PLACEMENT_COLUMNS,
    default_out,
    load_report,
    placement_rows,
    plan_rows,
    write_report,
)
from scepsy.report.contents import gpu_slots
from scepsy.report.figures import map_layout
from scepsy.report.folder import GENERATOR, write_folder
from scepsy.report.page import NO_CURVE
from scepsy_common.errors import InputError
from scepsy_opt.planning.planfile import CURVE_POINTS, workflow_curves
from scepsy_opt.prediction.pipeline import predict
from scepsy_place.formulations.loop import plan_document
from scepsy_place.packing.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "datasets" / "plans" / "rag-beam-a100-16.json"
RAG_BEAM = REPO / "datasets" / "workflows" / "rag-beam.yaml"
RAG = REPO / "datasets" / "workflows" / "rag.yaml"
A16 = REPO / "datasets" / "clusters" / "a100-16.yaml"
A4 = REPO / "datasets" / "clusters" / "a100-4.yaml"
RACKS = REPO / "datasets" / "clusters" / "racks-a100-h100.yaml"
REQ = 300  # trace requests per workflow (the bundled plan's)
REL = 1e-12  # recomputed predictor figures agree to rounding


def _plan_file(tmp_path: Path, doc: dict[str, Any], name: str = "plan.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def _bundled() -> dict[str, Any]:
    return json.loads(BUNDLED.read_text())


def _html(folder: Path) -> str:
    return (folder / "index.html").read_text(encoding="utf-8")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture(scope="module")
def fresh() -> scepsy.PlanResult:
    """The bundled plan's inputs, planned again."""
    return scepsy.plan(RAG_BEAM, A16, 0.6, trace_requests=REQ)


@pytest.fixture(scope="module")
def infeasible() -> dict[str, Any]:
    return json.loads(json.dumps(scepsy.plan(RAG, A4, 500, trace_requests=REQ).to_dict()))


@pytest.fixture(scope="module")
def unplaced() -> dict[str, Any]:
    res = scepsy.plan(RAG_BEAM, A16, 2.8, trace_requests=REQ, formulation="aggregate",
                      max_rounds=1)
    return json.loads(json.dumps(res.to_dict()))


@pytest.fixture(scope="module")
def racks() -> dict[str, Any]:
    res = scepsy.plan(RAG_BEAM, RACKS, 0.6, trace_requests=REQ, formulation="blocks")
    doc = plan_document(res.problem, res.placed, policy=res.placer, timings=False,
                        topology=load_topology(RACKS))
    return json.loads(json.dumps(doc))


# ------------------------------------------------------------------------------- the curve


def _check_curve(doc: dict[str, Any]) -> None:
    """Every workflow's curve: CURVE_POINTS points at k/(CURVE_POINTS+1) of its maximum
    throughput, increasing throughput, non-decreasing latency."""
    for w, wf in doc["workflows"].items():
        c = wf["curve"]
        assert c["bottleneck"] in wf["llms"]
        pts = c["points"]
        assert len(pts) == CURVE_POINTS, w
        for k, p in enumerate(pts, start=1):
            assert p["throughput"] == pytest.approx(c["max_throughput"] * k / (CURVE_POINTS + 1),
                                                    rel=REL)
        lat = [p["mean_latency_s"] for p in pts]
        assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(lat)), (w, lat)
        assert lat[-1] > lat[0]  # the queues grow towards saturation


def test_curve_is_the_predictors_answer(fresh):
    p, plan = fresh.problem, fresh.plan
    doc = json.loads(json.dumps(fresh.to_dict(timings=False)))
    _check_curve(doc)
    base = predict(p.stats, p.models, plan.allocation, p.latency, dict(p.targets),
                   catalog=p.catalog, policy=p.policy)
    for w, wf in doc["workflows"].items():
        c = wf["curve"]
        assert c["max_throughput"] == pytest.approx(base.workflows[w].max_throughput, rel=REL)
        assert c["bottleneck"] == base.workflows[w].bottleneck
        for k in (0, CURVE_POINTS // 2, CURVE_POINTS - 1):  # recomputed independently
            factor = c["points"][k]["throughput"] / p.targets[w]
            q = predict(p.stats, p.models, plan.allocation, p.latency,
                        {v: t * factor for v, t in p.targets.items()},
                        catalog=p.catalog, policy=p.policy)
            assert c["points"][k]["mean_latency_s"] == pytest.approx(
                q.workflows[w].mean_latency_s, rel=REL)
        # the operating point lies on the curve: between the points around it
        pts = c["points"]
        below = [x for x in pts if x["throughput"] <= wf["throughput"]]
        above = [x for x in pts if x["throughput"] >= wf["throughput"]]
        if below and above:
            assert below[-1]["mean_latency_s"] <= wf["mean_latency_s"] * (1 + 1e-12)
            assert wf["mean_latency_s"] <= above[0]["mean_latency_s"] * (1 + 1e-12)
    assert workflow_curves(p, plan) == workflow_curves(p, plan)  # deterministic


def test_max_throughput_plan_curves_start_from_its_scaled_rates():
    res = scepsy.plan(RAG, A4, 1.0, trace_requests=REQ, objective="max-throughput")
    doc = json.loads(json.dumps(res.to_dict(timings=False)))
    _check_curve(doc)
    wf = doc["workflows"]["rag"]
    assert wf["throughput"] == pytest.approx(doc["targets"]["rag"] * doc["scale"], rel=REL)
    assert wf["throughput"] < wf["curve"]["max_throughput"]


def test_bundled_plan_carries_current_curves(fresh):
    """datasets/plans/README.md says how to regenerate it when this fails."""
    doc = json.loads(json.dumps(fresh.to_dict(timings=False)))
    bundled = _bundled()
    for w, wf in doc["workflows"].items():
        got = bundled["workflows"][w]["curve"]
        assert got["bottleneck"] == wf["curve"]["bottleneck"]
        assert got["max_throughput"] == pytest.approx(wf["curve"]["max_throughput"], rel=1e-9)
        assert [p["mean_latency_s"] for p in got["points"]] == pytest.approx(
            [p["mean_latency_s"] for p in wf["curve"]["points"]], rel=1e-9)


def test_no_allocation_no_curve(infeasible):
    assert "workflows" not in infeasible


def test_a_curve_bounded_by_an_llm_the_workflow_does_not_call_is_rejected(tmp_path):
    doc = _bundled()
    doc["workflows"]["rag"]["curve"]["bottleneck"] = "prm"
    with pytest.raises(InputError) as e:
        write_report(_plan_file(tmp_path, doc), tmp_path / "out")
    assert "workflows.rag.curve.bottleneck" in str(e.value)
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------- the page


class _Links(HTMLParser):
    """Every src/href of a page, and whether it has a script or a stylesheet link."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]


def test_page_shows_every_llm_node_and_workflow_and_needs_only_its_folder(tmp_path):
    plan = tmp_path / "plan.json"
    shutil.copy(BUNDLED, plan)
    folder = write_report(plan, tmp_path / "r")
    text = _html(folder)
    doc = _bundled()
    names = [*doc["llms"], *doc["workflows"], "A100-80GB-0", "A100-80GB-1"]
    for name in names:
        assert name in text, name
    assert GENERATOR in text and "<title>scepsy report: plan.json</title>" in text
    links = _Links()
    links.feed(text)
    assert "script" not in links.tags and "link" not in links.tags
    files = {r for r in links.refs if not r.startswith("#")}
    assert files == {"curve-1.png", "curve-2.png", "latency-shares.png", "placement.png"}
    assert sorted(p.name for p in folder.iterdir()) == sorted({*files, "index.html"})
    for f in files:
        assert (folder / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the solver's statistics and gaps, the bounds
    for label in ("objective (s)", "bound (s)", "gap to bound", "Formulations compared",
                  "Cuts", "Rounds", "fragmentation"):
        assert label in text, label


def test_rows_cover_every_replica_on_every_gpu():
    rep = load_report(BUNDLED)
    doc = _bundled()
    rows = placement_rows(rep)
    assert len(rows) == sum(len(i["gpus"]) for i in doc["placement"]["instances"])
    assert set(rows[0]) == set(PLACEMENT_COLUMNS)
    per_gpu: dict[tuple[str, int], float] = {}
    for r in rows:
        per_gpu[(r["node"], r["gpu"])] = per_gpu.get((r["node"], r["gpu"]), 0.0) + r["share"]
    assert max(per_gpu.values()) <= 1 + 1e-9
    assert [r["llm"] for r in plan_rows(rep)] == sorted(doc["llms"])
    for r in plan_rows(rep):
        assert r["memory"] == pytest.approx(r["memory_gib"] / 80.0, rel=1e-12)


def test_same_plan_same_page(tmp_path):
    plan = tmp_path / "plan.json"
    shutil.copy(BUNDLED, plan)
    a = write_report(plan, tmp_path / "a")
    b = write_report(plan, tmp_path / "b")
    for f in sorted(a.iterdir()):
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name


def test_every_string_from_the_file_is_escaped(tmp_path):
    evil = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'
    doc = _bundled()
    doc["solver"]["solver"] = evil  # any text the file's string fields hold
    doc["placement"]["history"][0]["why"] = evil
    doc["placement"]["quality"][evil] = evil
    doc["placement"]["reason"] = evil
    text = _html(write_report(_plan_file(tmp_path, doc), tmp_path / "r"))
    assert "<script" not in text and "<img src=x" not in text
    assert text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;") >= 4


def test_infeasible_plan_says_what_happened(tmp_path, infeasible):
    folder = write_report(_plan_file(tmp_path, infeasible), tmp_path / "r")
    text = _html(folder)
    assert "What happened" in text and "The targets cannot be met" in text
    assert infeasible["infeasible"]["detail"].split(":")[0] in text
    assert "No allocation" in text
    assert [p.name for p in folder.iterdir()] == ["index.html"]


def test_unplaced_plan_says_why(tmp_path, unplaced):
    assert unplaced["status"] == "unplaced"
    text = _html(write_report(_plan_file(tmp_path, unplaced), tmp_path / "r"))
    assert "What happened" in text and "Not placed (unplaced)" in text
    assert "no placed plan after 1 round(s)" in text


def test_old_plan_without_curve_says_so(tmp_path):
    doc = _bundled()
    for wf in doc["workflows"].values():
        del wf["curve"]
    folder = write_report(_plan_file(tmp_path, doc), tmp_path / "r")
    text = _html(folder)
    assert text.count(NO_CURVE) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["index.html", "latency-shares.png",
                                                         "placement.png"]


def test_racks_plan_maps_every_node_and_what_was_in_use(tmp_path, racks):
    path = _plan_file(tmp_path, racks)
    rep = load_report(path)
    in_use = {k: [s for s in v if s.llm is None] for k, v in gpu_slots(rep).items()}
    assert {k for k, v in in_use.items() if v} == {("hgx-1", 0), ("hgx-1", 1)}
    text = _html(write_report(path, tmp_path / "r"))
    for n in rep.nodes.nodes:
        assert n.name in text
    assert (tmp_path / "r" / "placement.png").exists()


def test_map_wraps_large_nodes():
    lay = map_layout([72, 72])  # two NVL72 racks as nodes
    assert (lay.columns, lay.first_row, lay.rows) == (16, (0, 5), 10)
    assert lay.cell(1, 71) == (9, 7)
    assert map_layout([8, 4, 8]).first_row == (0, 1, 2)


# ------------------------------------------------------------------------------ the folder


def test_default_folder_is_beside_the_plan_and_an_earlier_report_is_replaced(tmp_path):
    plan = tmp_path / "a.json"
    shutil.copy(BUNDLED, plan)
    assert default_out(plan) == tmp_path / "a-report"
    assert write_report(plan) == tmp_path / "a-report"
    (tmp_path / "a-report" / "curve-9.png").write_bytes(b"stale")  # an earlier, larger report
    write_report(plan)
    assert "curve-9.png" not in _tree(tmp_path / "a-report")
    assert _tree(tmp_path) == ["a-report", *[f"a-report/{n}" for n in (
        "curve-1.png", "curve-2.png", "index.html", "latency-shares.png", "placement.png")],
        "a.json"]  # no temporary folder left


def test_a_failed_write_keeps_the_earlier_report(tmp_path):
    plan = tmp_path / "a.json"
    shutil.copy(BUNDLED, plan)
    out = write_report(plan)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fail(folder: Path) -> None:
        (folder / "index.html").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_folder(out, fail)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-report", "a.json"]


@pytest.mark.parametrize("kind", ["other files", "file", "report plus a file", "under a file"])
def test_never_writes_over_anything_but_a_report(tmp_path, kind, capsys):
    plan = tmp_path / "a.json"
    shutil.copy(BUNDLED, plan)
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("mine")
    elif kind == "under a file":
        out.write_text("mine")
        out = out / "report"
    elif kind == "other files":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    else:
        write_report(plan, out)
        (out / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["report", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"scepsy: error: {out}: expected a ") and "Traceback" not in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------------------------- the CLI


def test_cli_prints_tables_and_the_page_path(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    shutil.copy(BUNDLED, plan)
    assert main(["report", str(plan), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1] == f"wrote {tmp_path / 'r' / 'index.html'}"
    assert re.search(r"^\s*llm\s+model\s+gpu\s+tp\s+share\s+memory\s+memory_gib\s+replicas\s+"
                     r"mu_calls_s\s+latency_share$", out, re.M)
    assert re.search(r"^\s*node\s+gpu\s+replica\s+share\s+memory_gib$", out, re.M)
    for name in ("generator", "prm", "reranker", "rewriter", "A100-80GB-0", "A100-80GB-1",
                 "generator/4", "prm/2"):
        assert name in out
    assert (tmp_path / "r" / "index.html").exists()


def test_cli_on_a_plan_without_allocation(tmp_path, capsys, infeasible):
    plan = _plan_file(tmp_path, infeasible)
    assert main(["report", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "no placed allocation: the targets need more GPUs" in out
    assert (tmp_path / "plan-report" / "index.html").exists()


def _bad_json(tmp_path: Path) -> tuple[Path, str]:
    p = tmp_path / "p.json"
    p.write_text("{not json")
    return p, "p.json"


def _mutated(mutate: Any, field: str) -> Any:
    def make(tmp_path: Path) -> tuple[Path, str]:
        doc = copy.deepcopy(_bundled())
        mutate(doc)
        return _plan_file(tmp_path, doc, "p.json"), field
    return make


BAD = {
    "missing": lambda t: (t / "nope.json", "nope.json: expected an existing, readable plan.json"),
    "not json": _bad_json,
    "a list": lambda t: (_plan_file(t, [1], "p.json"), "p.json: top level: expected a plan"),
    "not a plan": lambda t: (_plan_file(t, {"name": "x"}, "p.json"),
                             "p.json: version: expected plan format version 1"),
    "wrong version": _mutated(lambda d: d.update(version=7),
                              "p.json: version: expected plan format version 1"),
    "bad field": _mutated(lambda d: d["llms"]["prm"].update(tp="two"), "llms.prm.tp"),
    "bad curve": _mutated(lambda d: d["workflows"]["rag"]["curve"]["points"][3].pop(
        "mean_latency_s"), "workflows.rag.curve.points[3].mean_latency_s"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_naming_file_and_field_with_nothing_written(tmp_path, case, capsys):
    plan, expect = BAD[case](tmp_path)
    before = _tree(tmp_path)
    assert main(["report", str(plan), "--out", str(tmp_path / "r")]) == 2
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and cap.out == ""
    assert cap.err.startswith("scepsy: error: ") and str(plan.name) in cap.err
    assert expect in cap.err, cap.err
    assert _tree(tmp_path) == before
    assert main(["report", str(plan)]) == 2  # nor beside the plan
    assert _tree(tmp_path) == before


