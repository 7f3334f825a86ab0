"""Where a sweep's runs execute: in this process, a local process pool, or a Dask cluster.

Every choice is a :class:`concurrent.futures.Executor` (or ``None`` for in-process serial runs), so the
runner is written once against that interface. Dask is an optional extra, imported only when asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor

from servesim.errors import ConfigError

DASK_HINT = "pip install servesim[dask]"


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


@contextlib.contextmanager
def open_executor(spec: str | Executor | None, jobs: int) -> Iterator[Executor | None]:
    """Yield the executor to run a sweep on, and shut down what this function started.

    Args:
        spec: an Executor the caller owns (used as is, never shut down here); or ``None``/``"local"``:
            serial in this process when ``jobs == 1`` (yields ``None``), else a ``ProcessPoolExecutor``
            of ``jobs`` workers; or ``"dask"``: a new ``distributed.LocalCluster`` (``jobs`` worker
            processes of one thread each when ``jobs > 1``, Dask's default otherwise); or
            ``"dask://HOST:PORT"``: the existing scheduler at that address. Dask executors come from
            ``distributed.Client.get_executor()``.
        jobs: number of local worker processes (>= 1).

    Raises:
        ConfigError: ``jobs < 1``, an unknown ``spec``, or Dask requested but not installed.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs: expected a positive integer (got {jobs!r})")
    if isinstance(spec, Executor):
        yield spec
        return
    kind, address = parse_executor(spec)
    if kind == "local":
        if jobs == 1:
            yield None
            return
        pool = ProcessPoolExecutor(max_workers=jobs)
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    distributed = _import_distributed()  # pragma: no cover - needs dask
    with contextlib.ExitStack() as stack:  # pragma: no cover - needs dask
        if address is None:
            workers = {"n_workers": jobs} if jobs > 1 else {}
            cluster = stack.enter_context(
                distributed.LocalCluster(processes=True, threads_per_worker=1, dashboard_address=None, **workers)
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
