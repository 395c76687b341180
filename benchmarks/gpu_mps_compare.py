"""Compare the stores of ``benchmarks/gpu_mps_profile.sh``: every point measured in more than
one run (a model alone at share 1, alone at 0.5, and at 0.5 beside the other model), with the
bundled roofline's prediction for the device, as a table (and ``--json FILE``).

    python benchmarks/gpu_mps_compare.py datasets/measurements/gpu-h200-torch-mps
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scepsy_profile.roofline import roofline_model

RUNS = {"gen": ("gen-1.0", "gen-0.5", "pair-gen-0.5"),
        "prm": ("prm-1.0", "prm-0.5", "pair-prm-0.5"),
        "big": ("big-1.0",)}


def load(folder: Path, name: str) -> tuple[dict[tuple[str, int, int], float], dict[str, str]]:
    """A store's ok points, ``(phase, batch, tokens) -> median ms``, and its model and device."""
    path = folder / f"{name}.jsonl"
    if not path.is_file():
        return {}, {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ok = [r for r in rows if r.get("status") == "ok"]
    meta = {"model": ok[0]["model"], "device": ok[0]["device"]} if ok else {}
    return {(r["phase"], r["batch"], r["tokens"]): r["latency_ms"] for r in ok}, meta


def table(folder: Path) -> list[dict[str, object]]:
    roof = roofline_model()
    out: list[dict[str, object]] = []
    for runs in RUNS.values():
        stores = [load(folder, r) for r in runs]
        meta = next((m for _, m in stores if m), None)
        if meta is None:
            continue
        keys = sorted(set().union(*(set(s) for s, _ in stores)))
        for phase, batch, tokens in keys:
            got = [s.get((phase, batch, tokens)) for s, _ in stores]
            if len(runs) > 1 and sum(v is not None for v in got) < 2:
                continue
            f = roof.prefill_ms if phase == "prefill" else roof.decode_ms
            row: dict[str, object] = {"model": meta["model"], "phase": phase, "batch": batch,
                                      "tokens": tokens,
                                      "roofline_1.0": round(float(f(meta["model"], meta["device"],
                                                                    1, 1.0, batch, tokens)), 2),
                                      "roofline_0.5": round(float(f(meta["model"], meta["device"],
                                                                    1, 0.5, batch, tokens)), 2)}
            for run, v in zip(runs, got, strict=True):
                share = run.rsplit("-", 1)[1]
                row[f"{'pair' if run.startswith('pair') else 'alone'}_{share}"] = v
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = table(args.folder)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print("  ".join(cols))
    for r in rows:
        print("  ".join("-" if r.get(c) is None else f"{r[c]:g}" if isinstance(r[c], float)
                        else str(r[c]) for c in cols))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
