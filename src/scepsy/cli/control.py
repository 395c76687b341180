"""``scepsy control``: keep a running plan right while its load moves (docs/control.md). Reads
the gateway's and the replicas' ``/metrics`` every window, forecasts each workflow's rate,
re-plans incrementally when the plan will miss its bound or waste capacity, and applies the
change through an apply target (start, wait for health, re-route, drain, stop).

Parsing and printing only; the work is :mod:`scepsy_serve.control` (``live``, ``core``,
``telemetry``, ``apply``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import NONNEGATIVE, POSITIVE

HELP = ("keep a running plan right while its load moves: read the gateway's and the replicas' "
        "metrics, forecast, re-plan and apply (start, health, re-route, drain, stop)")

REQUEST_FLAGS = ("--max-utilisation", "--trace", "--trace-requests", "--curves", "--overheads",
                 "--catalog", "--seed", "--shares", "--tp")
"""The plan request's options the controller's re-plans take (as ``scepsy replan`` does)."""
TARGETS = ("shell", "ray", "none")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return add_arguments(subparsers.add_parser("control", help=HELP))


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from scepsy.cli.fields import add_request_flags
    from scepsy_place.request import flag_fields

    cmd.add_argument("--plan", type=Path, required=True,
                     help="the running plan.json (placed; what the gateway routes to)")
    cmd.add_argument("--workflow", type=Path, required=True,
                     help="the workflow, workload or rate workload YAML the plan was made for")
    cmd.add_argument("--cluster", type=Path,
                     help="cluster YAML/JSON the plan runs on (default: the plan's own nodes)")
    cmd.add_argument("--gateway", required=True, metavar="URL",
                     help="the gateway's base URL (scepsy gateway), e.g. "
                     "http://127.0.0.1:8100")
    cmd.add_argument("--target", choices=TARGETS, default="none",
                     help="how changes are applied: shell (vllm serve on this host), ray (Ray "
                     "Serve), none (decisions only, like --dry-run; default)")
    cmd.add_argument("--window", type=POSITIVE, default=30.0, metavar="S",
                     help="seconds per telemetry window, one decision each (default "
                     "%(default)s)")
    cmd.add_argument("--startup-s", type=NONNEGATIVE, default=60.0, metavar="S",
                     help="seconds a new replica takes to answer /health (default "
                     "%(default)s)")
    cmd.add_argument("--health-timeout", type=POSITIVE, metavar="S",
                     help="seconds a new replica may take before its start is rolled back "
                     "(default: the plan's launch.health_timeout_s)")
    cmd.add_argument("--log", type=Path, default=Path("decisions.jsonl"),
                     help="decision log, JSON lines, appended (default %(default)s)")
    cmd.add_argument("--duration", type=POSITIVE, metavar="S",
                     help="stop after S seconds (default: until SIGINT or SIGTERM)")
    cmd.add_argument("--dry-run", action="store_true",
                     help="log decisions only: nothing is started, stopped or re-routed")
    cmd.add_argument("--metrics-listen", metavar="HOST:PORT",
                     help="serve the controller's Prometheus metrics at http://HOST:PORT/")
    cmd.add_argument("--run-dir", type=Path, default=Path("run"),
                     help="shell target: the launch folder's run folder (start.sh's pid files; "
                     "new servers' logs under control/) (default %(default)s)")
    add_request_flags(cmd, flag_fields(), only=REQUEST_FLAGS)
    cmd.set_defaults(func=cmd_control)
    return cmd


def _log_path(path: Path) -> Path:
    from scepsy_common.errors import InputError

    if path.is_dir():
        raise InputError("--log", "", "a file to append decisions to (not a folder)", str(path))
    if not path.parent.is_dir():
        raise InputError("--log", "", f"a file in an existing folder ({path.parent} is none)",
                         str(path))
    return path


def _gateway(url: str) -> str:
    """``url`` when it is a URL and a gateway answers ``GET /scepsy/state`` there."""
    import httpx

    from scepsy_common.errors import InputError
    from scepsy_common.net import check_url

    check_url(url, "--gateway")
    try:
        resp = httpx.get(url.rstrip("/") + "/scepsy/state", timeout=10, trust_env=False)
        resp.raise_for_status()
        data = resp.json()
        if not isinstance(data, dict) or "endpoints" not in data:
            raise ValueError("no endpoints in its answer")
    except (httpx.HTTPError, ValueError) as exc:
        raise InputError("--gateway", "", "the URL of a running gateway (scepsy "
                         f"gateway) that answers GET /scepsy/state ({exc})", url) from None
    return url


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(problem, topology, running placed plan, launch plan) of ``--plan``, rebuilt as
    ``scepsy replan`` does."""
    from scepsy import api
    from scepsy.cli.replan import running_problem
    from scepsy.cli.util import naming
    from scepsy_opt.planning.baselines import UserAllocation
    from scepsy_place.formulations.placed import PlacedPlan
    from scepsy_place.request import flag_names
    from scepsy_profile.catalog import catalog_in_force
    from scepsy_serve.launch.planfile import parse_launch_plan

    flags = {**flag_names(), "targets": "--plan"}
    rp = running_problem(args, flags, REQUEST_FLAGS)
    problem, topology, running = rp.problem, rp.topology, rp.running
    with api.using_catalog(rp.request.inputs.catalog), naming(flags):
        launch = parse_launch_plan(rp.raw, str(args.plan))
        with catalog_in_force(problem.catalog):
            plan = UserAllocation(running.allocation).solve(problem)
        placed = PlacedPlan(plan=plan, placement=running.placement, rounds=1, history=(),
                            quality=None, formulation="current", status="placed")
    return problem, topology, placed, launch


