"""Measured latency points and the project's JSON-lines store for them.

One :class:`Measurement` is one timed forward pass of one LLM instance:

* ``phase="prefill"``: one pass over ``batch`` prompts of ``tokens`` tokens each;
* ``phase="decode"``: one decode step for ``batch`` sequences whose KV cache holds ``tokens``
  tokens each (the context length).

``share`` is the fraction of each GPU's compute (an MPS percentage / 100) and the same fraction
of its memory; ``tp`` is the tensor-parallel degree. Importers for published data live in
:mod:`scepsy_profile.importers`; this module owns the record and the store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from scepsy_profile.errors import InputError, validated
from scepsy_profile.files import atomic_write_text, read_jsonl_objects

Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured point: the latency of one prefill pass or one decode step."""

    model: str
    gpu: str
    tp: int
    share: float
    phase: Phase
    batch: int
    tokens: int
    latency_ms: float
    source: str = ""

    def key(self) -> tuple[str, str, int, Phase]:
        """The curve this point belongs to: (model, gpu, tp, phase)."""
        return (self.model, self.gpu, self.tp, self.phase)


class _MeasurementRecord(BaseModel):
    """Schema of one line of a measurements JSONL file (validation at the boundary)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    tp: int = Field(ge=1, le=1024)
    share: float = Field(gt=0.0, le=1.0)
    phase: Phase
    batch: int = Field(ge=1)
    tokens: int = Field(ge=1)
    latency_ms: float = Field(gt=0.0, allow_inf_nan=False)
    source: str = ""


def validate_measurement(raw: object, source: str, where: str) -> Measurement:
    """Check one raw record and build a :class:`Measurement`, or raise :class:`InputError`.

    ``source`` names the file, ``where`` the position inside it (e.g. ``"line 3"``).
    """
    rec = validated(_MeasurementRecord, raw, source, f"{where}: ")
    return Measurement(**rec.model_dump())


def read_measurements(path: str | os.PathLike[str]) -> tuple[Measurement, ...]:
    """Read a JSON-lines measurements file; every bad line is reported with its number."""
    p = Path(path)
    out: list[Measurement] = []
    for lineno, raw in read_jsonl_objects(p, "measurements file (.jsonl)", "measurement"):
        out.append(validate_measurement(raw, str(p), f"line {lineno}"))
    if not out:
        raise InputError(str(p), "", "at least one measurement")
    return tuple(out)


def write_measurements(path: str | os.PathLike[str], rows: Iterable[Measurement]) -> None:
    """Write measurements as JSON lines, atomically (a temporary file renamed into place)."""
    atomic_write_text(path, "".join(json.dumps(asdict(m), sort_keys=True) + "\n" for m in rows))


def group_by_curve(
    rows: Sequence[Measurement],
) -> Iterator[tuple[tuple[str, str, int, Phase], list[Measurement]]]:
    """Yield ``(key, points)`` per (model, gpu, tp, phase), in sorted key order."""
    groups: dict[tuple[str, str, int, Phase], list[Measurement]] = {}
    for m in rows:
        groups.setdefault(m.key(), []).append(m)
    for key in sorted(groups):
        yield key, groups[key]
