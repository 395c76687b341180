"""Program-level scheduling priorities: least attained service (LAS) over a workflow request.

An agentic request makes many LLM calls. Per-call first-come-first-served lets a long request's
later calls delay every short request queued behind them; Autellix (program-level LAS) instead
favours the calls of requests that have received little service so far. One definition serves the
gateway (which sets vLLM's per-call ``priority`` under ``--scheduling-policy priority``) and the
simulator (which orders each replica's waiting queue by it):

* a request's **attained service** is the number of tokens (prompt plus output) of its LLM calls
  that have finished so far;
* its **priority level** is ``floor(log2(1 + attained / LAS_QUANTUM_TOKENS))``, capped at
  :data:`LAS_LEVELS` ``- 1``: level 0 for a request that has received less than one quantum,
  one level more each time its service doubles (Autellix's discretised queues). Lower is served
  first, as in vLLM; calls of one level are served first come, first served.

Under ``fcfs`` every call has level 0.
"""

from __future__ import annotations

import math
from typing import Literal

PriorityPolicy = Literal["fcfs", "las"]
PRIORITY_POLICIES: tuple[PriorityPolicy, ...] = ("fcfs", "las")
LAS_QUANTUM_TOKENS = 2048
"""Tokens of service in the first level (about one RAG call: a 2k-token prompt)."""
LAS_LEVELS = 16
"""Levels above the first grow by doubling: 16 levels cover 2^15 quanta (67M tokens)."""


def las_level(attained_tokens: int | float) -> int:
    """The LAS priority level of a request that has received ``attained_tokens`` tokens of
    service (0: served first)."""
    if not (attained_tokens >= 0):  # also NaN
        raise ValueError(f"attained service must be >= 0 tokens, got {attained_tokens!r}")
    if math.isinf(attained_tokens):
        return LAS_LEVELS - 1
    level = math.floor(math.log2(1.0 + float(attained_tokens) / LAS_QUANTUM_TOKENS))
    return min(level, LAS_LEVELS - 1)


def priority_level(policy: PriorityPolicy, attained_tokens: int | float) -> int:
    """The level a call gets under ``policy`` (``fcfs``: always 0)."""
    if policy == "fcfs":
        return 0
    if policy == "las":
        return las_level(attained_tokens)
    raise ValueError(f"priority policy must be one of {PRIORITY_POLICIES}, got {policy!r}")
