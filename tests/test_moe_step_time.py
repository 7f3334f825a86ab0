"""MoE step times: expert coverage, the fused-MoE kernel term and its fitted H100 fields, sliding-window
attention; each against hand computation (servesim/roofline.py, hardware/README.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim import simulate
from servesim.cards import load_hardware, load_model
from servesim.roofline import (
    ELEMENTWISE_OPS_PER_LAYER,
    GEMMS_PER_LAYER,
    LOGIT_BYTES,
    SUBPS_PER_S,
    build_step_time_model,
    elementwise_bytes_per_token,
    elementwise_time_s,
    expert_coverage,
    gemm_time_s,
    moe_time_s,
    smooth_max,
)

ROOT = Path(__file__).resolve().parents[1]
GPT_OSS = ROOT / "experiments" / "validation" / "cards" / "gpt-oss-120b-fp8-kv.yaml"


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def gpt_oss():
    return load_model(str(GPT_OSS))


def test_expert_coverage_is_the_occupancy_expectation(gpt_oss):
    # 128 experts, top-4: an expert is missed by one token with probability 124/128
    assert expert_coverage(gpt_oss, 0) == 0.0
    assert expert_coverage(gpt_oss, 1) == pytest.approx(4.0, rel=1e-12)
    assert expert_coverage(gpt_oss, 2) == pytest.approx(128 * (1 - (124 / 128) ** 2), rel=1e-12)  # 7.875
    assert expert_coverage(gpt_oss, 8) == pytest.approx(28.7104, abs=1e-4)  # the bound min(8 x 4, 128) is 32
    assert expert_coverage(gpt_oss, 40) == pytest.approx(92.0517, abs=1e-4)  # bound 128
    assert expert_coverage(load_model("llama-3.1-8b"), 40) == 0.0


def test_expert_coverage_matches_uniform_routing_by_simulation(gpt_oss):
    # T tokens each pick 4 distinct experts of 128 uniformly at random; the mean number of distinct experts
    # over 4,000 draws has a standard error below 0.06, so 0.3 catches a 1% error in the formula (28.7: 0.29)
    rng = np.random.default_rng(np.random.SeedSequence(9))
    draws = 4000
    for tokens in (8, 24, 56):
        picks = np.argpartition(rng.random((draws, tokens, 128)), 4, axis=2)[:, :, :4]
        hit = np.zeros((draws, 128), dtype=bool)
        hit[np.arange(draws)[:, None], picks.reshape(draws, -1)] = True
        assert hit.sum(axis=1).mean() == pytest.approx(expert_coverage(gpt_oss, tokens), abs=0.3)


def test_moe_time_is_the_documented_sum(h100):
    # 1 GB of experts, no FLOPs: the memory floor at moe_bandwidth_efficiency, plus the fixed costs
    expected = 1e9 / (h100.moe_bandwidth_efficiency * h100.memory_bandwidth_bytes_per_s) + 3 * (
        h100.moe_layer_overhead_s + 20 * h100.moe_expert_overhead_s)
    assert moe_time_s(h100, 1e9, 0.0, 20.0, 3, 9.895e14) == pytest.approx(expected, rel=1e-12)
    # with FLOPs: the smooth maximum of the dense GEMMs' compute line and transition exponent
    memory = 1e9 / (0.939 * 3.35e12)
    compute = 5e14 / (0.733 * 9.895e14)
    smooth = (memory ** 1.232 + compute ** 1.232) ** (1 / 1.232)
    assert moe_time_s(h100, 1e9, 5e14, 20.0, 3, 9.895e14) == pytest.approx(
        smooth + 3 * (1.63e-5 + 20 * 3.84e-7), rel=1e-9)


def test_card_without_moe_fields_reads_experts_like_dense_weights(h100):
    bare = h100.model_copy(update={"moe_bandwidth_efficiency": None, "moe_layer_overhead_s": 0.0,
                                   "moe_expert_overhead_s": 0.0})
    assert bare.resolved_moe_bandwidth_efficiency == bare.bandwidth_efficiency
    assert moe_time_s(bare, 1e9, 0.0, 20.0, 3, 9.895e14) == pytest.approx(
        1e9 / (bare.bandwidth_efficiency * bare.memory_bandwidth_bytes_per_s), rel=1e-12)


@pytest.mark.parametrize("tokens", [1, 8, 40, 300])
def test_gpt_oss_step_is_the_documented_sum_of_its_terms(h100, gpt_oss, tokens):
    m, hw = gpt_oss, h100
    st = build_step_time_model(hw, m, 1, "calibrated", speculative=True)
    peak, bw, L = hw.peak_flops_per_s["bf16"], hw.memory_bandwidth_bytes_per_s, m.num_hidden_layers
    pc = m.param_counts
    emb_and_lm_head = 2 * m.vocab_size * m.hidden_size * 2.0  # untied, bf16
    experts_flops = 2.0 * pc.routed_experts_matmul * 4 / 128
    touched = 128 * (1 - (124 / 128) ** tokens)
    ew = elementwise_bytes_per_token(2880, 64, 8, 64, 2880 * 4, 1)
    logits = tokens
    window = 128
    expected = (
        hw.step_overhead_s
        # attention, router, norms and biases as GEMMs; router GEMM launched per MoE layer besides the 4 per layer
        + gemm_time_s(hw, m.non_expert_weight_bytes - emb_and_lm_head,
                      (m.linear_flops_per_token - experts_flops) * tokens, GEMMS_PER_LAYER * L + 36, peak)
        # routed experts: the experts touched, in the fused MoE kernels
        + moe_time_s(hw, m.routed_expert_weight_bytes * touched / 128, experts_flops * tokens, touched, 36, peak)
        + elementwise_time_s(hw, L * ew * tokens, ELEMENTWISE_OPS_PER_LAYER * L)
        # sliding-window layers: each token attends 128 keys
        + tokens * window * m.attention_flops_per_pair_sliding / (hw.compute_efficiency * peak)
        + gemm_time_s(hw, m.vocab_size * m.hidden_size * 2.0, m.lm_head_flops_per_token * logits, 1, peak)
        + logits * m.vocab_size * LOGIT_BYTES * (hw.sampler_passes_per_logit + hw.rejection_sampler_passes_per_logit)
        / (hw.bandwidth_efficiency * bw)
    )
    assert st.base_s(tokens, logits, 0) == pytest.approx(expected, rel=1e-9)


def test_moe_gemm_launches_count_router_and_shared_experts(h100):
    # one more GEMM launch per step costs exactly gemm_launch_s: count them through a shifted launch time
    shifted = h100.model_copy(update={"gemm_launch_s": h100.gemm_launch_s + 1e-6})
    for name, launches in (("gpt-oss-120b", 4 * 36 + 36 + 1), ("deepseek-v3", 4 * 61 + 58 * 3 + 1),
                           ("mixtral-8x7b", 4 * 32 + 32 + 1)):
        m = load_model(name)
        diff = (build_step_time_model(shifted, m, 8).base_s(16, 16, 0)
                - build_step_time_model(h100, m, 8).base_s(16, 16, 0))
        assert diff == pytest.approx(launches * 1e-6, rel=1e-6), name


def test_sliding_window_terms_are_per_request_and_per_token(h100, gpt_oss):
    # doubling the window adds 128 more keys per token (attention FLOPs) and 128 more tokens of the
    # sliding layers' KV per request; nothing else changes (kv_bytes_per_token covers the full layers)
    wide = gpt_oss.model_copy(update={"sliding_window": 256})
    st, st_wide = build_step_time_model(h100, gpt_oss, 1), build_step_time_model(h100, wide, 1)
    kv_bw = h100.attention_bandwidth_efficiency * h100.memory_bandwidth_bytes_per_s
    sliding_kv = 2 * 18 * 8 * 64 * 1  # K and V, 18 layers, 8 KV heads of 64, FP8
    assert gpt_oss.kv_bytes_per_token_sliding == sliding_kv
    assert st.request_subps_per_request == round((h100.per_request_s + 128 * sliding_kv / kv_bw) * SUBPS_PER_S)
    assert st_wide.request_subps_per_request == round((h100.per_request_s + 256 * sliding_kv / kv_bw) * SUBPS_PER_S)
    per_token = 128 * 4 * 18 * 64 * 64 / (h100.compute_efficiency * h100.peak_flops_per_s["bf16"])
    for tokens in (1, 40, 1000):
        assert st_wide.base_s(tokens, 0, 0) - st.base_s(tokens, 0, 0) == pytest.approx(tokens * per_token, rel=1e-6)
    assert st_wide.kv_ps_per_token == st.kv_ps_per_token and st_wide.attn_ps_per_pair == st.attn_ps_per_pair


def test_dense_step_times_ignore_the_moe_fields(h100):
    other = h100.model_copy(update={"moe_bandwidth_efficiency": 0.5, "moe_layer_overhead_s": 1e-3,
                                    "moe_expert_overhead_s": 1e-4})
    m = load_model("llama-3.1-8b")
    a, b = build_step_time_model(h100, m, 1), build_step_time_model(other, m, 1)
    for tokens, logits, requests in ((1, 1, 1), (40, 40, 8), (4096, 1, 1)):
        assert a.base_subps(tokens, logits, requests) == b.base_subps(tokens, logits, requests)


def _fit_module():
    sys.path.insert(0, str(ROOT / "experiments" / "calibration"))
    try:
        import fit_moe_kernels
    finally:
        sys.path.pop(0)
    return fit_moe_kernels


def test_h100_moe_fields_are_the_fit_to_the_kernel_times(h100):
    # the shipped card carries experiments/calibration/fit_moe_kernels.py's result (3 significant digits)
    fit = _fit_module()
    data = pd.read_csv(fit.DATA)
    eta, layer_s, expert_s = fit.fit(h100, data)
    assert h100.moe_bandwidth_efficiency == pytest.approx(eta, rel=2e-3)
    assert h100.moe_layer_overhead_s == pytest.approx(layer_s, rel=5e-3)
    assert h100.moe_expert_overhead_s == pytest.approx(expert_s, rel=5e-3)
    for name in ("h100-pcie", "h200-sxm"):
        card = load_hardware(name)
        assert (card.moe_bandwidth_efficiency, card.moe_layer_overhead_s, card.moe_expert_overhead_s) == (
            h100.moe_bandwidth_efficiency, h100.moe_layer_overhead_s, h100.moe_expert_overhead_s)


def test_h100_moe_model_reproduces_the_kernel_times_up_to_128_tokens(h100):
    fit = _fit_module()
    data = pd.read_csv(fit.DATA)
    inside = data[data["num_tokens"] <= fit.FIT_MAX_TOKENS].reset_index(drop=True)
    errors = fit.relative_errors(h100, inside)
    assert np.abs(errors).max() < 0.12  # hardware/README.md: within 12% from 1 to 128 tokens
    assert np.sqrt(np.mean(np.log1p(errors) ** 2)) < 0.04  # 3.6%


def test_upper_bound_coverage_misses_the_kernel_times(h100, monkeypatch):
    # the same card with min(T k, E) experts touched is 37% too slow for Mixtral at 4 tokens (5.5 of its 8
    # experts touched on average, the bound says 8): the measurements follow the expected coverage
    fit = _fit_module()
    data = pd.read_csv(fit.DATA)
    mixtral4 = data[(data["shape"] == "mixtral-8x7b-tp2") & (data["num_tokens"] == 4)].reset_index(drop=True)
    assert abs(fit.relative_errors(h100, mixtral4)[0]) < 0.05
    monkeypatch.setattr(fit, "expert_coverage", lambda card, tokens: card.num_active_experts(tokens))
    assert fit.relative_errors(h100, mixtral4)[0] > 0.30


def test_moe_terms_keep_run_mode_equal_to_step_mode():
    base = {"hardware": "h100-sxm", "model": str(GPT_OSS), "seed": 3,
            "workload": {"type": "closed_loop", "concurrency": 8, "num_requests": 24,
                         "prompt_tokens": {"type": "uniform", "low": 50, "high": 300},
                         "output_tokens": {"type": "uniform", "low": 20, "high": 200}}}
    for spec in (None, {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": [0.58, 0.31, 0.16]}):
        cfg = dict(base, speculative_config=spec)
        run = simulate(dict(cfg, simulation={"mode": "run"}))
        step = simulate(dict(cfg, simulation={"mode": "step"}))
        pd.testing.assert_frame_equal(run.requests, step.requests)
        assert run.summary["output_throughput"] == step.summary["output_throughput"]
