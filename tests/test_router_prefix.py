"""The prefix-aware router (llm-d's scorers): hand-worked routing traces, its LRU index, degenerate
weights, config errors, and session affinity on a multi-turn workload."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from engine_helpers import realistic_step_model
from servesim.input_files import validate
from servesim.config.models import DeploymentConfig
from servesim.deployment import Deployment, prefix_aware_routing
from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.router import ApproxPrefixIndex, PrefixAwareRouting, Router
from servesim.errors import ConfigError
from servesim.workload import MultiTurnWorkloadConfig, build_workload
from servesim.workload.content import SequenceContent
from servesim.workload.workload import Workload

BLOCK = 16


def blocks_workload(prompts: list[list[int]], arrival_s: list[float] | None = None) -> Workload:
    """Request ``i``'s prompt is the 16-token blocks named ``prompts[i]`` (equal id lists up to block k =
    equal hashes up to block k), then 5 output tokens."""
    n = len(prompts)
    counts = np.array([len(p) for p in prompts], dtype=np.int64)
    offsets = np.r_[0, np.cumsum(counts)]
    prompt_tokens = BLOCK * counts
    output_tokens = np.full(n, 5, dtype=np.int64)
    content = SequenceContent.from_trace_blocks(offsets, np.concatenate([np.asarray(p) for p in prompts]),
                                                BLOCK, prompt_tokens, output_tokens)
    arrivals = np.arange(n, dtype=np.float64) if arrival_s is None else np.asarray(arrival_s)
    return Workload(arrival_s=arrivals, prompt_tokens=prompt_tokens, output_tokens=output_tokens, content=content)


def routing(wl, prefix=3.0, queue=2.0, active=2.0, capacity=31250, max_blocks=256) -> PrefixAwareRouting:
    return prefix_aware_routing(wl, block_size_tokens=BLOCK, max_prefix_blocks_to_match=max_blocks,
                                lru_capacity_per_server=capacity, prefix_cache_scorer_weight=prefix,
                                queue_scorer_weight=queue, active_request_scorer_weight=active)


class Trace:
    """A bare router over a workload; the test sets each replica's waiting queue and routes by hand."""

    def __init__(self, wl: Workload, replicas: int, settings: PrefixAwareRouting) -> None:
        times = [int(round(t * 1e12)) for t in wl.arrival_s]
        self.router = Router(simpy.Environment(), ArrivalSource(times=times, num_requests=len(wl)), replicas,
                             "prefix_aware", settings)
        self.waiting = [0] * replicas
        for j in range(replicas):
            self.router.waiting_of[j] = lambda j=j: self.waiting[j]

    def route(self, request: int, waiting: list[int] | None = None) -> int:
        """Route request ``request`` (arriving at ``request`` s), the replicas' queues set to ``waiting``;
        pulls every inbox first so that the queue lengths are exactly ``waiting``."""
        for box in self.router.inbox:
            box.clear()
        if waiting is not None:
            self.waiting[:] = waiting
        self.router.route_until(request * 10**12)
        return self.router.assignment[request]


# ---------------------------------------------------------------- hand-worked traces (2 replicas)
def test_prefix_beats_queue_and_load_beats_a_shorter_prefix():
    # r0 [1 2 3 4]: nothing cached, equal loads: all scores 3*0 + 2*1 + 2*1 = 4 -> tie -> replica 0.
    # r1 [9 10]: outstanding (1, 0) -> active scores (0, 1): replica 0 = 2, replica 1 = 4 -> 1.
    # r2 [1 2 3 5], queues (3, 0), outstanding (1, 1): replica 0 = 3*3/4 + 0 + 2 = 4.25, replica 1 = 0 + 2 + 2
    #    = 4 -> 0 (the cached prefix beats the longer queue).
    # r3 [1 2 6 7], queues (3, 0), outstanding (2, 1): replica 0 = 3*2/4 + 0 + 0 = 1.5, replica 1 = 4 -> 1.
    wl = blocks_workload([[1, 2, 3, 4], [9, 10], [1, 2, 3, 5], [1, 2, 6, 7]])
    trace = Trace(wl, 2, routing(wl))
    assert [trace.route(0), trace.route(1), trace.route(2, [3, 0]), trace.route(3, [3, 0])] == [0, 1, 0, 1]
    # the router's own tally: 4 + 2 + 4 + 4 blocks hashed, 3 of them held by the chosen replica (r2's)
    assert (trace.router.prefix_hashed_blocks, trace.router.prefix_matched_blocks) == (14, 3)


