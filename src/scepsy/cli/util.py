"""What every ``scepsy`` command shares: the usage error, output-path checks, list options,
tables on stdout."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """A bad option value found by the CLI itself (argparse's own errors exit directly)."""


def check_out(path: Path, flag: str = "--out") -> None:
    """Raise :class:`UsageError` unless a file can be written at ``path``: not empty, not a
    directory, under a writable directory (or one that can be created there), checked by
    creating and removing a temporary file, so that a bad path fails before any work."""
    text = str(path)
    if not text.strip() or text in (".", ".."):
        raise UsageError(f"{flag}: expected a file path (got {text!r})")
    if path.is_dir():
        raise UsageError(f"{flag}: expected a file path, not a directory (got {text!r})")
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag}: expected a path under a directory ({str(parent)!r} is a "
                         f"file) (got {text!r})")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=".scepsy-check-")
    except OSError as exc:
        raise UsageError(f"{flag}: expected a writable location ({exc.strerror}: "
                         f"{str(parent)!r}) (got {text!r})") from None
    os.close(fd)
    os.unlink(tmp)


OUTPUT_DESTS = ("out", "json", "trace_out", "report", "catalog_out", "launch_out", "log",
                "fit_overheads", "figures")
"""The option destinations that name a file or folder a command writes (where the value is a
path: ``--json`` is a switch in most commands)."""


def _paths(value: object) -> list[str]:
    if isinstance(value, str | os.PathLike):
        return [os.fspath(value)]
    if isinstance(value, list | tuple):
        return [os.fspath(v) for v in value if isinstance(v, str | os.PathLike)]
    return []


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_outputs_apart(args: argparse.Namespace) -> None:
    """A :class:`UsageError` when an output path (:data:`OUTPUT_DESTS`) names a file the
    command reads (any other path option or argument that is an existing file) or the same
    path as another output: the run would overwrite its own input or one output with another.
    Checked before anything runs."""
    given = {d: v for d, v in vars(args).items() if d != "func"}
    outs = [(d, p) for d in OUTPUT_DESTS for p in _paths(given.get(d))]
    seen: dict[str, str] = {}
    for dest, path in outs:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{_flag(dest)}: expected a path other than {_flag(seen[real])}'s "
                             f"(both name {path!r}: one output would overwrite the other)")
        seen[real] = dest
    for dest, path in outs:
        if not os.path.exists(path):
            continue
        for other, value in given.items():
            if other in OUTPUT_DESTS:
                continue
            for src in _paths(value):
                if os.path.isfile(src) and os.path.samefile(src, path):
                    it = "it" if src == path else f"{src!r}, the same file,"
                    raise UsageError(f"{_flag(dest)}: expected a path other than an input "
                                     f"({path!r}: the command reads {it} as its "
                                     f"{other.replace('_', ' ')}); nothing written")


def wrote_note(out: Path, written: Path) -> str:
    """What a failed run says about its plan.json: ``wrote OUT``, or, where ``OUT`` held a
    placed plan that was kept (:func:`scepsy_serve.launch.planfile.write_plan_file`), where
    the run's plan went instead."""
    if Path(written) == Path(out):
        return f"wrote {out}"
    return (f"{out} holds the last placed plan and was kept; this run's plan is in {written}")


def check_new_out(path: Path, flag: str = "--out") -> None:
    """:func:`check_out` for a file written as it goes (a recording): it must not exist yet, so
    that an earlier recording is never overwritten; its folder is created if need be."""
    if path.exists() or path.is_symlink():
        raise UsageError(f"{flag}: expected a file that does not exist yet; {str(path)!r} exists "
                         "and was left as it is (choose a new name or remove it)")
    check_out(path, flag)
    path.parent.mkdir(parents=True, exist_ok=True)


def add_trace_source_args(cmd: argparse.ArgumentParser, workflow_help: str) -> None:
    """The options both trace sources (``trace import``, ``record``) take: the model -> LLM
    table (docs/traces.md), the workflow name and client time."""
    cmd.add_argument("--map", type=Path, metavar="FILE",
                     help="trace map YAML: workflow, request_attribute, models (model -> LLM)")
    cmd.add_argument("--model", action="append", default=[], metavar="MODEL=LLM",
                     help="the LLM name of a model name (repeatable; wins over --map)")
    cmd.add_argument("--workflow", metavar="NAME", help=workflow_help)
    cmd.add_argument("--no-client-time", action="store_true",
                     help="do not write the gaps between a call and the calls it waited for as "
                     "'client' tool calls (docs/traces.md)")


def ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated integers (got {text!r})") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag}: expected comma-separated integers >= 1 (got {text!r})")
    return vals


def floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers (got {text!r})") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise UsageError(f"{flag}: expected comma-separated shares in (0, 1] (got {text!r})")
    return vals


