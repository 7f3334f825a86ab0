"""Rules that mutation testing found unpinned (docs/mutation-testing.md): each test names the rule it pins
and checks it against a hand-worked value, so that swapping the rule, dropping a term or shifting a
constant by 5% fails here."""

from __future__ import annotations

import pytest
from engine_helpers import flat_step_model, run_engine

from servesim.cards import load_hardware, load_model
from servesim.roofline import SUBPS_PER_S, build_step_time_model, subps_coefficient


# ---------------------------------------------------------------------------------------------- roofline
def _card(**fields):
    return load_hardware("h100-sxm").model_copy(update=fields)


def test_per_request_term_is_per_request_s_times_scheduled_requests():
    # roofline: t = t_step + R * t_req + ...; no shipped card sets per_request_s (default 0), so a user card
    # is the only place the term shows. 10 us per request = 10e-6 * 1e12 * 2^16 = 655,360,000,000 subps.
    llama = load_model("llama-3.1-8b")
    with_req = build_step_time_model(_card(per_request_s=10e-6), llama, 1)
    without = build_step_time_model(_card(per_request_s=0.0), llama, 1)
    assert with_req.request_subps_per_request == 655_360_000_000
    for tokens, logits, requests in ((1, 1, 1), (64, 64, 64), (2048, 3, 3)):
        assert (with_req.step_subps(tokens, logits, 1000, 5000, requests)
                - without.step_subps(tokens, logits, 1000, 5000, requests)) == requests * 655_360_000_000
    # a drafter's passes run inside the target's step: no second per-request term
    drafter = build_step_time_model(_card(per_request_s=10e-6), llama, 1, step_overhead=False)
    assert drafter.request_subps_per_request == 0


@pytest.mark.parametrize("tokens, logits", [(1, 1), (300, 64), (4096, 0)])
def test_launch_counts_are_five_elementwise_and_four_gemms_per_layer_plus_the_lm_head(tokens, logits):
    # Vidur's profiled non-GEMM operators: 2 RMSNorms, rotary embedding, SiLU-and-mul, residual add = 5 per
    # layer; GEMMs: QKV, O, gate+up, down = 4 per layer, + 1 for the lm_head when logits are computed.
    # Llama-3.1-8B has 32 layers: d t / d elementwise_launch_s = 5 * 32 = 160, d t / d gemm_launch_s =
    # 4 * 32 + 1 = 129 (128 without logits). Written out, not read from the module's constants.
    llama = load_model("llama-3.1-8b")
    hw = load_hardware("h100-sxm")
    delta = 1e-6
    ref = build_step_time_model(hw, llama, 1).base_s(tokens, logits, 1)
    ew = build_step_time_model(_card(elementwise_launch_s=hw.elementwise_launch_s + delta), llama, 1)
    gemm = build_step_time_model(_card(gemm_launch_s=hw.gemm_launch_s + delta), llama, 1)
    assert ew.base_s(tokens, logits, 1) - ref == pytest.approx(160 * delta, rel=1e-6)
    assert gemm.base_s(tokens, logits, 1) - ref == pytest.approx((129 if logits else 128) * delta, rel=1e-6)


def test_a_positive_coefficient_never_rounds_to_zero():
    # roofline "Exactness": each coefficient is rounded once, and a positive one is at least 1 subps
    assert subps_coefficient(0.3) == (1, pytest.approx(0.7 / 0.3))
    assert subps_coefficient(2.4) == (2, pytest.approx(0.4 / 2.4))
    assert subps_coefficient(0.0) == (0, 0.0)
    # 1e-20 s per token (far below 2^-16 ps) still costs 1 subps per token
    assert round(1e-20 * SUBPS_PER_S) == 0 and subps_coefficient(1e-20 * SUBPS_PER_S)[0] == 1



