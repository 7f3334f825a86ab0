"""Rules that the third mutation pass found unpinned (docs/mutation-testing.md, "Third pass"): each test names
the rule it pins and checks it against a hand-worked value or a closed form, so that swapping the rule,
dropping a term or shifting a constant fails here."""

from __future__ import annotations

import numpy as np
import pytest
from test_metrics import make_requests, make_steps

from servesim.config.models import MeasureWindow
from servesim.engine.output import EngineOutput
from servesim.metrics.steps import busy_time_weighted
from servesim.metrics.summary import measurement_window, prefix_cache_summary


# ----------------------------------------------------------------------------------------------- metrics
def _three_finishes() -> EngineOutput:
    """Three requests arriving at 0 s, finishing at 1, 3 and 4 s; TPOTs (E2E - TTFT) / (output - 1) of
    (1 - 0.5) / 2 = 0.25, (3 - 1) / 4 = 0.5 and (4 - 2) / 1 = 2 s."""
    requests = make_requests([
        (0.0, 10, 3, 3, 0.0, 0.5, 1.0, 0),
        (0.0, 20, 5, 5, 0.0, 1.0, 3.0, 0),
        (0.0, 30, 2, 2, 0.0, 2.0, 4.0, 0),
    ])
    steps = make_steps([dict(start_s=0.0, num_steps=1, first_step_s=4.0, batch_size=3)])
    return EngineOutput(requests, steps, np.zeros(0), 100, 16, 4.0)


def test_measurement_window_starts_at_the_later_and_ends_at_the_earlier_of_its_bounds():
    # MeasureWindow: start = max(after_s, finish of the after_completed-th) = max(1.5, 1) = 1.5 s; end =
    # min(last finish, until_s) = min(4, 10) = 4 s (an until_s past the run does not stretch the window).
    # Inside (1.5, 4]: the requests finishing at 3 and 4 s: 2 requests, 7 output and 50 prompt tokens in
    # 2.5 s; their TPOTs 0.5 and 2 s (the first request's 0.25 s is outside the window).
    w = measurement_window(_three_finishes(), MeasureWindow(after_s=1.5, after_completed=1, until_s=10.0))
    assert (w["start_s"], w["end_s"], w["completed"]) == (1.5, 4.0, 2)
    assert w["request_throughput"] == 2 / 2.5
    assert w["output_throughput"] == 7 / 2.5
    assert w["total_token_throughput"] == 57 / 2.5
    assert w["tpot_s"]["mean"] == 1.25
    assert (w["tpot_s"]["p50"], w["tpot_s"]["p99"]) == (1.25, 2.0 - 1.5 * (1 - 0.99))


def test_prefix_cache_hit_rate_is_hits_over_queries_of_first_admissions_only():
    # vLLM's vllm:prefix_cache_hits / vllm:prefix_cache_queries: re-admissions after a preemption are
    # counted apart (preempted_*) and left out of the hit rate: 40 / 100, not (40 + 50) / (100 + 50)
    counters = dict(requests=2, queries=100, hits=40, preempted_requests=1, preempted_queries=50,
                    preempted_hits=50)
    assert prefix_cache_summary(counters)["hit_rate"] == 0.4


def test_busy_time_mean_without_busy_time_is_the_plain_mean_over_the_scale():
    # no busy time (every row 0 ps): mean = plain mean of the values / scale = 3 / 8, max = 4 / 8
    assert busy_time_weighted(np.array([2, 4]), np.array([0, 0]), scale=8) == {"mean": 0.375, "max": 0.5}


