"""The ``scepsy`` command line.

User mistakes (bad files, unknown names, bad option values) print one line ``scepsy: error: ...``
naming the file or option, the field and what was expected, and exit with status 2; nothing is
written in that case. The commands parse arguments, call the library (:mod:`scepsy.api` for
plan, predict and simulate) and print; each imports only what it needs, so ``scepsy --help``
starts fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from scepsy.argtypes import (
    COUNT,
    POSITIVE,
    RATE,
    SEED,
    TOKENS,
    percentile_bound,
)
from scepsy.cli_util import UsageError, check_out, check_outputs_apart, wrote_note
from scepsy.cli_util import floats as _floats
from scepsy.cli_util import ints as _ints
from scepsy.cli_util import naming as _naming
from scepsy.cli_util import print_rows as _print_table
from scepsy.helptext import PlainHelpFormatter

EXIT_INFEASIBLE = 1  # plan: no allocation meets the targets (proven)
EXIT_USAGE = 2
EXIT_TIME_LIMIT = 3  # plan: the time limit ran out before any (placeable) allocation was found
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it: 128 + 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``scepsy plan: error: ... (see scepsy plan --help)``),
    exit status 2, and help text in plain text (:class:`scepsy.helptext.PlainHelpFormatter`;
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
        args = _parser(argv).parse_args(argv)
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


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser; only the command named in ``argv`` gets its options (and imports what its
    defaults and choices come from), so ``scepsy --help`` imports no library."""
    p = _Parser(prog="scepsy", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (helptext, build) in _COMMANDS.items():
        cmd = sub.add_parser(name, help=helptext)
        if name == wanted:
            build(cmd)
    module = _REGISTERED[wanted][0] if wanted in _REGISTERED else None
    if module is not None:
        import importlib

        importlib.import_module(module).register(sub)
    for name, (mod, helptext) in _REGISTERED.items():
        if mod != module:
            sub.add_parser(name, help=helptext)
    return p


def _profile_args(prof: argparse.ArgumentParser) -> None:
    psub = prof.add_subparsers(dest="profile_command", required=True)
    fit = psub.add_parser("fit", help="fit latency curves to measurements and write a curves file")
    src = fit.add_mutually_exclusive_group(required=True)
    src.add_argument("--muxserve", type=Path, help="a MuxServe grid JSON file")
    src.add_argument("--measurements", type=Path,
                     help="a measurements JSON-lines file, or a store written by `profile run`")
    fit.add_argument("--gpu", default="A100-80GB", help="GPU of a MuxServe grid (default %(default)s)")
    fit.add_argument("--out", type=Path, required=True, help="curves file to write (JSON)")
    fit.add_argument("--catalog-out", type=Path,
                     help="also write the catalog entries of a store's shrunk models and "
                     "non-catalog devices (YAML, for --catalog of later commands)")
    fit.add_argument("--seed", type=SEED, default=0)
    fit.add_argument("--jobs", type=COUNT, default=1, help="parallel fitting processes")
    fit.add_argument("--json", action="store_true", help="print the fit report as JSON")
    fit.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    fit.set_defaults(func=_cmd_fit)

    show = psub.add_parser("show", help="table of prefill, decode, μ and memory over tp and share")
    show.add_argument("--model", required=True)
    show.add_argument("--gpu", required=True)
    show.add_argument("--curves", type=Path, help="fitted curves file (measured curves win)")
    show.add_argument("--catalog", type=Path, help="YAML catalog extending the bundled one")
    show.add_argument("--calibration", type=Path, help="roofline calibration YAML")
    show.add_argument("--tp", default="1,2,4,8", help="comma-separated TP degrees")
    show.add_argument("--shares", default="0.3,0.5,0.7,1.0", help="comma-separated GPU shares")
    show.add_argument("--batch", type=int, default=32, help="batch of the latency columns")
    show.add_argument("--seq", type=int, default=512, help="prompt / context length of the latency columns")
    show.add_argument("--input", type=TOKENS, default=512.0, help="mean input tokens per call (μ)")
    show.add_argument("--output", type=TOKENS, default=128.0, help="mean output tokens per call (μ)")
    show.add_argument("--json", action="store_true", help="print rows as JSON")
    show.set_defaults(func=_cmd_show)

    from scepsy import cli_profile

    cli_profile.add_run(psub)
    cli_profile.add_serve_curve(psub)
    cli_profile.add_install_vllm(psub)


def _stats_args(stats: argparse.ArgumentParser) -> None:
    stats.add_argument("trace", type=Path, help="a trace JSON-lines file")
    stats.add_argument("--seed", type=SEED, default=0, help="seed of the bootstrap halves")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=_cmd_stats)


def _trace_args(trace: argparse.ArgumentParser) -> None:
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    gen = tsub.add_parser("generate", help="generate a trace from a workflow (or workload) YAML")
    gen.add_argument("--workflow", type=Path, required=True)
    gen.add_argument("--requests", type=COUNT, required=True, help="requests per workflow")
    gen.add_argument("--seed", type=SEED, default=0)
    gen.add_argument("--out", type=Path, required=True)
    gen.set_defaults(func=_cmd_trace_generate)
    from scepsy import cli_trace_import, cli_trace_receive

    cli_trace_import.add_import(tsub)
    cli_trace_receive.add_receive(tsub)


def _engine_fields() -> tuple[Any, ...]:
    from scepsy_place.request import flag_fields

    return tuple(f for f in flag_fields() if f.path[0] == "engine")


