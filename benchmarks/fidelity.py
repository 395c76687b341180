"""Predicted vs simulated vs measured, on every real-engine measurement the project holds.

    python benchmarks/fidelity.py [--sim-requests 1000] [--out results/fidelity.json]

The records (datasets/measurements/README.md) are runs of ``scepsy bench loop``: real ``vllm
serve`` processes driven with the workflows. For each record the prediction is recomputed with
today's code from the record's own inputs (its workflows, allocation, driven rate, the curves
measured on the machine it ran on, the CPU catalog): the Aggregate LLM Pipeline from a
generated trace's statistics and from the measured trace's, and the simulator on the same
allocation and rate. One table per record: per workflow throughput, mean and p90 latency; per
LLM mean call latency; each with the signed error ``(model − measured) / measured``. The bundled
serving-curve measurement (one ``vllm serve`` swept to saturation,
datasets/profiles/vllm-cpu-llama-3-8b-x0.0625.serve-curve.json) is compared with the serving
curve derived from the bundled step profile of the same machine: saturation throughput and mean
latency at 30/60/90% of it.

Everything is written to ``--out`` (JSON) as well.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import scepsy
from _common import REPO, RESULTS, table, write_results
from scepsy_profile.profiling.servecurve import compare_with_step_profile, load_result
from scepsy_profile.profiling.store import fit_store

MEASUREMENTS = REPO / "datasets" / "measurements"
SERVE_CURVE = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"
SERVE_STORE = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.jsonl"


def err(model: float | None, measured: float | None) -> str:
    if model is None or measured is None or not math.isfinite(model) or measured == 0:
        return "-"
    return f"{100 * (model - measured) / measured:+.0f}%"


def num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


def record(folder: Path, sim_requests: int) -> dict[str, Any]:
    """Predicted, simulated and measured of one ``bench loop`` record."""
    res = json.loads((folder / "results.json").read_text())
    opts = res["options"]
    workflow, catalog = REPO / opts["workflow"], REPO / opts["catalog"]
    curves, trace = folder / "curves.json", folder / "measured-trace.jsonl"
    rate = float(res["rate"])
    with tempfile.TemporaryDirectory() as tmp:
        alloc = Path(tmp) / "allocation.json"
        alloc.write_text(json.dumps({"llms": res["allocation"]}))
        common = {"curves": curves, "catalog": catalog, "seed": int(opts["seed"])}
        gen = scepsy.predict(workflow, alloc, rate, trace_requests=opts["trace_requests"],
                             **common)
        meas = scepsy.predict(workflow, alloc, rate, trace=trace, **common)
        sim = scepsy.simulate(workflow, alloc, rate, requests=sim_requests,
                              trace_requests=opts["trace_requests"], **common)
    drive = res["drive"]
    wf_rows, llm_rows = [], []
    out: dict[str, Any] = {"record": folder.name, "rate": rate, "workflows": {}, "llms": {}}
    for w, m in sorted(drive["workflows"].items()):
        measured_lat = m["latency"]["mean_s"]
        row = {"workflow": w, "thr_meas": m["throughput_rps"],
               "thr_pred": gen.workflows[w].rate, "thr_sim": sim.workflows[w].throughput,
               "lat_meas_s": measured_lat, "lat_pred_s": gen.workflows[w].mean_latency_s,
               "lat_pred_mtrace_s": meas.workflows[w].mean_latency_s,
               "lat_sim_s": sim.workflows[w].mean_latency_s,
               "p90_meas_s": m["latency"]["p90_s"], "p90_sim_s": sim.workflows[w].p90_latency_s}
        out["workflows"][w] = row
        wf_rows.append({
            "workflow": w, "thr meas": num(row["thr_meas"]),
            "thr pred": f"{num(row['thr_pred'])} ({err(row['thr_pred'], row['thr_meas'])})",
            "thr sim": f"{num(row['thr_sim'])} ({err(row['thr_sim'], row['thr_meas'])})",
            "lat meas s": num(measured_lat),
            "lat pred s": f"{num(row['lat_pred_s'])} ({err(row['lat_pred_s'], measured_lat)})",
            "lat pred(mtrace) s": f"{num(row['lat_pred_mtrace_s'])} "
                                  f"({err(row['lat_pred_mtrace_s'], measured_lat)})",
            "lat sim s": f"{num(row['lat_sim_s'])} ({err(row['lat_sim_s'], measured_lat)})",
            "p90 meas s": num(row["p90_meas_s"]),
            "p90 sim s": f"{num(row['p90_sim_s'])} ({err(row['p90_sim_s'], row['p90_meas_s'])})"})
    for llm, m in sorted(drive["llms"].items()):
        measured = m["latency"]["mean_s"]
        pred = gen.llms[llm].call_latency_s
        out["llms"][llm] = {"calls": m["calls"], "call_lat_meas_s": measured,
                            "call_lat_pred_s": pred, "ttft_meas_s": m["ttft_mean_s"]}
        llm_rows.append({"llm": llm, "calls": str(m["calls"]), "call lat meas s": num(measured),
                         "call lat pred s": f"{num(pred)} ({err(pred, measured)})",
                         "ttft meas s": num(m["ttft_mean_s"])})
    print(f"\n{folder.name}: {opts['workflow']} at {rate:.3g} req/s, allocation "
          + ", ".join(f"{k} tp{v['tp']}x{v['share']:g}x{v['replicas']}"
                      for k, v in sorted(res["allocation"].items())))
    print(table(wf_rows, list(wf_rows[0]), align="left"))
    print()
    print(table(llm_rows, list(llm_rows[0]), align="left"))
    return out


def serve_curve() -> dict[str, Any]:
    """The measured serving curve against the one derived from the step profile."""
    result = load_result(SERVE_CURVE)
    cmp = compare_with_step_profile(result, fit_store(SERVE_STORE))
    doc = {"measured_mu": cmp.measured_mu, "predicted_mu": cmp.predicted_mu,
           "loads": [{"fraction": x.fraction, "measured_latency_s": x.measured_latency_s,
                      "predicted_latency_s": x.predicted_latency_s} for x in cmp.loads],
           "verdict": cmp.verdict}
    rows = [{"quantity": "saturation calls/s", "measured": num(cmp.measured_mu),
             "derived": f"{num(cmp.predicted_mu)} ({err(cmp.predicted_mu, cmp.measured_mu)})"}]
    for load in cmp.loads:
        rows.append({"quantity": f"mean latency s at {load.fraction:.0%}",
                     "measured": num(load.measured_latency_s),
                     "derived": f"{num(load.predicted_latency_s)} "
                                f"({err(load.predicted_latency_s, load.measured_latency_s)})"})
    print(f"\nserving curve of one vllm serve ({SERVE_CURVE.name}) vs the step profile")
    print(table(rows, ["quantity", "measured", "derived"], align="left"))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim-requests", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=RESULTS / "fidelity.json")
    args = ap.parse_args()
    records = [record(f, args.sim_requests) for f in sorted(MEASUREMENTS.iterdir())
               if (f / "results.json").is_file()]
    payload = {"records": records, "serve_curve": serve_curve()}
    print(f"\nwrote {write_results(args.out.stem, payload)}")


if __name__ == "__main__":
    main()
