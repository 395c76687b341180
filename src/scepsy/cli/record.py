"""``scepsy record``: an OpenAI-compatible proxy that records every call it forwards as a trace
(docs/record.md). Parsing and printing only; the proxy is :mod:`scepsy_opt.ingest.record`. The
routing gateway, which records too, is ``scepsy gateway`` (:mod:`scepsy.cli.gateway`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, POSITIVE, RETRY_COUNT
from scepsy.cli.util import add_trace_source_args, record_summary

HELP = "an OpenAI-compatible proxy that records every call it forwards as a trace"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``record`` to a ``scepsy`` sub-command set; returns its parser."""
    cmd = subparsers.add_parser("record", help=HELP, description=HELP)
    cmd.add_argument("--listen", required=True, metavar="HOST:PORT",
                     help="where the proxy listens, e.g. 127.0.0.1:8100 (port 0: any free one)")
    cmd.add_argument("--upstream", metavar="URL",
                     help="the OpenAI-compatible server every call goes to, e.g. "
                     "http://127.0.0.1:8000 (a trailing /v1 is fine)")
    cmd.add_argument("--upstream-for", action="append", default=[], metavar="MODEL=URL",
                     help="the server of one model (repeatable; others go to --upstream)")
    cmd.add_argument("--out", type=Path, required=True, metavar="TRACE.jsonl",
                     help="the trace to write (must not exist; one line per call, flushed as "
                     "each call ends)")
    add_trace_source_args(cmd, "workflow name of the recorded requests (default: the map's, "
                          "else 'agent'; the X-Scepsy-Workflow header overrides it)")
    cmd.add_argument("--timeout", type=POSITIVE, default=600.0, metavar="S",
                     help="longest wait to connect to an upstream and for each read from it, s "
                     "(default %(default)s)")
    cmd.add_argument("--retries", type=RETRY_COUNT, default=1, metavar="N",
                     help="send a call again up to N times when its server refused, reset or "
                     "closed the connection before answering; 0 to 5 (default %(default)s)")
    cmd.add_argument("--duration", type=POSITIVE, metavar="S",
                     help="stop after this many seconds (default: run until SIGINT/SIGTERM)")
    cmd.add_argument("--max-body-bytes", type=COUNT, metavar="N",
                     help="largest request body accepted; larger ones are answered 413 "
                     "(default 268435456, 256 MiB)")
    cmd.set_defaults(func=cmd_record)
    return cmd


def _config(args: argparse.Namespace) -> Any:
    """The proxy's :class:`RecordConfig`."""
    from scepsy.cli.util import check_new_out
    from scepsy_common.net import parse_listen
    from scepsy_opt.ingest.record import MAX_BODY_BYTES, RecordConfig, upstream_pairs
    from scepsy_opt.ingest.tracemap import trace_map

    host, port = parse_listen(args.listen)
    config = RecordConfig(out=args.out, upstream=args.upstream,
                          upstream_for=upstream_pairs(args.upstream_for),
                          trace_map=trace_map(args.map, args.model, workflow=args.workflow),
                          host=host, port=port, timeout_s=args.timeout,
                          client_time=not args.no_client_time,
                          max_body_bytes=args.max_body_bytes or MAX_BODY_BYTES,
                          retries=args.retries)
    check_new_out(args.out)  # last: it may create the folder
    return config


def cmd_record(args: argparse.Namespace) -> int:
    """Run the proxy until a signal or ``--duration``; print the summary."""
    import asyncio
    import gc
    import sys

    from scepsy.cli.trace_receive import startup_line
    from scepsy.cli.util import stop_event
    from scepsy_opt.ingest.record import serve

    record = _config(args)
    ups = [f"{m} -> {u}" for m, u in record.upstream_for.items()]
    if record.upstream is not None:
        ups.append(record.upstream)

    async def main() -> Any:
        stop = stop_event(args.duration)

        def started(url: str) -> None:
            # what start-up built (imports) lives until exit: out of the collector's way, so
            # that each collection walks only what the calls allocate
            gc.freeze()
            print(startup_line("scepsy record", url, record.out, args.duration, ", ".join(ups)),
                  file=sys.stderr, flush=True)

        return await serve(record, stop, started)

    stats = asyncio.run(main())
    record_summary(stats, record.out)
    return 0
