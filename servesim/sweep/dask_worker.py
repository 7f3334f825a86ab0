"""Set-up of the worker processes of the local Dask clusters a sweep starts (``--executor dask``), loaded
in each as a Dask preload (a module with ``dask_setup``: distributed's "Customizing initialization")."""

from __future__ import annotations

import signal


def dask_setup(worker) -> None:
    """Ignore SIGINT in this worker process: Ctrl-C in a terminal reaches every process of the group, the
    sweep's own process handles it and closes the cluster, and an interrupted worker would print Dask's
    tracebacks after ``servesim: interrupted`` (``worker``: the ``distributed.Worker``, unused)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
