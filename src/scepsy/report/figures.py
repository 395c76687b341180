"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot,
no display, the process's backend untouched): a workflow's latency curve, the LLMs' latency
shares and the placement map. Each ``*_plot`` function builds one
:class:`matplotlib.figure.Figure`; :func:`save` writes it as PNG at :data:`DPI` (sharp on
high-DPI screens) or as SVG (vector), with no date or version in the file: the same plan gives
the same bytes.

Every number drawn comes from a validated plan (:func:`scepsy_serve.launch.planfile.read_plan`:
finite, shares in [0, 1]), so nothing reaches matplotlib that it would warn about.

matplotlib is imported inside the functions, so reading a plan (and the CLI's start-up) does
not pay for it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scepsy.report.contents import Report, Slot, device_memory, gpu_slots, llm_names
from scepsy_serve.launch.planfile import WorkflowSection

__all__ = ["DPI", "FORMATS", "LEGEND_REPLICAS", "MapLayout", "curve_figure", "curve_plot",
           "llm_colours", "map_layout", "placement_figure", "placement_plot", "replica_colours",
           "save", "shade", "shares_figure", "shares_plot"]

FORMATS = ("png", "svg")
"""The figure formats: PNG at :data:`DPI` (the default) or SVG."""
DPI = 200  # PNG pixels per inch: twice what a page shows per inch, sharp on high-DPI screens
PAGE_DPI = 100  # pixels per inch the page shows a PNG at (its <img> width and height)
MAP_COLUMNS = 16  # at most this many GPUs of a node per row of the map; larger nodes wrap
MAP_ROWS_FULL = 40  # up to this many rows, every row at full height (labels in the cells)
ROW_IN = 0.62  # full row height (inches)
CELL_IN = 0.95  # cell width (inches)
BAR_W = 0.88  # a bar's width (of a cell)
BAR_H = 0.38  # a bar's height (of a row)
LEGEND_REPLICAS = 48  # up to this many replicas in all, the legend has an entry per replica
FONT = 6.5  # a label across its segment (points)
FONT_SMALL = 5.5  # a label along a segment too narrow for it (points, rotated)
CHAR_EM = 0.62  # a label character's width, of its font size (digits, DejaVu Sans)
IN_USE = "#dddddd"  # what was in use before the plan (hatched)
FREE = "#eeeeee"
PNG_META = {"Software": None}  # no version string in the file: same plan, same bytes
SVG_META = {"Date": None, "Creator": None}
# fixed element ids, text as outlines (no font needed)
SVG_RC: dict[Any, Any] = {"svg.hashsalt": "scepsy report", "svg.fonttype": "path"}


@dataclass(frozen=True)
class MapLayout:
    """Where every GPU of the map sits: node ``k``'s GPU ``i`` is at row
    ``first_row[k] + i // columns``, column ``i % columns``."""

    columns: int
    first_row: tuple[int, ...]
    rows: int

    def cell(self, node: int, gpu: int) -> tuple[int, int]:
        return self.first_row[node] + gpu // self.columns, gpu % self.columns


def map_layout(gpus_per_node: Sequence[int]) -> MapLayout:
    """The map's grid for nodes of these GPU counts (:class:`MapLayout`)."""
    cols = min(max(gpus_per_node, default=1), MAP_COLUMNS)
    first, row = [], 0
    for g in gpus_per_node:
        first.append(row)
        row += math.ceil(g / cols)
    return MapLayout(cols, tuple(first), max(row, 1))


Colour = tuple[float, float, float, float]


def llm_colours(names: Sequence[str]) -> dict[str, Colour]:
    """A colour per LLM in the given order: tab10, tab20 beyond 10, a sampled turbo beyond
    20."""
    from matplotlib import colormaps

    n = len(names)
    if n <= 20:
        cmap = colormaps["tab10" if n <= 10 else "tab20"]
        return {m: cmap(i) for i, m in enumerate(names)}
    cmap = colormaps["turbo"]
    return {m: cmap(0.05 + 0.9 * i / (n - 1)) for i, m in enumerate(names)}


def shade(colour: Colour, k: int, n: int) -> Colour:
    """The ``k``-th of ``n`` shades of ``colour``: from 35% darker (``k`` 0) to 45% lighter
    (``k`` ``n - 1``); ``colour`` itself when ``n`` is 1. Distinct for distinct ``k`` unless
    ``colour`` is black or white."""
    if n <= 1:
        return colour
    t = -0.35 + 0.8 * k / (n - 1)
    r, g, b, a = colour
    if t < 0:
        return (r * (1 + t), g * (1 + t), b * (1 + t), a)
    return (r + (1 - r) * t, g + (1 - g) * t, b + (1 - b) * t, a)


def replica_colours(rep: Report) -> dict[tuple[str, int], Colour]:
    """A colour per placed replica ``(llm, replica)``: its LLM's colour (:func:`llm_colours`),
    a shade of it per replica (:func:`shade`, in replica order), so that the GPUs of one
    replica share a colour and two replicas of one LLM differ."""
    base = llm_colours(llm_names(rep))
    pl = rep.doc.placement
    mine: dict[str, list[int]] = {}
    if rep.placed and pl is not None:
        for inst in pl.instances:
            mine.setdefault(inst.llm, []).append(inst.replica)
    out = {}
    for m, ks in mine.items():
        ks = sorted(set(ks))
        for j, k in enumerate(ks):
            out[(m, k)] = shade(base[m], j, len(ks))
    return out


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=PAGE_DPI)


