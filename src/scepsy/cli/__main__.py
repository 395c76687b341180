"""``python -m scepsy.cli ARGS`` runs ``scepsy ARGS``."""

import sys

from scepsy.cli import main

sys.exit(main())
