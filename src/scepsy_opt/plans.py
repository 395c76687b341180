"""Moved to :mod:`scepsy_opt.planning.plans`; this path stays importable."""

import sys

from scepsy_opt.planning import plans as _moved

sys.modules[__name__] = _moved