def cmd_control(args: argparse.Namespace) -> int:
    import asyncio

    from scepsy.cli.util import stop_event
    from scepsy_common.errors import InputError
    from scepsy_common.net import check_url, parse_listen
    from scepsy_serve.control.actuate import apply_target
    from scepsy_serve.control.core import ControlConfig, Controller
    from scepsy_serve.control.live import ControlMetrics, JsonLog, control_loop

    # every input checked before anything runs or is written
    log_path = _log_path(args.log)
    listen = parse_listen(args.metrics_listen, "--metrics-listen") \
        if args.metrics_listen is not None else None
    check_url(args.gateway, "--gateway")
    problem, topology, placed, launch = build(args)
    gateway = _gateway(args.gateway)  # the network last: every file and flag is checked first
    config = ControlConfig(window_s=args.window, startup_s=args.startup_s)
    controller = Controller(problem, topology, placed, config)
    dry_run = args.dry_run or args.target == "none"
    target = None
    if not dry_run:
        options = {"run_dir": args.run_dir} if args.target == "shell" else {}
        target = apply_target(args.target, **options)
    health_timeout = args.health_timeout or launch.engine.health_timeout_s
    metrics = ControlMetrics()
    server = None
    if listen is not None:
        from prometheus_client import start_http_server

        try:
            server, _ = start_http_server(listen[1], listen[0], registry=metrics.registry)
        except OSError as exc:
            raise InputError("--metrics-listen", "", f"an address this host can listen on "
                             f"({exc.strerror or exc})", args.metrics_listen) from None
    print(f"scepsy control: {args.target if not dry_run else 'dry run'}, window {args.window:g} "
          f"s, gateway {gateway}, log {log_path}"
          + (f", metrics http://{args.metrics_listen.rpartition(':')[0]}:{server.server_port}/"
             if server is not None else ""),
          file=sys.stderr, flush=True)

    async def main() -> Any:
        stop = stop_event(args.duration)
        with open(log_path, "a", encoding="utf-8") as stream:
            return await control_loop(controller, launch, target, gateway,
                                      window_s=args.window, log=JsonLog(stream), stop=stop,
                                      dry_run=dry_run, health_timeout_s=health_timeout,
                                      metrics=metrics)

    try:
        res = asyncio.run(main())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    decided = ", ".join(f"{n} {a}" for a, n in sorted(res.decisions.items())) or "none"
    print(f"scepsy control: {res.windows} windows; decisions: {decided}; applied "
          f"{res.applied}, failed {res.failed}, moves {res.moves}; log {log_path}",
          file=sys.stderr)
    return 0
