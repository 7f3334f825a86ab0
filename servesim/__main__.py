"""``python -m servesim ...``: the same command line as the ``servesim`` console script."""

from servesim.cli import console_main

console_main()
