"""The resumable result store of a sweep: one JSON file per finished (point, replication).

Layout of ``out_dir``::

    points/<point_id>-r<replication>.json   one finished run (written atomically: temp file + os.replace)
    sweep.json                              the expanded sweep (axes, column names, points)
    failures.csv                            runs that raised in the last invocation (absent if none)
    summary.csv, speedup.csv                tables (see :mod:`servesim.sweep.tables`)

A file in ``points/`` exists only once its run has finished, so a rerun after a crash skips exactly the
finished runs. Each stored run records its resolved inputs (:mod:`servesim.sweep.inputs`: the run
config, seed, cards, referenced files and servesim version and source digest) and their digest ``inputs_sha256``; a stored
run whose digest differs from the current one (an input was edited) is treated as not finished and rerun.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from servesim.atomic import atomic_file


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old file or the whole new one."""
    with atomic_file(path, "w", fsync=True, encoding="utf-8", newline="") as handle:
        handle.write(text)


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and tuples into plain JSON types (recursively).

    Raises:
        TypeError: a value that has no JSON form (named in the message).
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"summary value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def point_path(out_dir: Path, point_id: str, replication: int) -> Path:
    """Path of the stored result of (point, replication)."""
    return out_dir / "points" / f"{point_id}-r{replication}.json"


def write_result(out_dir: Path, record: dict[str, Any]) -> Path:
    """Store one finished run atomically; ``record`` holds ``point_id``, ``replication`` and ``summary``."""
    path = point_path(out_dir, record["point_id"], record["replication"])
    text = json.dumps(record, sort_keys=False, indent=1, allow_nan=True) + "\n"
    atomic_write_text(path, text)
    return path


def read_stored(out_dir: Path, point_id: str, replication: int) -> dict[str, Any] | None:
    """The stored record of (point, replication) as written, or None if absent or unreadable."""
    path = point_path(out_dir, point_id, replication)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if _is_run_record(record) else None


def _is_run_record(record: Any) -> bool:
    """Whether parsed JSON is a run's record as :func:`write_result` writes it: a mapping with an integer
    ``seed`` and a ``summary`` mapping whose ``output_throughput`` (tokens/s) is a number (an edited or
    damaged file that parses is no record: the tables would break on it, or lose its row)."""
    if not isinstance(record, dict) or not isinstance(record.get("summary"), dict):
        return False
    seed, throughput = record.get("seed"), record["summary"].get("output_throughput")
    return (isinstance(seed, int) and not isinstance(seed, bool)
            and isinstance(throughput, (int, float)) and not isinstance(throughput, bool))


def read_result(out_dir: Path, point_id: str, replication: int, digest: str) -> dict[str, Any] | None:
    """The stored record of (point, replication), or None if absent, unreadable or stored for other inputs
    (its ``inputs_sha256`` is not ``digest``)."""
    record = read_stored(out_dir, point_id, replication)
    if record is None or record.get("inputs_sha256") != digest:
        return None
    return record
