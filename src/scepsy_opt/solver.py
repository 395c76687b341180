"""Moved to :mod:`scepsy_opt.planning.solver`; this path stays importable."""

import sys

from scepsy_opt.planning import solver as _moved

sys.modules[__name__] = _moved
