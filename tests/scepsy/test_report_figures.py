"""``scepsy report`` under bad and edge input, and its figures read as a reviewer reads them:
non-finite or negative predicted figures in plan.json are refused naming the field (never drawn,
never a matplotlib warning); any valid plan draws without a warning; PNGs at 200 dpi shown at
half their pixels (sharp on high-DPI screens) or SVG with ``--format svg``; in the placement
map every replica of an LLM has its own shade and legend entry (``llm#k``) and every share,
however small, is labelled. The figures are inspected as matplotlib objects, not pixels.
"""

from __future__ import annotations

import io
import json
import re
import struct
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scepsy.cli import main
from scepsy.report import load_report, placement_rows, write_report
from scepsy.report.contents import gpu_slots
from scepsy.report.figures import (
    DPI,
    llm_colours,
    map_layout,
    placement_plot,
    replica_colours,
    shade,
    shares_plot,
)
from scepsy_common.errors import InputError

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "datasets" / "plans" / "rag-beam-a100-16.json"
FIGURES = ["curve-1", "curve-2", "latency-shares", "placement"]


def _bundled() -> dict[str, Any]:
    return json.loads(BUNDLED.read_text())


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    return path


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _draw(fig: Any) -> None:
    """Render ``fig`` (where matplotlib warns about what it cannot draw)."""
    fig.savefig(io.BytesIO(), format="png", dpi=40)


# ------------------------------------------------------------- bad predicted figures refused


BAD_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "negative": -0.2}


@pytest.mark.parametrize("field", ["latency_share", "call_latency_s", "mu_calls_s"])
@pytest.mark.parametrize("value", list(BAD_VALUES))
def test_non_finite_or_negative_llm_figures_are_refused_naming_the_field(tmp_path, field, value,
                                                                         capsys):
    doc = _bundled()
    doc["llms"]["prm"][field] = BAD_VALUES[value]
    plan = _write(tmp_path, doc)
    before = _tree(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", str(plan), "--out", str(tmp_path / "r")]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "Traceback" not in cap.err and "Warning" not in cap.err
    assert cap.err.startswith(f"scepsy: error: {plan}: llms.prm.{field}: expected "), cap.err
    assert len(cap.err.splitlines()) == 1
    assert _tree(tmp_path) == before


def test_a_latency_share_above_one_is_refused(tmp_path):
    doc = _bundled()
    doc["llms"]["generator"]["latency_share"] = 1e308
    with pytest.raises(InputError) as exc:
        load_report(_write(tmp_path, doc))
    assert exc.value.field == "llms.generator.latency_share"
    assert "<= 1" in exc.value.expected


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(
    lambda x: not 0 <= x <= 1)))
def test_any_latency_share_outside_0_1_is_refused(tmp_path, bad):
    doc = _bundled()
    doc["llms"]["reranker"]["latency_share"] = bad
    with pytest.raises(InputError) as exc:
        load_report(_write(tmp_path, doc))
    assert exc.value.field == "llms.reranker.latency_share"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shares=st.lists(st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)), min_size=4,
                       max_size=4),
       calls=st.lists(st.floats(0, 1e4), min_size=4, max_size=4),
       beyond=st.floats(0, 3))
