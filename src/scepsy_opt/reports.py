"""Moved to :mod:`scepsy_opt.prediction.reports`; this path stays importable."""

import sys

from scepsy_opt.prediction import reports as _moved

sys.modules[__name__] = _moved
