"""Per-step quantities from a run-length-encoded :class:`StepLog`, vectorised (no loop over steps).

A StepLog row stands for ``num_steps`` consecutive steps; step ``i`` of the row lasts
``first_step_s + i * step_increment_s`` seconds (see :mod:`servesim.engine.output`).
"""

from __future__ import annotations

import operator

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
    if steps.durations_s is not None:
        exact = np.asarray(steps.durations_s, dtype=np.float64)
        if rows is None:
            return exact, row
        rows = np.asarray(rows)
        if rows.dtype == bool:  # the selected rows' steps, in order: one mask over the steps
            return exact[np.repeat(rows, np.asarray(steps.num_steps, dtype=np.int64))], row
    first = np.cumsum(counts) - counts  # position of each row's first step in the expansion
    i = np.arange(row.shape[0], dtype=np.int64) - np.repeat(first, counts)
    if steps.durations_s is not None:
        starts = np.cumsum(np.asarray(steps.num_steps, dtype=np.int64)) - np.asarray(steps.num_steps, dtype=np.int64)
        return exact[np.repeat(starts[index], counts) + i], row
    # The engine's clock is integer picoseconds: rebuild each step's exact integer duration before
    # converting, so that a run of n steps expands to exactly the n durations of stepping one at a time.
    ps = float(PS_PER_S)
    first_ps = np.rint(np.asarray(steps.first_step_s, dtype=np.float64) * ps).astype(np.int64)
    inc_ps = np.rint(np.asarray(steps.step_increment_s, dtype=np.float64) * ps).astype(np.int64)
    durations = (first_ps[row] + i * inc_ps[row]) / ps
    return durations, row


