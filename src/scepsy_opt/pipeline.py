"""Moved to :mod:`scepsy_opt.prediction.pipeline`; this path stays importable."""

import sys

from scepsy_opt.prediction import pipeline as _moved

sys.modules[__name__] = _moved
