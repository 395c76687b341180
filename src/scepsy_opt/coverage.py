"""Moved to :mod:`scepsy_opt.planning.coverage`; this path stays importable."""

import sys

from scepsy_opt.planning import coverage as _moved

sys.modules[__name__] = _moved
