"""Replicas to place (:class:`Demand`) and where they run (:class:`Slot`).

A :class:`Demand` is one replica of an allocation's instance: ``tp`` GPUs of one type, each
giving it ``share`` of its compute and ``memory_gib`` of its memory. A :class:`Slot` is the node
and GPU indices a placer gave it. Shares count in thousandths by
:func:`scepsy_common.units.share_units`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scepsy_common.errors import InputError
from scepsy_common.units import UNITS, share_units

Key = tuple[str, int]


class _Replica:
    """What a replica's demand and its slot share: the (llm, replica) key and the share. A plain
    base with no fields of its own: each dataclass below declares all its fields, in order (the
    share after their own fields)."""

    __slots__ = ()
    llm: str
    replica: int
    share: float

    @property
    def key(self) -> Key:
        return (self.llm, self.replica)

    @property
    def units(self) -> int:
        """Share per GPU in thousandths (:func:`scepsy_common.units.share_units`)."""
        return share_units(self.share)


@dataclass(frozen=True, slots=True)
class Demand(_Replica):
    """One replica to place: ``tp`` GPUs of type ``gpu``, ``share`` and ``memory_gib`` of each."""

    llm: str
    replica: int
    gpu: str
    tp: int
    share: float
    memory_gib: float

    def __post_init__(self) -> None:
        src = f"demand {self.llm}[{self.replica}]"
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise InputError(src, "tp", "an integer >= 1", self.tp)
        if not 0 < self.share <= 1:
            raise InputError(src, "share", "a GPU share in (0, 1]", self.share)
        if not self.memory_gib >= 0:
            raise InputError(src, "memory_gib", "memory >= 0 GiB", self.memory_gib)


    @property
    def content(self) -> tuple[Any, ...]:
        """Everything about the replica but its names (LLM, replica number)."""
        return (self.gpu, self.tp, self.units, self.share, self.memory_gib)

    @property
    def size(self) -> int:
        """GPU capacity in thousandths: ``tp × units``."""
        return self.tp * self.units

    @property
    def whole(self) -> bool:
        return self.units == UNITS


@dataclass(frozen=True, slots=True)
class Slot(_Replica):
    """Where one replica runs: ``gpus`` (indices on ``node``), each giving ``share`` and
    ``memory_gib``."""

    llm: str
    replica: int
    node: str
    gpus: tuple[int, ...]
    share: float
    memory_gib: float


def task_mix(ds: Sequence[Demand]) -> tuple[tuple[int, int, float], ...]:
    """The demands' instance mix for FGD: (GPUs, share per GPU in thousandths, probability)."""
    c = Counter((d.tp, d.units) for d in ds)
    total = sum(c.values())
    return tuple((tp, u, k / total) for (tp, u), k in sorted(c.items()))
