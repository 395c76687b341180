"""scepsy_profile: hardware and model catalog, measurements, fitted and analytical latency curves.

The public API the later stages use:

* catalog: :class:`GPUSpec`, :class:`ModelSpec` (its architecture fields: :class:`TransformerShape`),
  :class:`Catalog`, :func:`default_catalog`;
* measurements: :class:`Measurement`, :func:`read_measurements`, :func:`write_measurements` and the
  importers :func:`load_muxserve_grid`, :func:`load_vidur_mlp`, :func:`load_vidur_all_reduce`,
  :func:`load_distserve_profile`;
* latency models (the :class:`LatencyModel` protocol): :func:`fit_latency_model` (measured curves),
  :func:`roofline_model` (analytical), :class:`CompositeLatencyModel` (measured over analytical);
  :func:`measured_shares` (the shares a model's answers for an instance were measured over);
* serving: :func:`serving_curve` and :func:`memory_fit` for one instance (model, gpu, tp, share);
* engine overheads: :class:`EngineOverheads`, :func:`load_overheads`, :func:`save_overheads` and
  :func:`with_overheads` (the calibrated terms a step profile does not see).
"""

from scepsy_common.errors import InputError, UncoveredInstanceError, UnknownEntryError
from scepsy_profile.catalog import (
    Catalog,
    default_catalog,
    dump_catalog,
    load_catalog,
    parse_catalog,
    save_catalog,
)
from scepsy_profile.fitted import (
    CurveTable,
    FittedLatencyModel,
    cross_validate,
    fit_curve,
    fit_latency_model,
    load_curves,
    save_curves,
)
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.importers import (
    CollectiveTiming,
    DistServeCoefficients,
    OperatorTiming,
    distserve_measurements,
    load_distserve_profile,
    load_max_num_tokens,
    load_muxserve_grid,
    load_vidur_all_reduce,
    load_vidur_mlp,
    vidur_layer_time_ms,
)
from scepsy_profile.latency import CompositeLatencyModel, LatencyModel, measured_shares
from scepsy_profile.measurements import Measurement, read_measurements, write_measurements
from scepsy_profile.models import ModelSpec, TransformerShape
from scepsy_profile.overheads import (
    NO_OVERHEADS,
    EngineOverheads,
    load_overheads,
    save_overheads,
    with_overheads,
)
from scepsy_profile.roofline import (
    RooflineCalibration,
    RooflineModel,
    calibrate_roofline,
    load_calibration,
    roofline_model,
    save_calibration,
)
from scepsy_profile.serving import MemoryFit, MemoryPolicy, ServingCurve, memory_fit, serving_curve
from scepsy_profile.synthetic import synthetic_measurements

__all__ = [
    "NO_OVERHEADS",
    "Catalog",
    "CollectiveTiming",
    "CompositeLatencyModel",
    "CurveTable",
    "DistServeCoefficients",
    "EngineOverheads",
    "FittedLatencyModel",
    "GPUSpec",
    "InputError",
    "LatencyModel",
    "Measurement",
    "MemoryFit",
    "MemoryPolicy",
    "ModelSpec",
    "OperatorTiming",
    "RooflineCalibration",
    "RooflineModel",
    "ServingCurve",
    "TransformerShape",
    "UncoveredInstanceError",
    "UnknownEntryError",
    "calibrate_roofline",
    "cross_validate",
    "default_catalog",
    "distserve_measurements",
    "dump_catalog",
    "fit_curve",
    "fit_latency_model",
    "load_calibration",
    "load_catalog",
    "load_curves",
    "load_distserve_profile",
    "load_max_num_tokens",
    "load_muxserve_grid",
    "load_overheads",
    "load_vidur_all_reduce",
    "load_vidur_mlp",
    "measured_shares",
    "memory_fit",
    "parse_catalog",
    "read_measurements",
    "roofline_model",
    "save_calibration",
    "save_catalog",
    "save_curves",
    "save_overheads",
    "serving_curve",
    "synthetic_measurements",
    "vidur_layer_time_ms",
    "with_overheads",
    "write_measurements",
]