def _engine_args(cmd: argparse.ArgumentParser) -> None:
    """The serving engine's settings, as vLLM names them (predict, simulate): the engine
    fields of the plan request (:class:`scepsy_place.request.Engine`)."""
    from scepsy.cli_fields import add_request_flags

    add_request_flags(cmd, _engine_fields())


def _engine(args: argparse.Namespace) -> Any:
    """The MemoryPolicy of the engine flags, or None when none is given."""
    from scepsy.cli_fields import given_fields
    from scepsy_place.request import Engine, flag_names

    given = {path[-1]: v for path, v in given_fields(args, _engine_fields(), {}).items()}
    with _naming(flag_names()):
        return Engine.checked(given).memory_policy()


def _evaluate_args(cmd: argparse.ArgumentParser) -> None:
    """The options predict and simulate share."""
    from scepsy.api import DEFAULT_TRACE_REQUESTS

    cmd.add_argument("--workflow", type=Path, required=True,
                     help="workflow, workload or rate workload (kind: rates) YAML")
    cmd.add_argument("--allocation", type=Path, required=True, help="allocation YAML/JSON")
    cmd.add_argument("--rate", type=RATE,
                     help="total arrival rate, req/s (split over a workload's weights); "
                     "optional for a rate workload: its rates, rescaled to this total if given")
    cmd.add_argument("--trace", type=Path, help="recorded trace (default: generated)")
    cmd.add_argument("--trace-requests", type=COUNT, default=DEFAULT_TRACE_REQUESTS,
                     help="requests per workflow of the generated trace (default %(default)s)")
    cmd.add_argument("--curves", type=Path, help="fitted curves (measured curves win)")
    cmd.add_argument("--overheads", type=Path, help="engine overheads calibration YAML/JSON "
                     "(scepsy profile calibrate; default: none, optimistic)")
    cmd.add_argument("--catalog", type=Path, help="YAML catalog extending the bundled one")
    cmd.add_argument("--seed", type=SEED, default=0)
    cmd.add_argument("--json", action="store_true")
    _engine_args(cmd)


def _predict_args(cmd: argparse.ArgumentParser) -> None:
    from scepsy_opt.prediction.pipeline import FORMS

    _evaluate_args(cmd)
    cmd.add_argument("--form", choices=FORMS, default="critical-path")
    cmd.set_defaults(func=_cmd_predict)


def _simulate_args(cmd: argparse.ArgumentParser) -> None:
    from scepsy.api import DEFAULT_TRACE_REQUESTS
    from scepsy_opt.prediction.simulate import ROUTINGS

    _evaluate_args(cmd)
    cmd.add_argument("--requests", type=COUNT, default=None,
                     help=f"simulated arrivals (default {DEFAULT_TRACE_REQUESTS}; with "
                          "--arrivals: all of them)")
    cmd.add_argument("--arrivals", type=Path, metavar="FILE",
                     help="replay these recorded arrival times instead of Poisson arrivals: "
                          "JSON lines with a timestamp in ms (Mooncake) or one time in seconds "
                          "per line (docs/arrivals.md)")
    cmd.add_argument("--time-scale", type=POSITIVE, default=1.0, metavar="X",
                     help="replay --arrivals X times as fast (default 1)")
    cmd.add_argument("--routing", choices=ROUTINGS, default=ROUTINGS[0])
    cmd.add_argument("--progress", action="store_true")
    cmd.set_defaults(func=_cmd_simulate)


def _bench_args(bench: argparse.ArgumentParser) -> None:
    from scepsy.bench_openb import add_arguments

    bsub = bench.add_subparsers(dest="bench_command", required=True)
    openb = bsub.add_parser("openb", help="online replay of the Alibaba GPU-sharing trace "
                                          "(allocation ratio and fragmentation per policy)")
    add_arguments(openb)
    openb.set_defaults(func=_cmd_bench_openb)
    paper = bsub.add_parser("paper", help="the paper's experiments and beyond: scepsy against the "
                            "baselines, predictor accuracy, search time, a 1,024-GPU fleet")
    from scepsy.bench_paper import add_arguments as paper_arguments

    paper_arguments(paper)
    paper.set_defaults(func=_cmd_bench_paper)
    loop = bsub.add_parser("loop", help="the whole loop on this CPU with vLLM: profile, plan, launch, "
                           "drive, stop; predicted vs measured (a test target)")
    _bench_loop_args(loop)
    gpu = bsub.add_parser("gpu", help="the GPU kit: two small LLMs under MPS shares on one GPU: "
                          "profile, plan, launch, drive, stop; predicted vs measured")
    _bench_gpu_args(gpu)
    control = bsub.add_parser("control", help="control policies in the simulator under loads "
                              "that move: static, per-LLM autoscaling, scepsy's controller")
    from scepsy.cli_bench_control import add_arguments as control_arguments

    control_arguments(control)
    control.set_defaults(func=_cmd_bench_control)