def test_any_valid_plan_draws_without_a_warning(tmp_path, shares, calls, beyond):
    """Shares anywhere in [0, 1] (all zero: a zero objective), any call latency, an operating
    point anywhere (also beyond the curve's maximum): the figures draw, warnings as errors,
    every bar as long as its share."""
    from scepsy.report.figures import curve_plot

    doc = _bundled()
    for m, s, c in zip(sorted(doc["llms"]), shares, calls, strict=True):
        doc["llms"][m].update(latency_share=s, call_latency_s=c)
    wf = doc["workflows"]["rag"]
    wf["throughput"] = wf["curve"]["max_throughput"] * beyond
    rep = load_report(_write(tmp_path, doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = shares_plot(rep)
        _draw(fig)
        curve = curve_plot("rag", rep.doc.workflows["rag"])
        _draw(curve)
    bars = fig.axes[0].patches
    assert [b.get_width() for b in bars] == pytest.approx(shares, abs=0)
    lo, hi = curve.axes[0].get_xlim()
    assert lo <= wf["throughput"] <= hi  # the plan's star is on the figure


# --------------------------------------------------------------------------- formats, DPI


def _png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_png_figures_are_200_dpi_and_shown_at_half_their_pixels(tmp_path):
    assert DPI == 200
    folder = write_report(BUNDLED, tmp_path / "r")
    page = (folder / "index.html").read_text()
    for stem in FIGURES:
        width, height = _png_size(folder / f"{stem}.png")
        m = re.search(rf'<img src="{stem}\.png" width="(\d+)" height="(\d+)"', page)
        assert m is not None, stem
        assert (int(m[1]), int(m[2])) == (round(width / 2), round(height / 2))
        assert width >= 800  # a 5-inch figure at 200 dpi


def test_svg_format_writes_vector_figures_and_the_same_bytes_twice(tmp_path, capsys):
    for out in ("a", "b"):
        assert main(["report", str(BUNDLED), "--out", str(tmp_path / out),
                     "--format", "svg"]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert _tree(tmp_path / "a") == sorted([*(f"{s}.svg" for s in FIGURES), "index.html"])
    for name in _tree(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    svg = (tmp_path / "a" / "placement.svg").read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    assert "<image" not in svg and "Matplotlib v" not in svg  # vector, no version stamp
    page = (tmp_path / "a" / "index.html").read_text()
    assert '<img src="placement.svg" alt=' in page and ".png" not in page
    # an SVG report is an earlier report: a PNG one replaces it, and back
    assert main(["report", str(BUNDLED), "--out", str(tmp_path / "a")]) == 0
    assert _tree(tmp_path / "a") == sorted([*(f"{s}.png" for s in FIGURES), "index.html"])


def test_an_unknown_format_is_a_usage_error(tmp_path, capsys):
    assert main(["report", str(BUNDLED), "--out", str(tmp_path / "r"), "--format", "jpg"]) == 2
    assert "--format" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------- the placement map


def _texts(fig: Any) -> list[tuple[float, float, str]]:
    return [(*t.get_position(), t.get_text()) for t in fig.axes[0].texts]


def _in_bar(texts: list[tuple[float, float, str]], r: int, c: int,
            y0: float) -> list[str]:
    """The labels inside the bar of cell (r, c) that starts at ``y0`` (of its row), by x."""
    return [t for x, y, t in sorted(texts)
            if c + 0.06 <= x <= c + 0.94 and r + y0 <= y <= r + y0 + 0.38]


def test_every_share_and_memory_segment_is_labelled_even_0_1():
    rep = load_report(BUNDLED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = placement_plot(rep)
        _draw(fig)
    texts = _texts(fig)
    nodes = rep.nodes.nodes
    layout = map_layout([n.gpus for n in nodes])
    slots = gpu_slots(rep)
    small = 0
    for k, n in enumerate(nodes):
        for i in range(n.gpus):
            here = slots.get((n.name, i), [])
            r, c = layout.cell(k, i)
            compute = _in_bar(texts, r, c, 0.1)
            memory = _in_bar(texts, r, c, 0.52)
            assert len(compute) == len(here) and len(memory) == len(here), (n.name, i)
            for s, ct, mt in zip(here, compute, memory, strict=True):
                assert ct.endswith(f"{s.share:g}") and mt == f"{s.memory_gib:.0f}G"
                small += s.share <= 0.1
    assert small >= 4  # the bundled plan's reranker and rewriter GPUs: 0.1 each


def test_replicas_of_an_llm_have_distinct_shades_named_in_the_legend():
    rep = load_report(BUNDLED)
    fig = placement_plot(rep)
    ax = fig.axes[0]
    legend = {t.get_text(): h.get_facecolor()
              for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles,
                              strict=True)}
    placed = {tuple(r["replica"].split("/")) for r in placement_rows(rep)}
    assert {f"{m}#{k}" for m, k in placed} <= set(legend)
    drawn = {tuple(round(v, 6) for v in c) for c in ax.collections[0].get_facecolors()}
    colours = replica_colours(rep)
    for m in {m for m, _ in placed}:
        mine = [legend[f"{m}#{k}"] for mm, k in sorted(placed) if mm == m]
        assert len({tuple(c) for c in mine}) == len(mine), m  # one shade per replica
        for c in mine:
            assert tuple(round(v, 6) for v in c) in drawn  # the legend's shade is on the map
    # a TP replica's GPUs share its shade: generator (TP 4) replica 0 on four GPUs
    gen0 = [r for r in placement_rows(rep) if r["replica"] == "generator/0"]
    assert len(gen0) == 4 and ("generator", 0) in colours
    # each compute label names its replica
    assert sum(t.startswith("#0 ") for _, _, t in _texts(fig)) >= 4


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 24), which=st.integers(0, 29))
def test_shades_of_a_colour_are_distinct_and_valid(n, which):
    names = [f"m{i}" for i in range(30)]
    base = llm_colours(names)[names[which]]
    shades = [shade(base, k, n) for k in range(n)]
    assert len(set(shades)) == n
    assert all(0 <= v <= 1 for s in shades for v in s)
    assert shade(base, 0, 1) == base


def test_a_large_cluster_keeps_one_legend_entry_per_llm(tmp_path):
    """Beyond LEGEND_REPLICAS replicas the legend names the LLMs (every replica still its own
    shade on the map)."""
    from scepsy.report import figures

    rep = load_report(BUNDLED)
    keep = figures.LEGEND_REPLICAS
    try:
        figures.LEGEND_REPLICAS = 3
        fig = placement_plot(rep)
    finally:
        figures.LEGEND_REPLICAS = keep
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:4] == [f"{m} (a shade per replica)"
                          for m in ("generator", "prm", "reranker", "rewriter")]
    assert not any("#" in t for t in labels)
