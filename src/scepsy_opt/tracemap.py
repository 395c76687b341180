"""Moved to :mod:`scepsy_opt.ingest.tracemap`; this path stays importable."""

import sys

from scepsy_opt.ingest import tracemap as _moved

sys.modules[__name__] = _moved
