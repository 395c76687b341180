"""Calibrate the roofline model against published data and report its error.

    python benchmarks/calibrate_roofline.py [--write]

* all-reduce latency and efficiency: Vidur's NCCL timings on an A100 DGX (intra-node, 2-8 GPUs);
* per-phase efficiency factors: the MuxServe grid (LLaMA 7B-65B, A100-80GB, TP 1-8, 30-100% SMs);
* a cross-check against Vidur's per-layer non-attention operator times (A100 and H100), which the
  calibration never saw.
``--write`` stores the calibration as the package default (src/scepsy_profile/data/roofline.yaml).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from _common import REPO, pct, require_shared, table, write_results
from scepsy_profile.catalog import default_catalog
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.importers.vidur import (
    load_vidur_all_reduce,
    load_vidur_mlp,
    vidur_layer_time_ms,
)
from scepsy_profile.roofline import (
    RooflineModel,
    calibrate_allreduce,
    calibrate_roofline,
    save_calibration,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the package's default calibration")
    args = ap.parse_args()
    data = require_shared()
    cat = default_catalog()

    coll = load_vidur_all_reduce(data / "profiles/vidur/network/a100_dgx/all_reduce.csv")
    pts = [(c.num_workers, c.size_bytes, c.time_ms) for c in coll
           if c.num_workers == c.devices_per_node and c.num_workers <= 8]
    ar = calibrate_allreduce(pts, cat.gpu("A100-80GB").interconnect_gbps)
    w, s, y = (np.array([p[i] for p in pts], float) for i in range(3))
    pred = ar.latency_us * 1e-3 + 1e3 * 2 * (w - 1) / w * s / (600e9 * ar.efficiency)
    ar_err = np.abs(pred / y - 1)
    print(f"all-reduce (Vidur a100_dgx, {len(pts)} points): latency {ar.latency_us:.1f} µs, "
          f"efficiency {ar.efficiency:.3f}; median error {pct(np.median(ar_err))}, "
          f"p90 {pct(np.percentile(ar_err, 90))}")

    mux = load_muxserve_grid(data / "profiles/muxserve/llama-a100-80gb.json")
    cal, rep = calibrate_roofline(
        mux, cat, ar, source="MuxServe llama-a100-80gb.json (phases) + Vidur a100_dgx all_reduce.csv")
    model = RooflineModel(cat, cal)
    rows = []
    per = defaultdict(list)
    for m in mux:
        per[(m.model, m.tp, m.phase)].append(m)
    for (name, tp, phase), pts_ in sorted(per.items()):
        b, n, sh, yy = (np.array([getattr(p, f) for p in pts_], float)
                        for f in ("batch", "tokens", "share", "latency_ms"))
        e = np.abs(model.step_ms(name, "A100-80GB", tp, phase, sh, b, n) / yy - 1)
        rows.append({"model": name, "tp": tp, "phase": phase, "points": len(yy),
                     "median": pct(np.median(e)), "p90": pct(np.percentile(e, 90))})
    print("\nRoofline vs MuxServe grid after calibration")
    print(table(rows, ["model", "tp", "phase", "points", "median", "p90"]))
    print("overall: " + ", ".join(f"{ph} median {pct(rep.median_ape[ph])} p90 {pct(rep.p90_ape[ph])}"
                                  for ph in ("prefill", "decode")))

    # cross-check: non-attention per-layer time vs Vidur's operator profiles (never calibrated on)
    vrows = []
    for gpu_dir in ("a100", "h100"):
        for path in sorted((data / "profiles/vidur/compute" / gpu_dir).glob("*/*/mlp.csv")):
            timings = load_vidur_mlp(path)
            layer = vidur_layer_time_ms(timings)
            errs = []
            for (mname, gpu, tp, ntok), ms in layer.items():
                if not cat.has_model(mname) or ntok < 512 or ms <= 0:
                    continue
                spec, g = cat.model(mname), cat.gpu(gpu)
                if not spec.supports_tp(tp):
                    continue
                flops = 2.0 * spec.layer_matmul_params * ntok / tp
                e = cal.prefill
                t = max(flops / (g.peak_flops * e.compute_eff),
                        spec.layer_matmul_params * spec.dtype_bytes / tp / (g.hbm_bytes_per_s * e.memory_eff)) * 1e3
                errs.append(abs(t / ms - 1))
            if errs:
                vrows.append({"gpu": gpu_dir, "model": path.parent.name, "points": len(errs),
                              "median": pct(np.median(errs)), "p90": pct(np.percentile(errs, 90))})
    print("\nRoofline per-layer matmul time vs Vidur mlp.csv (>= 512 tokens; not calibrated on)")
    print(table(vrows, ["gpu", "model", "points", "median", "p90"]))

    out = write_results("roofline_calibration", {
        "calibration": cal.to_dict(), "muxserve": rows, "vidur_layers": vrows,
        "overall": {"median": rep.median_ape, "p90": rep.p90_ape},
        "allreduce_error": {"median": float(np.median(ar_err)), "p90": float(np.percentile(ar_err, 90))},
    })
    print(f"\nresults: {out}")
    if args.write:
        dest = REPO / "src/scepsy_profile/data/roofline.yaml"
        save_calibration(cal, dest)
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