def _bench_gpu_args(gpu: argparse.ArgumentParser) -> None:
    from scepsy_serve.loop import bench_gpu as bg

    d = bg.KitOptions()
    gpu.add_argument("--cpu", action="store_true",
                     help="run the same kit on this CPU (both LLMs on one core) instead of a GPU")
    gpu.add_argument("--requests", type=COUNT, default=d.requests,
                     help="requests to drive (default %(default)s)")
    gpu.add_argument("--rate", type=RATE, help="arrival rate, req/s (default: --load times "
                     "the largest throughput the plan predicts)")
    gpu.add_argument("--load", type=POSITIVE, default=d.load,
                     help="the target as a fraction of the largest predicted throughput "
                     "(default %(default)s)")
    gpu.add_argument("--curves", type=Path, help="latency curves to plan with (default: profile "
                     "both models here)")
    gpu.add_argument("--profile-budget", type=POSITIVE, default=d.profile_budget_s, metavar="S",
                     help="seconds the profiling stage may take (default %(default)s)")
    gpu.add_argument("--engine-python", help="interpreter of vLLM's environment (default: as "
                     "scepsy profile run finds it)")
    gpu.add_argument("--overheads", type=Path, metavar="FILE",
                     help="engine overheads the plan and the predictions add (default: none)")
    gpu.add_argument("--seed", type=SEED, default=d.seed)
    gpu.add_argument("--out", type=Path, default=Path(d.out),
                     help="folder of the results (default %(default)s)")
    gpu.add_argument("--keep", action="store_true", help="keep the plan, the launch folder and "
                     "the servers' logs under --out")
    gpu.add_argument("--json", action="store_true", help="print the results JSON")
    gpu.set_defaults(func=_cmd_bench_gpu)


def _bench_loop_args(loop: argparse.ArgumentParser) -> None:
    from scepsy_serve.loop import bench_loop as bl

    d = bl.LoopOptions()
    loop.add_argument("--requests", type=COUNT, default=d.requests,
                      help=f"requests to drive, over all workflows (default {bl.DEFAULT_REQUESTS}"
                      ", fewer where they would arrive over more than --max-drive-s at the "
                      f"target rate, at least {bl.MIN_REQUESTS})")
    loop.add_argument("--max-drive-s", type=POSITIVE, default=d.max_drive_s, metavar="S",
                      help="the longest the default drive's arrivals may take (default "
                      "%(default)s s; with --requests: a warning line only)")
    loop.add_argument("--rate", type=RATE,
                      help="total arrival rate, req/s (default: --load times the largest "
                      "throughput the plan predicts)")
    loop.add_argument("--load", type=POSITIVE, default=d.load,
                      help="the target as a fraction of the largest predicted throughput "
                      "(default %(default)s)")
    loop.add_argument("--workflow", type=Path, default=Path(d.workflow),
                      help="workflow or workload YAML (default %(default)s)")
    loop.add_argument("--cluster", type=Path, default=Path(d.cluster), help="default %(default)s")
    loop.add_argument("--catalog", type=Path,
                      default=None if d.catalog is None else Path(d.catalog),
                      help="default %(default)s")
    loop.add_argument("--curves", type=Path,
                      help="latency curves to plan with, e.g. the bundled "
                      f"{bl.BUNDLED_CURVES} (default: measure the step profile on this machine "
                      "with the vllm backend into OUT/profile/ and fit them there)")
    loop.add_argument("--profile-budget", type=POSITIVE, default=d.profile_budget_s,
                      metavar="S", help="seconds of measuring the profiling stage may take, "
                      "shared by its TP degrees; the engines' start-up comes on top and is "
                      "reported (default %(default)s; ignored with --curves)")
    loop.add_argument("--tp", default=",".join(map(str, d.tps)), help="default %(default)s")
    loop.add_argument("--shares", default=",".join(f"{x:g}" for x in d.shares),
                      help="share grid of a core (default %(default)s)")
    loop.add_argument("--engine-python", help="interpreter of vLLM's environment (default: "
                      "as scepsy profile run finds it)")
    loop.add_argument("--overheads", type=Path, metavar="FILE",
                      help="engine overheads (scepsy profile calibrate) the plan and the "
                      "predictions add to the curves (default: none)")
    loop.add_argument("--max-model-len", type=COUNT, default=d.max_model_len,
                      help="default %(default)s")
    loop.add_argument("--timeout-s", type=POSITIVE, default=d.call_timeout_s,
                      help="timeout of one LLM call (default %(default)s)")
    loop.add_argument("--seed", type=SEED, default=d.seed)
    loop.add_argument("--out", type=Path, default=Path(d.out),
                      help="folder of the results (default %(default)s)")
    loop.add_argument("--keep", action="store_true",
                      help="keep the plan, the launch folder, the model folders and the servers' "
                      "logs under --out (default: only the results and the measured trace)")
    loop.add_argument("--json", action="store_true", help="print the results JSON")
    ctl = loop.add_argument_group("the controller (docs/control.md)")
    ctl.add_argument("--control", action="store_true",
                     help="plan the cheapest deployment within 2.5x the fastest plan's latency, "
                     "serve it behind a gateway, step the load up mid-run and let scepsy "
                     "control add capacity")
    ctl.add_argument("--step-at", type=POSITIVE, default=90.0, metavar="S",
                     help="with --control: when the load steps up, s (default %(default)s)")
    ctl.add_argument("--step-factor", type=POSITIVE, default=3.0, metavar="F",
                     help="with --control: the rate after the step, times the rate before "
                     "(default %(default)s)")
    ctl.add_argument("--window", type=POSITIVE, default=10.0, metavar="S",
                     help="with --control: the controller's window, s (default %(default)s)")
    ctl.add_argument("--startup-s", type=POSITIVE, metavar="S",
                     help="with --control: the start-up time the controller plans with "
                     "(default: the time the loop's own servers took to answer /health)")
    ctl.add_argument("--priority", choices=("fcfs", "las"), default="fcfs",
                     help="with --control: the gateway's priority policy (las needs the "
                     "servers' --scheduling-policy priority, which --control sets; default "
                     "%(default)s)")
    loop.set_defaults(func=_cmd_bench_loop)