def test_a_heavier_prefix_weight_keeps_the_request_on_its_prefix():
    # As above with prefix weight 10: r2 = 7.5 + 2 vs 4; r3 = 10*2/4 = 5 vs 4 -> replica 0 this time.
    wl = blocks_workload([[1, 2, 3, 4], [9, 10], [1, 2, 3, 5], [1, 2, 6, 7]])
    trace = Trace(wl, 2, routing(wl, prefix=10.0))
    assert [trace.route(0), trace.route(1), trace.route(2, [3, 0]), trace.route(3, [3, 0])] == [0, 1, 0, 0]


def test_the_match_is_the_run_of_blocks_from_the_first():
    # r1 [7 2 3] shares blocks 1-2 of r0 but not block 0: chained hashes differ from block 0 on, no
    # match; outstanding (1, 0) sends it to replica 1. r2 [1 2] matches r0's first two blocks (2/2) on
    # replica 0, outstanding (1, 1): 3 + 2 + 2 = 7 against 4 -> 0.
    wl = blocks_workload([[1, 2, 3], [7, 2, 3], [1, 2]])
    trace = Trace(wl, 2, routing(wl))
    assert [trace.route(0), trace.route(1), trace.route(2)] == [0, 1, 0]
    index = trace.router.prefix_index
    h0 = wl.content.block_hashes(0, BLOCK).tolist()
    h1 = wl.content.block_hashes(1, BLOCK).tolist()
    assert index.matched_blocks(0, h0) == 3 and index.matched_blocks(1, h0) == 0
    assert index.matched_blocks(1, h1) == 3 and index.matched_blocks(0, h1) == 0
    assert not set(h0) & set(h1)


def test_ties_go_to_the_lowest_index():
    # Three replicas. r0 -> 0 (all equal). r1 shares nothing, outstanding (1, 0, 0): replicas 1 and 2 tie
    # at 4 -> 1. r2: outstanding (1, 1, 0) -> 2. r3 [5 6] shares nothing, outstanding (1, 1, 1), queues
    # (0, 2, 2): replica 0 alone scores 4 -> 0. r4: outstanding (2, 1, 1), queues (0, 2, 2) -> replica 0
    # = 2 + 0, replicas 1 and 2 = 0 + 2 -> tie of all three -> 0.
    wl = blocks_workload([[1], [2], [3], [5, 6], [8]])
    trace = Trace(wl, 3, routing(wl))
    got = [trace.route(0), trace.route(1), trace.route(2), trace.route(3, [0, 2, 2]), trace.route(4, [0, 2, 2])]
    assert got == [0, 1, 2, 0, 0]


def test_prompt_blocks_only_full_ones_and_at_most_max_prefix_blocks():
    # A 40-token prompt hashes its 2 full blocks; with max_prefix_blocks_to_match 3 a 5-block prompt
    # hashes 3 blocks, so a request matching those 3 scores 3/3 even though its blocks 4-5 differ.
    content = SequenceContent.from_trace_blocks(np.array([0, 3, 8, 13]), np.array([1, 2, 3, 4, 5, 6, 7, 8,
                                                4, 5, 6, 9, 9]), BLOCK, np.array([40, 80, 80]),
                                                np.array([5, 5, 5]))
    wl = Workload(arrival_s=np.array([0.0, 1.0, 2.0]), prompt_tokens=np.array([40, 80, 80]),
                  output_tokens=np.array([5, 5, 5]), content=content)
    settings = routing(wl, max_blocks=3)
    assert [len(settings.prompt_hashes.of(i)) for i in range(3)] == [2, 3, 3]
    assert np.array_equal(settings.prompt_hashes.of(1), content.block_hashes(1, BLOCK, 3))
    # r0 -> 0; r1 (blocks 4..8): outstanding (1, 0) -> 1; r2 (4 5 6 9 9) matches r1's 3 hashed blocks
    # on replica 1: 3*3/3 + 2 + 2 (outstanding 1, 1) = 7 against 4.
    trace = Trace(wl, 2, settings)
    assert [trace.route(0), trace.route(1), trace.route(2, [0, 0])] == [0, 1, 1]


