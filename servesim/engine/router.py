"""The router of a multi-replica deployment: it assigns every request to a replica at its arrival instant.

Policies (``deployment.router``), ties always to the lowest replica index:

* ``round_robin``: the k-th request routed (k = 0, 1, ... in arrival order) goes to replica ``k mod R``.
* ``least_outstanding``: fewest unfinished requests, ``assigned - finished``, where a request counts as
  finished at the arrival instant ``t`` when its finish time is ``<= t``.
* ``shortest_queue``: fewest waiting requests: the replica's waiting queue as its current step scheduled
  it (preempted requests included, as vLLM's ``num_requests_waiting``) plus the requests routed to it
  that it has not pulled yet (it pulls them at its next step boundary).

Timing. The deployment's SimPy clock counts integer picoseconds (exact, no float drift). The router's
wake-ups are SimPy events of priority ``URGENT`` (:class:`UrgentTimeout`), the replicas' steps are plain
timeouts (``NORMAL``): at one instant **the router runs before any replica steps**, so a request arriving
exactly at a replica's step boundary is routed first and can be scheduled in the step that starts then,
as on a single engine. A replica also asks the router to route every arrival up to its own clock before
it pulls (:meth:`Router.route_until`, a no-op when the urgent wake-up already ran), which makes the same
guarantee independent of event order.

Each replica's arrival source (:class:`ReplicaSource`) reports as its next arrival the earliest of: the
requests routed to it and not yet pulled, and the next GLOBAL arrival not yet routed, so a replica cuts
its runs of decode steps at every global arrival and a request routed to a busy replica is seen at the
replica's next step boundary. In a closed loop a request is routed when its client issues it, and
arrivals not yet issued are bounded below by the other busy replicas' next step boundaries plus the
think time (a finish is known one step ahead), which the source reports too.
"""

from __future__ import annotations

import heapq
from collections import deque

import simpy
from simpy.core import URGENT
from simpy.events import Event

from servesim.engine.arrival_source import ArrivalSource

#: Router policies understood by :class:`Router` (vLLM production-stack / llm-d style names).
ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "shortest_queue")


class UrgentTimeout(Event):
    """A timeout of SimPy priority ``URGENT``: processed before every ``NORMAL`` event of the same time.

    Args:
        env: the environment.
        delay: time to wait (the environment's unit; >= 0).

    Raises:
        ValueError: ``delay < 0``.
    """

    def __init__(self, env: simpy.Environment, delay) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        super().__init__(env)
        self._ok = True  # triggered at creation, like simpy.Timeout
        self._value = None
        env.schedule(self, URGENT, delay)


