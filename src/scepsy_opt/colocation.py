"""Moved to :mod:`scepsy_opt.prediction.colocation`; this path stays importable."""

import sys

from scepsy_opt.prediction import colocation as _moved

sys.modules[__name__] = _moved
