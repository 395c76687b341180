"""Moved to :mod:`scepsy_opt.planning.candidates`; this path stays importable."""

import sys

from scepsy_opt.planning import candidates as _moved

sys.modules[__name__] = _moved