def _plan_args(plan: argparse.ArgumentParser) -> None:
    """The options of ``scepsy plan``: one per field of the plan request
    (:mod:`scepsy_place.request`, its docstrings the help), then the output's."""
    from scepsy.cli_fields import add_request_flags
    from scepsy_place.request import flag_fields

    add_request_flags(plan, flag_fields())
    plan.add_argument("--out", type=Path, default=Path("plan.json"), help="default %(default)s")
    plan.add_argument("--launch", metavar="TARGET[,TARGET...]",
                      help="also render the written plan for launch targets (shell, k8s, ray, "
                      "routes; see scepsy launch)")
    plan.add_argument("--launch-out", type=Path, metavar="DIR",
                      help="folder of the rendered files (default launch-TARGET beside --out; "
                      "with several targets, DIR/TARGET)")
    plan.add_argument("--no-timings", action="store_true",
                      help="leave wall-clock timings out of plan.json (byte-identical reruns)")
    plan.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    plan.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    plan.set_defaults(func=_cmd_plan)


_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "profile": ("latency profiles: fit curves, show them", _profile_args),
    "stats": ("per-workflow, per-LLM statistics of a trace", _stats_args),
    "trace": ("workflow traces", _trace_args),
    "predict": ("predicted throughput and latency (Aggregate LLM Pipeline)", _predict_args),
    "simulate": ("simulated throughput and latency (discrete events)", _simulate_args),
    "bench": ("benchmarks: public traces, the whole loop on this CPU", _bench_args),
    "plan": ("optimal allocation for target throughputs (MILP)", _plan_args),
}

_REGISTERED: dict[str, tuple[str, str]] = {
    "launch": ("scepsy.cli_launch", "render a plan.json for a launch target (--apply: run it here)"),
    "stop": ("scepsy.cli_launch", "stop the servers a shell launch folder started"),
    "drive": ("scepsy.cli_drive", "run workflows against the servers of a routes file"),
    "report": ("scepsy.cli_report", "an HTML page (with PNG figures) and terminal tables that "
               "make a plan.json reviewable"),
    "replan": ("scepsy.cli_replan", "re-plan a running plan.json after events (node failed, "
               "rack drained, load changed)"),
    "record": ("scepsy.cli_record", "an OpenAI-compatible proxy that records every call it "
               "forwards as a trace"),
    "gateway": ("scepsy.cli_gateway", "the routing gateway in front of every replica of a "
                "launched plan"),
    "control": ("scepsy.cli_control", "keep a running plan right while its load moves: "
                "telemetry, forecasts, incremental re-plans applied without losing a call"),
    "validate": ("scepsy.cli_validate", "compare measured serving runs with scepsy's "
                 "predictions and simulations"),
}
"""Commands whose module adds its own parsers (``register(subparsers)``): imported only when
named, like the others."""


# ------------------------------------------------------------------------------ helpers


def _per_workflow(values: Sequence[str], flag: str) -> float | dict[str, float] | None:
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


def _latency_bounds(values: Sequence[str]) -> tuple[float | dict[str, float] | None, Any]:
    """``--latency-bound`` values split into mean bounds (``[W=]SECONDS``, as
    :func:`_per_workflow`) and percentile bounds (``[W=]PCT:SECONDS``: one ``(pct, s)`` for
    every workflow, or a mapping workflow -> ``(pct, s)``; None when there are none)."""
    pct = [v for v in values if ":" in v.rpartition("=")[2]]
    mean = _per_workflow([v for v in values if v not in pct], "--latency-bound")
    if not pct:
        return mean, None
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
    from dataclasses import fields

    from scepsy_opt.planning.problem import PlanOptions

    if "latency_bounds" not in {f.name for f in fields(PlanOptions)}:
        raise UsageError("--latency-bound: percentile bounds (PCT:SECONDS) are not supported by "
                         f"this optimiser (got {pct[0]!r})")
    return mean, named or total


def _json_float(o: object) -> object:
    raise TypeError(type(o))


# ----------------------------------------------------------------------------- commands


def _cmd_bench_openb(args: argparse.Namespace) -> int:
    from scepsy.bench_openb import run_cli

    return run_cli(args)


def _cmd_bench_control(args: argparse.Namespace) -> int:
    from scepsy.cli_bench_control import run_cli

    return run_cli(args)


def _cmd_bench_paper(args: argparse.Namespace) -> int:
    from scepsy.bench_paper import run_cli

    return run_cli(args)


def _prices(values: Sequence[str]) -> dict[str, float] | None:
    """``--price GPU=USD`` entries (None without any)."""
    from scepsy_common.errors import InputError
    from scepsy_opt.cluster import PRICE_EXPECTED, check_price

    out: dict[str, float] = {}
    for v in values:
        name, _, num = v.partition("=")
        try:
            usd = check_price(float(num), "--price", name)
        except (ValueError, InputError):
            raise UsageError(f"--price: expected GPU=USD with {PRICE_EXPECTED} (got {v!r})"
                             ) from None
        gpu = name.strip()
        if not gpu:
            raise UsageError(f"--price: expected GPU=USD with a GPU type (got {v!r})")
        if gpu.casefold() in {g.casefold() for g in out}:
            raise UsageError(f"--price: expected one price per GPU type ({gpu} is given twice: "
                             f"{out[next(g for g in out if g.casefold() == gpu.casefold())]:g} "
                             f"and {usd:g})")
        out[gpu] = usd
    return out or None


