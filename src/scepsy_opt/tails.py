"""Moved to :mod:`scepsy_opt.prediction.tails`; this path stays importable."""

import sys

from scepsy_opt.prediction import tails as _moved

sys.modules[__name__] = _moved
