"""Moved to :mod:`scepsy_opt.prediction.simulate`; this path stays importable."""

import sys

from scepsy_opt.prediction import simulate as _moved

sys.modules[__name__] = _moved
