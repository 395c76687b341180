"""``scepsy trace import FILE... --out TRACE.jsonl``: OpenTelemetry GenAI spans (OTLP/JSON files)
as a workflow trace (docs/otel.md). Parsing and printing only; the work is
:mod:`scepsy_opt.ingest.otel`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scepsy.cli.util import add_trace_source_args

HELP = "turn OpenTelemetry GenAI spans (OTLP/JSON files) into a trace"
EXAMPLES = 5  # span ids printed per kind of problem


def add_import(tsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``import`` to the ``scepsy trace`` sub-commands; returns its parser."""
    cmd = tsub.add_parser("import", help=HELP, description=HELP)
    cmd.add_argument("files", nargs="+", type=Path, metavar="FILE",
                     help="OTLP/JSON files: JSON lines of export requests (the collector's file "
                     "exporter, scepsy trace receive) or one JSON document")
    cmd.add_argument("--out", type=Path, required=True, metavar="TRACE.jsonl",
                     help="the trace to write (replaced atomically)")
    add_trace_source_args(cmd, "workflow name of every request (default: the map's, else "
                          "'agent')")
    cmd.add_argument("--request-attribute", metavar="KEY",
                     help="group spans into requests by this attribute (on the span, an "
                     "ancestor or the resource) instead of by root span")
    cmd.add_argument("--report", type=Path, metavar="REPORT.json",
                     help="also write the whole report (every span id) as JSON")
    cmd.add_argument("--strict", action="store_true",
                     help="exit 2 and write nothing when a span is malformed, unmapped, an "
                     "orphan, in a cycle, or an LLM call without token counts")
    cmd.add_argument("--json", action="store_true",
                     help="print the report as JSON instead of tables")
    cmd.set_defaults(func=cmd_import)
    return cmd


def cmd_import(args: argparse.Namespace) -> int:
    """Run ``scepsy trace import``: read, convert, check, write, print."""
    from scepsy.cli.util import UsageError, check_out
    from scepsy_common.files import atomic_write_text
    from scepsy_opt.ingest.otel import STRICT_KINDS, import_otlp
    from scepsy_opt.ingest.tracemap import trace_map
    from scepsy_opt.traces import with_client_time, write_trace

    check_out(args.out)
    if args.report is not None:
        check_out(args.report, "--report")  # not --out itself: main checks that
    tmap = trace_map(args.map, args.model, workflow=args.workflow,
                     request_attribute=args.request_attribute)
    imp = import_otlp(args.files, tmap)
    rep = imp.report
    files = " ".join(str(f) for f in args.files)
    if not imp.calls:
        raise UsageError(_no_calls(rep, files, args.report))
    counts = rep.counts()
    if args.strict and rep.problems:
        found = ", ".join(f"{k} {counts[k]}" for k in STRICT_KINDS if counts[k])
        raise UsageError(f"--strict: {rep.problems} problems in {files} ({found}); nothing "
                         "written (run without --strict for the span ids)")
    calls = imp.calls if args.no_client_time else with_client_time(imp.calls)
    write_trace(args.out, calls)
    if args.report is not None:
        atomic_write_text(args.report, json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n")
    gaps = len(calls) - len(imp.calls)
    if rep.problems:  # imported leniently: say so where a script looks, not only in the table
        found = ", ".join(f"{k} {counts[k]}" for k in STRICT_KINDS if counts[k])
        print(f"scepsy: warning: {rep.problems} problems in {files} ({found}): those spans "
              f"were dropped or read as they are; {args.report or ('the JSON' if args.json else 'the table below')} lists "
              "them (--strict refuses such input)", file=sys.stderr)
    if args.json:
        print(json.dumps({"out": str(args.out), "client_time_calls": gaps, **rep.to_dict()},
                         sort_keys=True))
        return 0
    _print_report(rep)
    print()
    n, r = len(calls), rep.requests
    print(f"wrote {args.out} ({n} call{'s' * (n != 1)}, {r} request{'s' * (r != 1)}"
          + (f", {gaps} of them client time" if gaps else "") + ")"
          + (f" and {args.report}" if args.report is not None else ""))
    return 0


_DROPPED = {
    "malformed": "malformed (bad ids, times or token counts)",
    "cycle": "in or beneath a parent cycle",
    "unmapped": "LLM calls of unmapped models",
    "duplicate": "duplicates of a span already read",
    "structure": "without LLM or tool attributes (structure only)",
}
_TO_DO = {
    "malformed": "fix what writes those spans",
    "cycle": "fix the parent ids",
    "unmapped": "map the models with --model MODEL=LLM or --map",
    "structure": "instrument the LLM and tool calls (GenAI gen_ai.operation.name, "
                 "OpenInference openinference.span.kind or a model attribute; docs/otel.md)",
}


def _no_calls(rep: Any, files: str, report: Path | None) -> str:
    """Why an import found no call: spans read, dropped per reason (an example each), what to
    do; with ``report`` the whole report is written there unless that file exists."""
    from scepsy_common.files import atomic_write_text

    dropped = rep.dropped()
    if not rep.spans:
        return f"no LLM or tool calls in {files}: no spans in it (is the exporter sending to " \
               "where this file was written?)"
    parts = [f"{n} {_DROPPED[k]} (e.g. {ex})" if ex else f"{n} {_DROPPED[k]}"
             for k, (n, ex) in dropped.items()]
    todo = [_TO_DO[k] for k in dropped if k in _TO_DO]
    where = "run with --report REPORT.json for every span id"
    if report is not None and not report.exists():
        atomic_write_text(report, json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n")
        where = f"every span id is in {report}"
    elif report is not None:
        where = f"{report} exists and was left as it is; pass a new --report for every span id"
    return (f"no LLM or tool calls in {files}: {rep.spans} spans read, none usable as a call: "
            + "; ".join(parts) + ". To do: " + "; ".join(todo or ["see docs/otel.md"])
            + f" ({where})")


def _print_report(rep: Any) -> None:
    from scepsy.cli.util import print_rows
    from scepsy_opt.ingest.otel import STRICT_KINDS

    print_rows([{"spans": rep.spans, "requests": rep.requests, "llm_calls": rep.llm_calls,
                 "tool_calls": rep.tool_calls, "structure_spans": rep.structure_spans,
                 "failed_calls": len(rep.failed)}],
               ["spans", "requests", "llm_calls", "tool_calls", "structure_spans",
                "failed_calls"])
    print()
    rows = []
    for kind, ids in rep.ids().items():
        more = f" (+{len(ids) - EXAMPLES})" if len(ids) > EXAMPLES else ""
        rows.append({"kind": kind, "problem": "yes" if kind in STRICT_KINDS else "no",
                     "count": len(ids), "span_ids": " ".join(ids[:EXAMPLES]) + more})
    print_rows(rows, ["kind", "problem", "count", "span_ids"])
    for model, ids in rep.unmapped.items():
        print(f"unmapped model {model or '(none)'!r}: {len(ids)} LLM calls dropped "
              f"(map it with --model '{model}=LLM')" if model else
              f"LLM spans without a model name: {len(ids)} dropped")
    for m in rep.malformed[:EXAMPLES]:
        print(f"malformed {m.span}: {m.reason}")
    if rep.cycle_dropped:
        print(f"{rep.cycle_dropped} spans in or beneath a parent cycle dropped")