_LAUNCH_FLAGS = {"launch": "--launch", "launch-out": "--launch-out"}


def _launch_folders(args: argparse.Namespace) -> dict[str, Path]:
    """``--launch T1,T2`` -> each target's folder: ``--launch-out DIR`` for one target,
    ``DIR/TARGET`` for several; by default ``launch-TARGET`` beside ``--out``."""
    if args.launch is None:
        if args.launch_out is not None:
            raise UsageError(f"--launch-out: expected together with --launch TARGET (got "
                             f"{str(args.launch_out)!r})")
        return {}
    targets = [t.strip() for t in args.launch.split(",")]
    if not all(targets) or len(set(targets)) != len(targets):
        raise UsageError(f"--launch: expected a target or a comma-separated list of distinct "
                         f"targets (got {args.launch!r})")
    if args.launch_out is None:
        return {t: args.out.parent / f"launch-{t}" for t in targets}
    if len(targets) == 1:
        return {targets[0]: args.launch_out}
    return {t: args.launch_out / t for t in targets}


def plan_request(args: argparse.Namespace) -> Any:
    """The :class:`~scepsy_place.request.PlanRequest` of ``scepsy plan``'s options."""
    from scepsy.cli_fields import given_fields
    from scepsy_place.request import PlanRequest, flag_fields, request_data

    given = given_fields(args, flag_fields(), {"rates": lambda v: _per_workflow(v, "--target"),
                                               "prices": _prices,
                                               "latency-bounds": _latency_bounds})
    return PlanRequest.of(request_data(given))


def _cmd_plan(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy.tables import progress
    from scepsy_opt.planning.planfile import dumps
    from scepsy_place.request import flag_names
    from scepsy_serve.launch.planfile import write_plan_file

    check_out(args.out)
    launches = _launch_folders(args)
    for target, folder in launches.items():
        with _naming(_LAUNCH_FLAGS):
            api.check_launch(target, folder)
    flags = flag_names()
    with _naming(flags):
        request = plan_request(args)
    with progress("planning", quiet=args.quiet or args.json) as bar, _naming(flags):
        res = api.run_plan(request, progress=lambda stage: bar.update(description=stage))
    doc = res.to_dict(timings=not args.no_timings)
    # the document printed below, built once; a failed run goes beside a placed plan at --out
    written = write_plan_file(args.out, doc)
    plan = res.plan
    if args.json:
        print(dumps(doc), end="")
    elif plan.allocation is not None:
        _print_plan(res, doc, args)
    for target, folder in launches.items() if plan.allocation is not None else ():
        with _naming(_LAUNCH_FLAGS):
            written = api.render(args.out, target, folder)
        print(f"rendered {target} files of {args.out} into {written}",
              file=sys.stderr if args.json else sys.stdout)
    if plan.status == "time_limit_no_solution":
        from scepsy_opt.planning.problem import time_limit_detail

        print(f"scepsy: {plan.status}: {time_limit_detail(request.search.time_limit_s)} "
              f"({wrote_note(args.out, written)})", file=sys.stderr)
        return EXIT_TIME_LIMIT
    if plan.allocation is None:
        why = (res.placed.reason if res.placed.reason else plan.infeasible.detail
               if plan.infeasible else "no allocation meets the targets")
        print(f"scepsy: {plan.status}: {why} ({wrote_note(args.out, written)})",
              file=sys.stderr)
        return EXIT_INFEASIBLE
    return 0


def plan_summary(res: Any, out: str, slos: dict[str, Any] | None = None) -> list[str]:
    """The lines under the plan's tables: the objective and its value, the targets and the
    cluster, how the plan was found (formulation, optimiser, status) and its placement."""
    plan, placed, problem = res.plan, res.placed, res.problem
    opts = problem.options
    lines = []
    if opts.objective == "max-throughput":
        lines.append(f"objective: the largest fraction of the targets carried: {plan.scale:.6g}"
                     + (f" (latency bounds {dict(opts.latency_bound_s)} s)"
                        if opts.latency_bound_s else ""))
    elif opts.objective == "min-cost":
        st = plan.stats
        used = ", ".join(f"{n} × {g}" for g, n in st.get("placed_gpus", {}).items())
        buy = st.get("nodes_to_buy")
        lines.append(f"objective: the price of the GPUs used: {st.get('placed_cost_per_hour', 0):.6g}"
                     f" USD/h ({used}); aggregate bound {st.get('cost_bound_per_hour', 0):.6g} "
                     f"USD/h (gap {st.get('placed_cost_gap', 0):.3g})"
                     + (f" subject to mean latencies {dict(opts.latency_bound_s)} s"
                        if opts.latency_bound_s else "")
                     + (f"; nodes to buy: {buy}" if buy else ""))
    else:
        weights = ", ".join(f"{w} {problem.weight(w):g}" for w in problem.targets)
        penalty = (f" + {opts.change_penalty_s:g} s per replica started or stopped"
                   if opts.current is not None and opts.change_penalty_s else "")
        lines.append(f"objective: the weighted sum of the workflows' mean predicted latencies "
                     f"(weights {weights}){penalty} = {plan.objective_s:.6g} s")
    pct = getattr(opts, "latency_bounds", None)
    if pct:
        lines[-1] += " subject to " + ", ".join(f"{w} p{q:g} <= {b:g} s"
                                                for w, (q, b) in pct.items())
    for m, c in (slos or {}).items():
        got = (f"ttft {c['predicted_ttft_s']:.4g} s" if c.get("ttft_s") is not None else "",
               f"tpot {c['predicted_tpot_s']:.4g} s" if c.get("tpot_s") is not None else "")
        lines.append(f"SLO {m}: {opts.slos[m].describe()}; predicted " + ", ".join(
            g for g in got if g) + f"; attainment {c['attainment']:.1%}"
            + ("" if c["met"] else " (missed)"))
    splits = plan.allocation.splits if plan.allocation is not None else {}
    for m, parts in splits.items():
        lines.append(f"{m} runs on several GPU types: " + ", ".join(
            f"{g} {f:.4g} of its calls" for g, f in parts.items()))
    targets = ", ".join(f"{w} {t:g}" for w, t in problem.targets.items())
    gpus = ", ".join(f"{n} × {g}" for g, n in problem.cluster.budgets().items())
    lines.append(f"targets (req/s): {targets}; cluster {problem.cluster.name}: {gpus}")
    if res.peak is not None:
        lines.append(f"targets from {res.peak.describe()}")
    st = plan.stats
    priced = st.get("placed_costs_per_hour", {}) if opts.objective == "min-cost" else {}
    tried = ", ".join(f"{k} {priced[k]:.6g} USD/h" if k in priced else
                      f"{k} {o.objective_s:.6g} s" if o.status == "placed" else f"{k} {o.status}"
                      for k, o in placed.compared.items())
    if placed.formulation == "current":
        how = "kept the current allocation (priced lower than any new plan)"
    else:
        scope = {"blocks": " among whole-GPU-block allocations",
                 "aggregate": "" if placed.exact else
                 " (not proven the cheapest placeable: inexact cuts were needed)"}
        if opts.objective == "min-cost":
            scope["aggregate"] = " (the cheapest allocation in aggregate, then placed)"
            scope["mixed"] = " (LLMs split over GPU types)"
        if opts.objective != "min-cost" and set(placed.compared) - {"current"}:
            scope = {}  # auto: its status and gap hold over the whole candidate grid
        gap = f"gap {plan.gap:.3g}" if math.isfinite(plan.gap) else "no proven gap"
        how = (f"{placed.formulation} formulation, optimiser {plan.optimiser}: {plan.status}"
               f"{scope.get(placed.formulation, '')}, {gap}, candidates "
               f"{st.get('candidates_generated', '-')} -> {st.get('candidates_kept', '-')}")
    lines.append(how + (f"; compared: {tried}" if tried else ""))
    q = placed.quality or {}
    pl = placed.placement
    by = (pl.placed_by or pl.policy) if pl is not None else res.placer
    lines.append(f"placed by {by} in {placed.rounds} round(s): {q.get('gpus_used')} GPUs "
                 f"(bound {q.get('bound_l2')}), {q.get('nodes_used')} nodes (bound "
                 f"{q.get('bound_nodes')}), {st.get('total_s', 0.0):.3f} s; wrote {out}")
    return lines


def _print_plan(res: Any, doc: dict[str, Any], args: argparse.Namespace) -> None:
    from scepsy_opt.planning.planfile import plan_rows

    memory = ["memory"] if res.problem.options.memory_shares is not None else []
    _print_table(plan_rows(res.problem, res.plan),
                 ["llm", "model", "gpu", "tp", "share", *memory, "replicas", "gpus",
                  "mu_calls_s", "call_latency_s", "latency_share"])
    print()
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "throughput", "mean_latency_s"])
    print()
    print("\n".join(plan_summary(res, str(args.out), doc["solver"].get("slos"))))
    for beyond in res.extrapolated_shares.values():  # latencies beyond the measured shares
        print(f"scepsy: warning: {beyond.message()}", file=sys.stderr, flush=True)


