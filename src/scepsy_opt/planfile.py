"""Moved to :mod:`scepsy_opt.planning.planfile`; this path stays importable."""

import sys

from scepsy_opt.planning import planfile as _moved

sys.modules[__name__] = _moved
