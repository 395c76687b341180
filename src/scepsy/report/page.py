"""The report page: ``index.html`` with its figures beside it (PNG or SVG, relative links), no
script, no external style, font or image, so that the folder works offline and anywhere it is
copied.

Every string taken from the plan file is HTML-escaped. Sections: what happened (only for a
plan without a placed allocation), workflows (a latency curve per workflow), LLMs (the latency
shares), placement (the map), solver, bounds, and the timings when the file has them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scepsy.report.contents import (
    PLACEMENT_COLUMNS,
    PLAN_COLUMNS,
    WORKFLOW_COLUMNS,
    Report,
    node_rows,
    open_fields,
    placement_rows,
    plan_rows,
    workflow_rows,
)
from scepsy.report.figures import FORMATS, curve_figure, placement_figure, shares_figure
from scepsy.report.folder import GENERATOR, INDEX, write_folder

__all__ = ["NO_CURVE", "PLACEMENT", "SHARES", "write_page"]

SHARES = "latency-shares"  # the figures' file names, without the format's suffix
PLACEMENT = "placement"
NO_CURVE = ("The curve is not in this plan file: it was written by an earlier scepsy. "
            "Run scepsy plan again to add it.")
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 70em;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.8em; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; vertical-align: top; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; max-width: 40em; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4em 0.8em; }
.bad { background: #fdecea; border-left: 4px solid #d62728; padding: 0.4em 0.8em; }
nav a { margin-right: 1em; }
"""


# ------------------------------------------------------------------------------ formatting


def _fmt(value: Any) -> str:
    """A value as the page shows it (not yet escaped): floats to 4 significant digits,
    ``None`` as ``-``, booleans as yes/no, mappings as ``key: value`` pairs, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _esc(value: Any) -> str:
    """:func:`_fmt`, HTML-escaped (quotes included)."""
    return html.escape(_fmt(value), quote=True)


def _cell(tag: str, value: Any) -> str:
    cls = "" if isinstance(value, int | float) and not isinstance(value, bool) else ' class="text"'
    return f"<{tag}{cls}>{_esc(value)}</{tag}>"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """An HTML table of ``rows`` (mappings) in ``columns``; a missing cell shows ``-``."""
    head = "".join(f'<th class="text">{_esc(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(_cell("td", r.get(c)) for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pairs(items: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of (name, value)."""
    body = "".join(f'<tr><th class="text">{_esc(k)}</th>{_cell("td", v)}</tr>' for k, v in items)
    return f"<table><tbody>{body}</tbody></table>"


Image = tuple[str, tuple[int, int] | None]  # a figure's file name and the size shown (PNG)