def step_times_ps(steps: StepLog, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start and duration of every individual step in the engine's integer picoseconds, exactly.

    Starts are each row's ``start_ps`` plus the durations of the row's earlier steps; durations are
    rebuilt from ``first_step_s``/``step_increment_s`` (or ``durations_s``) as in
    :func:`expand_step_durations`. A run expands to exactly the steps that stepping one at a time logs.

    Args:
        steps: the step log (R rows).
        rows: optional bool mask (R,) of the rows to expand (default: all).

    Returns:
        ``(start_ps, duration_ps, row)``: int64 arrays of shape (S,), S = total ``num_steps`` of the
        selected rows; ``row`` is the StepLog row of each step.
    """
    seconds, row = expand_step_durations(steps, rows)
    duration = np.rint(seconds * PS_PER_S).astype(np.int64)  # exact: the durations are integer ps
    counts = np.asarray(steps.num_steps, dtype=np.int64)[row[np.r_[True, row[1:] != row[:-1]]]] if row.size else row
    before = np.cumsum(duration) - duration  # exclusive prefix sums over the selected steps
    first = np.cumsum(counts) - counts  # position of each selected row's first step
    start = np.asarray(steps.start_ps, dtype=np.int64)[row] + before - np.repeat(before[first], counts)
    return start, duration, row


def row_durations_ps(steps: StepLog) -> np.ndarray:
    """Exact duration of every StepLog row in integer picoseconds (the sum of its steps'), int64 (R,)."""
    counts = np.asarray(steps.num_steps, dtype=np.int64)
    if steps.durations_s is None:  # arithmetic rows: n d0 + inc n (n - 1) / 2
        first_ps = np.rint(np.asarray(steps.first_step_s, dtype=np.float64) * PS_PER_S).astype(np.int64)
        inc_ps = np.rint(np.asarray(steps.step_increment_s, dtype=np.float64) * PS_PER_S).astype(np.int64)
        return counts * first_ps + inc_ps * (counts * (counts - 1) // 2)
    if not counts.size:
        return np.zeros(0, dtype=np.int64)
    duration = np.rint(np.asarray(steps.durations_s, dtype=np.float64) * PS_PER_S).astype(np.int64)
    return np.add.reduceat(duration, np.cumsum(counts) - counts)


def merged_step_order(out: EngineOutput, start_ps: np.ndarray, row: np.ndarray) -> np.ndarray | None:
    """The order of a deployment's expanded steps by (start, replica), or None for one engine's output.

    A deployment's merged step log (``out.step_replica`` set) orders its rows by start time, and a run of
    one replica is one row: the expanded steps of run mode then interleave the replicas otherwise than step
    mode's, and the float sums over them (the ITL mean, the saturation slope) differ in the last bits. Ordered
    by (start in ps, replica), stably, both modes give the same sequence. One engine's rows are in time order.

    Args:
        out: the run's output.
        start_ps, row: each expanded step's start (int64 ps) and StepLog row (:func:`step_times_ps`), (S,).

    Returns:
        int64 (S,) indices, or None.
    """
    if out.step_replica is None:
        return None
    return np.lexsort((np.asarray(out.step_replica, dtype=np.int64)[row], start_ps))


def itl_samples(out: EngineOutput) -> tuple[np.ndarray, np.ndarray]:
    """All inter-token latencies (ITL) of a run as weighted samples.

    ITL = every gap between two consecutive token emissions of the same request. The multiset is each
    step's duration repeated ``itl_samples`` times (its row's count), plus every value of
    ``out.extra_itl_s`` once (gaps across a preemption). Every step is listed, those of rows with
    ``itl_samples == 0`` with weight 0 (the steps' durations are then the step log's own array, not a copy
    of the selected ones: 8 bytes a step less at the summary's peak). A deployment's steps come in
    (start, replica) order (:func:`merged_step_order`): run mode and step mode give the same arrays.

    Returns:
        ``(values_s, weights)``: float64 seconds and int64 repeat counts (>= 0), both shape (m,); the ITL
        sample is ``np.repeat(values_s, weights)``.
    """
    steps = out.steps
    counts = np.asarray(steps.num_steps, dtype=np.int64)
    if steps.durations_s is not None:
        durations = np.asarray(steps.durations_s, dtype=np.float64)
    else:
        durations, _ = expand_step_durations(steps)
    weights = np.repeat(np.asarray(steps.itl_samples, dtype=np.int64), counts)
    if out.step_replica is not None:  # a deployment's: the steps in (start, replica) order, as in step mode
        start_ps, _, row = step_times_ps(steps)
        order = merged_step_order(out, start_ps, row)
        durations, weights = durations[order], weights[order]
    extra = np.asarray(out.extra_itl_s, dtype=np.float64)
    if not extra.size:
        return durations, weights
    return (np.concatenate([durations, extra]),
            np.concatenate([weights, np.ones(extra.shape[0], dtype=np.int64)]))


def busy_time_weighted(values: np.ndarray, row_ps: np.ndarray, integral: np.ndarray | None = None,
                       scale: int = 1) -> dict[str, float | None]:
    """``{mean, max}`` of a per-row quantity over busy time, divided by ``scale``, in exact integers.

    Args:
        values: int (R,), the quantity per row (its value at the row's end).
        row_ps: int64 (R,), the rows' exact durations (:func:`row_durations_ps`, ps).
        integral: optional int64 (R,), the quantity integrated over each row (quantity x ps) when it varies
            within a row (``StepLog.kv_block_ps``); default ``values * row_ps``.
        scale: the divisor of mean and max (e.g. the KV-cache capacity in blocks, for a fraction).

    Returns:
        mean = ``sum(integral) / (scale * sum(row_ps))``, one correctly rounded division of Python
        integers (a run and its steps one at a time give the same float); max = ``max(values) / scale``.
        Idle gaps between steps do not count; with zero busy time the mean is the plain mean of ``values``
        / ``scale``; with no rows both are ``None``.
    """
    values = np.asarray(values)
    if values.size == 0:
        return {"mean": None, "max": None}
    row_ps = np.asarray(row_ps, dtype=np.int64)
    busy = int(row_ps.sum())
    if busy <= 0:
        mean = float(np.mean(values)) / scale
    else:
        if integral is None:
            integral = _exact_products(np.asarray(values, dtype=np.int64), row_ps)
        elif not isinstance(integral, list):
            integral = np.asarray(integral, dtype=np.int64)
        mean = _exact_sum(integral) / (scale * busy)
    return {"mean": mean, "max": float(values.max()) / scale}


def _exact_products(values: np.ndarray, row_ps: np.ndarray) -> np.ndarray | list[int]:
    """``values * row_ps`` elementwise, exactly: int64 when no product can overflow, Python ints otherwise."""
    if values.size and int(np.abs(values).max()) * int(row_ps.max(initial=0)) < 2**63:
        return values * row_ps
    return list(map(operator.mul, values.tolist(), row_ps.tolist()))


def _exact_sum(values) -> int:
    """The exact integer sum: numpy's int64 sum when it cannot overflow; for an int64 array that could, the
    sums of its high and low 32-bit halves (each exact in int64 below 2^31 values), joined as a Python int;
    Python's sum otherwise."""
    if isinstance(values, np.ndarray) and (not values.size or int(np.abs(values).max()) * values.size < 2**63):
        return int(values.sum())
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and values.size < 2**31:
        high = values >> 32  # floor: values == high * 2^32 + low with 0 <= low < 2^32
        low = values & 0xFFFFFFFF
        return (int(high.sum()) << 32) + int(low.sum())
    return sum(values.tolist() if isinstance(values, np.ndarray) else values)
