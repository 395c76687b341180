"""Moved to :mod:`scepsy_opt.planning.mincost`; this path stays importable."""

import sys

from scepsy_opt.planning import mincost as _moved

sys.modules[__name__] = _moved
