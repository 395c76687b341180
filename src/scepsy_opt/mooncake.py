"""Moved to :mod:`scepsy_opt.ingest.mooncake`; this path stays importable."""

import sys

from scepsy_opt.ingest import mooncake as _moved

sys.modules[__name__] = _moved
