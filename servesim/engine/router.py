"""The router of a multi-replica deployment: it assigns every request to a replica at its arrival instant.

Policies (``deployment.router``), remaining ties to the lowest replica index:

* ``round_robin``: the k-th request routed (k = 0, 1, ... in arrival order) goes to replica ``k mod R``.
* ``least_outstanding``: fewest unfinished requests, ``assigned - finished``, where a request counts as
  finished at the arrival instant ``t`` when its finish time is ``<= t``.
* ``shortest_queue``: fewest waiting requests: the replica's waiting queue as its current step scheduled
  it (preempted requests included, as vLLM's ``num_requests_waiting``) plus the requests routed to it
  that it has not pulled yet (it pulls them at its next step boundary); among equal queues (below
  saturation every queue is empty), fewest unfinished requests, as ``least_outstanding``.
* ``prefix_aware``: the highest weighted sum of a prefix-cache score and two load scores, as llm-d's
  inference scheduler (its endpoint picker) scores pods; see :class:`PrefixAwareRouting` and
  :class:`ApproxPrefixIndex`.

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
from collections import OrderedDict, deque
from dataclasses import dataclass

import simpy
from simpy.core import URGENT
from simpy.events import Event

from servesim.engine.arrival_source import ArrivalSource
from servesim.workload.content import BlockHashes

#: Router policies understood by :class:`Router` (vLLM production-stack / llm-d style names).
ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "shortest_queue", "prefix_aware")


@dataclass(frozen=True)
class PrefixAwareRouting:
    """Settings and inputs of the ``prefix_aware`` router (llm-d's inference scheduler, approximate mode).

    For each request the router scores every replica ``j`` and picks the highest score (ties: the lowest
    index, deterministic, where llm-d's picker may break ties otherwise)::

        score_j = prefix_cache_scorer_weight   * matched_j / total
                + queue_scorer_weight          * (q_max - q_j) / (q_max - q_min)
                + active_request_scorer_weight * (a_max - a_j) / (a_max - a_min)

    * ``total``: the request's prompt blocks the router hashes: its full blocks of ``block_size_tokens``
      tokens (a partial last block is never hashed), at most ``max_prefix_blocks_to_match``; ``matched_j``:
      the longest run of those blocks, from the first, that the router's own index holds for replica ``j``
      (:class:`ApproxPrefixIndex`); the term is 0 when ``total`` is 0. This is the ``prefix-cache-scorer``
      (score = matched blocks / prompt blocks) over the ``approx-prefix-cache-producer``'s index, which
      records after every routing decision that the chosen pod now holds the request's prompt blocks;
      the router never sees what a replica really caches or evicts (llm-d docs, "Prefix-Cache Aware
      Routing", approximate implementation; gateway-api-inference-extension
      ``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``). Here the blocks are the
      workload's own chained block hashes (``Workload.content``, :mod:`servesim.workload.content`),
      where llm-d approximates tokens by characters: the simulated router hashes exact token blocks.
    * ``q_j``: the replica's waiting requests (as ``shortest_queue``), min-max normalised across the
      replicas as llm-d's ``queue-scorer`` does (shortest 1, longest 0, all equal: 1).
    * ``a_j``: the replica's outstanding requests, routed and not finished (as ``least_outstanding``),
      normalised the same way: the router's own count of requests in flight, in the place of llm-d's
      ``kv-cache-utilization-scorer`` (which scrapes each server's KV-cache use; this router reads no
      engine state but the waiting queue, vLLM's ``num_requests_waiting`` metric).

    Defaults (the config's): weights 3 / 2 / 2, the weights of the prefix-cache, queue and
    KV-cache-utilization scorers in llm-d's default scheduling profile; ``max_prefix_blocks_to_match``
    256 and the index capacity ``lru_capacity_per_server`` (entries = blocks per replica; llm-d's fixed
    default 31,250 is the KV blocks of Llama-3-8B on an 80 GB H100; by default servesim takes the
    replica's own KV-cache blocks, as llm-d's ``autoTune`` reads them from the server) and
    ``block_size_tokens`` = the engine's ``block_size`` (llm-d: must match the server's block size;
    vLLM's default 16).

    Attributes:
        prefix_cache_scorer_weight, queue_scorer_weight, active_request_scorer_weight: weights (>= 0,
            not all 0).
        lru_capacity_per_server: block hashes the index keeps per replica (>= 1).
        prompt_hashes: the prompt block hashes the router computes for each request (``of(i)`` =
            request ``i``'s, at most ``max_prefix_blocks_to_match`` of ``block_size_tokens`` tokens each),
            or None when the workload shares no content (no prefix can match: the prefix term is 0).

    Raises:
        ValueError: a negative or non-finite weight, all weights 0, or a capacity below 1.
    """

    prefix_cache_scorer_weight: float
    queue_scorer_weight: float
    active_request_scorer_weight: float
    lru_capacity_per_server: int
    prompt_hashes: BlockHashes | None

    def __post_init__(self) -> None:
        weights = (self.prefix_cache_scorer_weight, self.queue_scorer_weight, self.active_request_scorer_weight)
        if any(not (w >= 0.0 and w < float("inf")) for w in weights) or not any(weights):
            raise ValueError(f"scorer weights must be finite, >= 0 and not all 0 (got {weights})")
        if self.lru_capacity_per_server < 1:
            raise ValueError(f"lru_capacity_per_server must be >= 1 (got {self.lru_capacity_per_server})")


class ApproxPrefixIndex:
    """The router's own index of the prompt blocks it has sent to each replica, LRU-bounded per replica.

    As llm-d's approximate prefix-cache index ("per-pod LRU plus a reverse map from block hash to pods",
    llm-d router docs; gateway-api-inference-extension's prefix plugin indexer; the reverse map is only a
    faster lookup and is left out here): after a request is routed to replica ``j``, each of its prompt block hashes is recorded for ``j`` in
    order, first block first; a hash ``j`` already holds becomes its most recently used, a new one is added
    after evicting ``j``'s least recently used hashes while it holds ``capacity`` of them. Replicas' entries
    are independent (one LRU per replica).

    Args:
        num_replicas: R >= 1.
        capacity: hashes kept per replica (>= 1).

    Attributes:
        lru: per replica, an ``OrderedDict`` of block hash (int) -> None, least recently used first.
    """

    def __init__(self, num_replicas: int, capacity: int) -> None:
        self.capacity = int(capacity)
        self.lru: list[OrderedDict] = [OrderedDict() for _ in range(num_replicas)]

    def matched_blocks(self, replica: int, hashes: list[int]) -> int:
        """How many of ``hashes`` (a prompt's block hashes, first block first) the replica holds in a row
        from the first (the blocks a prefix cache holding them would hit); reads do not change the order."""
        held = self.lru[replica]
        count = 0
        for h in hashes:
            if h not in held:
                break
            count += 1
        return count

    def add(self, replica: int, hashes: list[int]) -> None:
        """Record that ``replica`` was sent a prompt with these block hashes (in order)."""
        held = self.lru[replica]
        for h in hashes:
            if h in held:
                held.move_to_end(h)
                continue
            while len(held) >= self.capacity:
                held.popitem(last=False)
            held[h] = None


def _min_max_scores(values: list[int]) -> list[float]:
    """llm-d's queue-scorer normalisation: ``(max - v) / (max - min)``; 1.0 for all when they are equal."""
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    return [(high - v) / (high - low) for v in values]


def _lowest(values: list[int]) -> int:
    """Index of the smallest value (the first of equal ones)."""
    return min(range(len(values)), key=values.__getitem__)


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
        prefix_aware: the ``prefix_aware`` policy's settings (required by it, ignored by the others).

    Attributes:
        assignment: list of N ints, the replica of each request (-1 = not routed yet).
        inbox: per replica, a deque of ``(request id, arrival ps)`` routed to it and not yet pulled.
        routed: per replica, requests routed to it so far.
        finished: per replica, requests it finished by the last routing instant.
        waiting_of: per replica, a callable giving the length of its engine's waiting queue (set by the
            deployment; needed by ``shortest_queue``).
        next_run_ps: per replica, when its SimPy process next resumes (ps), or None once it has ended.
        has_work: per replica, a callable telling whether it holds any request (closed-loop bound).
        prefix_index: the ``prefix_aware`` router's :class:`ApproxPrefixIndex` (None for other policies).
        prefix_hashed_blocks, prefix_matched_blocks: ``prefix_aware``: prompt blocks hashed over every
            routed request, and how many of them the chosen replica's index held (the router's estimate of
            the prefix-cache hits it steered to; llm-d's EPP records the same match per request).
        closed: set by :meth:`close` once every replica has ended (``simulation.max_time_s``): nothing is
            routed after it, and what no replica pulled is not counted as routed.

    Raises:
        ValueError: unknown policy, ``num_replicas < 1``, or ``prefix_aware`` without its settings.
    """

    def __init__(self, env: simpy.Environment, source: ArrivalSource, num_replicas: int, policy: str,
                 prefix_aware: PrefixAwareRouting | None = None) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"unknown router {policy!r} (expected one of {', '.join(ROUTERS)})")
        if num_replicas < 1:
            raise ValueError("num_replicas must be >= 1")
        if policy == "prefix_aware" and prefix_aware is None:
            raise ValueError("the prefix_aware router needs its PrefixAwareRouting settings")
        self.prefix_aware = prefix_aware if policy == "prefix_aware" else None
        self.prefix_index = (
            ApproxPrefixIndex(num_replicas, prefix_aware.lru_capacity_per_server) if self.prefix_aware else None
        )
        self.prefix_hashed_blocks = 0
        self.prefix_matched_blocks = 0
        # prefix_aware: each request's matched blocks, to take back what close() un-routes
        self._prefix_matched_of = [0] * source.num_requests if self.prefix_aware else None
        self.closed = False
        self.env = env
        self.source = source
        self.num_replicas = int(num_replicas)
        self.policy = policy
        self.assignment = [-1] * source.num_requests
        self.inbox: list[deque] = [deque() for _ in range(self.num_replicas)]
        self.routed = [0] * self.num_replicas
        self.finished = [0] * self.num_replicas
        self._finish_times: list[deque] = [deque() for _ in range(self.num_replicas)]
        self._num_routed = 0
        self._num_finished = 0
        self._scheduled: set[int] = set()
        self._pulled: list[tuple[int, int]] = []
        self._finishes: list[tuple[int, int, int]] = []  # closed loop: (finish ps, replica, report order)
        self.waiting_of = [lambda: 0] * self.num_replicas
        self.has_work = [lambda: False] * self.num_replicas
        self.next_run_ps: list[int | None] = [0] * self.num_replicas
        self._schedule_wake()

    # ------------------------------------------------------------------ routing
    def route_until(self, now_ps: int) -> None:
        """Route every global arrival at or before ``now_ps`` (ps), in arrival order.

        In a closed loop, first hand the finishes at or before ``now_ps`` to the global source in time
        order (ties: replica index, then the replica's own order), so that clients issue their next
        requests in the order their previous ones finished whatever the order the replicas reported
        them in (a replica reports a finish when the step producing it starts, up to a run ahead).
        """
        if self.closed:
            return
        finishes = self._finishes
        while finishes and finishes[0][0] <= now_ps:
            self.source.on_finish(heapq.heappop(finishes)[0])
        got = self._pulled
        self.source.pop_until(now_ps, got)
        if not got:
            return
        for r, t in got:
            j = self._choose(r, t)
            self.assignment[r] = j
            self.inbox[j].append((r, t))
            self.routed[j] += 1
            self._num_routed += 1
        got.clear()

    def _choose(self, request: int, t_ps: int) -> int:
        if self.policy == "round_robin":
            return self._num_routed % self.num_replicas
        if self.policy == "least_outstanding":
            return _lowest(self._outstanding(t_ps))
        if self.policy == "shortest_queue":
            # ties of queues (below saturation every queue is empty) go to the fewest unfinished requests, then
            # the lowest index: the lowest index alone sent nearly every request to replica 0
            queues, outstanding = self._queue_lengths(), self._outstanding(t_ps)
            return min(range(self.num_replicas), key=lambda j: (queues[j], outstanding[j]))
        return self._choose_prefix_aware(request, t_ps)

    def _outstanding(self, t_ps: int) -> list[int]:
        """Per replica: requests routed to it and not finished by ``t_ps`` (a finish at ``t_ps`` counts)."""
        for j in range(self.num_replicas):
            times = self._finish_times[j]
            while times and times[0] <= t_ps:
                times.popleft()
                self.finished[j] += 1
        return [self.routed[j] - self.finished[j] for j in range(self.num_replicas)]

    def _queue_lengths(self) -> list[int]:
        """Per replica: its engine's waiting queue plus the requests routed to it and not pulled yet."""
        return [self.waiting_of[j]() + len(self.inbox[j]) for j in range(self.num_replicas)]

    def _choose_prefix_aware(self, request: int, t_ps: int) -> int:
        """The best score of :class:`PrefixAwareRouting` (ties: lowest index), then index the prompt there."""
        cfg = self.prefix_aware
        index = self.prefix_index
        hashes = cfg.prompt_hashes.of(request).tolist() if cfg.prompt_hashes is not None else []
        queue = _min_max_scores(self._queue_lengths())
        active = _min_max_scores(self._outstanding(t_ps))
        best, best_score, best_matched = 0, None, 0
        for j in range(self.num_replicas):
            score = cfg.queue_scorer_weight * queue[j] + cfg.active_request_scorer_weight * active[j]
            matched = index.matched_blocks(j, hashes) if hashes else 0
            if hashes:
                score += cfg.prefix_cache_scorer_weight * matched / len(hashes)
            if best_score is None or score > best_score:
                best, best_score, best_matched = j, score, matched
        index.add(best, hashes)
        self.prefix_hashed_blocks += len(hashes)
        self.prefix_matched_blocks += best_matched
        self._prefix_matched_of[request] = best_matched
        return best

    def close(self) -> None:
        """Every replica has ended (a run stopped by ``simulation.max_time_s``; at a normal end every
        request was pulled): the requests routed to a replica that never pulled them had not arrived
        there when it stopped, so they become unrouted (``assignment`` -1, out of ``routed`` and the
        ``prefix_aware`` counters), as a single engine leaves the requests after its last step
        unarrived; later wake-ups route nothing."""
        self.closed = True
        cfg = self.prefix_aware
        for j, inbox in enumerate(self.inbox):
            for r, _ in inbox:
                self.assignment[r] = -1
                self.routed[j] -= 1
                self._num_routed -= 1
                if cfg is not None:
                    self.prefix_hashed_blocks -= len(cfg.prompt_hashes.of(r)) if cfg.prompt_hashes is not None else 0
                    self.prefix_matched_blocks -= self._prefix_matched_of[r]
            inbox.clear()

    # ------------------------------------------------------------------ wake-ups (URGENT events)
    def _next_event_ps(self) -> int | None:
        t = self.source.next_time()
        if self._finishes and (t is None or self._finishes[0][0] < t):
            t = self._finishes[0][0]
        return t

    def _schedule_wake(self) -> None:
        if self.closed:
            return
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
            for k in range(self.num_replicas):
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