def print_rows(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> None:
    from scepsy.tables import print_table

    print_table([{k: _round(v) for k, v in r.items()} for r in rows], cols)


def _round(v: object) -> object:
    return round(v, 4) if isinstance(v, float) and math.isfinite(v) else v


_ARGUMENT_SOURCES = ("plan", "plan options", "profile show", "profile", "profile options",
                     "sweep", "serve-curve plan", "trace", "launch", "engine")


def flagged(exc: ValueError, flags: dict[str, str]) -> ValueError | UsageError:
    """A library :class:`InputError` about an argument (its source, or its field when the
    source is the call itself), reworded to name the CLI's option; other errors unchanged."""
    from scepsy_common.errors import InputError

    if not isinstance(exc, InputError):
        return exc
    if exc.source in flags:
        flag, field = flags[exc.source], exc.field
    elif exc.source in _ARGUMENT_SOURCES and exc.field in flags:
        flag, field = flags[exc.field], ""
    elif exc.source in _ARGUMENT_SOURCES and exc.field.startswith("extra.") and "extra" in flags:
        flag, field = flags["extra"], exc.field.removeprefix("extra.")
    else:
        return exc
    tail = f" (got {exc.got!r})" if exc.got is not None else ""
    return UsageError(f"{flag}: {field + ': ' if field else ''}expected {exc.expected}{tail}")


@contextmanager
def naming(flags: dict[str, str]) -> Iterator[None]:
    """Errors about arguments raised inside the block name the CLI's options."""
    try:
        yield
    except ValueError as exc:
        new = flagged(exc, flags)
        if new is exc:
            raise
        raise new from None


def stop_event(duration_s: float | None) -> Any:
    """An :class:`asyncio.Event` of the running loop that SIGINT, SIGTERM or ``duration_s``
    (None: no limit) sets: how a long-running command (``record``, ``control``) ends."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if duration_s is not None:
        loop.call_later(duration_s, stop.set)
    return stop


def per_workflow(values: Sequence[str], flag: str) -> float | dict[str, float] | None:
    """``RATE`` (a total, or the same for all) or ``NAME=RATE`` entries; names are checked
    against the workflows by the library. No values: None."""
    total: float | None = None
    named: dict[str, float] = {}
    for v in values:
        name, _, num = v.rpartition("=")
        try:
            x = float(num)
        except ValueError:
            raise UsageError(f"{flag}: expected a number (or WORKFLOW=NUMBER) (got {v!r})") from None
        if not (math.isfinite(x) and x > 0):
            raise UsageError(f"{flag}: expected a number > 0 (got {v!r})")
        if name in named or (not name and total is not None):
            what = f"workflow {name}" if name else "the total"
            raise UsageError(f"{flag}: expected one value for {what} (got {v!r} after "
                             f"{named.get(name, total):g})")
        if name:
            named[name] = x
        else:
            total = x
    if total is not None and named:
        raise UsageError(f"{flag}: expected either one total or WORKFLOW=NUMBER entries "
                         f"(got {list(values)!r})")
    return named or total


def latency_bounds(values: Sequence[str]) -> tuple[float | dict[str, float] | None, Any]:
    """``--latency-bound`` values split into mean bounds (``[W=]SECONDS``, as
    :func:`_per_workflow`) and percentile bounds (``[W=]PCT:SECONDS``: one ``(pct, s)`` for
    every workflow, or a mapping workflow -> ``(pct, s)``; None when there are none)."""
    pct = [v for v in values if ":" in v.rpartition("=")[2]]
    mean = per_workflow([v for v in values if v not in pct], "--latency-bound")
    if not pct:
        return mean, None
    from scepsy.cli.argtypes import percentile_bound

    total: tuple[float, float] | None = None
    named: dict[str, tuple[float, float]] = {}
    for v in pct:
        name, _, text = v.rpartition("=")
        bound = percentile_bound(text, "--latency-bound", v)
        if name in named or (not name and total is not None):
            what = f"workflow {name}" if name else "every workflow"
            raise UsageError(f"--latency-bound: expected one percentile bound for {what} (got "
                             f"{v!r} after another)")
        if name:
            named[name] = bound
        else:
            total = bound
    if total is not None and named:
        raise UsageError("--latency-bound: expected either one PCT:SECONDS for every workflow "
                         f"or WORKFLOW=PCT:SECONDS entries (got {list(pct)!r})")
    return mean, named or total


def json_float(o: object) -> object:
    raise TypeError(type(o))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def record_summary(stats: Any, out: Path) -> None:
    """The closing lines of ``scepsy record`` and ``scepsy gateway``: calls per LLM, failures,
    what was not recorded."""
    print()
    if stats.llms:
        print_rows([{"llm": k, "calls": v.calls, "failed": v.failed,
                     "input_tokens": v.input_tokens, "output_tokens": v.output_tokens,
                     "prefix_tokens": v.prefix_tokens} for k, v in stats.llms.items()],
                   ["llm", "calls", "failed", "input_tokens", "output_tokens", "prefix_tokens"])
        print()
    if stats.errors:
        print("failed calls: " + ", ".join(f"{k} {v}" for k, v in stats.errors.items()))
    if stats.unmapped:
        print("not recorded, unmapped models: "
              + ", ".join(f"{k} ({v} calls)" for k, v in stats.unmapped.items()))
    if not stats.recorded:
        print(f"no call recorded: {out} not written")
    print(f"recorded {stats.recorded} calls ({stats.failed} failed) to {out}; "
          f"{stats.unattributed} unattributed, {stats.usage_missing} without usage, "
          f"{stats.malformed} malformed bodies, {stats.rejected} bad X-Scepsy headers, "
          f"{stats.forwarded} other requests forwarded")