def _figure(img: Image, alt: str, caption: str) -> str:
    src, size = img
    wh = f' width="{size[0]}" height="{size[1]}"' if size is not None else ""
    return (f'<figure><img src="{html.escape(src)}"{wh} alt="{_esc(alt)}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def _note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{_esc(text)}</p>'


def _section(ident: str, title: str, parts: Iterable[str]) -> str:
    return f'<section id="{ident}"><h2>{_esc(title)}</h2>\n' + "\n".join(parts) + "</section>"


# -------------------------------------------------------------------------------- sections


def _summary(rep: Report) -> str:
    """The line under the title: status, optimiser, objective, cluster and targets."""
    d = rep.doc
    per_type: dict[str, int] = {}
    for n in rep.nodes.nodes:
        per_type[n.gpu] = per_type.get(n.gpu, 0) + n.gpus
    gpus = ", ".join(f"{v} × {k}" for k, v in sorted(per_type.items()))
    targets = ", ".join(f"{w} {_fmt(t)} req/s" for w, t in sorted(d.targets.items()))
    return (f"<p>Status <b>{_esc(d.status)}</b> · optimiser {_esc(d.optimiser)} · objective "
            f"{_esc(d.objective)} · cluster {_esc(d.cluster.name)}: {_esc(gpus)} in "
            f"{len(rep.nodes.nodes)} node(s) · targets: {_esc(targets)} · scale {_esc(d.scale)}</p>")


def _outcome_section(rep: Report) -> str:
    """Why the plan has no placed allocation: the infeasibility or the placement's reason."""
    d, parts = rep.doc, []
    if d.infeasible is not None:
        inf = d.infeasible
        parts.append(_note(f"The targets cannot be met ({inf.reason}): {inf.detail}", "bad"))
        parts.append(_pairs([("reason", inf.reason), ("max scale of the targets", inf.max_scale),
                            ("bottleneck", inf.bottleneck), ("binding", inf.binding)]))
        parts.append("<h3>Maximum throughput per workflow</h3>" + _table(
            [{"workflow": w, "max_throughput": t} for w, t in sorted(inf.max_throughput.items())],
            ["workflow", "max_throughput"]))
        if inf.gain_per_gpu:
            parts.append("<h3>Gain per added GPU</h3>" + _table(
                [{"device": g, "gain": v} for g, v in inf.gain_per_gpu.items()],
                ["device", "gain"]))
    pl = d.placement
    if pl is not None and not pl.placed:
        if d.infeasible is None or pl.reason != d.infeasible.detail:
            parts.append(_note(f"Not placed ({pl.status}): {pl.reason or 'no reason given'}",
                              "bad"))
        if pl.unplaced:
            parts.append("<h3>Replicas left unplaced</h3>" + _table(
                [{"llm": m, "replica": k, "why": why} for m, k, why in pl.unplaced],
                ["llm", "replica", "why"]))
    if not parts:
        parts.append(_note(f"This plan has no placed allocation (status {d.status}).", "bad"))
    return _section("outcome", "What happened", parts)


def _workflows_section(rep: Report, curves: Mapping[str, Image]) -> str:
    """The workflows table and a curve figure per workflow (or why there is none)."""
    if not rep.has_allocation:
        rows = [{"workflow": w, "target": t} for w, t in sorted(rep.doc.targets.items())]
        return _section("workflows", "Workflows", [
            _table(rows, ["workflow", "target"]),
            _note("No allocation, so no predicted latency or curve.")])
    parts = [_table(workflow_rows(rep), WORKFLOW_COLUMNS)]
    for w, wf in sorted((rep.doc.workflows or {}).items()):
        if w in curves:
            parts.append(_figure(curves[w], f"predicted latency curve of {w}",
                                f"{w}: predicted mean latency against throughput, every "
                                "workflow's rate scaled with it; the star is the plan's "
                                "operating point, the dashed line the maximum throughput."))
        elif wf.curve is None:
            parts.append(_note(f"{w}: {NO_CURVE}"))
        else:
            parts.append(_note(f"{w}: the curve has no point with a finite latency."))
    return _section("workflows", "Workflows", parts)


def _llms_section(rep: Report, figs: Mapping[str, Image]) -> str:
    if not rep.has_allocation:
        return _section("llms", "LLMs", [_note("No allocation.")])
    return _section("llms", "LLMs", [
        _table(plan_rows(rep), PLAN_COLUMNS),
        _figure(figs[SHARES], "latency share per LLM",
               "Each LLM's share of the predicted latency (the objective), with its mean "
               "call latency.")])


def _placement_section(rep: Report, figs: Mapping[str, Image]) -> str:
    if not rep.placed:
        return _section("placement", "Placement", [_note("No placed allocation.")])
    rows = node_rows(rep)
    return _section("placement", "Placement", [
        _figure(figs[PLACEMENT], "placement map",
               "Every GPU of every node: the upper bar is the compute share each replica "
               "takes, the lower bar its memory (GiB); colours are the LLMs, a shade of one "
               "per replica (the legend's llm#k, #k in the cells)."),
        "<h3>Nodes</h3>" + _table(rows, list(rows[0]) if rows else []),
        "<details><summary>Every GPU's replicas</summary>"
        + _table(placement_rows(rep), PLACEMENT_COLUMNS) + "</details>"])


def _solver_section(rep: Report) -> str:
    """The optimiser's statistics and gap, then the optimise-place loop's: formulations
    compared, cuts, rounds."""
    d, s = rep.doc, rep.doc.solver
    parts = ["<h3>Optimiser</h3>" + _pairs([
        ("status", d.status), ("optimiser", d.optimiser), ("objective", d.objective),
        ("objective (s)", s.objective_s), ("bound (s)", s.bound_s), ("gap", s.gap),
        ("gap limit", s.gap_limit), ("time limit (s)", s.time_limit_s),
        *open_fields(s).items()])]
    pl = d.placement
    if pl is not None:
        parts.append("<h3>Optimise-place loop</h3>" + _pairs([
            ("status", pl.status), ("placed", pl.placed), ("formulation", pl.formulation),
            ("placed by", pl.placed_by), ("policy", pl.policy), ("rounds", pl.rounds),
            ("exact", pl.exact), ("bound (s)", pl.bound_s), ("gap to bound", pl.gap),
            ("reason", pl.reason)]))
        compared = [{"formulation": f, **o.model_dump()} for f, o in sorted(pl.compared.items())]
        parts.append("<h3>Formulations compared</h3>" + _table(
            compared, ["formulation", "status", "objective_s", "bound_s", "seconds"]))
        parts.append("<h3>Cuts</h3>" + _table(
            [{"cut": k, "count": v} for k, v in sorted(pl.cuts.items())], ["cut", "count"]))
        if pl.history:
            cols = list(dict.fromkeys(k for h in pl.history for k in h))
            parts.append("<h3>Rounds</h3>" + _table(pl.history, cols))
    return _section("solver", "Solver", parts)


def _bounds_section(rep: Report) -> str:
    """GPUs and nodes used against their lower bounds, fragmentation and the rest of the
    placement's quality figures."""
    pl = rep.doc.placement
    quality = pl.quality if pl is not None else None
    total = sum(n.gpus for n in rep.nodes.nodes)
    units = sum(r.gpus for r in (rep.doc.llms or {}).values())
    parts = [_pairs([("GPUs in the cluster", total), ("GPU units allocated (shares)", units)])]
    if not quality:
        parts.append(_note("The plan file has no placement bounds."))
        return _section("bounds", "Bounds", parts)
    q = dict(quality)
    rows = [{"resource": "GPUs", "used": q.get("gpus_used"), "opened": q.get("gpus_opened"),
             "bound": q.get("bound_best", q.get("bound_l2")), "ratio": q.get("gpus_over_bound")},
            {"resource": "nodes", "used": q.get("nodes_used"), "opened": q.get("nodes_opened"),
             "bound": q.get("bound_nodes"), "ratio": q.get("nodes_over_bound")}]
    parts.append(_table(rows, ["resource", "used", "opened", "bound", "ratio"]))
    if "fragmentation" in q:
        parts.append(f"<p>Fragmentation: {_esc(q['fragmentation'])}</p>")
    parts.append("<details><summary>Every quality figure</summary>"
                 + _pairs(sorted(q.items())) + "</details>")
    return _section("bounds", "Bounds", parts)


def _timings_section(rep: Report) -> str:
    t = rep.doc.timings
    if t is None:
        return ""
    return _section("timings", "Timings", [_pairs(
        (k, v) for k, v in t.model_dump().items() if v is not None)])


def _page(rep: Report, curves: Mapping[str, Image], figs: Mapping[str, Image]) -> str:
    """The whole ``index.html`` (``curves``: workflow → its curve figure; ``figs``: the
    shares and placement figures)."""
    name = rep.path.name
    body = [_summary(rep)]
    ids = ["workflows", "llms", "placement", "solver", "bounds"]
    if not rep.placed:
        body.append(_outcome_section(rep))
        ids.insert(0, "outcome")
    body += [_workflows_section(rep, curves), _llms_section(rep, figs),
             _placement_section(rep, figs),
             _solver_section(rep), _bounds_section(rep), _timings_section(rep)]
    nav = "".join(f'<a href="#{i}">{i}</a>' for i in ids)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"{GENERATOR}\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>scepsy report: {_esc(name)}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n<h1>Plan report: {_esc(name)}</h1>\n{body[0]}\n<nav>{nav}</nav>\n"
            + "\n".join(b for b in body[1:] if b) + "\n</body>\n</html>\n")


