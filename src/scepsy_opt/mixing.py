"""Moved to :mod:`scepsy_opt.planning.mixing`; this path stays importable."""

import sys

from scepsy_opt.planning import mixing as _moved

sys.modules[__name__] = _moved
