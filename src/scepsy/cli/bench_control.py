"""``scepsy bench control``: control policies compared in the simulator under loads that move
(docs/bench-control.md). Parsing and printing only; the comparison is
:mod:`scepsy_serve.control.bench`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from scepsy.cli.argtypes import POSITIVE, SEED, arg_type
from scepsy.cli.util import UsageError, check_out

GPUS = arg_type(int, lambda v: 16 <= v <= 64, "a number of GPUs in [16, 64]")
"""``--gpus``: the range the bench is made for (docs/bench-control.md); the aggregate MILP it
plans with is exact up to 64 GPUs."""
WINDOWS = arg_type(int, lambda v: v >= 4, "a number of windows >= 4")


def _profile_names(text: str) -> str:
    """``--profiles``: one or more of the bench's rate profiles, comma-separated."""
    from scepsy_serve.control.bench import PROFILES

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in PROFILES for n in names):
        raise argparse.ArgumentTypeError(f"expected one or more of {','.join(PROFILES)}, "
                                         f"comma-separated (got {text!r})")
    return text


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``scepsy bench control`` on ``cmd``."""
    from scepsy_serve.control.bench import PROFILES, BenchOptions

    d = BenchOptions()
    cmd.add_argument("--quick", action="store_true",
                     help="the CI size: the daily cycle only, shorter plan time limits")
    cmd.add_argument("--workflow", default=d.workflow,
                     help=f"a workflow of datasets/workflows (default {d.workflow})")
    cmd.add_argument("--gpu", default=d.gpu, help=f"GPU type (default {d.gpu})")
    cmd.add_argument("--gpus", type=GPUS, default=d.gpus, help=f"GPUs (default {d.gpus})")
    cmd.add_argument("--profiles", type=_profile_names, default=None, metavar="NAMES",
                     help=f"comma-separated rate profiles among {','.join(PROFILES)} "
                          "(default all; --quick: daily)")
    cmd.add_argument("--windows", type=WINDOWS, default=d.windows,
                     help=f"windows of the run (default {d.windows})")
    cmd.add_argument("--window", type=POSITIVE, default=d.window_s, metavar="S",
                     help=f"seconds per window (default {d.window_s:g})")
    cmd.add_argument("--startup", type=POSITIVE, default=d.startup_s, metavar="S",
                     help=f"seconds a new replica takes to start (default {d.startup_s:g})")
    cmd.add_argument("--arrivals", default=None, metavar="FILE", type=Path,
                     help="a recorded arrival trace to compare the policies on: seconds per "
                          "line, Mooncake JSON lines (.jsonl) or CSV with a timestamp column "
                          "and optional token counts (docs/bench-control.md); with it the "
                          "run covers only this trace unless --profiles names more")
    cmd.add_argument("--seed", type=SEED, default=0, help="seed (default 0)")
    cmd.add_argument("--json", default=None, metavar="PATH", type=Path,
                     help="write the results as JSON ({\"policies\": ...} and more)")
    cmd.add_argument("--figures", default=None, metavar="DIR", type=Path,
                     help="write one PNG per profile over time (rate, GPUs, p90 latency)")
    return cmd


def options(args: argparse.Namespace):
    """The bench options of the parsed arguments."""
    from scepsy_serve.control.bench import QUICK, BenchOptions

    base = QUICK if args.quick else BenchOptions()
    profiles = (tuple(x.strip() for x in args.profiles.split(",") if x.strip())
                if args.profiles else () if args.arrivals is not None else base.profiles)
    shared = Path(__file__).resolve().parents[4] / "shared" / "data"  # ../shared/data
    return replace(base, workflow=args.workflow, gpu=args.gpu, gpus=args.gpus,
                   profiles=profiles, windows=args.windows, window_s=args.window,
                   startup_s=args.startup, seed=args.seed, arrivals=args.arrivals,
                   shared_data=shared if shared.is_dir() else None)


def run_cli(args: argparse.Namespace) -> int:
    """Run the comparison, print its tables, write --json and --figures; 0, or 2 for bad
    input."""
    from scepsy.tables import print_table
    from scepsy_common.files import atomic_write_text, write_files_into
    from scepsy_serve.control import bench

    if args.json is not None:
        check_out(args.json, "--json")
    if args.figures is not None:
        _check_figures(args.figures)
    _check_gpu(args.gpu)
    opts = options(args)
    result = bench.run(opts, say=lambda s: print(s, file=sys.stderr, flush=True))
    cols = ["policy", "p90_latency_s", "slo_attainment", "gpu_hours", "moves", "lost_requests"]
    for name, prof in result["profiles"].items():
        print(f"\n{name} (mean {prof['mean_rate']:.3g} req/s, peak {prof['peak_rate']:.3g}; "
              f"forecast MAPE one window ahead: holt {_pct(result['forecast'][name]['holt'])}, "
              f"last {_pct(result['forecast'][name]['last'])}; "
              f"{result['forecast'][name]['horizon']} ahead: holt "
              f"{_pct(result['forecast'][name]['holt_at_horizon'])}, last "
              f"{_pct(result['forecast'][name]['last_at_horizon'])})")
        print_table([{"policy": p, **{k: _cell(v) for k, v in row.items()}}
                     for p, row in prof["policies"].items()], cols)
    if result["priority"]:
        print("\nscepsy-control under FCFS and LAS priorities")
        print_table([{"policy": f"{name}/{pol}", **{k: _cell(v) for k, v in row.items()}}
                     for name, pr in result["priority"].items() for pol, row in pr.items()],
                    cols)
    for note in result["notes"]:
        print(f"note: {note}")
    # every figure drawn before anything is written: a failed drawing leaves --json and
    # --figures as they were; then the JSON (atomic), then the figures, each renamed into place
    with tempfile.TemporaryDirectory(prefix="scepsy-figures-") as drawn:
        figures = bench.figures(result, Path(drawn)) if args.figures is not None else []
        if args.json is not None:
            atomic_write_text(args.json, json.dumps(result, indent=1, sort_keys=False) + "\n")
            print(f"wrote {args.json}")
        if args.figures is not None:
            for path in write_files_into(args.figures, lambda tmp: _moved(figures, tmp)):
                print(f"wrote {path}")
    return 0


def _check_figures(folder: Path) -> None:
    """``--figures``: a folder, or a path where one can be made, that this user can write to;
    refused before the run."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise UsageError(f"--figures: expected a folder (got {str(folder)!r})")
    if folder.is_dir():
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"--figures: expected a folder this user can write to (got "
                             f"{str(folder)!r})")
    else:
        check_out(folder, "--figures")


def _check_gpu(gpu: str) -> None:
    """``--gpu``: a GPU type of the catalog, refused before the run."""
    from scepsy_common.errors import InputError
    from scepsy_profile.catalog import default_catalog

    try:
        default_catalog().gpu(gpu)
    except InputError as exc:
        raise UsageError(f"--gpu: expected {exc.expected} (got {gpu!r})") from None


def _moved(files: list[Path], into: Path) -> list[Path]:
    return [Path(shutil.move(f, into / f.name)) for f in files]


def _cell(v: object) -> object:
    return float(f"{v:.3g}") if isinstance(v, float) else ("-" if v is None else v)


def _pct(x: object) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, float) else "-"
