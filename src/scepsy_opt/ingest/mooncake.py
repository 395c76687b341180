"""Token lengths from the Mooncake production trace, as workflow distributions.

Mooncake (kvcache-ai/Mooncake, FAST'25) released request traces with one JSON object a line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}

``timestamp`` is milliseconds from the trace start, lengths are tokens, and ``hash_ids`` name the
prompt's 512-token blocks (requests that share leading ids share a prompt prefix). The
conversation trace is in ``../shared/data/request-traces/mooncake/conversation_trace.jsonl``
when the shared data folder is present; nothing in scepsy needs it by default.

A workflow param can take Mooncake's lengths instead of its YAML distribution::

    lengths = load_mooncake_lengths(path)
    trace = generate_trace(spec, 100, seed=0,
                           token_source={"task_tokens": lengths.distribution("input", max=16000)})
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from scepsy_common.errors import InputError, validated
from scepsy_common.files import read_jsonl_objects
from scepsy_opt.workflows import Distribution

BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces (``len(hash_ids) = ⌈input/512⌉``)."""


class _MooncakeRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    timestamp: int = Field(ge=0)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=1)
    hash_ids: list[int] = Field(default_factory=list)


def _frozen(values: list[int]) -> NDArray[np.int64]:
    a = np.array(values, dtype=np.int64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class MooncakeLengths:
    """One Mooncake trace as read-only arrays, one entry per request in file order."""

    timestamps_ms: NDArray[np.int64]
    input_lengths: NDArray[np.int64]
    output_lengths: NDArray[np.int64]
    prefix_blocks: NDArray[np.int64]  # len(hash_ids): 512-token blocks of the prompt

    def __len__(self) -> int:
        return len(self.input_lengths)

    def distribution(self, which: Literal["input", "output"], *, scale: float = 1.0,
                     min: float | None = None, max: float | None = None) -> Distribution:
        """An ``empirical`` :class:`Distribution` of the input or output lengths.

        ``scale`` multiplies every length (e.g. 0.25 to map Mooncake's long chat prompts onto a
        shorter prompt of a workflow); ``min``/``max`` clip the samples (use ``max`` to stay
        inside the model's context window).
        """
        if which not in ("input", "output"):
            raise InputError("mooncake", "which", "'input' or 'output'", which)
        if not (isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 0):
            raise InputError("mooncake", "scale", "a number > 0", scale)
        values = self.input_lengths if which == "input" else self.output_lengths
        return Distribution.empirical(values * float(scale), min=min, max=max)


def load_mooncake_lengths(path: str | os.PathLike[str]) -> MooncakeLengths:
    """Read a Mooncake JSONL trace; every error names the line and the field."""
    p = Path(path)
    src = str(p)
    ts: list[int] = []
    inputs: list[int] = []
    outputs: list[int] = []
    blocks: list[int] = []
    for lineno, raw in read_jsonl_objects(p, "Mooncake trace (.jsonl)", "request"):
        rec = validated(_MooncakeRecord, raw, src, f"line {lineno}: ",
                                  allowed=lambda _loc: list(_MooncakeRecord.model_fields))
        if any(h < 0 for h in rec.hash_ids):
            raise InputError(src, f"line {lineno}: hash_ids", "non-negative block ids",
                             min(rec.hash_ids))
        ts.append(rec.timestamp)
        inputs.append(rec.input_length)
        outputs.append(rec.output_length)
        blocks.append(len(rec.hash_ids))
    if not inputs:
        raise InputError(src, "", "at least one request record")
    return MooncakeLengths(_frozen(ts), _frozen(inputs), _frozen(outputs), _frozen(blocks))
