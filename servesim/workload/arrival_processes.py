"""Open-loop arrival processes: renewal processes with exponential (Poisson) or gamma gaps.

Gaps are never clipped or truncated: clipping exponential gaps at 3x their mean (as Vidur does) shortens
the mean gap by ``exp(-3)`` ~ 5% and so runs the server 5% hotter than the stated rate. The first request
arrives one gap after t = 0 (for a Poisson process this is exactly the process observed from time 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def renewal_arrivals(
    draw_gaps: Callable[[int], np.ndarray],
    rate: float,
    gap_cv: float,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Arrival times of a renewal process started at t = 0.

    Args:
        draw_gaps: ``draw_gaps(n)`` returns ``n`` independent gaps (s), float64 ``(n,)``.
        rate: mean arrival rate (requests/s), used only to size the batches of draws.
        gap_cv: coefficient of variation of the gaps, used only to size the batches of draws.
        num_requests: exactly this many arrivals; or
        duration_s: every arrival in ``[0, duration_s)`` (s).

    Returns:
        float64 ``(N,)``, sorted ascending (s). The draws consumed depend only on the arguments, so the
        same generator state gives the same times.

    Raises:
        ValueError: not exactly one of ``num_requests`` and ``duration_s`` is given.
    """
    if (num_requests is None) == (duration_s is None):
        raise ValueError("give exactly one of num_requests and duration_s")
    if num_requests is not None:
        return np.cumsum(draw_gaps(num_requests))
    assert duration_s is not None
    expected = rate * duration_s
    batch = int(expected + 6.0 * max(gap_cv, 1.0) * math.sqrt(expected) + 16)
    chunks: list[np.ndarray] = []
    last = 0.0
    while last < duration_s:
        times = last + np.cumsum(draw_gaps(batch))
        chunks.append(times)
        last = float(times[-1])
        batch = max(16, batch // 4)
    times = np.concatenate(chunks)
    return times[: int(np.searchsorted(times, duration_s, side="left"))]


def poisson_arrivals(
    rate: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Poisson process of ``rate`` requests/s: i.i.d. exponential gaps of mean ``1 / rate`` s (gap cv 1).

    Returns:
        float64 ``(N,)`` arrival times (s), sorted; see :func:`renewal_arrivals`.

    Raises:
        ValueError: ``rate <= 0``, or not exactly one of ``num_requests`` and ``duration_s``.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (got {rate})")
    return renewal_arrivals(lambda n: rng.exponential(1.0 / rate, size=n), rate, 1.0, num_requests, duration_s)


def gamma_arrivals(
    rate: float,
    cv: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Renewal process with gamma gaps of mean ``1 / rate`` s and coefficient of variation ``cv``.

    Shape ``k = 1 / cv^2``, scale ``theta = cv^2 / rate`` (mean ``k theta = 1 / rate``, variance
    ``k theta^2 = cv^2 / rate^2``). ``cv = 1`` is a Poisson process; ``cv > 1`` is burstier.

    Returns:
        float64 ``(N,)`` arrival times (s), sorted; see :func:`renewal_arrivals`.

    Raises:
        ValueError: ``rate <= 0`` or ``cv <= 0``, or not exactly one of ``num_requests`` and ``duration_s``.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (got {rate})")
    if not cv > 0:
        raise ValueError(f"cv must be > 0 (got {cv})")
    shape = 1.0 / cv**2
    scale = cv**2 / rate
    return renewal_arrivals(lambda n: rng.gamma(shape, scale, size=n), rate, cv, num_requests, duration_s)
