"""Accuracy and speed of the fitted latency curves on the MuxServe grid.

    python benchmarks/profile_accuracy.py [--jobs 2] [--quick]

Prints, per (model, tp) and phase, the 5-fold cross-validated median and 90th-percentile absolute
percentage error of
* scepsy: physics form + residual Gaussian process + monotone lattice (the library's model);
* physics-only: the same without the residual GP (ablation);
* poly3-log: a cubic polynomial in log batch, log tokens and log share per (model, tp, phase);
* share-interp: linear interpolation in 1/share between the neighbouring measured share levels
  of the same (batch, tokens) point (undefined where a point has no neighbour in its fold);
then extrapolation (a held-out share level; the two largest batch sizes held out), fit time for
the whole grid and prediction speed. Results go to results/profile_accuracy.json.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import KFold
from sklearn.preprocessing import PolynomialFeatures

from _common import pct, require_shared, table, write_results
from scepsy_profile.fitted import cross_validate, fit_curve, fit_latency_model, predict_points
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.measurements import group_by_curve


def poly3_cv(pts, seed=0):
    x = np.log([[m.batch, m.tokens, m.share] for m in pts])
    y = np.log([m.latency_ms for m in pts])
    ape = np.zeros(len(pts))
    poly = PolynomialFeatures(3)
    for tr, te in KFold(5, shuffle=True, random_state=seed).split(y):
        reg = LinearRegression().fit(poly.fit_transform(x[tr]), y[tr])
        ape[te] = np.abs(np.exp(reg.predict(poly.transform(x[te])) - y[te]) - 1)
    return ape


def share_interp_cv(pts, seed=0):
    y = np.array([m.latency_ms for m in pts])
    ape = np.full(len(pts), np.nan)
    for tr, te in KFold(5, shuffle=True, random_state=seed).split(y):
        cells = defaultdict(list)
        for i in tr:
            cells[(pts[i].batch, pts[i].tokens)].append((1 / pts[i].share, y[i]))
        for i in te:
            known = sorted(cells.get((pts[i].batch, pts[i].tokens), []))
            u = 1 / pts[i].share
            if len(known) < 2 or not known[0][0] <= u <= known[-1][0]:
                continue  # no neighbour on one side: interpolation is undefined here
            ape[i] = abs(np.interp(u, [k[0] for k in known], [k[1] for k in known]) / y[i] - 1)
    return ape[~np.isnan(ape)]


def held_out_share(groups, level):
    errs = {"prefill": [], "decode": []}
    for key, pts in groups:
        train = [m for m in pts if abs(m.share - level) > 1e-9]
        test = [m for m in pts if abs(m.share - level) <= 1e-9]
        if not test:
            continue
        tab, _ = fit_curve(key, train, 0)
        errs[key[3]].extend(np.abs(predict_points(tab, test) / [m.latency_ms for m in test] - 1))
    return errs


def held_out_batches(groups):
    errs = {"prefill": [], "decode": []}
    for key, pts in groups:
        top = sorted({m.batch for m in pts})[-2:]
        train = [m for m in pts if m.batch not in top]
        test = [m for m in pts if m.batch in top]
        tab, _ = fit_curve(key, train, 0)
        errs[key[3]].extend(np.abs(predict_points(tab, test) / [m.latency_ms for m in test] - 1))
    return errs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="skip the extrapolation studies")
    args = ap.parse_args()
    rows = load_muxserve_grid(require_shared() / "profiles/muxserve/llama-a100-80gb.json")
    groups = list(group_by_curve(rows))

    t0 = time.perf_counter()
    ours = {r.key: r.ape for r in cross_validate(rows, n_jobs=args.jobs)}
    t_cv = time.perf_counter() - t0
    phys = {r.key: r.ape for r in cross_validate(rows, n_jobs=args.jobs, residual_gp=False)}
    table_rows, payload, fails = [], [], []
    for key, pts in groups:
        base = {"poly3": poly3_cv(pts), "interp": share_interp_cv(pts)}
        row = {"model": key[0], "tp": key[2], "phase": key[3], "points": len(pts)}
        rec = dict(row)
        for name, e in (("scepsy", ours[key]), ("physics", phys[key]), ("poly3", base["poly3"]),
                        ("interp", base["interp"])):
            row[f"{name} med"] = pct(np.median(e))
            row[f"{name} p90"] = pct(np.percentile(e, 90))
            rec[name] = {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)), "n": len(e)}
        if rec["scepsy"]["median"] > 0.03 or rec["scepsy"]["p90"] > 0.10:
            fails.append(f"{key[0]} tp{key[2]} {key[3]}")
        table_rows.append(row)
        payload.append(rec)
    cols = list(table_rows[0])
    print("5-fold cross-validation on the MuxServe grid (absolute percentage error)")
    print(table(table_rows, cols))
    all_ours = np.concatenate(list(ours.values()))
    all_phys = np.concatenate(list(phys.values()))
    print(f"\nall points: scepsy median {pct(np.median(all_ours))} p90 {pct(np.percentile(all_ours, 90))}; "
          f"physics-only median {pct(np.median(all_phys))} p90 {pct(np.percentile(all_phys, 90))}")
    print(f"curves missing the target (median <= 3%, p90 <= 10%): {fails or 'none'}")
    print(f"cross-validation wall time: {t_cv:.1f} s")

    extrap = {}
    if not args.quick:
        for level in (0.4, 0.6, 0.8, 0.9):
            e = held_out_share(groups, level)
            extrap[f"share {level:.0%} held out"] = {ph: (float(np.median(v)), float(np.percentile(v, 90)))
                                                     for ph, v in e.items()}
        e = held_out_batches(groups)
        extrap["two largest batches held out"] = {ph: (float(np.median(v)), float(np.percentile(v, 90)))
                                                  for ph, v in e.items()}
        print("\nExtrapolation (median / p90 absolute percentage error)")
        print(table([{"study": k, **{ph: f"{pct(v[ph][0])} / {pct(v[ph][1])}" for ph in ("prefill", "decode")}}
                     for k, v in extrap.items()], ["study", "prefill", "decode"]))

    t0 = time.perf_counter()
    model = fit_latency_model(rows, n_jobs=args.jobs)
    t_fit = time.perf_counter() - t0
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        model.decode_ms("llama-13b", "A100-80GB", 2, 0.55, 1 + i % 200, 700.0)
    t_one = (time.perf_counter() - t0) / n
    b = np.arange(1, 100_001) % 300 + 1.0
    t0 = time.perf_counter()
    model.decode_ms("llama-13b", "A100-80GB", 2, 0.55, b, 700.0)
    t_vec = (time.perf_counter() - t0) / len(b)
    print(f"\nfit of the whole grid ({len(rows)} points, {len(groups)} curves, {args.jobs} jobs): {t_fit:.1f} s")
    print(f"one scalar prediction: {t_one * 1e6:.1f} µs; vectorised: {t_vec * 1e9:.0f} ns per point")
    out = write_results("profile_accuracy", {
        "per_curve": payload, "extrapolation": extrap, "fit_seconds": t_fit, "jobs": args.jobs,
        "scalar_prediction_us": t_one * 1e6, "vector_prediction_ns": t_vec * 1e9,
        "all_points": {"median": float(np.median(all_ours)), "p90": float(np.percentile(all_ours, 90))},
    })
    print(f"results: {out}")


if __name__ == "__main__":
    main()
