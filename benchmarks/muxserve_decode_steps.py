"""How many of an LLM's decoding requests each decode step carries, measured and simulated.

    python benchmarks/muxserve_decode_steps.py [FOLDER] [--strategies flexsm,temporal]

For every LLM of every MuxServe run in FOLDER (default: the shared ChatLMSYS loads), the
requests decoding on average (Little's law: throughput x mean output x mean TPOT) over the mean
decode batch, measured and simulated (``scepsy_opt.validate.evaluate.decoding_ratio``).
1 means every decoding request is in every step and the count decoding holds steady; well
above 1 means the count decoding swung over the run, or requests waited between steps.
The simulator runs with the bundled calibration, as ``scepsy validate muxserve`` does.
Written to ``results/muxserve_decode_steps.json`` as well.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _common import SHARED_DATA, require_shared, sig, table, write_results
from scepsy_opt.validate.evaluate import decoding_ratio, validate_run
from scepsy_opt.validate.muxserve import load_muxserve_dir
from scepsy_profile.fitted import MUXSERVE_A100_CURVES, load_curves
from scepsy_profile.latency import CompositeLatencyModel
from scepsy_profile.overheads import MUXSERVE_A100, load_overheads, with_overheads
from scepsy_profile.roofline import roofline_model


def rows(folder: Path, strategies: set[str]) -> list[dict[str, object]]:
    base = CompositeLatencyModel(load_curves(MUXSERVE_A100_CURVES), roofline_model())
    latency = with_overheads(base, load_overheads(MUXSERVE_A100))
    out = []
    for run in load_muxserve_dir(folder):
        if run.strategy not in strategies:
            continue
        v = validate_run(run, latency)
        for mesh in run.meshes:
            for x in mesh.llms:
                output = run.lengths(x.name)[1]
                figs = v.llms[x.name]
                meas, sim = (decoding_ratio(figs[k], output) for k in ("measured", "simulated"))
                out.append({"load": run.workload, "strategy": run.strategy, "llm": x.name,
                            "model": run.models[x.name], "shared": len(mesh.llms) > 1,
                            "measured_batch": figs["measured"].decode_batch,
                            "simulated_batch": figs["simulated"].decode_batch,
                            "measured_ratio": meas, "simulated_ratio": sim})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path,
                    default=SHARED_DATA / "e2e" / "muxserve-chatlmsys")
    ap.add_argument("--strategies", default="spatial,flexsm,temporal")
    args = ap.parse_args()
    if args.folder == SHARED_DATA / "e2e" / "muxserve-chatlmsys":
        require_shared()
    found = rows(args.folder, set(args.strategies.split(",")))

    def f(x: object) -> str:
        return "-" if x is None else f"{sig(float(x), 3):g}"  # type: ignore[arg-type]
    shown = [{"load": r["load"], "strategy": r["strategy"], "llm": r["llm"], "model": r["model"],
              "shared": "yes" if r["shared"] else "no",
              "batch (meas / sim)": f"{f(r['measured_batch'])} / {f(r['simulated_batch'])}",
              "decoding per step (meas / sim)":
                  f"{f(r['measured_ratio'])} / {f(r['simulated_ratio'])}"} for r in found]
    if shown:
        print(table(shown, list(shown[0]), align="left"))
    summary = []
    for load, strategy in sorted({(str(r["load"]), str(r["strategy"])) for r in found}):
        rs = [r for r in found if r["load"] == load and r["strategy"] == strategy]
        meas = [float(r["measured_ratio"]) for r in rs if r["measured_ratio"] is not None]
        sim = [float(r["simulated_ratio"]) for r in rs if r["simulated_ratio"] is not None]
        summary.append({"load": load, "strategy": strategy,
                        "measured median": f(statistics.median(meas)) if meas else "-",
                        "measured max": f(max(meas)) if meas else "-",
                        "simulated median": f(statistics.median(sim)) if sim else "-",
                        "simulated max": f(max(sim)) if sim else "-"})
    if summary:
        print()
        print(table(summary, list(summary[0]), align="left"))
    print(f"written to {write_results('muxserve_decode_steps', {'rows': found})}")


if __name__ == "__main__":
    main()
