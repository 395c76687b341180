"""The one rule of every rate a user gives (``--rate``, ``--target``, a workflow's target, a
load event's result): a finite number of requests/s in [:data:`MIN_RATE`, :data:`MAX_RATE`].

Light on purpose (no pydantic, no numpy): the command line's argument types use it.
:func:`scepsy_common.errors.check_rate` turns a value that breaks the rule into an
:class:`~scepsy_common.errors.InputError`.
"""

from __future__ import annotations

import math

MIN_RATE = 1e-6
"""The smallest rate (requests/s): one request in about 11.6 days. Below it throughputs and
latencies leave the floating-point range (a rate of 1e-320 made the maximum throughput inf)."""
MAX_RATE = 1e6
"""The largest rate (requests/s, or calls/s for one LLM of a rate workload)."""
RATE_EXPECTED = f"a rate in [{MIN_RATE:g}, {MAX_RATE:g}] requests/s"
"""The rate rule in words: every rate flag, target and load event says it."""


def is_rate(value: object) -> bool:
    """Whether ``value`` is a rate: a finite number (not a bool) in [:data:`MIN_RATE`,
    :data:`MAX_RATE`]."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and MIN_RATE <= value <= MAX_RATE)

