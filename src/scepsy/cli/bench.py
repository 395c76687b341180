"""``scepsy bench``: the benchmarks a user runs: ``openb``, ``paper``, ``loop``
(:mod:`scepsy.cli.bench_loop`), ``gpu`` (:mod:`scepsy.cli.bench_gpu`) and ``control``
(:mod:`scepsy.cli.bench_control`)."""

from __future__ import annotations

import argparse

from scepsy.cli.bench_gpu import _bench_gpu_args
from scepsy.cli.bench_loop import _bench_loop_args


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
    from scepsy.cli.bench_control import add_arguments as control_arguments

    control_arguments(control)
    control.set_defaults(func=_cmd_bench_control)


def _cmd_bench_openb(args: argparse.Namespace) -> int:
    from scepsy.bench_openb import run_cli

    return run_cli(args)


def _cmd_bench_control(args: argparse.Namespace) -> int:
    from scepsy.cli.bench_control import run_cli

    return run_cli(args)


def _cmd_bench_paper(args: argparse.Namespace) -> int:
    from scepsy.bench_paper import run_cli

    return run_cli(args)


HELP = "benchmarks: public traces, the whole loop on this CPU"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy bench`` and its options."""
    cmd = subparsers.add_parser("bench", help=HELP)
    _bench_args(cmd)
    return cmd
