"""Moved to :mod:`scepsy_opt.ingest.otel`; this path stays importable."""

import sys

from scepsy_opt.ingest import otel as _moved

sys.modules[__name__] = _moved
