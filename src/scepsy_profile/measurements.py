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

from scepsy_common.errors import InputError, Name, UnknownEntryError, validated
from scepsy_common.files import atomic_write_text, read_jsonl_objects
from scepsy_profile.catalog import Catalog, default_catalog

MAX_BATCH = 65_536
"""The largest batch a measurement may have."""
MAX_TOKENS = 10_000_000
"""The most tokens a measurement may have."""

MIN_CURVE_POINTS = 5
"""The fewest measured points, at distinct (share, batch, tokens), that one curve is fitted from
(the physics form has five parameters)."""

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

    model: Name
    gpu: Name
    tp: int = Field(ge=1, le=1024)
    share: float = Field(gt=0.0, le=1.0)
    phase: Phase
    batch: int = Field(ge=1, le=MAX_BATCH)
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    latency_ms: float = Field(gt=0.0, allow_inf_nan=False)
    source: str = ""


def validate_measurement(raw: object, source: str, where: str,
                         catalog: Catalog | None = None) -> Measurement:
    """Check one raw record and build a :class:`Measurement`, or raise :class:`InputError`.

    ``source`` names the file, ``where`` the position inside it (e.g. ``"line 3"``).
    """
    rec = validated(_MeasurementRecord, raw, source, f"{where}: ")
    check_instance(rec.model, rec.gpu, rec.tp, source, f"{where}: ", catalog)
    return Measurement(**rec.model_dump())


def check_instance(model: str, gpu: str, tp: int, source: str, prefix: str = "",
                   catalog: Catalog | None = None) -> None:
    """A measured instance must be one the catalog knows: a catalog model (or alias) and GPU,
    and a TP degree the model supports inside one NVLink domain of the GPU; otherwise an
    :class:`InputError` naming ``source`` and ``prefix`` + the field."""
    cat = catalog or default_catalog()
    try:
        spec = cat.model(model)
    except UnknownEntryError as exc:
        raise InputError(source, f"{prefix}model", exc.expected, model) from None
    try:
        g = cat.gpu(gpu)
    except UnknownEntryError as exc:
        raise InputError(source, f"{prefix}gpu", exc.expected, gpu) from None
    if not spec.supports_tp(tp) or tp > g.nvlink_domain:
        ok = [t for t in (1, 2, 4, 8, 16, 32, 64) if spec.supports_tp(t) and t <= g.nvlink_domain]
        raise InputError(source, f"{prefix}tp", f"a TP degree {spec.name} supports on {g.name} "
                         f"({', '.join(map(str, ok))})", tp)


def read_measurements(path: str | os.PathLike[str],
                      catalog: Catalog | None = None) -> tuple[Measurement, ...]:
    """Read a JSON-lines measurements file; every bad line is reported with its number.

    Every line must name an instance of ``catalog`` (default: the bundled catalog; see
    :func:`check_instance`)."""
    p = Path(path)
    out: list[Measurement] = []
    for lineno, raw in read_jsonl_objects(p, "measurements file (.jsonl)", "measurement"):
        out.append(validate_measurement(raw, str(p), f"line {lineno}", catalog))
    if not out:
        raise InputError(str(p), "", "at least one measurement")
    return tuple(out)


def check_curve_points(rows: Sequence[Measurement], source: str) -> None:
    """Every curve (model, gpu, tp, phase) of ``rows`` has at least :data:`MIN_CURVE_POINTS`
    points at distinct (share, batch, tokens); otherwise an :class:`InputError` naming
    ``source`` and the curve."""
    for (model, gpu, tp, phase), pts in group_by_curve(rows):
        n = len({(m.share, m.batch, m.tokens) for m in pts})
        if n < MIN_CURVE_POINTS:
            raise InputError(source, f"curve {model}@{gpu} tp={tp} {phase}",
                             f"at least {MIN_CURVE_POINTS} measured points at distinct (share, "
                             "batch, tokens) to fit a curve from", n)


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