@pytest.mark.parametrize("tp", [1, 2])
def test_attention_pair_coefficient_is_4_l_h_d_flops_at_the_effective_peak(tp):
    # roofline: F_attn_pair * sum pairs / (eta_c P) per GPU. Llama-3.1-8B: QK^T and PV, 2 d FLOPs each per
    # head and layer: 4 x 32 layers x 32 heads x 128 = 524,288 FLOPs per (query, key) pair, split over TP;
    # H100 SXM: eta_c 0.733 x 989.5 TFLOP/s = 725.3 TFLOP/s -> 722.853 ps per pair at TP 1 (the old tests
    # reached this coefficient only through its rounding error)
    st = build_step_time_model(load_hardware("h100-sxm"), load_model("llama-3.1-8b"), tp)
    # (rel 1e-7: the integer coefficient is rounded once to 2^-16 ps, 2e-8 relative here)
    assert st.attn_ps_per_pair == pytest.approx(524_288 / tp / (0.733 * 989.5e12) * 1e12, rel=1e-7)
    assert (st.step_subps(8, 8, 0, 1000, 8) - st.step_subps(8, 8, 0, 0, 8)) == 1000 * st.attn_subps_per_pair

# ---------------------------------------------------------------------------------------------- KV capacity
def test_activation_reserve_is_hidden_states_mlp_logits_and_one_gib():
    # kv_cache: T_max (4 D + 2 F / TP) 2 B + max_num_seqs V / TP 4 B + 1 GiB, Llama-3.1-8B (D 4096,
    # F 14336, V 128256), T_max 8192, 256 sequences:
    #   TP 1: 8192 * (16384 + 28672) * 2 = 738,197,504; 256 * 128256 * 4 = 131,334,144; + 1,073,741,824
    #   TP 2: 8192 * (16384 + 14336) * 2 = 503,316,480; 256 * 64128 * 4 = 65,667,072; + 1,073,741,824
    from servesim.engine.kv_cache import activation_reserve_bytes

    llama = load_model("llama-3.1-8b")
    assert activation_reserve_bytes(llama, 1, 8192, 256) == 738_197_504 + 131_334_144 + 1_073_741_824
    assert activation_reserve_bytes(llama, 2, 8192, 256) == 503_316_480 + 65_667_072 + 1_073_741_824


def test_kv_blocks_are_the_floor_of_what_is_left_over_the_block_bytes():
    # 0.9 x 80e9 B - 16,060,522,496 B of weights - 1,943,273,472 B reserve = 53,996,204,032 B; a block of 16
    # tokens of 131,072 B is 2,097,152 B: 25,747.396 -> 25,747 blocks (floor, as vLLM's
    # num_gpu_blocks = available // page_size). A drafter's KV bytes per token share the block: + 65,536 B a
    # token gives 3,145,728 B a block: 17,164.93 -> 17,164.
    from servesim.engine.kv_cache import kv_cache_blocks

    args = dict(tensor_parallel_size=1, block_size=16, gpu_memory_utilization=0.9, max_num_batched_tokens=8192,
                max_num_seqs=256)
    hw, llama = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    assert kv_cache_blocks(hw, llama, **args) == 25_747
    assert kv_cache_blocks(hw, llama, **args, extra_kv_bytes_per_token_per_gpu=65_536) == 17_164


# ---------------------------------------------------------------------------------------------- engine
def test_a_decode_run_behind_max_num_seqs_is_one_row():
    # run mode sums the decode steps between two events in closed form: a queue held back by max_num_seqs
    # (head_blocked: running >= max_num_seqs) does not end a run. max_num_seqs 2, three 16-token prompts at
    # t = 0, outputs 50, 50, 5, every step 10 ms: step 0 prefills r0 and r1 (r2 waits), steps 1-49 decode
    # both (their 50th token at 0.50 s), step 50 prefills r2, steps 51-54 decode it (finish 0.55 s).
    kwargs = dict(step_model=flat_step_model(0.01), max_num_seqs=2)
    run = run_engine([16, 16, 16], [50, 50, 5], [0.0, 0.0, 0.0], mode="run", **kwargs).output()
    step = run_engine([16, 16, 16], [50, 50, 5], [0.0, 0.0, 0.0], mode="step", **kwargs).output()
    assert run.steps.num_steps.tolist() == [1, 49, 1, 4]
    assert run.steps.batch_size.tolist() == [2, 2, 1, 1]
    assert step.steps.num_steps.tolist() == [1] * 55
    for out in (run, step):
        assert out.requests.finish_s.tolist() == pytest.approx([0.50, 0.50, 0.55], abs=1e-12)
        assert out.requests.first_token_s.tolist() == pytest.approx([0.01, 0.01, 0.51], abs=1e-12)



