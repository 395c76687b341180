"""Moved to :mod:`scepsy_opt.prediction.slo`; this path stays importable."""

import sys

from scepsy_opt.prediction import slo as _moved

sys.modules[__name__] = _moved
