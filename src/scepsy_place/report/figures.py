"""The report's PNG figures, drawn with matplotlib's object API on the Agg canvas (no pyplot,
no display, the process's backend untouched): a workflow's latency curve, the LLMs' latency
shares and the placement map. Each function writes one PNG at :data:`DPI`.

matplotlib is imported inside the functions, so reading a plan (and the CLI's start-up) does
not pay for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scepsy_place.launch.planfile import WorkflowSection
from scepsy_place.report.model import Report, Slot, device_memory, gpu_slots, llm_names

__all__ = ["DPI", "MapLayout", "curve_figure", "llm_colours", "map_layout", "placement_figure",
           "shares_figure"]

DPI = 100
MAP_COLUMNS = 16  # at most this many GPUs of a node per row of the map; larger nodes wrap
MAP_ROWS_FULL = 40  # up to this many rows, every row at full height (labels in the cells)
ROW_IN = 0.62  # full row height (inches)
CELL_IN = 0.95  # cell width (inches)
LABEL_MIN = 0.22  # a bar segment at least this wide (of a GPU) is labelled
IN_USE = "#dddddd"  # what was in use before the plan (hatched)
FREE = "#eeeeee"
PNG_META = {"Software": None}  # no version string in the file: same plan, same bytes


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


def llm_colours(names: Sequence[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per LLM in the given order: tab10, tab20 beyond 10, a sampled turbo beyond
    20."""
    from matplotlib import colormaps

    n = len(names)
    if n <= 20:
        cmap = colormaps["tab10" if n <= 10 else "tab20"]
        return {m: cmap(i) for i, m in enumerate(names)}
    cmap = colormaps["turbo"]
    return {m: cmap(0.05 + 0.9 * i / (n - 1)) for i, m in enumerate(names)}


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), dpi=DPI)


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=DPI, metadata=PNG_META, bbox_inches="tight", pad_inches=0.08)


def curve_figure(path: Path, workflow: str, wf: WorkflowSection) -> None:
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
    ax.set_xlim(0, c.max_throughput * 1.05)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("mean latency (s)")
    ax.set_title(workflow, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save(fig, path)


def shares_figure(path: Path, rep: Report) -> None:
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
    _save(fig, path)


def _bar(rects: list[Any], texts: list[tuple[float, float, str]], slots: list[Slot],
         fractions: list[float], labels: list[str], x0: float, y0: float, h: float,
         colours: dict[str, Any]) -> None:
    """One stacked bar of a GPU cell (compute or memory): a free background, then a segment
    per slot, its width the slot's fraction of the GPU."""
    from matplotlib.patches import Rectangle

    width = 0.88
    rects.append(Rectangle((x0, y0), width, h, facecolor=FREE, edgecolor="none"))
    at = x0
    for s, f, label in zip(slots, fractions, labels, strict=True):
        w = width * min(max(f, 0.0), 1.0 - (at - x0) / width)
        colour = IN_USE if s.llm is None else colours[s.llm]
        rects.append(Rectangle((at, y0), w, h, facecolor=colour, lw=0.6,
                               edgecolor="white" if s.llm is not None else "#555555",
                               hatch="///" if s.llm is None else None))
        if f >= LABEL_MIN:
            texts.append((at + w / 2, y0 + h / 2, label))
        at += w


def placement_figure(path: Path, rep: Report) -> None:
    """The placement map: a row of GPU cells per node (nodes wider than :data:`MAP_COLUMNS`
    wrap), each cell's upper bar its compute shares, its lower bar its memory shares, coloured
    by LLM (hatched grey: in use before the plan); labels in the cells while the map is small
    enough to read them."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    nodes = rep.nodes.nodes
    names = llm_names(rep)
    colours = llm_colours(names)
    layout = map_layout([n.gpus for n in nodes])
    slots = gpu_slots(rep)
    full = layout.rows <= MAP_ROWS_FULL
    row_in = ROW_IN if full else max(0.05, ROW_IN * MAP_ROWS_FULL / layout.rows)
    cell_in = CELL_IN if layout.columns <= 8 else CELL_IN * 8 / layout.columns
    labelled = full and layout.columns <= 8
    fig = _figure(3.2 + cell_in * layout.columns, 0.9 + row_in * layout.rows)
    ax = fig.add_subplot()
    rects: list[Any] = []
    texts: list[tuple[float, float, str]] = []
    in_use = False
    for k, n in enumerate(nodes):
        cap = device_memory(rep, n)
        for i in range(n.gpus):
            r, c = layout.cell(k, i)
            rects.append(Rectangle((c, r), 1, 1, facecolor="white", edgecolor="#333333",
                                   lw=0.6))
            here = slots.get((n.name, i), [])
            in_use = in_use or any(s.llm is None for s in here)
            _bar(rects, texts, here, [s.share for s in here], [f"{s.share:g}" for s in here],
                 c + 0.06, r + 0.1, 0.38, colours)
            _bar(rects, texts, here, [s.memory_gib / cap for s in here],
                 [f"{s.memory_gib:.0f}G" for s in here], c + 0.06, r + 0.52, 0.38, colours)
    ax.add_collection(PatchCollection([r for r in rects if not r.get_hatch()],
                                      match_original=True))
    for r in rects:  # a collection draws no per-patch hatching
        if r.get_hatch():
            ax.add_patch(r)
    if labelled:
        for x, y, t in texts:
            ax.text(x, y, t, ha="center", va="center", fontsize=6.5, color="black")
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
    handles = [Patch(facecolor=colours[m], label=m) for m in names]
    if in_use:
        handles.append(Patch(facecolor=IN_USE, edgecolor="#555555", hatch="///",
                             label="in use before the plan"))
    handles.append(Patch(facecolor=FREE, edgecolor="#999999", label="free"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              ncol=1 if len(handles) <= 24 else 2, fontsize=7, frameon=False)
    fig.tight_layout()
    _save(fig, path)
