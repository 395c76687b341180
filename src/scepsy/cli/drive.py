"""``scepsy drive``: run workflow requests against the servers of a routing table and print
throughput and latency (docs/drive.md).

Parsing and printing only; the driver lives in :mod:`scepsy_serve.launch.drive`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, POSITIVE, RATE, SEED

HELP = "run workflow requests against the servers of a routing table (routes.json) at a " \
       "Poisson rate; print throughput and latency, write the measured trace"

EXIT_FAILURES = 1
"""Exit status of a drive where some request failed or was never sent."""

_FLAGS = {"rate": "--rate", "requests": "--requests", "seed": "--seed",
          "max_in_flight": "--max-in-flight", "deadline_s": "--deadline", "vocab": "--vocab"}
"""Fields of the driver's argument errors (source ``drive``) and the options that set them."""


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``scepsy drive`` on ``cmd``; sets ``func``."""
    cmd.add_argument("--workflow", type=Path, action="append", required=True,
                     help="workflow or workload YAML (repeatable; a workload's weights set the "
                     "mix, default equal)")
    cmd.add_argument("--catalog", type=Path,
                     help="YAML catalog extending the bundled one (models the workflows name "
                     "that it lacks, e.g. datasets/catalogs/cpu-host.yaml)")
    cmd.add_argument("--routes", type=Path, required=True,
                     help="routing table (routes.json, written by `scepsy launch`)")
    cmd.add_argument("--rate", type=RATE, required=True,
                     help="total arrival rate, requests/s (Poisson, split over the workflows)")
    cmd.add_argument("--requests", type=COUNT, required=True, help="requests in all")
    cmd.add_argument("--seed", type=SEED, default=0,
                     help="seed of the arrivals, the requests and the endpoint choices")
    cmd.add_argument("--max-in-flight", type=COUNT, default=64,
                     help="most requests running at once; later arrivals wait (default "
                     "%(default)s)")
    cmd.add_argument("--timeout", type=POSITIVE, default=300.0,
                     help="longest one LLM call may take, s (default %(default)s)")
    cmd.add_argument("--stall-timeout", type=POSITIVE, default=60.0,
                     help="longest wait for the first or the next bytes of a call, s (default "
                     "%(default)s)")
    cmd.add_argument("--connect-timeout", type=POSITIVE, default=10.0,
                     help="longest wait for a connection, s (default %(default)s)")
    cmd.add_argument("--deadline", type=POSITIVE,
                     help="end the whole run after this many seconds (requests still running "
                     "fail as 'deadline', later ones are not sent)")
    cmd.add_argument("--vocab", type=COUNT, default=1000,
                     help="prompt token ids are drawn below this (default %(default)s; lower it "
                     "for a test model with a smaller vocabulary)")
    cmd.add_argument("--trace-out", type=Path,
                     help="write the measured trace (JSON lines) of the completed requests here")
    cmd.add_argument("--json", type=Path, metavar="FILE",
                     help="write the full result (JSON) here")
    cmd.set_defaults(func=cmd_drive)
    return cmd


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``drive`` to a ``scepsy`` sub-command set; returns its parser."""
    return add_arguments(subparsers.add_parser("drive", help=HELP))


def _specs(paths: list[Path]) -> tuple[Any, ...]:
    from scepsy_common.errors import InputError
    from scepsy_opt.workload import load_specs

    specs: list[Any] = []
    for p in paths:
        for s in load_specs(p):
            if any(s.name == t.name for t in specs):
                raise InputError(str(p), "name", "workflows with unique names over every "
                                 f"--workflow (two are called {s.name!r})", s.name)
            specs.append(s)
    return tuple(specs)


def _ci(lat: Any) -> str | None:
    return None if lat.ci95_s is None else f"±{lat.ci95_s:.3g}"


