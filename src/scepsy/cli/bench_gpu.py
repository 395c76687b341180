"""``scepsy bench gpu``: the GPU kit (:mod:`scepsy_serve.loop.bench_gpu`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, POSITIVE, RATE, SEED
from scepsy.cli.bench_loop import _loop_report, _loop_usage
from scepsy.cli.util import UsageError
from scepsy.cli.util import say as _say


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
