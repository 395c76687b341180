"""Moved to :mod:`scepsy_opt.planning.problem`; this path stays importable."""

import sys

from scepsy_opt.planning import problem as _moved

sys.modules[__name__] = _moved