# ------------------------------------------------------------------------------------------------ router
def test_shortest_queue_orders_by_the_queue_first_and_only_then_by_unfinished_requests():
    # Router "shortest_queue": the lexicographic minimum of (waiting queue, unfinished requests, index).
    # A bare router over four arrivals 1 s apart, nothing finishing, every inbox pulled before the next
    # arrival; the replicas' waiting queues are set by hand. r0: (0, 0) (0, 0) -> 0; r1: queues equal,
    # unfinished (1, 0) -> 1; r2: unfinished (1, 1) -> 0; r3: queues (0, 1), unfinished (2, 1): the shorter
    # queue wins over the fewer unfinished requests -> 0.
    import simpy

    from servesim.engine.arrival_source import ArrivalSource
    from servesim.engine.router import Router

    router = Router(simpy.Environment(), ArrivalSource(times=[k * 10**12 for k in range(4)], num_requests=4),
                    2, "shortest_queue")
    waiting = [0, 0]
    for j in range(2):
        router.waiting_of[j] = lambda j=j: waiting[j]
    for r, queues in enumerate([(0, 0), (0, 0), (0, 0), (0, 1)]):
        for box in router.inbox:
            box.clear()
        waiting[:] = queues
        router.route_until(r * 10**12)
    assert router.assignment == [0, 1, 0, 0]


# ----------------------------------------------------------------------------------------- block manager
def test_an_own_chain_hit_leaves_the_last_known_token_to_recompute():
    # BlockManager.lookup: a hit is at most (num_tokens - 1) // block_size blocks, also into the request's
    # own chain (its cached blocks freed by a preemption). Request 0 held 2 blocks with 32 tokens cached
    # (both full); re-admitted with 32 known tokens it hits (32 - 1) // 16 = 1 block, with 33 it hits 2.
    from servesim.engine.block_manager import BlockManager

    bm = BlockManager(11, 16, True)  # 10 usable blocks
    bm.sync(8)  # the engine allocated 2 of them
    assert bm.free(0, 2, 32, 8) == 2
    hit = bm.lookup(0, 32, 10)
    assert (hit.num_blocks, hit.num_evictable) == (1, 1)
    hit = bm.lookup(0, 33, 10)
    assert (hit.num_blocks, hit.num_evictable) == (2, 2)


# ---------------------------------------------------------------------------------------------- workload
def test_an_empirical_length_is_raised_to_its_min_and_cut_at_its_max(tmp_path):
    # EmpiricalLengthConfig: the column is clipped to [min, max] before resampling: prompts 3, 50, 7 and
    # 200 with min 10, max 100 resample from 10, 50, 10, 100 (mean 42.5)
    from servesim.workload.lengths import EmpiricalLengthConfig

    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.0000000,3,5\n2023-11-16 18:15:47.0000000,50,5\n"
                                    "2023-11-16 18:15:48.0000000,7,5\n2023-11-16 18:15:49.0000000,200,5\n")
    dist = EmpiricalLengthConfig(type="empirical", path="t.csv", column="prompt", min=10, max=100).build(tmp_path)
    assert dist.values.tolist() == [10, 50, 10, 100]
    assert dist.mean() == 42.5


def test_empirical_pairs_raise_zero_token_counts_to_one(tmp_path):
    # EmpiricalPairsConfig: token counts of 0 in the file are raised to 1, as when replaying the trace;
    # pairs stay together: (0, 5) -> (1, 5), (7, 0) -> (7, 1)
    from servesim.workload.lengths import EmpiricalPairsConfig

    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.0000000,0,5\n2023-11-16 18:15:47.0000000,7,0\n")
    pairs = EmpiricalPairsConfig(type="empirical", path="t.csv").build(tmp_path)
    assert (pairs.prompt_tokens.tolist(), pairs.output_tokens.tolist()) == ([1, 7], [5, 1])


