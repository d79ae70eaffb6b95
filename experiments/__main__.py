"""``python -m experiments NAME [options]`` from the root of a dpfy checkout (see :mod:`experiments.cli`)."""

import sys

from experiments.cli import main

sys.exit(main())
