"""Is the server saturated? The waiting queue is still growing when the arrivals end.

Rule (documented in :func:`detect_saturation`): over the last quarter of the arrival window (the
arrivals that happened, when ``simulation.max_time_s`` stops the run first), fit the number
of waiting requests against time by least squares, each engine STEP weighted by its duration (the time
that queue length held; a StepLog row of several steps is expanded into its steps, whose waiting count is
the row's: the engine ends a run at every arrival, so the count cannot change inside one). The server is saturated when the slope is positive and the growth it implies
over that quarter exceeds ``max(5, 5% of the requests that arrived in it)``: requests pile up faster than
they are served by more than 5% of the arrival rate. A stable server's queue fluctuates around a
level, so its fitted growth stays well under this threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.engine.output import EngineOutput
from servesim.metrics.steps import merged_step_order, step_times_ps
from servesim.roofline import PS_PER_S

#: Fraction of the arrival window (its end) over which the queue trend is measured.
TAIL_FRACTION = 0.25
#: Minimum growth (requests) of the waiting queue over the tail to call the server saturated.
MIN_GROWTH_REQUESTS = 5.0
#: Minimum growth as a fraction of the requests that arrived during the tail.
MIN_GROWTH_FRACTION = 0.05


@dataclass
class Saturation:
    """Outcome of the saturation rule.

    Attributes:
        saturated: True when the waiting queue still grows at the end of the arrivals.
        slope_per_s: fitted growth rate of the waiting queue over the tail (requests/s); 0.0 when the
            tail has fewer than two step rows.
        growth: ``slope_per_s * tail length`` (requests).
        threshold: growth needed to be saturated (requests).
    """

    saturated: bool
    slope_per_s: float
    growth: float
    threshold: float


def detect_saturation(out: EngineOutput) -> Saturation:
    """Apply the saturation rule of this module to one run.

    Let ``t0, t1`` be the first and last arrival that happened in the run (a run cut off by
    ``simulation.max_time_s`` leaves later requests unarrived, ``arrival_s`` NaN: its window ends at the
    last request that did arrive), ``T = TAIL_FRACTION * (t1 - t0)`` and the tail the
    steps (each row expanded into its steps, :func:`~servesim.metrics.steps.step_times_ps`) that start in
    ``[t1 - T, t1]``. The slope ``b`` is the duration-weighted least-squares slope of the waiting count on
    the step start over the tail (uniform weights if all durations are zero); run mode and step mode give
    the same steps, hence the same slope bit for bit. Saturated iff ``b > 0`` and ``b * T > max(MIN_GROWTH_REQUESTS, MIN_GROWTH_FRACTION * A)``
    where ``A`` is the number of arrivals in ``[t1 - T, t1]``. Fewer than two requests, a zero-length
    arrival window, or fewer than two tail steps with distinct start times give "not saturated".
    """
    arrival = np.asarray(out.requests.arrival_s, dtype=np.float64)
    arrival = arrival[~np.isnan(arrival)]  # NaN: the run stopped before the request arrived
    if arrival.size < 2:
        return Saturation(False, 0.0, 0.0, MIN_GROWTH_REQUESTS)
    t0, t1 = float(arrival.min()), float(arrival.max())
    tail = TAIL_FRACTION * (t1 - t0)
    arrived = int(np.count_nonzero(arrival >= t1 - tail))
    threshold = max(MIN_GROWTH_REQUESTS, MIN_GROWTH_FRACTION * arrived)
    row_start = np.asarray(out.steps.start_s, dtype=np.float64)
    row_end = row_start + np.asarray(out.steps.duration_s, dtype=np.float64)
    near = (row_start <= t1 + 1e-9 * (1.0 + abs(t1))) & (row_end >= t1 - tail - 1e-9 * (1.0 + abs(t1)))
    start_ps, duration_ps, row = step_times_ps(out.steps, near)  # the rows that may hold tail steps
    order = merged_step_order(out, start_ps, row)  # a deployment's steps as step mode orders them
    if order is not None:
        start_ps, duration_ps, row = start_ps[order], duration_ps[order], row[order]
    start = start_ps / float(PS_PER_S)
    in_tail = (start >= t1 - tail) & (start <= t1)
    x = start[in_tail]
    if tail <= 0 or x.size < 2 or np.ptp(x) == 0:
        return Saturation(False, 0.0, 0.0, threshold)
    y = np.asarray(out.steps.num_waiting, dtype=np.float64)[row[in_tail]]
    w = duration_ps[in_tail] / float(PS_PER_S)
    if not w.sum() > 0:
        w = np.ones_like(x)
    x_mean = np.sum(w * x) / w.sum()
    y_mean = np.sum(w * y) / w.sum()
    sxx = float(np.sum(w * (x - x_mean) ** 2))
    if sxx == 0:
        return Saturation(False, 0.0, 0.0, threshold)
    slope = float(np.sum(w * (x - x_mean) * (y - y_mean)) / sxx)
    growth = slope * tail
    return Saturation(bool(slope > 0 and growth > threshold), slope, growth, threshold)
