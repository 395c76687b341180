"""``scepsy gateway``: the routing gateway in front of every replica of a deployment
(docs/gateway.md). Each call goes to the least-loaded endpoint of its LLM within the routing
table's weights; the table is re-read on SIGHUP, when its file changes and on
``PUT /scepsy/routes``; every call forwarded is recorded as a trace, as ``scepsy record`` does.
Parsing and printing only; the gateway is :mod:`scepsy_serve.gateway`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, POSITIVE, RETRY_COUNT
from scepsy.cli.util import add_trace_source_args, record_summary

HELP = "the routing gateway in front of every replica of a launched plan"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``gateway`` to a ``scepsy`` sub-command set; returns its parser."""
    cmd = subparsers.add_parser("gateway", help=HELP, description=HELP)
    cmd.add_argument("--listen", required=True, metavar="HOST:PORT",
                     help="where the gateway listens, e.g. 127.0.0.1:8100 or the node's "
                     "address in the plan (port 0: any free one); 0.0.0.0 or [::] only with "
                     "--all-interfaces")
    cmd.add_argument("--all-interfaces", action="store_true",
                     help="allow a --listen address of every interface (0.0.0.0, [::]): the "
                     "admin API (PUT /scepsy/routes) has no authentication")
    cmd.add_argument("--health-check", default="on", metavar="off|on|KEY=VALUE,...",
                     help="active health checks of every endpoint: keys path (default /health), "
                     "interval and timeout (s, default 1 and 1), unhealthy and healthy (probes "
                     "in a row, default 2 and 2); off: none (default on)")
    cmd.add_argument("--outlier-detection", metavar="KEY=VALUE,...",
                     help="ejection on errors, as Envoy's: keys consecutive_5xx (default 5), "
                     "consecutive_gateway_failure (3), base_ejection (s, 5), max_ejection (s, "
                     "300), max_ejection_percent (50), decay (s, 10)")
    cmd.add_argument("--routes", type=Path, required=True, metavar="ROUTES.json",
                     help="the routing table (routes.json of a launch): each call goes to the "
                     "least-loaded endpoint of its LLM within the weights; re-read on SIGHUP "
                     "and when it changes")
    cmd.add_argument("--priority", choices=("fcfs", "las"), default="fcfs",
                     help="las sets each call's vLLM priority from its request's tokens served "
                     "so far (least attained service; the servers need --scheduling-policy "
                     "priority); fcfs leaves calls alone (default)")
    cmd.add_argument("--out", type=Path, required=True, metavar="TRACE.jsonl",
                     help="the trace of the calls forwarded (must not exist; one line per "
                     "call, flushed as each call ends)")
    add_trace_source_args(cmd, "workflow name of the recorded requests (default: the map's, "
                          "else 'agent'; the X-Scepsy-Workflow header overrides it)")
    cmd.add_argument("--timeout", type=POSITIVE, default=600.0, metavar="S",
                     help="longest wait to connect to a replica and for each read from it, s "
                     "(default %(default)s)")
    cmd.add_argument("--retries", type=RETRY_COUNT, default=1, metavar="N",
                     help="send a call again up to N times, to another replica of its LLM when "
                     "there is one, when its replica refused, reset or closed the connection "
                     "before answering; 0 to 5 (default %(default)s)")
    cmd.add_argument("--duration", type=POSITIVE, metavar="S",
                     help="stop after this many seconds (default: run until SIGINT/SIGTERM)")
    cmd.add_argument("--max-body-bytes", type=COUNT, metavar="N",
                     help="largest request body accepted; larger ones are answered 413 "
                     "(default 268435456, 256 MiB)")
    cmd.set_defaults(func=cmd_gateway)
    return cmd


def _config(args: argparse.Namespace) -> Any:
    """The gateway's :class:`~scepsy_serve.gateway.GatewayConfig`."""
    from scepsy.cli.util import check_new_out
    from scepsy_common.net import parse_listen
    from scepsy_opt.ingest.record import MAX_BODY_BYTES, RecordConfig
    from scepsy_opt.ingest.tracemap import trace_map
    from scepsy_serve.gateway import (
        GatewayConfig,
        OutlierDetection,
        parse_health_check,
        parse_outlier_detection,
    )
    from scepsy_serve.launch.routes import load_routes

    host, port = parse_listen(args.listen)
    record = RecordConfig(out=args.out, upstream=None, upstream_for={},
                          trace_map=trace_map(args.map, args.model, workflow=args.workflow),
                          host=host, port=port, timeout_s=args.timeout,
                          client_time=not args.no_client_time,
                          max_body_bytes=args.max_body_bytes or MAX_BODY_BYTES,
                          retries=args.retries, routed=True)
    config = GatewayConfig(record=record, routes=load_routes(args.routes),
                           routes_file=args.routes, priority=args.priority,
                           health=parse_health_check(args.health_check),
                           outlier=parse_outlier_detection(args.outlier_detection)
                           if args.outlier_detection else OutlierDetection(),
                           all_interfaces=args.all_interfaces)
    check_new_out(args.out)  # last: it may create the folder
    return config


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the gateway until a signal or ``--duration``; print the summary."""
    import asyncio
    import gc
    import signal
    import sys

    from scepsy.cli.trace_receive import startup_line
    from scepsy.cli.util import stop_event
    from scepsy_opt.ingest.record import serve
    from scepsy_serve.gateway import Gateway, loop_factory

    config = _config(args)
    n = len({e.url for llms in config.routes.workflows.values()
             for eps in llms.values() for e in eps})
    what = f"{n} endpoints of {args.routes} (priority {args.priority})"

    async def main() -> Any:
        stop = stop_event(args.duration)
        gateway = Gateway(config)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, gateway.reload_file)

        def started(url: str) -> None:
            # what start-up built (imports, the table) lives until exit: out of the collector's
            # way, so that each collection walks only what the calls allocate
            gc.freeze()
            print(startup_line("scepsy gateway", url, config.record.out, args.duration, what),
                  file=sys.stderr, flush=True)

        return await serve(config.record, stop, started, proxy=gateway)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # uvloop where installed
        stats = runner.run(main())
    record_summary(stats, config.record.out)
    return 0
