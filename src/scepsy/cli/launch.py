"""``scepsy launch PLAN --target TARGET --out DIR [--apply]`` and ``scepsy stop DIR``: a plan.json
rendered for a launch target, the shell target run and stopped on this host (docs/launch.md).

Parsing and printing only; the renderers live in :mod:`scepsy_serve.launch.renderers`, running
a shell folder in :mod:`scepsy_serve.launch.host`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scepsy.cli.argtypes import POSITIVE

EXIT_FAILED = 1  # --apply: a server did not start (start.sh stopped the others); stop: left


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``launch`` and ``stop`` to the ``scepsy`` command's subparsers."""
    add_launch_args(subparsers.add_parser(
        "launch", help="render a plan.json for a launch target (--apply: run it here)"))
    add_stop_args(subparsers.add_parser(
        "stop", help="stop the servers a shell launch folder started"))


def add_launch_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Write the files a launch target reads for the plan (atomically: DIR "
                     "holds the old files or all the new ones). With --apply (shell target) "
                     "run them on this host: start the servers and wait until every one "
                     "answers /health; `scepsy stop DIR` stops them.")
    p.add_argument("plan", type=Path, metavar="PLAN", help="a plan.json written by scepsy plan")
    p.add_argument("--target", required=True, metavar="shell|k8s|ray|routes",
                   help="launch target (docs/launch.md)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="folder to write (replaced only if empty or written by scepsy launch)")
    p.add_argument("--apply", action="store_true",
                   help="shell target: run the node's start.sh here and wait for /health")
    p.add_argument("--node", help="with --apply: the node this host is (default: the plan's "
                   "only node)")
    p.add_argument("--timeout-s", type=POSITIVE,
                   help="with --apply: seconds to wait for /health (default: the plan's)")
    p.add_argument("--json", action="store_true", help="print what was written (and started) "
                   "as JSON")
    p.set_defaults(func=cmd_launch)


def add_stop_args(p: argparse.ArgumentParser) -> None:
    p.description = ("Stop the servers `scepsy launch --target shell --apply` (or a node's "
                     "start.sh) started from DIR on this host; succeeds when none is left "
                     "and their ports are free. Running it again is harmless.")
    p.add_argument("folder", type=Path, metavar="DIR", help="a folder written by "
                   "`scepsy launch --target shell`")
    p.add_argument("--node", help="stop only this node's servers (default: every node's)")
    p.add_argument("--grace-s", type=POSITIVE, default=10.0,
                   help="seconds between SIGTERM and SIGKILL (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_stop)


def _file_rows(files: dict[str, str]) -> list[dict[str, object]]:
    return [{"file": path, "bytes": len(text.encode("utf-8"))}
            for path, text in sorted(files.items())]


def cmd_launch(args: argparse.Namespace) -> int:
    from scepsy.cli.util import UsageError, naming
    from scepsy.tables import print_table
    from scepsy_serve.launch.planfile import load_plan
    from scepsy_serve.launch.renderers import check_folder, get_renderer, write_rendered

    if args.target != "shell" and args.apply:
        raise UsageError(f"--apply: only the shell target runs here (got --target "
                         f"{args.target}); apply its files with the target's own tools")
    if not args.apply and (args.node is not None or args.timeout_s is not None):
        raise UsageError("--node and --timeout-s need --apply")
    from scepsy_serve.launch.host import busy_ports, choose_node, running_servers

    # every flag and input is checked before anything is written: the folder at --out is
    # replaced whole (write_rendered) only once nothing is left to refuse
    with naming({"target": "--target"}):
        renderer = get_renderer(args.target)
    check_folder(args.out)
    plan = load_plan(args.plan)
    files = dict(renderer.render(plan))
    if live := running_servers(args.out):
        raise UsageError(f"--out: servers started from {args.out} still run "
                         f"({', '.join(live)}); `scepsy stop {args.out}` first")
    if args.apply:
        node = choose_node(plan.node_names(), args.node, str(args.plan))
        if busy := busy_ports((f"{r.llm}-{r.replica}", r.port) for r in plan.replicas_on(node)):
            raise UsageError(f"--apply: ports of node {node} are in use on this host: "
                             f"{', '.join(busy)}; stop what listens there, or set "
                             f"launch.base_port in {args.plan}")
    out = write_rendered(files, args.out, renderer.name)
    report: dict[str, object] = {"target": renderer.name, "out": str(out),
                                 "files": _file_rows(files)}
    if not args.json:
        print(f"{renderer.name}: wrote {len(files)} files to {out}")
        print_table(report["files"], ["file", "bytes"], align="left")  # type: ignore[arg-type]
    if not args.apply:
        if args.json:
            print(json.dumps(report, indent=2))
        return 0

    from scepsy_serve.launch.host import LaunchError, apply

    if not args.json:
        print(f"starting the servers (waiting for /health; `scepsy stop {out}` stops them)",
              flush=True)
    try:
        run = apply(out, node, args.timeout_s, echo=sys.stderr)
    except LaunchError:  # start.sh said why (on stderr, above) and stopped what it started
        print(f"scepsy: the servers did not start; nothing of {out} runs", file=sys.stderr)
        return EXIT_FAILED
    rows = [{"server": s.name, "llm": s.llm, "pid": s.pid, "port": s.port, "url": s.url,
             "log": str(s.log)} for s in run.servers]
    if args.json:
        report.update(node=run.node, run_dir=str(run.run_dir), servers=rows,
                      startup_s=round(run.startup_s, 3))
        print(json.dumps(report, indent=2))
    else:
        print(f"node {run.node}: {len(rows)} servers healthy after {run.startup_s:.1f} s "
              f"(routes: {out / 'routes.json'})")
        print_table(rows, ["server", "llm", "pid", "port", "url", "log"], align="left")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from scepsy.tables import print_table
    from scepsy_serve.launch.host import stop

    report = stop(args.folder, args.grace_s, node=args.node)
    if args.json:
        print(json.dumps({"stopped": list(report.stopped), "left": list(report.left),
                          "busy_ports": list(report.busy_ports),
                          "stale": [{"server": n, "pid": p} for n, p in report.stale],
                          "ok": report.ok}, indent=2))
    else:
        for n, p in report.stale:
            print(f"stale pid file, process {p} is not {n}: not signalled", file=sys.stderr)
        rows = [{"server": n, "state": "stopped"} for n in report.stopped]
        rows += [{"server": n, "state": "STILL RUNNING"} for n in report.left]
        if rows:
            print_table(rows, ["server", "state"], align="left")
        if report.busy_ports:
            print("ports still in use: " + ", ".join(map(str, report.busy_ports)))
        print("nothing left running" if report.ok else "some servers are left (see above)")
    return 0 if report.ok else EXIT_FAILED