# ---------------------------------------------------------------- the router's LRU index
def test_index_evicts_the_least_recently_routed_blocks_per_replica():
    index = ApproxPrefixIndex(2, capacity=4)
    index.add(0, [11, 12, 13, 14])
    index.add(0, [11])              # 11 becomes the most recent: 12 13 14 11
    index.add(1, [21, 22, 23, 24, 25])  # replica 1's own LRU: 22 23 24 25 (replica 0 unchanged)
    index.add(0, [15, 16])          # evicts 12, 13: 14 11 15 16
    assert list(index.lru[0]) == [14, 11, 15, 16]
    assert list(index.lru[1]) == [22, 23, 24, 25]
    assert index.matched_blocks(0, [11, 12, 13]) == 1
    assert index.matched_blocks(0, [12, 14, 11]) == 0   # held blocks after a missing one do not count
    assert index.matched_blocks(0, [14, 11, 15, 16, 17]) == 4
    assert list(index.lru[0]) == [14, 11, 15, 16]  # reads change no recency


@pytest.mark.parametrize("capacity, expected", [(6, 0), (4, 1)])
def test_eviction_from_the_routers_index_changes_the_choice(capacity, expected):
    # Queue weight only besides the prefix (active 0). r0 [1 2 3 4] -> 0 (tie). r1 [5 6], queues (0, 1) ->
    # 0: with capacity 4 it evicts r0's blocks 1 and 2. r2 [1 2 3 4], queues (1, 0): with capacity 6
    # replica 0 still holds all 4 blocks, 3*4/4 + 0 = 3 against replica 1's 2 -> 0; with capacity 4 its
    # run from block 0 is broken, 0 against 2 -> 1.
    wl = blocks_workload([[1, 2, 3, 4], [5, 6], [1, 2, 3, 4]])
    trace = Trace(wl, 2, routing(wl, queue=2.0, active=0.0, capacity=capacity))
    assert [trace.route(0), trace.route(1, [0, 1]), trace.route(2, [1, 0])] == [0, 0, expected]


