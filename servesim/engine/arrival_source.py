"""Where the engine's requests come from: an open-loop schedule or closed-loop clients.

The engine pulls arrivals at step boundaries instead of receiving one SimPy event per request: with
arrival times known in advance (open loop) or issued by completions (closed loop), the engine knows the
next arrival time and can cut a run of decode steps there. Times are integer picoseconds.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class ArrivalSource:
    """Arrival times of requests ``0..N-1`` (integer ps), released in time order.

    Open loop: ``times`` holds every request's arrival time, sorted (a list or an ``array('q')``). Closed loop: ``concurrency`` clients;
    the first ``concurrency`` requests arrive at 0 and every finish releases the next request (in index
    order) ``think_ps`` later, like ``vllm bench serve --max-concurrency``.
    """

    times: Sequence[int] | None
    num_requests: int
    concurrency: int | None = None
    think_ps: int = 0
    _pos: int = 0
    _heap: list = field(default_factory=list)
    _next_issue: int = 0
    #: what :meth:`next_time` returns, kept up to date by every change (the engine's hot loop reads it)
    next_ps: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            first = min(self.concurrency, self.num_requests)
            self._heap = [(0, r) for r in range(first)]
            self._next_issue = first
        self._update_next()

    def _update_next(self) -> None:
        if self.concurrency is None:
            self.next_ps = self.times[self._pos] if self._pos < self.num_requests else None
        else:
            self.next_ps = self._heap[0][0] if self._heap else None

    def next_time(self) -> int | None:
        """Arrival time (ps) of the next request not yet released, or None when none is pending."""
        return self.next_ps

    def pop_until(self, now: int, out: list) -> None:
        """Append to ``out`` (request id, arrival ps) of every pending request arrived by ``now``."""
        if self.concurrency is None:
            times, pos, n = self.times, self._pos, self.num_requests
            while pos < n and times[pos] <= now:
                out.append((pos, times[pos]))
                pos += 1
            self._pos = pos
        else:
            heap = self._heap
            while heap and heap[0][0] <= now:
                t, r = heapq.heappop(heap)
                out.append((r, t))
        self._update_next()

    def on_finish(self, now: int) -> None:
        """A request finished at ``now`` (ps): in closed loop, its client sends the next request."""
        if self.concurrency is not None and self._next_issue < self.num_requests:
            heapq.heappush(self._heap, (now + self.think_ps, self._next_issue))
            self._next_issue += 1
            self._update_next()

    def count_until(self, now: int) -> int:
        """How many requests not yet released have arrived by ``now`` (ps), without releasing them."""
        if self.concurrency is None:
            return bisect.bisect_right(self.times, now, lo=self._pos) - self._pos
        return sum(1 for t, _ in self._heap if t <= now)