# ----------------------------------------------------------------------------------- write


def _write_files(rep: Report, folder: Path, fmt: str) -> None:
    """The figures (as ``fmt``) and ``index.html`` of ``rep`` into ``folder``."""
    curves: dict[str, Image] = {}
    figs: dict[str, Image] = {}
    if rep.has_allocation:
        for k, (w, wf) in enumerate(sorted((rep.doc.workflows or {}).items()), start=1):
            if wf.curve is not None and wf.curve.points:
                name = f"curve-{k}.{fmt}"
                curves[w] = (name, curve_figure(folder / name, w, wf, fmt))
        name = f"{SHARES}.{fmt}"
        figs[SHARES] = (name, shares_figure(folder / name, rep, fmt))
    if rep.placed:
        name = f"{PLACEMENT}.{fmt}"
        figs[PLACEMENT] = (name, placement_figure(folder / name, rep, fmt))
    (folder / INDEX).write_text(_page(rep, curves, figs), encoding="utf-8")


def write_page(rep: Report, out: Path, fmt: str = "png") -> Path:
    """Write the report of ``rep`` into the folder ``out`` (replacing an earlier report there,
    :func:`scepsy.report.folder.write_folder`), its figures as ``fmt`` (``png`` or
    ``svg``, :data:`~scepsy.report.figures.FORMATS`); returns ``out``."""
    if fmt not in FORMATS:
        raise ValueError(f"figure format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return write_folder(out, lambda folder: _write_files(rep, folder, fmt))
