"""Moved to :mod:`scepsy_opt.ingest.record`; this path stays importable."""

import sys

from scepsy_opt.ingest import record as _moved

sys.modules[__name__] = _moved
