"""Where a sweep's runs execute: in this process, a local process pool, or a Dask cluster.

Every choice is a :class:`concurrent.futures.Executor` (or ``None`` for in-process serial runs), so the
runner is written once against that interface. Dask is an optional extra, imported only when asked for.

Local worker processes die with the sweep: when the block using the pool raises (Ctrl-C, or SIGTERM,
which the command line turns into the same interrupt) their processes are terminated at once instead of
finishing their runs; and each worker watches its parent, so that a parent killed with SIGKILL takes its
workers with it (Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, immediately; elsewhere, and as a second
guard, a thread that exits the worker within :data:`ORPHAN_POLL_S` of its parent's death).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor

from servesim.errors import ConfigError

DASK_HINT = "pip install servesim[dask]"
#: How often (s) a worker checks that its parent is still alive.
ORPHAN_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid: int) -> None:
    """Initializer of local worker processes: end this process when the sweep process ``parent_pid`` dies.

    Ctrl-C in a terminal reaches every process of the group; the parent handles it (and terminates the
    workers), so workers ignore SIGINT and take SIGTERM's default action.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the watchdog below still works
            pass
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            threading.Event().wait(ORPHAN_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="servesim-orphan-watch", daemon=True).start()


@contextlib.contextmanager
def _local_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """A process pool whose workers die with this process; on an exception they are terminated at once."""
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_die_with_parent, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        manager = getattr(pool, "_executor_manager_thread", None)  # (shutdown forgets it)
        pool.shutdown(wait=False, cancel_futures=True)
        workers = [p for p in multiprocessing.active_children() if p not in before]
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
        if manager is not None:
            # the pool's manager thread ends once it sees its workers gone; left running into the
            # interpreter's exit it can write to a closed pipe ("Exception ignored ... Bad file descriptor",
            # CPython gh-132969, fixed after 3.13)
            manager.join(timeout=5)
        raise
    pool.shutdown(wait=True, cancel_futures=True)


def parse_executor(spec: str | None) -> tuple[str, str | None]:
    """Parse ``--executor``: ``local`` (or None), ``dask`` or ``dask://HOST:PORT``.

    Returns:
        ``("local", None)``, ``("dask", None)`` (a new local Dask cluster) or ``("dask", "tcp://HOST:PORT")``.

    Raises:
        ConfigError: any other text, or ``dask://`` without ``HOST:PORT``.
    """
    if spec is None or spec == "local":
        return "local", None
    if spec == "dask":
        return "dask", None
    if spec.startswith("dask://"):
        address = spec.removeprefix("dask://")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--executor: expected dask://HOST:PORT (got {spec!r})")
        return "dask", f"tcp://{address}"
    raise ConfigError(f"--executor: expected local, dask or dask://HOST:PORT (got {spec!r})")


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise ConfigError(f"--executor dask: dask.distributed is not installed ({DASK_HINT})") from None
    return distributed


MAX_JOBS_PER_CPU = 4
"""Most local worker processes per CPU that ``--jobs`` may ask for (the simulation is CPU-bound)."""


def check_executor(spec: str | Executor | None, jobs: int) -> tuple[str, str | None]:
    """Check ``--executor`` and ``--jobs`` without starting anything (see :func:`open_executor`).

    Returns:
        :func:`parse_executor`'s ``(kind, address)``; ``("given", None)`` for an Executor instance.

    Raises:
        ConfigError: ``jobs < 1``, more local workers than :data:`MAX_JOBS_PER_CPU` per CPU, or an unknown
            ``spec``.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs: expected a positive integer (got {jobs!r})")
    if isinstance(spec, Executor):
        return "given", None
    kind, address = parse_executor(spec)
    most = MAX_JOBS_PER_CPU * (os.cpu_count() or 1)
    if address is None and jobs > most:  # local processes: a pool forks all of its workers at once
        raise ConfigError(f"--jobs: {jobs} worker processes on {os.cpu_count() or 1} CPU(s); expected at most "
                          f"{most} ({MAX_JOBS_PER_CPU} per CPU: more only slow the runs down and exhaust memory)")
    return kind, address


@contextlib.contextmanager
def open_executor(spec: str | Executor | None, jobs: int) -> Iterator[Executor | None]:
    """Yield the executor to run a sweep on, and shut down what this function started.

    Args:
        spec: an Executor the caller owns (used as is, never shut down here); or ``None``/``"local"``:
            serial in this process when ``jobs == 1`` (yields ``None``), else a ``ProcessPoolExecutor``
            of ``jobs`` workers that die with this process (see the module docstring); or ``"dask"``: a
            new ``distributed.LocalCluster`` (``jobs`` worker processes of one thread each when
            ``jobs > 1``, Dask's default otherwise); or
            ``"dask://HOST:PORT"``: the existing scheduler at that address. Dask executors come from
            ``distributed.Client.get_executor()``.
        jobs: number of local worker processes (>= 1).

    Raises:
        ConfigError: ``jobs < 1``, an unknown ``spec``, or Dask requested but not installed.
    """
    kind, address = check_executor(spec, jobs)
    if isinstance(spec, Executor):
        yield spec
        return
    if kind == "local":
        if jobs == 1:
            yield None
            return
        with _local_pool(jobs) as pool:
            yield pool
        return
    distributed = _import_distributed()  # pragma: no cover - needs dask
    with contextlib.ExitStack() as stack:  # pragma: no cover - needs dask
        if address is None:
            workers = {"n_workers": jobs} if jobs > 1 else {}
            # critical messages only: closing the cluster (after the last run, or on Ctrl-C mid-run) stops
            # the scheduler while its workers still run, and Dask's warnings and errors about that (cancelled
            # tasks, workers killed after the nanny's grace period, a worker's heartbeat to a closed
            # scheduler) are not the user's to act on; a run's own error reaches the sweep as its exception
            cluster = stack.enter_context(
                distributed.LocalCluster(processes=True, threads_per_worker=1, dashboard_address=None,
                                         silence_logs=logging.CRITICAL, preload=["servesim.sweep.dask_worker"],
                                         **workers)
            )
            client = stack.enter_context(distributed.Client(cluster))
        else:
            try:
                client = stack.enter_context(distributed.Client(address, timeout=30))
            except OSError as exc:
                raise ConfigError(f"--executor dask://{address.removeprefix('tcp://')}: cannot reach the scheduler ({exc})") from None
        executor = client.get_executor(pure=False)
        try:
            yield executor
        finally:
            executor.shutdown(wait=False)
