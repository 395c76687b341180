"""GPU specifications: the public numbers the analytical latency model and the placer need.

Units are the ones datasheets and ``nvidia-smi`` use, so an entry can be checked by eye:

* ``memory_gib``: usable device memory in GiB (2**30 bytes), i.e. the ``MiB`` total that
  ``nvidia-smi`` prints divided by 1024 (an H100 SXM prints ``81559MiB`` -> 79.65 GiB);
* ``bf16_tflops``: dense BF16 tensor-core peak in TFLOPS (10**12 FLOP/s), *without* the 2:4
  sparsity factor that datasheets often quote first;
* ``hbm_gbps``: device-memory bandwidth in GB/s (10**9 bytes/s);
* ``nvlink_domain``: how many GPUs share one NVLink/NVSwitch domain (8 for an HGX board, 72 for a
  GB200 NVL72 rack, 1 for PCIe-only cards);
* ``interconnect_gbps``: per-GPU NVLink bandwidth in GB/s as the datasheet states it (total of
  both directions), or the PCIe bandwidth for cards whose domain is 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scepsy_common.errors import InputError

GIB = 2**30
"""Bytes in one GiB."""


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU model: memory, peak compute, memory bandwidth and interconnect."""

    name: str
    memory_gib: float
    bf16_tflops: float
    hbm_gbps: float
    nvlink_domain: int
    interconnect_gbps: float

    def __post_init__(self) -> None:
        source = f"GPU {self.name!r}"
        _check_name(self.name, "GPU")
        for field in ("memory_gib", "bf16_tflops", "hbm_gbps", "interconnect_gbps"):
            _check_positive_number(getattr(self, field), source, field)
            object.__setattr__(self, field, float(getattr(self, field)))  # 80 and 80.0 alike
        _check_positive_int(self.nvlink_domain, source, "nvlink_domain")

    @property
    def memory_bytes(self) -> int:
        """Usable device memory in bytes: ``memory_gib * 2**30`` (rounded down)."""
        return int(self.memory_gib * GIB)

    @property
    def peak_flops(self) -> float:
        """Dense BF16 peak in FLOP/s: ``bf16_tflops * 1e12``."""
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        """Device-memory bandwidth in bytes/s: ``hbm_gbps * 1e9``."""
        return self.hbm_gbps * 1e9

    @property
    def interconnect_bytes_per_s(self) -> float:
        """Per-GPU interconnect bandwidth in bytes/s: ``interconnect_gbps * 1e9``."""
        return self.interconnect_gbps * 1e9


def _check_name(name: object, kind: str) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise InputError(f"{kind} {name!r}", "name", "a non-empty name without surrounding spaces",
                         name)


def _check_positive_number(value: object, source: str, field: str) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
    if not ok:
        raise InputError(source, field, "a number > 0", value)


def _check_positive_int(value: object, source: str, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(source, field, "an integer >= 1", value)
