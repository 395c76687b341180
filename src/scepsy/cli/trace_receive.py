"""``scepsy trace receive --listen HOST:PORT --out FILE [--duration S]``: an OTLP/HTTP trace
receiver that writes every export request as one line of OTLP/JSON (docs/otel.md).

Parsing and printing only; the receiver lives in :mod:`scepsy_opt.ingest.otlp_http`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scepsy.cli.argtypes import COUNT, POSITIVE

HELP = "receive OpenTelemetry spans over OTLP/HTTP (POST /v1/traces) and write them as " \
       "OTLP/JSON lines for `scepsy trace import`"


def add_receive(tsub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``receive`` to the ``scepsy trace`` sub-commands; returns its parser."""
    p = tsub.add_parser("receive", help=HELP, description=HELP + ". Runs until Ctrl-C, "
                        "SIGTERM or --duration, then prints how many export requests and spans "
                        "it wrote.")
    p.add_argument("--listen", default="127.0.0.1:4318", metavar="HOST:PORT",
                   help="address to listen on (default %(default)s, the OTLP/HTTP port; "
                   "port 0 takes a free one, printed at start)")
    p.add_argument("--out", type=Path, required=True,
                   help="file to write (OTLP/JSON lines); must not exist yet")
    p.add_argument("--duration", type=POSITIVE, metavar="S",
                   help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--max-body-bytes", type=COUNT, metavar="N",
                   help="largest export request accepted, as sent and after decompression; "
                   "larger ones are answered 413 (default 67108864, 64 MiB)")
    p.set_defaults(func=cmd_receive)
    return p


def cmd_receive(args: argparse.Namespace) -> int:
    from scepsy.cli.util import UsageError, check_new_out
    from scepsy_common.net import parse_listen
    from scepsy_opt.ingest.otlp_http import MAX_BODY_BYTES, TRACES_PATH, receive

    host, port = parse_listen(args.listen)
    out: Path = args.out
    check_new_out(out)

    def listening(url: str) -> None:
        print(startup_line("scepsy trace receive", url + TRACES_PATH, out, args.duration),
              file=sys.stderr, flush=True)

    limit = args.max_body_bytes or MAX_BODY_BYTES
    try:
        counts = receive(out, host, port, duration_s=args.duration, on_listening=listening,
                         max_body_bytes=limit)
    except FileExistsError:
        raise UsageError(f"--out: expected a file that does not exist yet; {str(out)!r} "
                         "exists and was left as it is") from None
    except OSError as exc:
        raise UsageError(f"--listen: cannot listen on {args.listen!r}: "
                         f"{exc.strerror or exc}") from None
    print(f"wrote {counts.requests} export requests, {counts.spans} spans to {out}")
    return 0


def startup_line(command: str, url: str, out: Path, duration: float | None,
                 forwarding: str = "") -> str:
    """The line a long-running server command prints on stderr once it listens (status goes
    to stderr, results to stdout): ``scepsy CMD: listening on URL; [forwarding to ...; ]writing
    OUT; stop with Ctrl-C[ (or it stops after S s)]``."""
    stop = "stop with Ctrl-C" + (f" (or it stops after {duration:g} s)" if duration else "")
    fwd = f"forwarding to {forwarding}; " if forwarding else ""
    return f"{command}: listening on {url}; {fwd}writing {out}; {stop}"
