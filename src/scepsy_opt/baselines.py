"""Moved to :mod:`scepsy_opt.planning.baselines`; this path stays importable."""

import sys

from scepsy_opt.planning import baselines as _moved

sys.modules[__name__] = _moved
