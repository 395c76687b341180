"""Moved to :mod:`scepsy_opt.planning.instances`; this path stays importable."""

import sys

from scepsy_opt.planning import instances as _moved

sys.modules[__name__] = _moved
