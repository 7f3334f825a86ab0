"""Percentiles of weighted samples, exactly equal to numpy's ``linear`` method on the expanded samples.

A weight is a repeat count: the sample set ``(values, weights)`` stands for the multiset
``np.repeat(values, weights)``. Inter-token latencies come this way (one step duration repeated once per
token emitted in that step), and expanding them would cost one array element per generated token.
"""

from __future__ import annotations

import numpy as np

#: Percentiles reported for every latency distribution (``p50``, ``p90``, ``p95``, ``p99``).
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, q: np.ndarray | list[float]) -> np.ndarray:
    """Percentiles of ``np.repeat(values, weights)`` without expanding it (numpy's ``linear`` method).

    The result equals ``np.percentile(np.repeat(values, weights), q)`` bit for bit: the virtual index is
    ``h = (n - 1) * (q / 100)`` over the ``n = sum(weights)`` expanded samples (Hyndman & Fan's
    definition 7, numpy's default), its two neighbours are located with a cumulative sum of the weights
    over the sorted values, and they are interpolated with the same two-sided formula as numpy's
    ``_lerp`` (``a + (b - a) * g`` for ``g < 0.5``, ``b - (b - a) * (1 - g)`` otherwise).
    Cost: one sort of ``values`` (O(m log m) for m values), independent of the total weight.

    Args:
        values: shape (m,), float; must not contain NaN.
        weights: shape (m,), non-negative integers (repeat counts); zero weights are allowed.
        q: shape (k,) percentiles in [0, 100].

    Returns:
        shape (k,) float64 array.

    Raises:
        ValueError: shapes differ, a weight is negative, or the total weight is zero.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights)
    if values.shape != weights.shape or values.ndim != 1:
        raise ValueError(f"values and weights must be 1-D of equal length, got {values.shape} and {weights.shape}")
    weights = weights.astype(np.int64, copy=False)
    if weights.size and weights.min() < 0:
        raise ValueError("weights must be non-negative repeat counts")
    order = np.argsort(values)  # ties need no order: equal values are interchangeable
    if order.size < 2**31:
        order = order.astype(np.int32)  # half the index's memory beside the cumulative weights
    cum = weights[order]
    np.cumsum(cum, out=cum)  # in place: one temporary of the sample's size less
    n = int(cum[-1]) if cum.size else 0
    if n == 0:
        raise ValueError("total weight is zero: no samples")
    # expanded sample j belongs to the first sorted value whose cumulative weight exceeds j: the sorted
    # values are read through ``order`` at the few ranks needed (no sorted copy of the sample)
    return _interpolate(lambda j: values[order[np.searchsorted(cum, j, side="right")]], n, q)


def percentiles(values: np.ndarray, q: np.ndarray | list[float]) -> np.ndarray:
    """``np.percentile(values, q)`` bit for bit (numpy's ``linear`` method), from one sort of ``values``.

    A home-made replacement (issue 13): ``np.percentile`` of several ``q`` at once imports ``numpy.ma``
    (through ``np.unique``), a tenth of the time ``servesim run`` spends on its summary.
    ``tests/test_metrics.py`` checks it against ``np.percentile``.

    Args:
        values: shape (m,), float, m >= 1; must not contain NaN.
        q: shape (k,) percentiles in [0, 100].

    Returns:
        shape (k,) float64 array.

    Raises:
        ValueError: ``values`` is empty or not 1-D.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be 1-D and non-empty, got shape {values.shape}")
    sorted_values = np.sort(values)
    return _interpolate(lambda j: sorted_values[j], values.size, q)


def _interpolate(sample_at, n: int, q: np.ndarray | list[float]) -> np.ndarray:
    """numpy's ``linear`` percentiles of ``n`` sorted samples, ``sample_at(j)`` giving samples ``j`` (int64
    array): virtual index ``h = (n - 1) * (q / 100)``, its two neighbours interpolated with numpy's
    two-sided ``_lerp``."""
    quantiles = np.true_divide(np.asarray(q, dtype=np.float64), 100)
    virtual = (n - 1) * quantiles
    prev = np.floor(virtual).astype(np.int64)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = n - 1
    nxt[above] = n - 1
    below = virtual < 0
    prev[below] = 0
    nxt[below] = 0
    a = sample_at(prev)
    b = sample_at(nxt)
    gamma = virtual - prev
    diff = b - a
    result = a + diff * gamma
    upper = gamma >= 0.5
    result[upper] = (b - diff * (1 - gamma))[upper]
    return result


def distribution_stats(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float | None]:
    """``{mean, p50, p90, p95, p99}`` of a sample (seconds in, seconds out), as plain Python floats.

    Percentiles use numpy's ``linear`` method (what ``vllm bench serve`` reports); with ``weights`` the
    sample is ``np.repeat(values, weights)`` (see :func:`weighted_percentiles`) and the mean is
    ``sum(values * weights) / sum(weights)``. An empty sample gives ``None`` for every key (JSON ``null``).

    Args:
        values: shape (m,) float, no NaN.
        weights: shape (m,) non-negative integer repeat counts, or None for weight 1 each; values of weight
            0 change nothing (neither the percentiles nor, bit for bit, the mean).
    """
    keys = ["mean"] + [f"p{p}" for p in PERCENTILES]
    values = np.asarray(values, dtype=np.float64)
    if weights is None:
        if values.size == 0:
            return dict.fromkeys(keys)
        mean = float(np.mean(values))
        pct = percentiles(values, PERCENTILES)
    else:
        weights = np.asarray(weights, dtype=np.int64)
        total = int(weights.sum())
        if total == 0:
            return dict.fromkeys(keys)
        products = values * weights
        positive = weights > 0
        # the sum over the samples of positive weight only: the same float whether or not a caller lists
        # values of weight 0 (numpy's pairwise summation depends on the array's length)
        mean = float(np.sum(products if positive.all() else products[positive]) / total)
        del products, positive
        pct = weighted_percentiles(values, weights, PERCENTILES)
    return {"mean": mean, **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct)}}