def save(fig: Any, path: Path, fmt: str = "png") -> tuple[int, int] | None:
    """Write ``fig`` to ``path`` as ``fmt`` (:data:`FORMATS`); returns the size (CSS pixels)
    a page shows a PNG at (:data:`PAGE_DPI` per inch, half its pixels), None for an SVG (its
    own size holds)."""
    if fmt == "svg":
        from matplotlib import rc_context

        with rc_context(SVG_RC):
            fig.savefig(path, format="svg", metadata=SVG_META, bbox_inches="tight",
                        pad_inches=0.08)
        return None
    if fmt != "png":
        raise ValueError(f"figure format {fmt!r}: expected one of {', '.join(FORMATS)}")
    fig.savefig(path, format="png", dpi=DPI, metadata=PNG_META, bbox_inches="tight",
                pad_inches=0.08)
    with open(path, "rb") as f:
        width, height = struct.unpack(">II", f.read(24)[16:24])  # the IHDR chunk
    return (round(width * PAGE_DPI / DPI), round(height * PAGE_DPI / DPI))


def curve_plot(workflow: str, wf: WorkflowSection) -> Any:
    """``workflow``'s predicted mean latency against its throughput (the plan's ``curve``),
    its maximum throughput (dashed) and the plan's operating point (its target, a star)."""
    assert wf.curve is not None
    c = wf.curve
    fig = _figure(5.2, 3.3)
    ax = fig.add_subplot()
    ax.plot([p.throughput for p in c.points], [p.mean_latency_s for p in c.points],
            marker="o", ms=3, lw=1.5, color="#1f77b4", label="predicted mean latency")
    ax.axvline(c.max_throughput, ls="--", lw=1, color="#555555",
               label=f"max {c.max_throughput:.3g} req/s ({c.bottleneck} saturates)")
    ax.plot([wf.throughput], [wf.mean_latency_s], marker="*", ms=13, ls="none",
            color="#d62728",
            label=f"plan: {wf.throughput:.3g} req/s, {wf.mean_latency_s:.3g} s")
    ax.set_xlim(0, max(c.max_throughput, wf.throughput) * 1.05)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("mean latency (s)")
    ax.set_title(workflow, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def curve_figure(path: Path, workflow: str, wf: WorkflowSection,
                 fmt: str = "png") -> tuple[int, int] | None:
    """:func:`curve_plot` written to ``path`` (:func:`save`)."""
    return save(curve_plot(workflow, wf), path, fmt)


def shares_plot(rep: Report) -> Any:
    """Each LLM's share of the objective (``llms.*.latency_share``), one bar per LLM in the
    LLM colours, labelled with the percentage and the mean call latency."""
    names = llm_names(rep)
    llms = rep.doc.llms or {}
    colours = llm_colours(names)
    shares = [llms[m].latency_share for m in names]
    fig = _figure(5.2, 0.9 + 0.32 * len(names))
    ax = fig.add_subplot()
    ys = range(len(names))
    ax.barh(ys, shares, color=[colours[m] for m in names], height=0.7)
    for y, m in zip(ys, names, strict=True):
        ax.text(llms[m].latency_share, y, f" {100 * llms[m].latency_share:.1f}%"
                f"  ({llms[m].call_latency_s:.3g} s/call)", va="center", fontsize=7)
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3)  # room for the labels right of the longest bar
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "25%", "50%", "75%", "100%"])
    ax.set_xlabel("share of the predicted latency (objective)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def shares_figure(path: Path, rep: Report, fmt: str = "png") -> tuple[int, int] | None:
    """:func:`shares_plot` written to ``path`` (:func:`save`)."""
    return save(shares_plot(rep), path, fmt)


@dataclass(frozen=True)
class _Label:
    x: float
    y: float
    text: str
    size: float
    rotation: int
    colour: str


def _ink(background: Colour | str) -> str:
    """Black or white, whichever reads better on ``background`` (its relative luminance)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.4 else "white"


def _label(x0: float, w: float, y0: float, h: float, long: str, short: str, cell_in: float,
           row_in: float, colour: str) -> _Label:
    """A segment's label: ``long`` across it where it fits, else ``short``; along it (rotated)
    where neither fits across: every segment is labelled, however narrow."""
    def width_in(text: str, size: float) -> float:
        return len(text) * CHAR_EM * size / 72

    x, y = x0 + w / 2, y0 + h / 2
    for text in (long, short):
        if width_in(text, FONT) <= w * cell_in:
            return _Label(x, y, text, FONT, 0, colour)
    text = long if width_in(long, FONT_SMALL) <= h * row_in else short
    return _Label(x, y, text, FONT_SMALL, 90, colour)


def _bar(rects: list[Any], labels: list[_Label], slots: list[Slot],
         fractions: list[float], texts: list[tuple[str, str]], x0: float, y0: float,
         colours: dict[tuple[str, int], Colour], size_in: tuple[float, float]) -> None:
    """One stacked bar of a GPU cell (compute or memory): a free background, then a segment
    per slot, its width the slot's fraction of the GPU, each labelled (``texts``: a long and
    a short label per slot)."""
    from matplotlib.patches import Rectangle

    rects.append(Rectangle((x0, y0), BAR_W, BAR_H, facecolor=FREE, edgecolor="none"))
    at = x0
    for s, f, (long, short) in zip(slots, fractions, texts, strict=True):
        w = BAR_W * min(max(f, 0.0), 1.0 - (at - x0) / BAR_W)
        mine = s.llm is not None
        colour = colours[(s.llm, s.replica)] if s.llm is not None else IN_USE
        rects.append(Rectangle((at, y0), w, BAR_H, facecolor=colour, lw=0.6,
                               edgecolor="white" if mine else "#555555",
                               hatch=None if mine else "///"))
        labels.append(_label(at, w, y0, BAR_H, long, short, *size_in, _ink(colour)))
        at += w


def placement_plot(rep: Report) -> Any:
    """The placement map: a row of GPU cells per node (nodes wider than :data:`MAP_COLUMNS`
    wrap), each cell's upper bar its compute shares, its lower bar its memory shares, a shade
    of its LLM's colour per replica (:func:`replica_colours`; hatched grey: in use before the
    plan). While the map is small enough to read them, every segment is labelled (compute:
    ``#k`` and the share, or the share alone where narrow; memory: GiB) and the legend names
    every replica (``llm#k``, up to :data:`LEGEND_REPLICAS` replicas; else one entry per LLM
    in its middle shade)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    nodes = rep.nodes.nodes
    names = llm_names(rep)
    colours = replica_colours(rep)
    layout = map_layout([n.gpus for n in nodes])
    slots = gpu_slots(rep)
    full = layout.rows <= MAP_ROWS_FULL
    row_in = ROW_IN if full else max(0.05, ROW_IN * MAP_ROWS_FULL / layout.rows)
    cell_in = CELL_IN if layout.columns <= 8 else CELL_IN * 8 / layout.columns
    labelled = full and layout.columns <= 8
    fig = _figure(3.2 + cell_in * layout.columns, 0.9 + row_in * layout.rows)
    ax = fig.add_subplot()
    rects: list[Any] = []
    labels: list[_Label] = []
    in_use = False
    for k, n in enumerate(nodes):
        cap = device_memory(rep, n)
        for i in range(n.gpus):
            r, c = layout.cell(k, i)
            rects.append(Rectangle((c, r), 1, 1, facecolor="white", edgecolor="#333333",
                                   lw=0.6))
            here = slots.get((n.name, i), [])
            in_use = in_use or any(s.llm is None for s in here)
            compute = [(f"{s.share:g}" if s.llm is None else f"#{s.replica} {s.share:g}",
                        f"{s.share:g}") for s in here]
            memory = [(f"{s.memory_gib:.0f}G",) * 2 for s in here]
            _bar(rects, labels, here, [s.share for s in here], compute, c + 0.06, r + 0.1,
                 colours, (cell_in, row_in))
            _bar(rects, labels, here, [s.memory_gib / cap for s in here], memory, c + 0.06,
                 r + 0.52, colours, (cell_in, row_in))
    ax.add_collection(PatchCollection([r for r in rects if not r.get_hatch()],
                                      match_original=True))
    for r in rects:  # a collection draws no per-patch hatching
        if r.get_hatch():
            ax.add_patch(r)
    if labelled:
        for lb in labels:
            ax.text(lb.x, lb.y, lb.text, ha="center", va="center", fontsize=lb.size,
                    rotation=lb.rotation, color=lb.colour)
    ax.set_xlim(0, layout.columns)
    ax.set_ylim(layout.rows, 0)
    step = max(1, len(nodes) // 64)
    racks = len({n.rack for n in nodes}) > 1
    ticks = [(layout.first_row[k] + 0.5, f"{n.rack} · {n.name}" if racks else n.name)
             for k, n in enumerate(nodes)][::step]
    ax.set_yticks([t for t, _ in ticks], [s for _, s in ticks],
                  fontsize=8 if full else 5)
    ax.set_xticks([c + 0.5 for c in range(layout.columns)],
                  [str(c) for c in range(layout.columns)], fontsize=7)
    ax.tick_params(length=0)
    ax.set_xlabel("GPU index (each cell: upper bar compute share, lower bar memory)")
    for side in ax.spines.values():
        side.set_visible(False)
    if len(colours) <= LEGEND_REPLICAS:
        handles = [Patch(facecolor=colours[key], label=f"{key[0]}#{key[1]}")
                   for key in sorted(colours)]
    else:
        base = llm_colours(names)
        handles = [Patch(facecolor=shade(base[m], 1, 3), label=f"{m} (a shade per replica)")
                   for m in names]
    if in_use:
        handles.append(Patch(facecolor=IN_USE, edgecolor="#555555", hatch="///",
                             label="in use before the plan"))
    handles.append(Patch(facecolor=FREE, edgecolor="#999999", label="free"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              ncol=1 if len(handles) <= 24 else 2, fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def placement_figure(path: Path, rep: Report, fmt: str = "png") -> tuple[int, int] | None:
    """:func:`placement_plot` written to ``path`` (:func:`save`)."""
    return save(placement_plot(rep), path, fmt)
