"""``python -m servesim ...``: the same command line as the ``servesim`` console script."""

import sys

from servesim.cli import main

sys.exit(main())
