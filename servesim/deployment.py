"""Multi-replica deployments: R identical engine replicas behind a router, in one SimPy environment.

Design:

* Every replica is its own :class:`~servesim.engine.core.Engine` (its own scheduler, KV cache and step
  clock), built over ALL N requests of the workload (the full token arrays), and only ever receives the
  ids the router sends it (:mod:`servesim.engine.router`). Request ids are global everywhere; memory is
  O(R N) small lists (fine for R <= 64), and every idle replica wakes at every arrival (time O(R N)):
  beyond :data:`MAX_REPLICAS` replicas or :data:`MAX_REPLICA_REQUESTS` replicas x requests a deployment
  is refused (:func:`check_deployment_size`).
* The environment's clock counts integer picoseconds, the engine's own unit, so that events of different
  replicas at the same instant compare exactly equal. Each engine's SimPy process runs unchanged on a thin
  adapter (:class:`_ReplicaClock`) that turns its waits, which it expresses in seconds, back into the
  exact picosecond instants it computed.
* At one instant the router runs before any replica steps (URGENT priority; see the router module).

Merged output (:meth:`Deployment.output`), what :func:`servesim.metrics.summarize` then computes:

* requests: each request's row from the replica that served it (rows of never-routed requests are
  unset, like a single engine's never-arrived requests); latencies, throughput and goodput are therefore
  those of the whole deployment.
* steps: the StepLog rows of all replicas concatenated and sorted by start time (stable: ties in replica
  order); ``step_replica`` (and ``request_replica`` for the requests) says whose each row is, the
  ``replica`` column of ``steps.csv`` and ``requests.csv``. Every row is ONE replica's step or run:
  ``batch_size``, ``num_waiting`` and ``kv_blocks_used`` are per replica. So ``summarize``'s
  ``batch_size`` is the busy-time-weighted mean (and the max) of the per-replica batch size;
  ``kv_blocks_total`` is R x the per-replica blocks, so its ``kv_cache_utilization`` is the busy-time-weighted per-replica utilisation divided by R (use the
  per-replica summaries, ``summary["replicas"]``, for a replica's own utilisation); its saturation test
  fits the per-replica waiting queues of the interleaved rows (about the mean per-replica trend).
* ``extra_itl_s`` concatenated in replica order; ``end_s`` the latest replica end; speculative-decoding
  counters summed (per-position lists element-wise).

:meth:`Deployment.replica_outputs` gives each replica's own output restricted to its requests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simpy

from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.output import EngineOutput, RequestLog, StepLog
from servesim.engine.router import PrefixAwareRouting, ReplicaSource, Router
from servesim.roofline import PS_PER_S


class _ReplicaClock:
    """The ``env`` an engine's process sees: ``timeout(delay_s)`` -> a picosecond timeout of the real env.

    The engine computes every instant in integer ps and waits ``(t - now) / PS_PER_S`` seconds: after a
    step it has already set ``engine.now`` to the step's end; before an idle wait ``engine.now`` is still
    the current instant and the wait ends at its source's ``next_time()``, computed just before.
    """

    def __init__(self, env: simpy.Environment, engine, source: ReplicaSource, router: Router, index: int) -> None:
        self.env = env
        self.engine = engine
        self.source = source
        self.router = router
        self.index = index
        self.at_ps = 0

    def timeout(self, delay_s: float):
        engine = self.engine
        if engine.now != self.at_ps:
            target = engine.now  # a step or run of steps ending at engine.now
        elif delay_s == 0:
            target = self.at_ps
        else:
            target = self.source.next_time()  # idle until the next possible arrival
            if target is None or abs((target - self.at_ps) - delay_s * PS_PER_S) > 1e-6 * delay_s * PS_PER_S + 2:
                raise RuntimeError("replica clock out of step with its engine")  # pragma: no cover
        self.at_ps = target
        self.router.next_run_ps[self.index] = target
        return self.env.timeout(target - self.env.now)


class Deployment:
    """R replicas of one engine behind a router, ready to run with ``env.run()``.

    Args:
        workload: the :class:`~servesim.workload.Workload` (N requests; open or closed loop).
        make_replica: builds one replica's engine over requests ``0..N-1`` of the workload's token arrays
            reading from the given arrival source (e.g. ``lambda s: make_engine(prepared, s)``).
        replicas: R >= 1.
        router: ``round_robin``, ``least_outstanding``, ``shortest_queue`` or ``prefix_aware``.
        prefix_aware: the ``prefix_aware`` router's settings (see :func:`prefix_aware_routing`, which
            hashes the workload's prompts for it); required by that router only.

    Attributes:
        env: the SimPy environment (time unit: integer picoseconds).
        engines: the R engines.
        router: the :class:`~servesim.engine.router.Router`.

    Raises:
        ValueError: ``replicas < 1``, an unknown router, or ``prefix_aware`` without its settings.
    """

    def __init__(self, workload, make_replica: Callable[[ReplicaSource], object], replicas: int, router: str,
                 prefix_aware: PrefixAwareRouting | None = None) -> None:
        from servesim.wiring import arrival_source

        self.env = simpy.Environment(initial_time=0)
        self.source: ArrivalSource = arrival_source(workload)
        # The router is created first: its first URGENT wake-up precedes the replicas' start events.
        self.router = Router(self.env, self.source, replicas, router, prefix_aware)
        self.engines = []
        for j in range(replicas):
            src = ReplicaSource(self.router, j)
            engine = make_replica(src)
            self.engines.append(engine)
            self.router.waiting_of[j] = lambda e=engine: len(e.waiting)
            self.router.has_work[j] = lambda e=engine, s=src: bool(e.running or e.waiting or self.router.inbox[s.index])
            self.env.process(self._drive(j, engine, _ReplicaClock(self.env, engine, src, self.router, j)))

    def _drive(self, j: int, engine, clock: _ReplicaClock):
        yield from engine.process(clock)
        self.router.next_run_ps[j] = None
        if all(t is None for t in self.router.next_run_ps):
            self.router.close()  # with simulation.max_time_s: what no replica pulled never arrived

    @property
    def assignment(self) -> np.ndarray:
        """int64 (N,): the replica each request was routed to (-1: never routed)."""
        return np.asarray(self.router.assignment, dtype=np.int64)

    def router_summary(self) -> dict:
        """What the router did (after ``env.run()``): ``policy``, ``requests_per_replica`` (list of R ints)
        and, for ``prefix_aware``, ``prefix_hashed_blocks``, ``prefix_matched_blocks`` (see
        :class:`~servesim.engine.router.Router`) and ``prefix_match_rate`` (matched / hashed; None when
        nothing was hashed)."""
        router = self.router
        out = {"policy": router.policy, "requests_per_replica": list(router.routed)}
        if router.prefix_aware is not None:
            hashed, matched = router.prefix_hashed_blocks, router.prefix_matched_blocks
            out.update(prefix_hashed_blocks=hashed, prefix_matched_blocks=matched,
                       prefix_match_rate=matched / hashed if hashed else None)
        return out

    def replica_outputs(self) -> list[EngineOutput]:
        """Each replica's :class:`EngineOutput`, its RequestLog restricted to the requests routed to it
        (``request_id`` = global ids, ascending); call after ``env.run()``."""
        assign = self.assignment
        outs = []
        for j, engine in enumerate(self.engines):
            out = engine.output()
            idx = np.flatnonzero(assign == j)
            fields = {f.name: getattr(out.requests, f.name) for f in dataclasses.fields(RequestLog)}
            requests = RequestLog(**{k: np.asarray(v)[idx] for k, v in fields.items()})
            outs.append(dataclasses.replace(out, requests=requests))
        return outs

    def output(self) -> EngineOutput:
        """One merged :class:`EngineOutput` over all replicas (see the module docstring); after ``env.run()``."""
        outs = [engine.output() for engine in self.engines]
        return merge_outputs(outs, self.assignment)


def merge_outputs(outs: list[EngineOutput], assignment: np.ndarray) -> EngineOutput:
    """Merge per-replica outputs, each over all N requests, into one (see the module docstring).

    Args:
        outs: R outputs whose RequestLogs all have N rows (global request ids).
        assignment: int (N,), the replica of each request; -1 takes replica 0's (unset) row.

    Returns:
        The merged output; with R = 1 it equals ``outs[0]`` field by field.
    """
    assign = np.maximum(np.asarray(assignment, dtype=np.int64), 0)
    rows = np.arange(assign.shape[0])
    req = {}
    for f in dataclasses.fields(RequestLog):
        stacked = np.stack([np.asarray(getattr(o.requests, f.name)) for o in outs])
        req[f.name] = stacked[assign, rows] if stacked.shape[1] else stacked[0]
    requests = RequestLog(**req)

    starts = np.concatenate([np.asarray(o.steps.start_s, dtype=np.float64) for o in outs])
    order = np.argsort(starts, kind="stable")
    steps_fields = {}
    for f in dataclasses.fields(StepLog):
        if f.name == "durations_s":
            continue
        steps_fields[f.name] = np.concatenate([np.asarray(getattr(o.steps, f.name)) for o in outs])[order]
    if any(getattr(o.steps, "durations_s", None) is not None for o in outs):
        from servesim.metrics.steps import expand_step_durations

        pieces = []
        for o in outs:
            d = getattr(o.steps, "durations_s", None)
            d = np.asarray(d, dtype=np.float64) if d is not None else expand_step_durations(o.steps)[0]
            counts = np.asarray(o.steps.num_steps, dtype=np.int64)
            pieces.extend(np.split(d, np.cumsum(counts)[:-1]) if counts.size else [])
        steps_fields["durations_s"] = (
            np.concatenate([pieces[i] for i in order]) if pieces else np.zeros(0, dtype=np.float64)
        )
    steps = StepLog(**steps_fields)
    counters: dict = {}
    for o in outs:
        for key, value in (o.spec_counters or {}).items():
            if isinstance(value, (list, tuple, np.ndarray)):
                old = list(counters.get(key, []))
                new = list(value)
                size = max(len(old), len(new))
                old += [0] * (size - len(old))
                new += [0] * (size - len(new))
                counters[key] = [a + b for a, b in zip(old, new)]
            else:
                counters[key] = counters.get(key, 0) + value
    prefix_cache: dict = {}
    for o in outs:
        for key, value in (o.prefix_cache or {}).items():
            prefix_cache[key] = prefix_cache.get(key, 0) + value
    first = outs[0]
    return dataclasses.replace(
        first,
        requests=requests,
        steps=steps,
        extra_itl_s=np.concatenate([np.asarray(o.extra_itl_s, dtype=np.float64) for o in outs]),
        kv_blocks_total=sum(o.kv_blocks_total for o in outs),
        end_s=max(o.end_s for o in outs),
        spec_counters=counters if len(outs) > 1 else first.spec_counters,
        prefix_cache=prefix_cache,
        num_replicas=len(outs),
        request_replica=np.asarray(assignment, dtype=np.int64).copy() if len(outs) > 1 else None,
        step_replica=(np.concatenate([np.full(len(o.steps), j, dtype=np.int64) for j, o in enumerate(outs)])[order]
                      if len(outs) > 1 else None),
    )


def prefix_aware_routing(
    workload,
    *,
    block_size_tokens: int,
    max_prefix_blocks_to_match: int,
    lru_capacity_per_server: int,
    prefix_cache_scorer_weight: float,
    queue_scorer_weight: float,
    active_request_scorer_weight: float,
) -> PrefixAwareRouting:
    """The ``prefix_aware`` router's settings, with the prompt block hashes it computes for every request.

    Request ``i``'s hashes are those of its prompt's first ``min(prompt_tokens[i] // block_size_tokens,
    max_prefix_blocks_to_match)`` full blocks (``Workload.content.block_hashes_many``, one pass over all
    requests); a workload without ``content`` shares no prefix, so no hashes are made (the prefix term
    is 0 for every replica).

    Args:
        workload: the :class:`~servesim.workload.Workload` (N requests).
        block_size_tokens: tokens per hashed block (>= 1; the engine's ``block_size`` by default).
        max_prefix_blocks_to_match: most blocks hashed per prompt (>= 1).
        lru_capacity_per_server, prefix_cache_scorer_weight, queue_scorer_weight,
            active_request_scorer_weight: as :class:`~servesim.engine.router.PrefixAwareRouting`.

    Raises:
        ValueError: as :class:`~servesim.engine.router.PrefixAwareRouting`, or a block size or block cap
            below 1.
    """
    if block_size_tokens < 1 or max_prefix_blocks_to_match < 1:
        raise ValueError("block_size_tokens and max_prefix_blocks_to_match must be >= 1")
    hashes = None
    if workload.content is not None:
        blocks = np.minimum(np.asarray(workload.prompt_tokens) // block_size_tokens, max_prefix_blocks_to_match)
        hashes = workload.content.block_hashes_many(np.arange(len(workload), dtype=np.int64), block_size_tokens,
                                                    blocks)
    return PrefixAwareRouting(
        prefix_cache_scorer_weight=prefix_cache_scorer_weight,
        queue_scorer_weight=queue_scorer_weight,
        active_request_scorer_weight=active_request_scorer_weight,
        lru_capacity_per_server=lru_capacity_per_server,
        prompt_hashes=hashes,
    )


MAX_REPLICAS = 4096
"""Most replicas one deployment simulates: each is a whole engine (its KV-block pool, its SimPy process)."""

MAX_REPLICA_REQUESTS = 2 * 10**7
"""Most replicas x requests: every replica is built over all N requests of the workload and wakes at every
arrival (memory and time O(replicas x requests); 2 x 10^7 is a few GB and minutes)."""


TRAFFIC_KEYS = {"trace": "rate_scale", "closed_loop": "concurrency"}
"""The workload key that sets a workload type's traffic (``rate`` where a type is not listed)."""


def check_deployment_size(replicas: int, num_requests: int, workload_type: str) -> None:
    """Refuse a deployment beyond :data:`MAX_REPLICAS` or :data:`MAX_REPLICA_REQUESTS`, in one line, rather
    than run for hours or out of memory; the advice names the traffic key of ``workload_type``.

    Raises:
        SettingError: naming ``deployment.replicas``, the workload's size and the limits.
    """
    from servesim.errors import SettingError

    if replicas > MAX_REPLICAS or replicas * num_requests > MAX_REPLICA_REQUESTS:
        raise SettingError(
            f"deployment.replicas: {replicas} replicas of a {num_requests}-request workload; servesim builds every "
            f"replica over the whole workload (memory and time grow with replicas x requests) and simulates at "
            f"most {MAX_REPLICAS:,} replicas and {MAX_REPLICA_REQUESTS:,} replicas x requests: simulate fewer "
            f"replicas with their share of the traffic (workload.{TRAFFIC_KEYS.get(workload_type, 'rate')})"
        )


def build_deployment(cfg, folder: Path, root: np.random.SeedSequence):
    """Build ``cfg.deployment.replicas`` replicas of the config's server behind its router.

    Args:
        cfg: a validated :class:`~servesim.config.models.SimConfig`.
        folder: folder that relative paths in the config resolve against.
        root: the run's root SeedSequence (the workload uses its child stream, as a single engine does;
            the routers are deterministic).

    Returns:
        ``(deployment, env, info)``: ``deployment.output()`` (merged) and ``deployment.replica_outputs()``
        after ``env.run()``; ``info`` is the single-replica setup plus ``replicas``, ``router`` and
        ``kv_cache_blocks_total`` (blocks over all replicas), and for the ``prefix_aware`` router its
        resolved settings (``prefix_aware``: weights, block size, block cap, index capacity).

    Raises:
        ConfigError: as :func:`servesim.wiring.prepare` and :func:`servesim.wiring.make_engine`.
    """
    from servesim.wiring import make_engine, prepare

    p = prepare(cfg, folder, root)
    dep = cfg.deployment
    check_deployment_size(dep.replicas, len(p.workload), cfg.workload.type)
    info = dict(p.info)
    routing = None
    if dep.router == "prefix_aware":
        settings = dep.prefix_aware.model_dump()
        if settings["block_size_tokens"] is None:
            settings["block_size_tokens"] = cfg.engine.block_size
        if settings["lru_capacity_per_server"] is None:
            settings["lru_capacity_per_server"] = int(p.kv_blocks)  # llm-d's autoTune: the server's KV blocks
        routing = prefix_aware_routing(p.workload, **settings)
        info["prefix_aware"] = settings
    deployment = Deployment(p.workload, lambda source: make_engine(p, source), dep.replicas, dep.router, routing)
    info.update(replicas=dep.replicas, router=dep.router, kv_cache_blocks_total=dep.replicas * p.kv_blocks)
    return deployment, deployment.env, info