@pytest.mark.parametrize("mode", ["run", "step"])
def test_a_closed_loop_client_sends_its_next_request_a_think_time_after_the_finish(mode):
    # ArrivalSource (vllm bench serve --max-concurrency): one client, think 50 ms, flat 10 ms steps. r0 at
    # 0 s: prefill + first token at 10 ms, tokens 2, 3 at 20, 30 ms; r1 at 30 + 50 = 80 ms, done at 110 ms;
    # r2 (2 tokens) at 160 ms, done at 180 ms.
    out = run_engine([10, 10, 10], [3, 3, 2], concurrency=1, think_s=0.05, step_model=flat_step_model(0.01),
                     mode=mode).output()
    assert out.requests.arrival_s.tolist() == pytest.approx([0.0, 0.08, 0.16], abs=1e-12)
    assert out.requests.finish_s.tolist() == pytest.approx([0.03, 0.11, 0.18], abs=1e-12)

# ---------------------------------------------------------------------------------------------- speculation
def _closed_loop_eagle(concurrency: int, **spec) -> dict:
    return {
        "hardware": "h100-sxm", "model": "llama-3.1-8b",
        "workload": {"type": "closed_loop", "concurrency": concurrency, "num_requests": concurrency,
                     "prompt_tokens": {"type": "fixed", "value": 100}, "output_tokens": {"type": "fixed", "value": 40}},
        "speculative_config": {"method": "eagle", "num_speculative_tokens": 3, **spec},
    }


@pytest.mark.parametrize("concurrency, drafts", [(4, False), (3, True)])
def test_disable_by_batch_size_is_running_requests_at_or_above_the_threshold(concurrency, drafts):
    # V0's speculative_disable_by_batch_size: no drafts in a step when running requests >= the threshold
    # (4 here). Four requests admitted together run in lockstep: 4 >= 4 from the first step, no draft ever;
    # three never reach it.
    from servesim import simulate

    sd = simulate(_closed_loop_eagle(concurrency, disable_by_batch_size=4)).summary["spec_decode"]
    assert (sd["num_drafts"] > 0) is drafts


def test_ngram_proposer_costs_its_cpu_time_per_request_per_step():
    # speculation/costs.py: ngram/suffix drafting = n requests * ngram_cpu_s_per_request in each step that
    # proposes (k > 0); 10 us = 655,360,000,000 subps per request
    from servesim.speculation.config import SpeculativeConfig
    from servesim.speculation.costs import build_drafter

    hw, llama = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    target = build_step_time_model(hw, llama, 1, speculative=True)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, ngram_cpu_s_per_request=10e-6)
    drafter = build_drafter(spec, hw, llama, 1, "calibrated", target)
    assert drafter.weight_bytes_per_gpu == 0 and drafter.kv_bytes_per_token_per_gpu == 0
    for requests in (1, 7, 64):
        assert drafter.step_subps(requests * 4, requests, 3, 10_000) == requests * 655_360_000_000
    assert drafter.step_subps(32, 8, 0, 10_000) == 0  # nothing proposed, nothing spent


def test_best_k_keeps_the_smallest_k_of_a_tie_and_zero_when_nothing_beats_one():
    # acceptance/formulas.best_k: strictly greater wins (the lesson's Example 4 search). alpha 0.5, one draft
    # step costing 0.2 target steps: k = 1 gives 1.5 / 1.2 = 1.25, k = 2 gives 1.75 / 1.4 = 1.25 (a tie,
    # exact in binary), k = 3 gives 1.875 / 1.6 = 1.171875. Free drafts that are never accepted (alpha 0) or
    # always accepted but as dear as the target (alpha 1, cost 1) give speedup 1 for every k: do not speculate.
    from servesim.acceptance.formulas import best_k

    assert best_k(0.5, 0.2) == (1, 1.25)
    assert best_k(0.0, 0.0) == (0, 1.0)
    assert best_k(1.0, 1.0) == (0, 1.0)


