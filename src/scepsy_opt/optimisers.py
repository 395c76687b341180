"""Moved to :mod:`scepsy_opt.planning.optimisers`; this path stays importable."""

import sys

from scepsy_opt.planning import optimisers as _moved

sys.modules[__name__] = _moved
