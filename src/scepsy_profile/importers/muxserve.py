"""Importer for the MuxServe profiling grid (hao-ai-lab/MuxServe ``examples/placement/llama.json``).

Layout: ``model -> tp -> percent_of_SMs -> batch -> seq_len -> {"prefill": ms, "decoding": ms}``.
Entries with a non-positive latency (the upstream marker for "not measured", usually
out-of-memory) are skipped; anything else malformed is an :class:`InputError` naming the path.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from scepsy_profile.errors import InputError
from scepsy_profile.measurements import Measurement

_PHASE_KEYS = (("prefill", "prefill"), ("decode", "decoding"))


def load_muxserve_grid(
    path: str | os.PathLike[str], gpu: str = "A100-80GB"
) -> tuple[Measurement, ...]:
    """Read a MuxServe grid file into measurements (model names as in the file)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(p), "", "an existing MuxServe grid JSON file") from None
    except json.JSONDecodeError as exc:
        raise InputError(str(p), "", f"valid JSON ({exc.msg} at line {exc.lineno})") from None
    src = f"muxserve:{p.name}"
    out: list[Measurement] = []
    for model, by_tp in _items(data, str(p), ""):
        for tp, by_sm in _items(by_tp, str(p), model):
            for pct, by_batch in _items(by_sm, str(p), f"{model}.{tp}"):
                share = _number(pct, str(p), f"{model}.{tp}.{pct}", "an SM percentage in (0, 100]")
                if not 0 < share <= 100:
                    raise InputError(str(p), f"{model}.{tp}.{pct}", "an SM percentage in (0, 100]")
                for batch, by_seq in _items(by_batch, str(p), f"{model}.{tp}.{pct}"):
                    for seq, point in _items(by_seq, str(p), f"{model}.{tp}.{pct}.{batch}"):
                        where = f"{model}.{tp}.{pct}.{batch}.{seq}"
                        for phase, key in _PHASE_KEYS:
                            if not isinstance(point, dict) or key not in point:
                                raise InputError(str(p), f"{where}.{key}", "a latency in ms")
                            ms = _number(point[key], str(p), f"{where}.{key}", "a latency in ms")
                            if ms <= 0:
                                continue  # upstream marks points it could not measure with -1
                            out.append(
                                Measurement(
                                    model=model,
                                    gpu=gpu,
                                    tp=_int(tp, str(p), f"{model}.{tp}"),
                                    share=share / 100.0,
                                    phase=phase,
                                    batch=_int(batch, str(p), f"{model}.{tp}.{pct}.{batch}"),
                                    tokens=_int(seq, str(p), where),
                                    latency_ms=ms,
                                    source=src,
                                )
                            )
    if not out:
        raise InputError(str(p), "", "at least one measured point")
    out.sort(key=lambda m: (m.model, m.tp, m.phase, m.share, m.batch, m.tokens))
    return tuple(out)


def _items(obj: object, src: str, where: str) -> list[tuple[str, object]]:
    if not isinstance(obj, dict):
        raise InputError(src, where or "top level", "a JSON object")
    return list(obj.items())


def _number(raw: object, src: str, where: str, expected: str) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(src, where, expected, raw) from None
    if not math.isfinite(value):
        raise InputError(src, where, expected, raw)
    return value


def _int(raw: str, src: str, where: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InputError(src, where, "a positive integer key", raw) from None
    if value < 1:
        raise InputError(src, where, "a positive integer key", raw)
    return value