def _cmd_bench_loop(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy_common.errors import InputError
    from scepsy_serve.loop import bench_loop as bl

    try:
        options = bl.LoopOptions(
            requests=args.requests, rate=args.rate, load=args.load, workflow=str(args.workflow),
            cluster=str(args.cluster), catalog=str(args.catalog),
            curves=None if args.curves is None else str(args.curves),
            profile_budget_s=args.profile_budget,
            tps=tuple(_ints(args.tp, "--tp")), shares=tuple(_floats(args.shares, "--shares")),
            engine_python=args.engine_python, max_model_len=args.max_model_len,
            call_timeout_s=args.timeout_s, seed=args.seed, out=str(args.out), keep=args.keep,
            overheads=None if args.overheads is None else str(args.overheads),
            max_drive_s=args.max_drive_s, control=_control_loop(args))
    except InputError as exc:
        _loop_usage(exc)
    with _naming(_EVAL_FLAGS | {"tps": "--tp", "shares": "--shares"}):
        return _loop_report(lambda: api.bench_loop(options, say=_say), args)


def _control_loop(args: argparse.Namespace) -> Any:
    """``bench loop``'s controller options (None without --control; refused without it)."""
    from scepsy_serve.loop.realloop import ControlLoop

    if not args.control:
        given = [f for f, v in (("--step-at", args.step_at != 90.0),
                                ("--step-factor", args.step_factor != 3.0),
                                ("--window", args.window != 10.0),
                                ("--startup-s", args.startup_s is not None),
                                ("--priority", args.priority != "fcfs")) if v]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --control")
        return None
    return ControlLoop(step_at_s=args.step_at, step_factor=args.step_factor,
                       window_s=args.window, startup_s=args.startup_s, priority=args.priority)


def _loop_usage(exc: Exception) -> None:
    """Raise a loop option's error as a usage error naming its flag; others unchanged."""
    from scepsy_common.errors import InputError
    from scepsy_serve.loop import bench_gpu as bg
    from scepsy_serve.loop import bench_loop as bl

    if isinstance(exc, InputError) and exc.source in (bl.SOURCE, bg.SOURCE) and \
            exc.field in bl.FLAGS:
        got = f" (got {exc.got!r})" if exc.got is not None else ""
        raise UsageError(f"{bl.FLAGS[exc.field]}: expected {exc.expected}{got}") from None
    raise exc


def _loop_report(run: Callable[[], Any], args: argparse.Namespace) -> int:
    """Run a loop (``bench loop``, ``bench gpu``), print its report or JSON; its exit status
    (0 clean, 1 not, 130 interrupted after stopping every server)."""
    from scepsy_common.errors import InputError
    from scepsy_profile.profiling.backend import BackendUnavailable
    from scepsy_serve.launch.host import LaunchError
    from scepsy_serve.loop import bench_loop as bl

    try:
        result = run()
    except InputError as exc:
        _loop_usage(exc)
    except BackendUnavailable as exc:  # no engine here: results.json says so too
        raise UsageError(f"{exc} (results in {args.out})") from None
    except LaunchError as exc:  # the servers' own failure, with their logs' last lines
        print(f"{exc}\nscepsy: the servers did not start; every server was stopped "
              f"(results in {args.out})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"scepsy: interrupted; every server was stopped (results in {args.out})",
              file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=_json_float))
    else:
        print("\n".join(bl.report_lines(result)))
    return 0 if result.clean else 1