class Router:
    """Routes the requests of one global :class:`ArrivalSource` to ``num_replicas`` replica inboxes.

    Args:
        env: the deployment's SimPy environment (time unit: integer picoseconds).
        source: the global arrival source over requests ``0..N-1`` (open loop or closed loop).
        num_replicas: R >= 1.
        policy: one of :data:`ROUTERS`.

    Attributes:
        assignment: list of N ints, the replica of each request (-1 = not routed yet).
        inbox: per replica, a deque of ``(request id, arrival ps)`` routed to it and not yet pulled.
        routed: per replica, requests routed to it so far.
        finished: per replica, requests it finished by the last routing instant.
        waiting_of: per replica, a callable giving the length of its engine's waiting queue (set by the
            deployment; needed by ``shortest_queue``).
        next_run_ps: per replica, when its SimPy process next resumes (ps), or None once it has ended.
        has_work: per replica, a callable telling whether it holds any request (closed-loop bound).

    Raises:
        ValueError: unknown policy or ``num_replicas < 1``.
    """

    def __init__(self, env: simpy.Environment, source: ArrivalSource, num_replicas: int, policy: str) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"unknown router {policy!r} (expected one of {', '.join(ROUTERS)})")
        if num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        self.env = env
        self.source = source
        self.R = int(num_replicas)
        self.policy = policy
        self.assignment = [-1] * source.num_requests
        self.inbox: list[deque] = [deque() for _ in range(self.R)]
        self.routed = [0] * self.R
        self.finished = [0] * self.R
        self._finish_times: list[deque] = [deque() for _ in range(self.R)]
        self._num_routed = 0
        self._num_finished = 0
        self._scheduled: set[int] = set()
        self._pulled: list[tuple[int, int]] = []
        self._finishes: list[tuple[int, int, int]] = []  # closed loop: (finish ps, replica, report order)
        self.waiting_of = [lambda: 0] * self.R
        self.has_work = [lambda: False] * self.R
        self.next_run_ps: list[int | None] = [0] * self.R
        self._schedule_wake()

    # ------------------------------------------------------------------ routing
    def route_until(self, now_ps: int) -> None:
        """Route every global arrival at or before ``now_ps`` (ps), in arrival order.

        In a closed loop, first hand the finishes at or before ``now_ps`` to the global source in time
        order (ties: replica index, then the replica's own order), so that clients issue their next
        requests in the order their previous ones finished whatever the order the replicas reported
        them in (a replica reports a finish when the step producing it starts, up to a run ahead).
        """
        finishes = self._finishes
        while finishes and finishes[0][0] <= now_ps:
            self.source.on_finish(heapq.heappop(finishes)[0])
        got = self._pulled
        self.source.pop_until(now_ps, got)
        if not got:
            return
        for r, t in got:
            j = self._choose(t)
            self.assignment[r] = j
            self.inbox[j].append((r, t))
            self.routed[j] += 1
            self._num_routed += 1
        got.clear()

    def _choose(self, t_ps: int) -> int:
        R = self.R
        if self.policy == "round_robin":
            return self._num_routed % R
        if self.policy == "least_outstanding":
            best, best_value = 0, None
            for j in range(R):
                times = self._finish_times[j]
                while times and times[0] <= t_ps:
                    times.popleft()
                    self.finished[j] += 1
                value = self.routed[j] - self.finished[j]
                if best_value is None or value < best_value:
                    best, best_value = j, value
            return best
        best, best_value = 0, None
        for j in range(R):
            value = self.waiting_of[j]() + len(self.inbox[j])
            if best_value is None or value < best_value:
                best, best_value = j, value
        return best

    # ------------------------------------------------------------------ wake-ups (URGENT events)
    def _next_event_ps(self) -> int | None:
        t = self.source.next_time()
        if self._finishes and (t is None or self._finishes[0][0] < t):
            t = self._finishes[0][0]
        return t

    def _schedule_wake(self) -> None:
        t = self._next_event_ps()
        if t is None or (self._scheduled and min(self._scheduled) <= t):
            return  # an earlier wake-up is pending; it schedules the next one after routing
        self._scheduled.add(t)
        event = UrgentTimeout(self.env, t - self.env.now)
        event.callbacks.append(self._on_wake)

    def _on_wake(self, _event) -> None:
        now = self.env.now
        self._scheduled.discard(now)
        self.route_until(now)
        self._schedule_wake()

    def on_finish(self, replica: int, now_ps: int) -> None:
        """Replica ``replica`` finished a request at ``now_ps`` (reported up to one step ahead)."""
        self._finish_times[replica].append(now_ps)
        self._num_finished += 1
        if self.source.concurrency is not None:
            heapq.heappush(self._finishes, (now_ps, replica, self._num_finished))
            self._schedule_wake()

    # ------------------------------------------------------------------ what a replica may expect
    def next_global_ps(self, replica: int) -> int | None:
        """Earliest time (ps) of a global arrival not yet routed, or a lower bound on the arrival time of
        requests a closed loop has not issued yet (the other replicas' next resumption + think time + 1 ps:
        a finish is always reported before the step that produces it starts); None if nothing can come."""
        t = self.source.next_time()
        src = self.source
        if self._finishes:
            issue = self._finishes[0][0] + src.think_ps
            if t is None or issue < t:
                t = issue
        if src.concurrency is not None and src.concurrency + self._num_finished < src.num_requests:
            think = src.think_ps
            for k in range(self.R):
                wake = self.next_run_ps[k]
                if k != replica and wake is not None and self.has_work[k]():
                    bound = max(wake, self.env.now) + think + 1
                    if t is None or bound < t:
                        t = bound
        return t


class ReplicaSource:
    """The arrival source one replica's :class:`~servesim.engine.core.Engine` pulls from.

    It releases only the requests routed to replica ``index`` (ids are the global request ids), and its
    :meth:`next_time` is the earliest of its own unpulled requests and :meth:`Router.next_global_ps`.
    """

    def __init__(self, router: Router, index: int) -> None:
        self.router = router
        self.index = index
        self.num_requests = router.source.num_requests

    def next_time(self) -> int | None:
        """Earliest time (ps) at which a request may reach this replica, or None when none can."""
        t = self.router.next_global_ps(self.index)
        inbox = self.router.inbox[self.index]
        if inbox and (t is None or inbox[0][1] < t):
            t = inbox[0][1]
        return t

    def pop_until(self, now_ps: int, out: list) -> None:
        """Append ``(request id, arrival ps)`` of every request routed here that arrived by ``now_ps``."""
        self.router.route_until(now_ps)
        inbox = self.router.inbox[self.index]
        while inbox and inbox[0][1] <= now_ps:
            out.append(inbox.popleft())

    def on_finish(self, now_ps: int) -> None:
        """A request of this replica finishes at ``now_ps`` (ps)."""
        self.router.on_finish(self.index, now_ps)
