"""scepsy_profile: hardware and model catalog, measurements, fitted and analytical latency curves."""

from scepsy_profile.errors import InputError, UnknownEntryError
from scepsy_profile.importers import load_muxserve_grid
from scepsy_profile.measurements import Measurement, read_measurements, write_measurements

__all__ = [
    "InputError",
    "Measurement",
    "UnknownEntryError",
    "load_muxserve_grid",
    "read_measurements",
    "write_measurements",
]
