"""``scepsy validate muxserve DIR``: measured multi-LLM runs against scepsy's predictions and
simulations (docs/validate.md). Parsing and printing only; the work is
:mod:`scepsy_opt.validate`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from scepsy.cli.argtypes import add_slo_flags, slo_flags

if TYPE_CHECKING:
    from scepsy_profile.latency import LatencyModel

HELP = "compare measured serving runs with scepsy's predictions and simulations"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``validate`` to a ``scepsy`` sub-command set; returns its parser."""
    cmd = subparsers.add_parser("validate", help=HELP, description=HELP)
    vsub = cmd.add_subparsers(dest="validate_command", required=True)
    mux = vsub.add_parser(
        "muxserve", help="MuxServe's end-to-end runs (benchmark/chatlmsys layout)",
        description="Read MuxServe's workload and placement YAMLs and merged results in DIR, "
        "predict and simulate every run, and print measured vs predicted vs simulated per "
        "run and per LLM.")
    mux.add_argument("folder", type=Path, metavar="DIR",
                     help="a folder with yamls/ and merged/ (any subset of loads and strategies)")
    mux.add_argument("--curves", type=Path, metavar="FILE",
                     help="the A100 latency curves (default: MuxServe's own A100 profile, "
                     "datasets/profiles/muxserve-a100-curves.json of the repository)")
    over = mux.add_mutually_exclusive_group()
    over.add_argument("--overheads", type=Path, metavar="FILE",
                      help="engine overheads (default: the bundled MuxServe A100 calibration)")
    over.add_argument("--no-overheads", action="store_true",
                      help="raw predictions, without engine overheads")
    mux.add_argument("--no-simulate", action="store_true",
                     help="predict only (the simulator replays every run otherwise)")
    mux.add_argument("--seed", type=int, default=0, help="seed of lengths and arrivals")
    mux.add_argument("--output-cv", type=_output_cv, metavar="CV",
                     help="coefficient of variation of the output lengths, log-normal around "
                     "each LLM's mean (default: the calibration on the shared ChatLMSYS "
                     "loads; with --fit-overheads, fitted on DIR's runs)")
    mux.add_argument("--llms", action="store_true", help="print one table per run, per LLM")
    mux.add_argument("--arrivals", type=Path, metavar="FILE", action="append", default=[],
                     help="a load's recorded requests: MuxServe's workload file "
                     "(--workload-file), named after the load (<workload>.json); its runs are "
                     "also predicted and simulated with the recorded arrivals (repeatable)")
    add_slo_flags(mux, "reports each source's SLO attainment")
    mux.add_argument("--json", type=Path, metavar="FILE",
                     help="write the results as JSON (written only when every run succeeded)")
    mux.add_argument("--fit-overheads", type=Path, metavar="FILE",
                     help="instead: fit the engine overheads on the spatial runs of DIR and "
                     "write them to FILE (YAML)")
    mux.set_defaults(func=cmd_validate_muxserve)
    return cmd


def _output_cv(text: str) -> float:
    from scepsy_opt.validate.evaluate import MAX_OUTPUT_CV

    try:
        cv = float(text)
    except ValueError:
        cv = float("nan")
    if not 0 < cv <= MAX_OUTPUT_CV:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"expected a coefficient of variation in (0, {MAX_OUTPUT_CV:g}], got {text!r}")
    return cv