# ---------------------------------------------------------------------------------------------- metrics
def test_duration_runs_from_the_first_arrival_even_when_that_request_did_not_complete():
    # vllm bench serve: benchmark duration = from the start (first request sent) to the last completion;
    # throughputs divide by it. Request 0 arrives at 0 s and is cut unfinished, request 1 arrives at 1 s
    # and finishes at 3 s: duration 3 s (not 2 s), 1/3 request/s, 4/3 output tokens/s.
    import numpy as np
    from test_metrics import make_requests, make_steps

    from servesim.engine.output import EngineOutput
    from servesim.metrics import summarize

    nan = float("nan")
    requests = make_requests([(0.0, 10, 8, 2, 0.0, 0.5, nan, 0), (1.0, 10, 4, 4, 1.0, 1.5, 3.0, 0)])
    steps = make_steps([dict(start_s=0.0, num_steps=1, first_step_s=3.0, batch_size=2, num_tokens=2)])
    out = EngineOutput(requests=requests, steps=steps, extra_itl_s=np.zeros(0), kv_blocks_total=10,
                       block_size=16, end_s=3.0)
    s = summarize(out)
    assert s["duration_s"] == 3.0
    assert s["request_throughput"] == pytest.approx(1 / 3, rel=1e-12)
    assert s["output_throughput"] == pytest.approx(4 / 3, rel=1e-12)



@pytest.mark.parametrize("num_requests, tail_arrivals, saturated", [(4117, 1030, False), (3881, 971, True)])
def test_saturation_threshold_is_five_percent_of_the_tail_arrivals_within_3_percent(num_requests, tail_arrivals,
                                                                                     saturated):
    # metrics/saturation: saturated iff growth = slope x tail > max(5, 5% of the arrivals in the tail). A queue
    # growing by exactly 2 requests/s (waiting = 2t, integers at the 0.5 s steps) over the last 25 s of
    # 100 s of evenly spaced arrivals grows by 50 requests; 1030 arrivals in the tail give a threshold of
    # 51.5 (50 is 3% below it: not saturated), 971 give 48.55 (50 is 3% above: saturated).
    from test_metrics import queue_output

    from servesim.metrics import detect_saturation

    result = detect_saturation(queue_output(num_requests, 100.0, lambda t: 2 * t))
    assert result.threshold == pytest.approx(0.05 * tail_arrivals, rel=1e-12)
    assert result.growth == pytest.approx(50.0, rel=1e-9)
    assert result.saturated is saturated


def test_busy_time_mean_is_one_exact_division_and_the_max_is_over_every_row():
    # metrics/steps.busy_time_weighted: mean = sum(integral) / (scale x busy ps), one correctly rounded
    # division of integers; max = max(values) / scale over all rows (not the last row's). Rows of 0.5, 1.75
    # and 1.25 s holding 2, 8 and 4 of 10 blocks: (2 x 0.5 + 8 x 1.75 + 4 x 1.25) e12 / (10 x 3.5e12)
    # = 20 / 35 = 4 / 7 exactly; max 8 / 10.
    import numpy as np

    from servesim.metrics.steps import busy_time_weighted

    row_ps = np.array([500_000_000_000, 1_750_000_000_000, 1_250_000_000_000], dtype=np.int64)
    result = busy_time_weighted(np.array([2, 8, 4]), row_ps, scale=10)
    assert result == {"mean": 4 / 7, "max": 0.8}

# ---------------------------------------------------------------------------------------------- workload
def test_trace_window_is_closed_at_its_start_and_open_at_its_end():
    # load_trace keeps the requests with start_s <= t < start_s + duration_s, then rebases and divides by
    # rate_scale. tests/data/workload/mooncake_buckets.jsonl: timestamps 0, 0, 0, 3000, 6000, 6000 ms.
    from pathlib import Path

    from servesim.workload import load_trace

    path = Path(__file__).resolve().parent / "data" / "workload" / "mooncake_buckets.jsonl"
    assert load_trace(path, start_s=0.0, duration_s=6.0, bucket_policy="burst").arrival_s.tolist() == [0, 0, 0, 3]
    later = load_trace(path, start_s=3.0, duration_s=3.0, bucket_policy="burst", rate_scale=2.0)
    assert later.arrival_s.tolist() == [0.0]  # 3 s kept (rebased to 0), the two at 6 s left out
    assert load_trace(path, start_s=3.0, bucket_policy="burst", rate_scale=2.0).arrival_s.tolist() == [0.0, 1.5, 1.5]


