"""Importers that turn published profiling data into :class:`~scepsy_profile.Measurement` s."""

from scepsy_profile.importers.distserve import (
    DistServeCoefficients,
    distserve_measurements,
    load_distserve_profile,
    load_max_num_tokens,
)
from scepsy_profile.importers.muxserve import load_muxserve_grid
from scepsy_profile.importers.vidur import (
    CollectiveTiming,
    OperatorTiming,
    load_vidur_all_reduce,
    load_vidur_mlp,
    vidur_layer_time_ms,
)

__all__ = [
    "CollectiveTiming", "DistServeCoefficients", "OperatorTiming", "distserve_measurements",
    "load_distserve_profile", "load_max_num_tokens", "load_muxserve_grid", "load_vidur_all_reduce",
    "load_vidur_mlp", "vidur_layer_time_ms",
]
