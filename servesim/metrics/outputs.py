"""Writing one run's results: ``summary.json``, ``requests.csv``, ``steps.csv`` (no pandas import).

Every file is first written to a temporary name in the output folder and then renamed over its final
name with :func:`os.replace` (atomic on POSIX and Windows), so a crash never leaves a half-written file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

import numpy as np

from servesim.atomic import atomic_file
from servesim.engine.output import EngineOutput, StepLog
from servesim.metrics.csv_text import iter_csv_chunks
from servesim.metrics.latencies import request_latencies
from servesim.metrics.summary import json_safe

#: Column order of ``requests.csv`` (times and latencies in seconds, counts in tokens); a multi-replica
#: run adds :data:`REPLICA_COLUMN` last.
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id", "arrival_s", "prompt_tokens", "output_tokens", "generated_tokens",
    "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions",
    "first_scheduled_s", "first_token_s", "finish_s", "num_cached_tokens",
)
#: Column order of ``steps.csv``: every :class:`StepLog` field, in its declaration order; a multi-replica
#: run adds :data:`REPLICA_COLUMN` last.
STEP_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StepLog) if f.name != "durations_s")
#: The last column of ``requests.csv`` and ``steps.csv`` in a multi-replica run (``deployment.replicas >
#: 1``): the replica (0-based) that served the request (-1: never routed) or whose step the row is.
REPLICA_COLUMN = "replica"


def request_columns(out: EngineOutput) -> dict[str, np.ndarray]:
    """The columns of ``requests.csv`` (see :data:`REQUEST_COLUMNS`), each shape (N,); NaN where undefined.

    Latencies follow :mod:`servesim.metrics.latencies` (TTFT, TPOT, E2E, queueing delay, in seconds).
    """
    req = out.requests
    lat = request_latencies(req)
    data = {name: np.asarray(getattr(req, name)) for name in REQUEST_COLUMNS if hasattr(req, name)}
    data.update({key: lat[key] for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s")})
    columns = {name: data[name] for name in REQUEST_COLUMNS}
    if out.request_replica is not None:
        columns[REPLICA_COLUMN] = out.request_replica
    return columns


def step_columns(out: EngineOutput) -> dict[str, np.ndarray]:
    """The columns of ``steps.csv``: every :class:`StepLog` field (see :data:`STEP_COLUMNS`), shape (R,),
    then :data:`REPLICA_COLUMN` in a multi-replica run."""
    columns = {name: np.asarray(getattr(out.steps, name)) for name in STEP_COLUMNS}
    if out.step_replica is not None:
        columns[REPLICA_COLUMN] = out.step_replica
    return columns


def atomic_write(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` through a temporary file in the same folder and :func:`os.replace`.

    The temporary file (``.<name>.*.tmp``) is removed if writing fails; ``path`` then keeps its previous
    content (or does not exist).

    Raises:
        OSError: the folder is not writable, the disk is full, ...
    """
    with atomic_file(path, "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)


def write_outputs(out: EngineOutput, summary: dict, out_dir: Path) -> None:
    """Write ``summary.json``, ``requests.csv`` and ``steps.csv`` into ``out_dir`` (created if needed).

    * ``summary.json``: ``summary`` as strict JSON (numpy scalars converted, NaN/inf written as null),
      indented, keys in the summary's order.
    * ``requests.csv``: one row per request, columns :data:`REQUEST_COLUMNS` (then :data:`REPLICA_COLUMN`
      in a multi-replica run).
    * ``steps.csv``: one row per :class:`StepLog` row, columns :data:`STEP_COLUMNS` (then
      :data:`REPLICA_COLUMN` in a multi-replica run).

    CSV floats are written at full precision (each reads back as the same float64; the engine's
    picosecond times as their exact decimal) and NaN is an empty field (see
    :mod:`servesim.metrics.csv_text`); lines end with ``\\n``. Each file is written atomically
    (:func:`atomic_write`), ``summary.json`` last: its presence
    means the CSVs are complete.

    Raises:
        OSError: ``out_dir`` cannot be created or written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n"
    atomic_write(out_dir / "requests.csv", iter_csv_chunks(request_columns(out), full_precision=True))
    atomic_write(out_dir / "steps.csv", iter_csv_chunks(step_columns(out), full_precision=True))
    # last: a summary.json beside them says the files are complete, also after a kill -9 mid-write (which
    # no cleanup can follow)
    atomic_write(out_dir / "summary.json", [text.encode("utf-8")])
