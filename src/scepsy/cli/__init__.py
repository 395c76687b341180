"""The ``scepsy`` command line.

User mistakes (bad files, unknown names, bad option values) print one line ``scepsy: error: ...``
naming the file or option, the field and what was expected, and exit with status 2; nothing is
written in that case. The commands parse arguments, call the library (:mod:`scepsy.api` for
plan, predict and simulate) and print; each imports only what it needs, so ``scepsy --help``
starts fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from scepsy.cli.helptext import PlainHelpFormatter
from scepsy.cli.util import UsageError, check_outputs_apart

EXIT_INFEASIBLE = 1  # plan: no allocation meets the targets (proven)
EXIT_USAGE = 2
EXIT_TIME_LIMIT = 3  # plan: the time limit ran out before any (placeable) allocation was found
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it: 128 + 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``scepsy plan: error: ... (see scepsy plan --help)``),
    exit status 2, and help text in plain text (:class:`scepsy.cli.helptext.PlainHelpFormatter`;
    every sub-command's parser is one of these)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> Any:
        """argparse's, after refusing a single-valued option given twice (argparse keeps the
        last value silently): each parser checks its own options on the words it is given."""
        words = list(sys.argv[1:] if args is None else args)
        seen: dict[argparse.Action, str] = {}
        for i, word in enumerate(words):
            if word == "--":
                break
            name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
            action = self._option_string_actions.get(name)
            if type(action) is not argparse._StoreAction:  # append, switches, help: no
                continue
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if action in seen:
                self.error(f"{'/'.join(action.option_strings)}: expected once (given "
                           f"{seen[action]!r}, then {value!r}: only one value can count)")
            seen[action] = value
        return super().parse_known_args(words, namespace)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error, already printed (2)
        return int(exc.code or 0)
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load: nothing written
        return _interrupted()
    from scepsy_common.errors import InputError

    try:
        check_outputs_apart(args)
        return int(args.func(args) or 0)
    except (InputError, UsageError) as exc:
        print(f"scepsy: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: every write is atomic, so nothing is half-written
        return _interrupted()


def _interrupted() -> int:
    print(f"scepsy: interrupted; nothing more was written (exit {EXIT_INTERRUPTED})",
          file=sys.stderr)
    return EXIT_INTERRUPTED


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------- output paths


# ------------------------------------------------------------------------------- parsers


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser; only the command named in ``argv`` gets its options (its module imported,
    and with it what its defaults and choices come from), so ``scepsy --help`` imports no
    library."""
    p = _Parser(prog="scepsy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    module = COMMANDS[wanted][0] if wanted in COMMANDS else None
    if module is not None:
        import importlib

        importlib.import_module(module).register(sub)
    for name, (mod, helptext) in COMMANDS.items():
        if mod != module:
            sub.add_parser(name, help=helptext)
    return p


COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("scepsy.cli.profile", "latency profiles: fit curves, show them, measure them"),
    "stats": ("scepsy.cli.stats", "per-workflow, per-LLM statistics of a trace"),
    "trace": ("scepsy.cli.trace", "workflow traces"),
    "predict": ("scepsy.cli.predict", "predicted throughput and latency (Aggregate LLM Pipeline)"),
    "simulate": ("scepsy.cli.simulate", "simulated throughput and latency (discrete events)"),
    "bench": ("scepsy.cli.bench", "benchmarks: public traces, the whole loop on this CPU"),
    "plan": ("scepsy.cli.plan", "optimal allocation for target throughputs (MILP)"),
    "launch": ("scepsy.cli.launch", "render a plan.json for a launch target (--apply: run it here)"),
    "stop": ("scepsy.cli.launch", "stop the servers a shell launch folder started"),
    "drive": ("scepsy.cli.drive", "run workflows against the servers of a routes file"),
    "report": ("scepsy.cli.report", "an HTML page (with PNG figures) and terminal tables that "
               "make a plan.json reviewable"),
    "replan": ("scepsy.cli.replan", "re-plan a running plan.json after events (node failed, "
               "rack drained, load changed)"),
    "record": ("scepsy.cli.record", "an OpenAI-compatible proxy that records every call it "
               "forwards as a trace"),
    "gateway": ("scepsy.cli.gateway", "the routing gateway in front of every replica of a "
                "launched plan"),
    "control": ("scepsy.cli.control", "keep a running plan right while its load moves: "
                "telemetry, forecasts, incremental re-plans applied without losing a call"),
    "validate": ("scepsy.cli.validate", "compare measured serving runs with scepsy's "
                 "predictions and simulations"),
}
"""Every command: the module that adds its parser (``register(subparsers)``, which sets the
handler as ``func``) and its one-line help. A command's module is imported only when the
command is named."""


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
