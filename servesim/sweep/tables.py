"""The tables a sweep writes: ``summary.csv`` (one tidy row per run) and ``speedup.csv``.

Rows follow the sweep's expansion order, then replication, whichever executor ran them and in whatever
order they finished, so the files are identical bit for bit across executors.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.sweep.points import Point
from servesim.sweep.spec import LoadedSweep
from servesim.sweep.store import atomic_write_text

#: The metric compared in speedup.csv (tokens/s, from ``Result.summary``).
SPEEDUP_METRIC = "output_throughput"


def flatten_metrics(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings of scalars: ``{"ttft_s": {"p99": 0.2}}`` -> ``{"ttft_s.p99": 0.2}``.

    Lists of numbers become one column per position, numbered from 1
    (``spec_decode.per_position_acceptance_rate.1``, ...); other lists and non-scalar values are left out.
    """
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, f"{name}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[name] = value
        elif isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            for i, v in enumerate(value, start=1):
                flat[f"{name}.{i}"] = v
    return flat


def cell(value: Any) -> Any:
    """A swept value as a CSV cell: scalars as they are, lists and mappings as canonical JSON."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def summary_frame(sweep: LoadedSweep, records: Sequence[tuple[Point, int, dict[str, Any]]]) -> pd.DataFrame:
    """One row per stored run: swept columns, ``variant``, ``replication``, ``seed``, ``point_id``, metrics.

    Args:
        sweep: the sweep (for the swept keys and their column names).
        records: ``(point, replication, stored record)`` in row order; a record holds ``seed`` and
            ``summary`` (the simulator's ``Result.summary``).

    Returns:
        a DataFrame whose metric columns are the union of the flattened summaries, in first-seen order.
    """
    names = sweep.config.column_names()
    rows = []
    for point, replication, record in records:
        row: dict[str, Any] = {names[key]: cell(point.axes[key]) for key in names}
        row.update(variant=point.variant, replication=replication, seed=record["seed"], point_id=point.point_id)
        for metric, value in flatten_metrics(record["summary"]).items():
            row.setdefault(metric, value)
        rows.append(row)
    columns = list(names.values()) + ["variant", "replication", "seed", "point_id"]
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    return pd.DataFrame(rows, columns=columns)


def speculative_variants(summary: pd.DataFrame) -> set[str]:
    """The variants (as text) of ``summary`` whose runs used speculative decoding.

    A run did when its row has a ``spec_decode.*`` value (the simulator reports vLLM's speculative
    counters only for a speculative run, :func:`servesim.metrics.summary.spec_decode_summary`).
    """
    columns = [c for c in summary.columns if str(c).startswith("spec_decode.")]
    if not columns or "variant" not in summary.columns:
        return set()
    used = summary[columns].notna().any(axis=1)
    return set(summary.loc[used, "variant"].astype(str))


def is_speculative_comparison(summary: pd.DataFrame, baseline: str | None) -> bool:
    """True when the baseline variant ran without speculative decoding and every other variant with it.

    Such a sweep's ``speedup.csv`` is the speedup of speculative decoding; any other comparison (two
    schedulers, two routers, two GPUs) is a plain ratio of throughputs to the baseline's.
    """
    if baseline is None or "variant" not in summary.columns:
        return False
    variants = set(summary["variant"].astype(str))
    speculative = speculative_variants(summary)
    others = variants - {str(baseline)}
    return str(baseline) not in speculative and bool(others) and others <= speculative


def speedup_frame(sweep: LoadedSweep, summary: pd.DataFrame) -> pd.DataFrame:
    """Compare every non-baseline variant with the baseline at each setting of the swept keys.

    The throughput of a (setting, variant) is the mean ``output_throughput`` (tokens/s) over its
    replications; ``speedup = variant_output_throughput / baseline_output_throughput`` (ratio of means).
    A setting appears only where both the baseline and the variant have at least one finished run.

    Columns: the swept columns, then ``variant``, ``baseline_output_throughput``,
    ``variant_output_throughput``, ``speedup``. When the sweep compares exactly two variants, a baseline
    without speculative decoding and one with it (:func:`is_speculative_comparison`), the ``variant``
    column is dropped and the throughput columns are named ``plain_output_throughput`` and
    ``spec_output_throughput`` (e.g. ``batch_size, plain_output_throughput, spec_output_throughput,
    speedup``).

    Raises:
        KeyError: the summaries have no ``output_throughput``.
    """
    cfg = sweep.config
    baseline = cfg.baseline
    assert baseline is not None
    axis_columns = list(cfg.column_names().values())
    if SPEEDUP_METRIC not in summary.columns:
        raise KeyError(SPEEDUP_METRIC)
    means: dict[tuple[tuple[str, ...], str], float] = {}
    order: list[tuple[str, ...]] = []
    settings: dict[tuple[str, ...], list[Any]] = {}
    for (key, variant), group in _groups(summary, axis_columns):
        values = group[SPEEDUP_METRIC].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        if values.size:
            means[(key, variant)] = float(np.mean(values))
        if key not in settings:
            settings[key] = list(group.iloc[0][axis_columns]) if axis_columns else []
            order.append(key)
    pair = len(cfg.variants) == 2 and is_speculative_comparison(summary, baseline)
    base_name, other_name = ("plain", "spec") if pair else ("baseline", "variant")
    rows = []
    for key in order:
        if (key, baseline) not in means:
            continue
        for variant in cfg.variants:
            if variant == baseline or (key, variant) not in means:
                continue
            base, other = means[(key, baseline)], means[(key, variant)]
            row = dict(zip(axis_columns, settings[key]))
            if not pair:
                row["variant"] = variant
            row[f"{base_name}_{SPEEDUP_METRIC}"] = base
            row[f"{other_name}_{SPEEDUP_METRIC}"] = other
            row["speedup"] = other / base if base != 0 else float("nan")
            rows.append(row)
    columns = axis_columns + ([] if pair else ["variant"])
    columns += [f"{base_name}_{SPEEDUP_METRIC}", f"{other_name}_{SPEEDUP_METRIC}", "speedup"]
    return pd.DataFrame(rows, columns=columns)


def _groups(summary: pd.DataFrame, axis_columns: list[str]):
    # Group rows by (setting of the swept columns, variant) in first-seen order, treating missing and
    # JSON-encoded values as plain text keys so that None/NaN settings group too.
    keys: dict[tuple[tuple[str, ...], str], list[int]] = {}
    for i, row in enumerate(summary[axis_columns + ["variant"]].itertuples(index=False, name=None)):
        key = tuple(repr(v) for v in row[:-1])
        keys.setdefault((key, row[-1]), []).append(i)
    for group_key, index in keys.items():
        yield group_key, summary.iloc[index]


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as CSV (no index, ``\\n`` line ends) atomically."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    atomic_write_text(path, buffer.getvalue())