def cmd_drive(args: argparse.Namespace) -> int:
    from scepsy.api import using_catalog
    from scepsy.cli.util import UsageError, check_out, print_rows
    from scepsy_common.errors import InputError
    from scepsy_common.files import atomic_write_text, failed_run_output
    from scepsy_profile.profiling.replay import ReplayTimeouts
    from scepsy_serve.launch.drive import drive, write_drive_trace
    from scepsy_serve.launch.routes import load_routes

    for path, flag in ((args.trace_out, "--trace-out"), (args.json, "--json")):
        if path is not None:
            check_out(path, flag)
    with using_catalog(args.catalog):  # the workflows' models, while their requests are drawn
        specs = _specs(args.workflow)
        routes = load_routes(args.routes)
        timeouts = ReplayTimeouts(connect_s=args.connect_timeout, stall_s=args.stall_timeout,
                                  call_s=args.timeout)
        try:
            result = drive(specs, routes, rate=args.rate, requests=args.requests, seed=args.seed,
                           max_in_flight=args.max_in_flight, timeouts=timeouts,
                           deadline_s=args.deadline, vocab=args.vocab)
        except InputError as exc:  # name the file or option the problem is in
            if exc.source == "routes":
                raise InputError(str(args.routes), exc.field, exc.expected, exc.got) from None
            if exc.source == "drive" and exc.field in _FLAGS:
                tail = f" (got {exc.got!r})" if exc.got is not None else ""
                raise UsageError(f"{_FLAGS[exc.field]}: expected {exc.expected}{tail}") from None
            raise
    rows = [{"workflow": w, "sent": r.sent, "ok": r.completed, "failed": r.failed,
             "req_per_s": r.throughput_rps, "mean_s": r.latency.mean_s, "ci95_s": _ci(r.latency),
             "std_s": r.latency.std_s, "p50_s": r.latency.p50_s, "p90_s": r.latency.p90_s,
             "p99_s": r.latency.p99_s} for w, r in result.workflows.items()]
    print_rows(rows, ["workflow", "sent", "ok", "failed", "req_per_s", "mean_s", "ci95_s",
                      "std_s", "p50_s", "p90_s", "p99_s"])
    print()
    print_rows([{"llm": m, "calls": r.calls, "ok": r.ok, "failed": r.failed,
                 "mean_s": r.latency.mean_s, "p90_s": r.latency.p90_s, "ttft_s": r.ttft_mean_s}
                for m, r in result.llms.items()],
               ["llm", "calls", "ok", "failed", "mean_s", "p90_s", "ttft_s"])
    kinds = sorted(set(result.failures) | set(result.call_failures))
    if kinds:
        print()
        print_rows([{"failure": k, "requests": result.failures.get(k, 0),
                     "calls": result.call_failures.get(k, 0)} for k in kinds],
                   ["failure", "requests", "calls"])
        for k in kinds:  # why, in the client's words: the first request that failed so
            why = next((o.detail for o in result.requests if o.failure == k and o.detail), "")
            if why:
                print(f"{k}: e.g. {why}")
    print(f"\nsent {result.sent} of {result.planned} requests: {result.completed} completed, "
          f"{result.failed} failed, {result.not_sent} not sent; {result.throughput_rps:.3g} "
          f"req/s over {result.window_s:.3g} s (run {result.wall_s:.3g} s"
          f"{', deadline reached' if result.deadline_hit else ''})")
    ok = result.failed == 0 and result.not_sent == 0

    def dest(path: Path) -> Path:  # a run with failures never replaces an earlier result
        out = path if ok else failed_run_output(path)
        if out != path:
            print(f"scepsy: {path} holds an earlier result and was kept; this run had failures: "
                  f"its output is in {out}", file=sys.stderr)
        return out

    if args.trace_out is not None:
        if result.calls:
            trace_out = dest(args.trace_out)
            n = write_drive_trace(str(trace_out), result)
            print(f"wrote {n} calls of {result.completed} requests to {trace_out}")
        else:
            print(f"no request completed: {args.trace_out} not written")
    if args.json is not None:
        json_out = dest(args.json)
        atomic_write_text(json_out, json.dumps(result.to_dict(), indent=2, sort_keys=True)
                          + "\n")
        print(f"wrote {json_out}")
    return 0 if ok else EXIT_FAILURES
