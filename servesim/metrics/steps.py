"""Per-step quantities from a run-length-encoded :class:`StepLog`, vectorised (no loop over steps).

A StepLog row stands for ``num_steps`` consecutive steps; step ``i`` of the row lasts
``first_step_s + i * step_increment_s`` seconds (see :mod:`servesim.engine.output`).
"""

from __future__ import annotations

import numpy as np

from servesim.engine.output import EngineOutput, StepLog
from servesim.roofline import PS_PER_S


def expand_step_durations(steps: StepLog, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Duration of every individual step, expanded from the runs.

    Args:
        steps: the step log (R rows).
        rows: optional bool mask or index array selecting the rows to expand (default: all).

    Returns:
        ``(durations_s, row)``: float64 shape (S,) step durations in seconds, and int64 shape (S,) the
        StepLog row each step came from, where S is the total ``num_steps`` of the selected rows.
    """
    index = np.arange(len(steps), dtype=np.int64)
    if rows is not None:
        index = index[rows]
    counts = np.asarray(steps.num_steps, dtype=np.int64)[index]
    row = np.repeat(index, counts)
    first = np.cumsum(counts) - counts  # position of each row's first step in the expansion
    i = np.arange(row.shape[0], dtype=np.int64) - np.repeat(first, counts)
    if steps.durations_s is not None:
        exact = np.asarray(steps.durations_s, dtype=np.float64)
        if rows is None:
            return exact, row
        starts = np.cumsum(np.asarray(steps.num_steps, dtype=np.int64)) - np.asarray(steps.num_steps, dtype=np.int64)
        return exact[np.repeat(starts[index], counts) + i], row
    # The engine's clock is integer picoseconds: rebuild each step's exact integer duration before
    # converting, so that a run of n steps expands to exactly the n durations of stepping one at a time.
    ps = float(PS_PER_S)
    first_ps = np.rint(np.asarray(steps.first_step_s, dtype=np.float64) * ps).astype(np.int64)
    inc_ps = np.rint(np.asarray(steps.step_increment_s, dtype=np.float64) * ps).astype(np.int64)
    durations = (first_ps[row] + i * inc_ps[row]) / ps
    return durations, row


def itl_samples(out: EngineOutput) -> tuple[np.ndarray, np.ndarray]:
    """All inter-token latencies (ITL) of a run as weighted samples.

    ITL = every gap between two consecutive token emissions of the same request. The multiset is each
    step's duration repeated ``itl_samples`` times (its row's count), plus every value of
    ``out.extra_itl_s`` once (gaps across a preemption). Rows with ``itl_samples == 0`` are skipped.

    Returns:
        ``(values_s, weights)``: float64 seconds and int64 repeat counts, both shape (m,); the ITL sample
        is ``np.repeat(values_s, weights)``.
    """
    samples = np.asarray(out.steps.itl_samples, dtype=np.int64)
    durations, row = expand_step_durations(out.steps, samples > 0)
    extra = np.asarray(out.extra_itl_s, dtype=np.float64)
    values = np.concatenate([durations, extra])
    weights = np.concatenate([samples[row], np.ones(extra.shape[0], dtype=np.int64)])
    return values, weights


def time_weighted(values: np.ndarray, durations_s: np.ndarray) -> dict[str, float | None]:
    """``{mean, max}`` of a per-row quantity, the mean weighted by each row's duration (seconds).

    The mean is ``sum(values * durations_s) / sum(durations_s)``, i.e. the average over busy time (idle
    gaps between steps are not counted); if every duration is zero it is the plain mean. With no rows
    both are ``None``.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"mean": None, "max": None}
    durations_s = np.asarray(durations_s, dtype=np.float64)
    total = float(durations_s.sum())
    mean = float(np.sum(values * durations_s) / total) if total > 0 else float(values.mean())
    return {"mean": mean, "max": float(values.max())}
