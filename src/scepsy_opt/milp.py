"""Moved to :mod:`scepsy_opt.planning.milp`; this path stays importable."""

import sys

from scepsy_opt.planning import milp as _moved

sys.modules[__name__] = _moved
