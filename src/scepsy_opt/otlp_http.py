"""Moved to :mod:`scepsy_opt.ingest.otlp_http`; this path stays importable."""

import sys

from scepsy_opt.ingest import otlp_http as _moved

sys.modules[__name__] = _moved