def cmd_validate_muxserve(args: argparse.Namespace) -> int:
    """Run ``scepsy validate muxserve``."""
    from scepsy.cli.util import naming, print_rows
    from scepsy_common.errors import InputError
    from scepsy_common.files import atomic_write_text
    from scepsy_opt.validate.muxserve import (
        READ_FOLDERS,
        inside_read_folders,
        load_muxserve_workload,
    )
    from scepsy_opt.validate.report import (
        document,
        llm_columns,
        llm_rows,
        run_columns,
        run_rows,
        validate_muxserve,
    )
    from scepsy_profile.fitted import MUXSERVE_A100_CURVES, load_curves
    from scepsy_profile.latency import CompositeLatencyModel
    from scepsy_profile.overheads import MUXSERVE_A100, load_overheads, with_overheads
    from scepsy_profile.roofline import roofline_model

    slos = slo_flags(args.ttft_slo, args.tpot_slo)
    if args.fit_overheads is not None:
        for flag, given in (("--overheads", args.overheads is not None),
                            ("--ttft-slo/--tpot-slo", slos is not None),
                            ("--no-overheads", args.no_overheads), ("--json", args.json),
                            ("--llms", args.llms), ("--no-simulate", args.no_simulate),
                            ("--arrivals", bool(args.arrivals))):
            if given:
                raise InputError("validate", flag, "no --fit-overheads with it (the fit writes "
                                 "overheads; validate with them in a second run)")
    for flag, path in (("--json", args.json), ("--fit-overheads", args.fit_overheads)):
        if path is not None and not path.parent.is_dir():
            raise InputError(str(path), flag, "a file in an existing folder")
        if path is not None and inside_read_folders(args.folder, path):
            raise InputError(str(path), flag, f"a file outside {args.folder}'s "
                             f"{' and '.join(f'{d}/' for d in READ_FOLDERS)} (the runs are read "
                             "from there); nothing written")
    if args.seed < 0:
        raise InputError("validate", "--seed", "an integer >= 0", args.seed)
    if args.curves is None:
        if not MUXSERVE_A100_CURVES.is_file():
            raise InputError(str(MUXSERVE_A100_CURVES), "--curves", "a curves file (this "
                             "install has no repository datasets/: pass --curves FILE)")
        args.curves = MUXSERVE_A100_CURVES
        shown = "datasets/profiles/muxserve-a100-curves.json"
    else:
        shown = str(args.curves)
    base = CompositeLatencyModel(load_curves(args.curves), roofline_model())
    if args.fit_overheads is not None:
        return _fit(args, base)
    latency: LatencyModel
    if args.no_overheads:
        latency, model = base, f"{shown} (no overheads)"
    else:
        path = args.overheads or MUXSERVE_A100
        latency = with_overheads(base, load_overheads(path))
        model = f"{shown} + overheads {path.name}"
    with naming({"slos": "--ttft-slo/--tpot-slo"}):
        recorded = [load_muxserve_workload(p) for p in args.arrivals]
        report = validate_muxserve(args.folder, latency, model=model,
                                   simulate=not args.no_simulate, seed=args.seed, slos=slos,
                                   recorded=recorded,
                                   **({} if args.output_cv is None
                                      else {"output_cv": args.output_cv}))
    runs = len({(v.workload, v.strategy) for v in report.runs})
    print(f"{args.folder}: {runs} run(s); latency model {model}")
    print_rows(run_rows(report), run_columns(report))
    if args.llms:
        for v in report.runs:
            print()
            print(f"{v.workload} / {v.strategy}"
                  + ("" if v.arrivals == "poisson" else f" ({v.arrivals} arrivals)"))
            print_rows(llm_rows(v), llm_columns(v.simulated is not None, slos is not None))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(document(report), indent=1, sort_keys=True)
                          + "\n")
        print(f"wrote {args.json}")
    return 0


def _fit(args: argparse.Namespace, base: LatencyModel) -> int:
    from scepsy_opt.validate.fit import fit_overheads
    from scepsy_opt.validate.muxserve import load_muxserve_dir
    from scepsy_profile.overheads import save_overheads

    runs = load_muxserve_dir(args.folder)
    fit = fit_overheads(runs, base, seed=args.seed, output_cv=args.output_cv,
                        source=f"scepsy validate muxserve {args.folder} "
                        f"--fit-overheads (runs: {', '.join(sorted({r.workload for r in runs}))})")
    o = fit.overheads
    print(f"fitted on {len(fit.runs)} run(s): output_cv {fit.output_cv:g} (pass it as "
          f"--output-cv with these overheads), iteration_ms {o.iteration_ms:g}, "
          f"tp_doubling_ms {o.tp_doubling_ms:g}, first_token_ms {o.first_token_ms:g}, "
          f"overload_queued {o.overload_queued:g}")
    save_overheads(o, args.fit_overheads)
    print(f"wrote {args.fit_overheads}")
    return 0