# ------------------------------------------------------------------------------------------- speculation
def test_mean_acceptance_length_counts_rounds_without_a_draft():
    # AcceptanceProfile: rates given over rounds with a draft (rates_include_no_match false), no match in
    # half the rounds: position 1 is 0.5 x 0.8 = 0.4 over all rounds, position 2 0.4 x 0.4 / 0.8 = 0.2, and
    # beyond K the last conditional rate 0.5 repeats: AL(2) = 1.6, AL(3) = 1 + 0.4 + 0.2 + 0.1 = 1.7
    from servesim.speculation.profile import AcceptanceProfile

    prof = AcceptanceProfile(source="test", per_position_acceptance=[0.8, 0.4], no_match_probability=0.5,
                             rates_include_no_match=False)
    assert prof.unconditional_extended(3).tolist() == pytest.approx([0.4, 0.2, 0.1], rel=1e-15)
    assert prof.mean_acceptance_length() == pytest.approx(1.6, rel=1e-15)
    assert prof.mean_acceptance_length(3) == pytest.approx(1.7, rel=1e-15)


def _llama_eagle_drafter(tp: int, mode: str, **spec_fields):
    """The default EAGLE head's costs (k = 3) for Llama-3.1-8B on H100s at target TP ``tp``."""
    from servesim.cards import load_hardware, load_model
    from servesim.roofline import build_step_time_model
    from servesim.speculation.config import SpeculativeConfig
    from servesim.speculation.costs import build_drafter

    hw, target = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, **spec_fields)
    return build_drafter(spec, hw, target, tp, mode, build_step_time_model(hw, target, tp, mode, speculative=True))


@pytest.mark.parametrize("draft_tp, weight_bytes, kv_bytes", [(None, 218_116_096, 2048), (1, 436_232_192, 4096)])
def test_the_drafter_is_split_over_its_own_tensor_parallel_size(draft_tp, weight_bytes, kv_bytes):
    # build_drafter: the drafter's weights and KV are divided by draft_tensor_parallel_size, by default the
    # target's. Llama-3.1-8B's default EAGLE head stores one decoder layer and the final norm (the
    # embedding and lm_head are the target's): q, o 4096 x 4096, k, v 4096 x 1024, MLP 3 x 4096 x 14336,
    # norms 3 x 4096 = 218,116,096 bf16 parameters = 436,232,192 bytes; its KV 2 x 8 x 128 x 2 = 4096
    # bytes per token. Under a target of TP 2: half of each by default, all of it with a drafter TP of 1.
    drafter = _llama_eagle_drafter(2, "calibrated", draft_tensor_parallel_size=draft_tp)
    assert (drafter.weight_bytes_per_gpu, drafter.kv_bytes_per_token_per_gpu) == (weight_bytes, kv_bytes)


@pytest.mark.parametrize("mode, overhead_subps", [("ideal", 0), ("calibrated", 39_976_960_000_000)])
def test_the_draft_pass_overhead_is_left_out_of_the_ideal_roofline(mode, overhead_subps):
    # the ideal roofline has no overhead terms: draft_pass_overhead_s (default 0.61 ms) counts only in the
    # calibrated mode, 0.61e-3 s x 1e12 ps/s x 2^16 = 39,976,960,000,000 subps per pass
    drafter = _llama_eagle_drafter(1, mode)
    assert drafter.pass_overhead_subps == overhead_subps


# ---------------------------------------------------------------------------------------------- roofline
def test_compute_bound_tokens_count_each_tokens_lm_head():
    # ideal roofline, Llama-3.1-8B on an H100: a step reads all 8,030,261,248 parameters in bf16 and each
    # decode token costs 2 FLOPs per matmul parameter, its logit's lm_head included (8,030,261,248 less the
    # 128,256 x 4,096 embedding table and the 65 x 4,096 norm weights = 7,504,658,432), so the weight read
    # and the compute line cross at T = 8,030,261,248 / 7,504,658,432 x 989.5e12 / 3.35e12 = 316.06 tokens
    # (339.85 without the lm_head)
    from servesim.cards import load_hardware, load_model
    from servesim.roofline import build_step_time_model

    model = build_step_time_model(load_hardware("h100-sxm"), load_model("llama-3.1-8b"), 1, mode="ideal")
    expected = 8_030_261_248 / 7_504_658_432 * 989.5e12 / 3.35e12
    assert model.compute_bound_tokens() == pytest.approx(expected, rel=1e-12)