# ---------------------------------------------------------------- config and settings errors
@pytest.mark.parametrize("data, message", [
    ({"router": "prefix_aware", "prefix_aware": {"queue_scorer_weight": -1}}, "greater than or equal to 0"),
    ({"router": "prefix_aware", "prefix_aware": {"prefix_cache_scorer_weight": float("nan")}}, "finite"),
    ({"router": "prefix_aware", "prefix_aware": {"prefix_cache_scorer_weight": 0, "queue_scorer_weight": 0,
                                                 "active_request_scorer_weight": 0}}, "at least one scorer"),
    ({"router": "prefix_aware", "prefix_aware": {"lru_capacity_per_server": 0}}, "greater than or equal to 1"),
    ({"router": "prefix_aware", "prefix_aware": {"queue_weight": 1}}, "unknown key"),
    ({"router": "shortest_queue", "prefix_aware": {}}, "only read by router: prefix_aware"),
])
def test_bad_router_settings_are_one_line_errors(data, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(DeploymentConfig, data, "run.yaml", key_prefix="deployment")
    assert "\n" not in str(err.value) and str(err.value).startswith("run.yaml: deployment")


def test_defaults_are_llm_ds():
    cfg = validate(DeploymentConfig, {"router": "prefix_aware"}, "run.yaml")
    assert cfg.prefix_aware.model_dump() == {
        "prefix_cache_scorer_weight": 3.0, "queue_scorer_weight": 2.0, "active_request_scorer_weight": 2.0,
        "block_size_tokens": None, "max_prefix_blocks_to_match": 256, "lru_capacity_per_server": None}


def test_prefix_aware_needs_its_settings_and_valid_weights():
    wl = blocks_workload([[1]])
    with pytest.raises(ValueError, match="needs its PrefixAwareRouting"):
        Router(simpy.Environment(), ArrivalSource(times=[0], num_requests=1), 2, "prefix_aware")
    with pytest.raises(ValueError, match="not all 0"):
        routing(wl, prefix=0.0, queue=0.0, active=0.0)


# ---------------------------------------------------------------- deployments on a multi-turn workload
def chat(seed=7, rate=2.0, num_sessions=48):
    """Sessions of 2-6 turns, messages of 8 blocks, outputs of 16: turn t's prompt is 8 + 24 t blocks, of
    which the previous turn's prompt (the router only indexes prompts) covers 8 + 24 (t - 1): >= 25%."""
    wcfg = MultiTurnWorkloadConfig(
        type="multi_turn", rate=rate, num_sessions=num_sessions, turns={"type": "uniform", "low": 2, "high": 6},
        message_tokens={"type": "fixed", "value": 8 * BLOCK}, output_tokens={"type": "fixed", "value": 16 * BLOCK},
        think_time_s=8.0)
    return build_workload(wcfg, np.random.default_rng(np.random.SeedSequence(seed)))


def deploy(wl, router, replicas=4, settings=None, max_num_seqs=256):
    def make(src):
        return Engine(prompt_tokens=wl.prompt_tokens, output_tokens=wl.output_tokens, arrivals=src,
                      step_time=realistic_step_model(), kv_blocks_total=100_000, block_size=BLOCK,
                      max_num_seqs=max_num_seqs, max_num_batched_tokens=8192)

    dep = Deployment(wl, make, replicas, router, settings)
    dep.env.run()
    return dep


def follows_previous_turn(wl, assignment) -> np.ndarray:
    """For every turn after a session's first: was it routed to the replica of the session's previous turn?"""
    order = np.lexsort((wl.sessions.turn_index, wl.sessions.session_id))
    sess, rep = wl.sessions.session_id[order], assignment[order]
    later = sess[1:] == sess[:-1]
    return (rep[1:] == rep[:-1])[later]


def test_prefix_aware_keeps_every_session_on_its_replica_and_round_robin_does_not():
    # Prefix weight 5, outstanding-requests weight 1: a later turn scores >= 5 x 0.25 = 1.25 on its
    # previous turn's replica and 0 elsewhere (sessions share nothing), more than any load difference
    # (<= 1), so it always stays; a first turn matches nowhere and goes to the least loaded replica.
    wl = chat()
    aware = deploy(wl, "prefix_aware", settings=routing(wl, prefix=5.0, queue=0.0, active=1.0)).assignment
    rr = deploy(wl, "round_robin").assignment
    assert (aware >= 0).all() and (rr >= 0).all()
    assert follows_previous_turn(wl, aware).all()
    assert follows_previous_turn(wl, rr).mean() < 0.5
    # the sessions are spread: every replica serves at least 6 of the 48 sessions
    first = aware[wl.sessions.turn_index == 0]
    assert np.bincount(first, minlength=4).min() >= 6, np.bincount(first, minlength=4)


# shortest_queue breaks ties of equal queues by fewest unfinished requests: as a queue score with an active
# score too small to outweigh any queue difference (min-max normalised queue scores differ by >= 1/(max-min))
@pytest.mark.parametrize("weights, policy", [((0.0, 1.0, 1e-6), "shortest_queue"),
                                             ((0.0, 0.0, 1.0), "least_outstanding")])
def test_zero_prefix_weight_is_the_load_policys_choice(weights, policy):
    wl = chat(seed=11, rate=3.0, num_sessions=80)   # max_num_seqs 1: busy enough that queues form
    prefix, queue, active = weights
    aware = deploy(wl, "prefix_aware", settings=routing(wl, prefix=prefix, queue=queue, active=active),
                   max_num_seqs=1)
    load = deploy(wl, policy, max_num_seqs=1)
    assert np.array_equal(aware.assignment, load.assignment)
    assert len(np.unique(load.assignment)) == 4
    with_prefix = deploy(wl, "prefix_aware", settings=routing(wl, prefix=3.0, queue=queue, active=active),
                         max_num_seqs=1)
    assert not np.array_equal(with_prefix.assignment, load.assignment)


def test_a_run_config_reports_the_resolved_settings_and_the_routers_tally():
    from servesim import simulate

    config = {
        "hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": {"block_size": 32},
        "workload": {"type": "multi_turn", "rate": 1.0, "num_sessions": 6, "turns": {"type": "fixed", "value": 3},
                     "message_tokens": {"type": "fixed", "value": 64}, "output_tokens": {"type": "fixed", "value": 32},
                     "think_time_s": 5.0},
        "deployment": {"replicas": 2, "router": "prefix_aware",
                       "prefix_aware": {"prefix_cache_scorer_weight": 10.0, "queue_scorer_weight": 1.0,
                                        "active_request_scorer_weight": 0.0}},
    }
    result = simulate(config)
    settings = result.info["prefix_aware"]
    assert settings["block_size_tokens"] == 32 and settings["queue_scorer_weight"] == 1.0
    assert settings["lru_capacity_per_server"] == result.info["kv_cache_blocks"]
    router = result.summary["router"]
    assert router["policy"] == "prefix_aware" and sum(router["requests_per_replica"]) == 18
    # prompts of 64, 160 and 256 tokens: 2 + 5 + 8 blocks of 32 per session; turns 2 and 3 match their
    # previous turn's 2 and 5 blocks, and stay with it (10 x 2/5 = 4 beats any queue difference, <= 1)
    assert router["prefix_hashed_blocks"] == 6 * 15
    assert router["prefix_matched_blocks"] == 6 * 7 and router["prefix_match_rate"] == 42 / 90


def test_a_workload_without_shared_content_routes_by_load_alone():
    rng = np.random.default_rng(np.random.SeedSequence(3))
    n = 200
    wl = Workload(arrival_s=np.cumsum(rng.exponential(1 / 8.0, n)), prompt_tokens=rng.integers(100, 2000, n),
                  output_tokens=rng.integers(20, 300, n))
    settings = routing(wl, prefix=3.0, queue=0.0, active=1.0)
    assert settings.prompt_hashes is None
    assert np.array_equal(deploy(wl, "prefix_aware", settings=settings).assignment,
                          deploy(wl, "least_outstanding").assignment)


@pytest.mark.parametrize("loop", ["open", "closed"])
def test_run_mode_equals_step_mode_with_the_prefix_aware_router(loop):
    if loop == "open":
        wl = chat(seed=5, rate=3.0, num_sessions=40)
    else:   # a closed loop whose prompts share 8 system prompts (Zipf)
        from servesim.workload import ClosedLoopWorkloadConfig

        wl = build_workload(ClosedLoopWorkloadConfig(
            type="closed_loop", concurrency=12, num_requests=150, think_time_s=0.05,
            prompt_tokens={"type": "uniform", "low": 20, "high": 600},
            output_tokens={"type": "uniform", "low": 5, "high": 120},
            system_prompts={"num_prompts": 8, "prompt_tokens": {"type": "uniform", "low": 64, "high": 512}}),
            np.random.default_rng(np.random.SeedSequence(2)))
        assert wl.content is not None

    def routed(mode):
        def make(src):
            return Engine(prompt_tokens=wl.prompt_tokens, output_tokens=wl.output_tokens, arrivals=src,
                          step_time=realistic_step_model(), kv_blocks_total=3_000, block_size=BLOCK,
                          max_num_seqs=8, max_num_batched_tokens=2048, mode=mode)

        dep = Deployment(wl, make, 3, "prefix_aware", routing(wl))
        dep.env.run()
        return dep

    run_dep, step_dep = routed("run"), routed("step")
    assert (run_dep.assignment >= 0).all() and len(np.unique(run_dep.assignment)) == 3
    assert np.array_equal(run_dep.assignment, step_dep.assignment)
    a, b = run_dep.output().requests, step_dep.output().requests
    for name in ("first_token_s", "finish_s", "preemptions"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert run_dep.router_summary() == step_dep.router_summary()
    assert run_dep.router_summary()["prefix_matched_blocks"] > 0
