"""``scepsy bench loop``: the whole loop on this CPU with vLLM
(:mod:`scepsy_serve.loop.bench_loop`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, POSITIVE, RATE, SEED
from scepsy.cli.util import UsageError
from scepsy.cli.util import floats as _floats
from scepsy.cli.util import ints as _ints
from scepsy.cli.util import json_float as _json_float
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import say as _say


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
    with _naming(_LOOP_FLAGS):
        return _loop_report(lambda: api.bench_loop(options, say=_say), args)


_LOOP_FLAGS = {"seed": "--seed", "rate": "--rate", "requests": "--requests",
               "overheads": "--overheads", "tps": "--tp", "shares": "--shares"}
"""Fields of the loop's options -> the options that set them, for error messages."""


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