def test_arrivals_by_duration_are_those_in_the_half_open_interval():
    # renewal_arrivals(duration_s=D): every arrival in [0, D). Gaps of exactly 0.5 s and D = 2 s: 0.5, 1, 1.5
    # (an arrival at 2 s is outside)
    import numpy as np

    from servesim.workload.arrival_processes import renewal_arrivals

    times = renewal_arrivals(lambda n: np.full(n, 0.5), 2.0, 1.0, duration_s=2.0)
    assert times.tolist() == [0.5, 1.0, 1.5]


# ---------------------------------------------------------------------------------------------- router
def test_least_outstanding_counts_a_finish_at_the_arrival_instant_on_the_replica_it_frees():
    # Router._outstanding: a request finished at or before the arrival instant is not outstanding. Flat
    # 10 ms steps: A (0 s, 10 tokens out) -> replica 0, finishes at 0.10 s; B (5 ms, 3 out) -> replica 1
    # (0 has one outstanding), finishes at 5 + 3 x 10 = 35 ms; C arrives at exactly 35 ms: replica 1 has
    # none outstanding (B counts as finished), replica 0 one -> replica 1 (counting B as outstanding would
    # tie them and send C to replica 0, the lowest index). C then runs alone: 35 ms + 3 steps = 65 ms.
    from test_deployment import run

    from servesim.workload.workload import Workload

    wl = Workload(arrival_s=[0.0, 0.005, 0.035], prompt_tokens=[10, 10, 10], output_tokens=[10, 3, 3])
    dep = run(wl, 2, "least_outstanding", step_time=flat_step_model(0.01))
    assert list(dep.assignment) == [0, 1, 1]
    assert dep.output().requests.finish_s.tolist() == pytest.approx([0.10, 0.035, 0.065], abs=1e-12)


def test_shortest_queue_counts_requests_routed_but_not_yet_pulled():
    # Router._queue_lengths: a replica's waiting queue plus its inbox (routed at this instant, not pulled by
    # its engine yet). Two requests at t = 0: the first goes to replica 0 (tie, lowest index), the second
    # sees queue 1 there and 0 on replica 1 -> replica 1; a third at t = 0 ties again (1, 1) -> replica 0.
    from test_deployment import run

    from servesim.workload.workload import Workload

    wl = Workload(arrival_s=[0.0, 0.0, 0.0], prompt_tokens=[10, 10, 10], output_tokens=[3, 3, 3])
    dep = run(wl, 2, "shortest_queue", step_time=flat_step_model(0.01))
    assert list(dep.assignment) == [0, 1, 0]


@pytest.mark.parametrize("mode", ["run", "step"])
def test_a_request_finished_unknown_to_vllm_is_scheduled_once_more_with_the_trees_verify_width(mode):
    # async scheduling: a request whose last step finished it through accepted drafts (vLLM did not know it
    # would) is scheduled in the next step once more, 1 + verify width tokens, output discarded. A draft
    # tree [2, 2] has 2 + 4 = 6 nodes: every decoder, verifying or scheduled once more, takes 1 + 6 = 7
    # tokens (the token budget cuts nothing here), so every step's decode tokens are a multiple of 7; this
    # seed's last request finishes through accepted drafts, so the last step schedules it alone, 7 tokens.
    from servesim import simulate

    cfg = _closed_loop_eagle(2)
    cfg["workload"].update(num_requests=6, output_tokens={"type": "fixed", "value": 30})
    cfg["speculative_config"].update(num_speculative_tokens=2, draft_tree=[2, 2], acceptance={"alpha": 0.8})
    cfg.update(engine={"async_scheduling": True}, simulation={"mode": mode})
    steps = simulate(cfg).output.steps
    decode_tokens = steps.num_tokens - steps.num_prefill_tokens
    assert (decode_tokens % 7 == 0).all()
    assert (steps.num_tokens[-1], steps.batch_size[-1]) == (7, 1)
    # the tokens scheduled once more are a verify's, not a prefill's: the only prefill tokens are the six
    # 100-token prompts (no preemption), and the last step has none
    assert int((steps.num_steps * steps.num_prefill_tokens).sum()) == 6 * 100 and steps.num_prefill_tokens[-1] == 0