def _cmd_bench_gpu(args: argparse.Namespace) -> int:
    from scepsy import api
    from scepsy_common.errors import InputError
    from scepsy_serve.loop import bench_gpu as bg

    try:
        options = bg.KitOptions(
            device="cpu" if args.cpu else "auto", out=str(args.out), requests=args.requests,
            rate=args.rate, load=args.load, profile_budget_s=args.profile_budget,
            engine_python=args.engine_python,
            curves=None if args.curves is None else str(args.curves), seed=args.seed,
            keep=args.keep, overheads=None if args.overheads is None else str(args.overheads))
    except InputError as exc:
        _loop_usage(exc)

    def run() -> Any:
        try:
            return api.bench_gpu(options, say=_say)
        except InputError as exc:
            if exc.source == bg.SOURCE and exc.field == "device":
                raise UsageError(f"bench gpu: expected {exc.expected}") from None
            raise
    return _loop_report(run, args)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _cmd_fit(args: argparse.Namespace) -> int:
    from scepsy.tables import progress

    check_out(args.out)
    if args.catalog_out:
        check_out(args.catalog_out, "--catalog-out")  # not --out itself: main checks that
    with progress("reading measurements", quiet=args.quiet or args.json) as bar:
        from scepsy_profile.fitted import fit_latency_model, save_curves
        from scepsy_profile.importers import load_muxserve_grid
        from scepsy_profile.measurements import read_measurements
        from scepsy_profile.profiling.records import is_store
        from scepsy_profile.profiling.store import checked_store, store_measurements

        catalog = None
        notes: list[str] = []  # printed once the progress display is gone
        if args.muxserve:
            rows = load_muxserve_grid(args.muxserve, gpu=args.gpu)
        elif is_store(args.measurements):
            rows, catalog = store_measurements(checked_store(args.measurements, notes.append))
        else:
            rows = read_measurements(args.measurements)
        if args.catalog_out and catalog is None:  # before anything is written
            raise UsageError(f"--catalog-out: expected --measurements of a profile store "
                             f"(`scepsy profile run --out`), whose records hold the catalog "
                             f"entries; {args.muxserve or args.measurements} has none")
        bar.update(description=f"fitting latency curves to {len(rows)} measurements")
        model = fit_latency_model(rows, seed=args.seed, n_jobs=args.jobs,
                                  source=str(args.muxserve or args.measurements))
    for note in notes:
        print(f"scepsy: warning: {note}", file=sys.stderr, flush=True)
    save_curves(model, args.out)
    if args.catalog_out and catalog is not None:
        from scepsy_profile.catalog import save_catalog

        save_catalog(catalog, args.catalog_out)
    reports = [
        {"model": r.key[0], "gpu": r.key[1], "tp": r.key[2], "phase": r.key[3],
         "points": r.n_points, "outliers": r.n_outliers,
         "train_median_ape_pct": round(100 * r.train_median_ape, 3),
         "monotone_adjust_max_pct": round(100 * r.monotone_adjust_max, 3)}
        for r in model.reports
    ]
    if args.json:
        print(json.dumps({"out": str(args.out), "curves": reports}, indent=2, sort_keys=True))
    else:
        _print_table(reports, ["model", "gpu", "tp", "phase", "points", "outliers",
                               "train_median_ape_pct", "monotone_adjust_max_pct"])
        print(f"wrote {len(reports)} curves to {args.out}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from scepsy_profile.catalog import default_catalog, load_catalog
    from scepsy_profile.fitted import load_curves
    from scepsy_profile.latency import CompositeLatencyModel, LatencyModel
    from scepsy_profile.roofline import load_calibration, roofline_model
    from scepsy_profile.show import profile_rows

    tps, shares = _ints(args.tp, "--tp"), _floats(args.shares, "--shares")
    catalog = default_catalog()
    if args.catalog:
        catalog = load_catalog(args.catalog, base=catalog)
    cal = load_calibration(args.calibration) if args.calibration else None
    roof = roofline_model(catalog, cal)
    latency: LatencyModel = roof
    fitted = load_curves(args.curves) if args.curves else None
    if fitted is not None:
        latency = CompositeLatencyModel(fitted, roof)
    with _naming({"catalog": "--model"}):  # the catalog's "unknown model" names the option
        catalog.model(args.model)
    with _naming({"catalog": "--gpu"}):
        gpu = catalog.gpu(args.gpu).name
    with _naming({"batch": "--batch", "seq": "--seq", "input_tokens": "--input",
                  "output_tokens": "--output", "tp": "--tp"}):
        rows = profile_rows(latency, args.model, args.gpu, tps, shares, batch=args.batch,
                            seq=args.seq, input_tokens=args.input, output_tokens=args.output,
                            fitted=fitted, catalog=catalog)
    if args.json:
        print(json.dumps({"model": args.model, "gpu": gpu, "batch": args.batch,
                          "seq": args.seq, "input_tokens": args.input,
                          "output_tokens": args.output, "rows": rows}, indent=2, sort_keys=True))
    else:
        print(f"{args.model} on {gpu}: latency at batch {args.batch}, {args.seq} tokens; "
              f"μ for calls of {args.input:g} in / {args.output:g} out tokens")
        _print_table(rows, list(rows[0]))
    return 0


def _cmd_trace_generate(args: argparse.Namespace) -> int:
    from scepsy_opt.traces import write_trace
    from scepsy_opt.workload import generate_workload_trace, load_specs

    check_out(args.out)
    specs = load_specs(args.workflow)
    with _naming({"requests": "--requests"}):
        calls = generate_workload_trace(specs, args.requests, args.seed)
    write_trace(args.out, calls)
    print(f"wrote {len(calls)} calls of {args.requests * len(specs)} requests to {args.out}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    from scepsy_opt.stats import stats_table, stats_to_dict, trace_stats
    from scepsy_opt.traces import read_trace

    stats = trace_stats(read_trace(args.trace), seed=args.seed, source=str(args.trace))
    if args.json:
        print(json.dumps(stats_to_dict(stats), indent=2, sort_keys=True))
        return 0
    rows = stats_table(stats)
    _print_table(rows, list(rows[0]))
    print()
    _print_table([{
        "workflow": w, "requests": st.requests, "latency_mean_s": round(st.latency_mean_s, 3),
        "latency_cv": round(st.latency_cv, 3),
        "max_share_cv_requests": round(max(x.time_share_cv_requests for x in st.llms.values()), 3),
        "max_share_cv_halves": round(max(x.time_share_cv_halves for x in st.llms.values()), 4),
        "llm_overlap": round(st.llm_overlap, 3), "tool_critical_s": round(st.tool_critical_s, 3),
        "failed_calls": st.failed_calls,
    } for w, st in stats.items()], ["workflow", "requests", "latency_mean_s", "latency_cv",
                                     "max_share_cv_requests", "max_share_cv_halves",
                                     "llm_overlap", "tool_critical_s", "failed_calls"])
    return 0


_EVAL_FLAGS = {"seed": "--seed", "trace_requests": "--trace-requests", "rate": "--rate",
               "requests": "--requests", "overheads": "--overheads", "arrivals": "--arrivals",
               "time_scale": "--time-scale"}


def _cmd_predict(args: argparse.Namespace) -> int:
    from scepsy import api

    with _naming(_EVAL_FLAGS):
        pred = api.predict(args.workflow, args.allocation, args.rate, form=args.form,
                           trace=args.trace, trace_requests=args.trace_requests, seed=args.seed,
                           curves=args.curves, overheads=args.overheads,
                           engine=_engine(args), catalog=args.catalog)
    doc = api.prediction_document(pred, args.form)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_float))
        return 0
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "rate", "throughput", "max_throughput", "bottleneck", "saturated",
                  "mean_latency_s", "p50_latency_s", "p90_latency_s", "p99_latency_s"])
    print()
    _print_table([{"llm": m, **o} for m, o in doc["llms"].items()],
                 ["llm", "model", "replicas", "rate", "mu", "utilisation", "call_latency_s",
                  "ttft_s", "tpot_s", "preemptions_per_call", "overloaded"])
    return 0



def _cmd_simulate(args: argparse.Namespace) -> int:
    from scepsy import api

    with _naming(_EVAL_FLAGS):
        if args.time_scale != 1.0 and args.arrivals is None:
            raise UsageError(f"--time-scale: expected together with --arrivals FILE (got "
                             f"{args.time_scale:g})")
        res = api.simulate(args.workflow, args.allocation, args.rate, requests=args.requests,
                           arrivals=args.arrivals, time_scale=args.time_scale,
                           routing=args.routing, trace=args.trace,
                           trace_requests=args.trace_requests, seed=args.seed,
                           curves=args.curves, overheads=args.overheads,
                           engine=_engine(args), progress=args.progress, catalog=args.catalog)
    doc = api.simulation_document(res)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_float))
        return 0
    _print_table([{"workflow": w, **o} for w, o in doc["workflows"].items()],
                 ["workflow", "throughput", "mean_latency_s", "p50_latency_s",
                  "p90_latency_s", "p99_latency_s", "completed", "unfinished"])
    print()
    _print_table([{"llm": m, **o} for m, o in doc["llms"].items()],
                 ["llm", "replicas", "calls", "utilisation", "mean_batch", "preemptions", "preemptions_per_call"])
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
