"""Step times from the roofline: the seed lesson's Example 12 exactly, and the H100 calibration."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.cards import load_hardware, load_model
from servesim.roofline import PS_PER_S, SUBPS_PER_PS, build_step_time_model


@pytest.fixture(scope="module")
def lesson():
    # Example 12: 16e9 B of weights, 3.35e12 B/s, 16e9 FLOP per token, 989e12 FLOP/s, ideal roofline.
    return build_step_time_model(load_hardware("lesson-h100-sxm"), load_model("lesson-8b-fp16"), 1, "ideal")


def step_ms(model, tokens: int) -> float:
    return model.step_s(tokens, 0, 0, 0) * 1e3


def test_example12_plain_step_is_memory_bound_at_4_78_ms(lesson):
    for batch in (1, 8, 32, 64, 128, 256):
        assert round(step_ms(lesson, batch), 2) == 4.78
    assert step_ms(lesson, 1) == pytest.approx(16e9 / 3.35e12 * 1e3, rel=1e-9)


def test_example12_compute_bound_above_295_tokens(lesson):
    assert round(lesson.compute_bound_tokens()) == 295
    assert step_ms(lesson, 295) == pytest.approx(step_ms(lesson, 1), rel=1e-9)
    assert step_ms(lesson, 296) > step_ms(lesson, 295)
    assert step_ms(lesson, 640) == pytest.approx(640 * 16e9 / 989e12 * 1e3, rel=1e-9)


@pytest.mark.parametrize(
    "batch, round_ms",
    [(1, 5.73), (8, 5.73), (32, 5.73), (64, 6.13), (128, 11.31), (256, 21.66)],
)
def test_example12_speculative_round_times(lesson, batch, round_ms):
    # A round verifies batch x (k+1) tokens and pays k draft steps at c = 0.05 of a plain step.
    k, c = 4, 0.05
    assert round(step_ms(lesson, batch * (k + 1)) + k * c * step_ms(lesson, batch), 2) == round_ms


def test_ideal_mode_has_no_kv_or_attention_terms(lesson):
    assert lesson.kv_ps_per_token == 0 and lesson.attn_ps_per_pair == 0
    assert lesson.step_subps(1, 1, 10_000, 10_000) == lesson.step_subps(1, 1, 0, 0)


def test_calibrated_llama8b_h100_batch1_decode_is_about_7_5_ms():
    model = build_step_time_model(load_hardware("h100-sxm"), load_model("llama-3.1-8b"), 1, "calibrated")
    # batch 1 at a 1,000-token context (vLLM V1 measures 133 tok/s = 7.5 ms per token, PR 16937)
    t = model.step_s(1, 1, 1000, 1000)
    assert t == pytest.approx(7.5e-3, rel=0.05)


def test_kv_term_reads_kv_bytes_per_token_at_effective_bandwidth():
    hw, m = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    model = build_step_time_model(hw, m, 1, "calibrated")
    expected_ps = m.kv_bytes_per_token / (hw.memory_bandwidth_bytes_per_s * hw.attention_bandwidth_efficiency) * PS_PER_S
    assert model.kv_subps_per_token == round(expected_ps * SUBPS_PER_PS)


def test_tensor_parallel_splits_weights_and_adds_allreduce():
    hw, m = load_hardware("h100-sxm"), load_model("llama-3.1-70b")
    tp1 = build_step_time_model(hw, m, 1, "calibrated")
    tp4 = build_step_time_model(hw, m, 4, "calibrated")
    w1 = tp1.weight_read_s(1)
    assert tp4.weight_read_s(1) == pytest.approx(w1 / 4, rel=1e-12)
    no_link = build_step_time_model(hw.model_copy(update={"allreduce_latency_s": 0.0}), m, 4, "calibrated")
    # two all-reduces per layer, each paying the card's latency
    assert tp4.base_s(1, 1, 1) - no_link.base_s(1, 1, 1) == pytest.approx(
        2 * m.num_hidden_layers * hw.allreduce_latency_s, rel=1e-6)
    assert tp4.kv_ps_per_token == pytest.approx(tp1.kv_ps_per_token / 4, rel=1e-4)


def test_moe_reads_only_touched_experts():
    hw, m = load_hardware("h100-sxm"), load_model("mixtral-8x7b")
    model = build_step_time_model(hw, m, 2, "calibrated")
    assert model.weight_read_s(1) < model.weight_read_s(4) <= model.weight_read_s(1000)
    # all experts touched: every weight but the input embedding (a lookup of T rows); the routed experts at the
    # fused MoE kernel's bandwidth, the rest at the GEMM bandwidth
    emb = m.param_counts.input_embedding * 2.0
    dense = m.weight_bytes - emb - m.routed_expert_weight_bytes
    assert model.weight_read_s(1000) == pytest.approx(
        dense / 2 / (hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency)
        + m.routed_expert_weight_bytes / 2 / (hw.memory_bandwidth_bytes_per_s * hw.moe_bandwidth_efficiency))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("speculative", [False, True])
def test_calibrated_step_is_the_documented_sum_of_its_terms(tp, speculative):
    # servesim/roofline.py's formula, term by term, from the public helpers and the card's fields
    from servesim.roofline import (ELEMENTWISE_OPS_PER_LAYER, GEMMS_PER_LAYER, elementwise_bytes_per_token,
                                   elementwise_time_s, gemm_time_s)

    hw, m = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    st = build_step_time_model(hw, m, tp, "calibrated", speculative=speculative)
    peak, bw, L = hw.peak_flops_per_s["bf16"], hw.memory_bandwidth_bytes_per_s, m.num_hidden_layers
    emb_and_lm_head = 2 * m.vocab_size * m.hidden_size * 2.0  # untied, bf16
    ew = elementwise_bytes_per_token(m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                                     m.head_dim, m.intermediate_size, tp)
    passes = hw.sampler_passes_per_logit + (hw.rejection_sampler_passes_per_logit if speculative else 0.0)
    link = hw.interconnect_bandwidth_bytes_per_s / 2 * hw.interconnect_efficiency
    for tokens, logits, requests in ((1, 1, 1), (300, 64, 64), (4096, 1, 1)):
        allreduce = 0.0 if tp == 1 else 2 * L * (hw.allreduce_latency_s
                                                 + 2 * (tp - 1) / tp * tokens * m.hidden_size * 2 / link)
        expected = (
            hw.step_overhead_s + requests * hw.per_request_s
            + gemm_time_s(hw, (m.weight_bytes_read(tokens) - emb_and_lm_head) / tp,
                          m.linear_flops_per_token / tp * tokens, GEMMS_PER_LAYER * L, peak)
            + elementwise_time_s(hw, L * ew * tokens, ELEMENTWISE_OPS_PER_LAYER * L)
            + allreduce
            + gemm_time_s(hw, m.vocab_size * m.hidden_size * 2.0 / tp, m.lm_head_flops_per_token / tp * logits,
                          1, peak)
            + logits * m.vocab_size * 4 * passes / (hw.bandwidth_efficiency * bw)
        )
        assert st.base_s(tokens, logits, requests) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_verify_tokens_are_not_free_below_the_ridge_point():
    # issue 9: the plain max() made every token below ~290 free on an H100; measured GEMMs (and the model)
    # cost more from the first tens of tokens on
    st = build_step_time_model(load_hardware("h100-sxm"), load_model("llama-3.1-8b"), 1)
    times = [st.base_s(t, 1, 1) for t in (1, 32, 64, 128, 256)]
    assert all(b > a for a, b in zip(times, times[1:]))
    assert times[3] > 1.10 * times[0]  # 128 tokens: > 10% more than 1 (Vidur's Llama-2-7B layer: +15%)


def test_allreduce_falls_back_to_a_64_gb_per_s_link():
    # a card without interconnect_bandwidth_bytes_per_s runs its all-reduces over a PCIe-class 64e9 B/s link:
    # the same step times as the card with that link written out
    hw, m = load_hardware("h100-sxm"), load_model("llama-3.1-70b")
    unnamed = build_step_time_model(hw.model_copy(update={"interconnect_bandwidth_bytes_per_s": None}), m, 4)
    pcie = build_step_time_model(hw.model_copy(update={"interconnect_bandwidth_bytes_per_s": 64e9}), m, 4)
    for tokens in (1, 512):
        assert unnamed.base_s(tokens, 1, 1) == pytest.approx(pcie.base_s(tokens, 1, 1), rel=1e-12)
    # and the per-token all-reduce term is 2 L * 2 (TP-1)/TP * D * 2 B / (64e9 / 2 * eta_ic): the step of 512
    # tokens minus that of 1 token differs from the NVLink card's by exactly 511 tokens of it
    nvlink = build_step_time_model(hw, m, 4)
    per_token = lambda link: 2 * 80 * 2 * 3 / 4 * 8192 * 2 / (link / 2 * hw.interconnect_efficiency)
    growth = lambda st: st.base_s(512, 1, 1) - st.base_s(1, 1, 1)
    assert growth(unnamed) - growth(nvlink) == pytest.approx(
        511 * (per_token(64e9) - per_token(hw.interconnect_bandwidth_bytes_per_s)), rel=1e-6)


def test_ideal_mode_counts_the_lm_head_flops_of_every_logit():
    # the ideal form is t = max(W / BW, (F_lin T + F_lm n_logits) / P): at 2,048 tokens the compute line wins,
    # and each logit position adds F_lm / P
    hw, m = load_hardware("lesson-h100-sxm"), load_model("llama-3.1-8b")
    st = build_step_time_model(hw, m, 1, "ideal")
    peak = hw.peak_flops_per_s["bf16"]
    for tokens, logits in ((2048, 1), (2048, 2048)):
        expected = max(m.weight_bytes_read(tokens) / hw.memory_bandwidth_bytes_per_s,
                       (m.linear_flops_per_token * tokens + m.lm_head_flops_per_token * logits) / peak)
        assert st.step_s(tokens, logits, 0, 0) == pytest.approx(expected, rel=1e-9)
    assert st.step_s(2048, 2048, 0, 0) > st.step_s(2048, 1, 0, 0) * 1.05  # lm_head FLOPs matter at full logits


def test_context_free_part_is_rounded_to_the_nearest_unit():
    # tokens_subps rounds the exact seconds once to the nearest 2^-16 ps (not truncation): over 1..64 tokens
    # the fractional parts are spread, so truncation would be short by one unit on about half of them
    from servesim.roofline import SUBPS_PER_S

    st = build_step_time_model(load_hardware("h100-sxm"), load_model("llama-3.1-8b"), 1)
    for tokens in range(1, 65):
        exact = st.context_free_s(tokens, 1) * SUBPS_PER_S
        assert st.tokens_subps(tokens, 1) == round(exact)
        assert abs(st.tokens_subps(tokens, 1) - exact) <= 0.5


def test_tensor_parallelism_without_a_scale_up_link_runs_over_the_documented_pcie_link():
    # a card without interconnect_bandwidth_bytes_per_s (L40S, L4) at TP 2 all-reduced over an undocumented
    # 64 GB/s, while the card's field said "tensor parallelism over PCIe is not described by this card"
    from pathlib import Path

    from servesim.roofline import PCIE_LINK_BYTES_PER_S

    l40s, model = load_hardware("l40s"), load_model("llama-3.1-8b")
    assert l40s.interconnect_bandwidth_bytes_per_s is None
    over_pcie = l40s.model_copy(update={"interconnect_bandwidth_bytes_per_s": PCIE_LINK_BYTES_PER_S})
    for tokens in (1, 512):
        assert (build_step_time_model(l40s, model, 2, "calibrated").step_s(tokens, 1, 1000, 0, 1)
                == build_step_time_model(over_pcie, model, 2, "calibrated").step_s(tokens, 1, 1000, 0, 1))
    readme = (Path(__file__).resolve().parents[1] / "hardware" / "README.md").read_text(encoding="utf-8")
    said = f"{PCIE_LINK_BYTES_PER_S / 1e9:g} GB/s bidirectional (`servesim.roofline.PCIE_LINK_BYTES_PER_S`)"
    assert said in " ".join(readme.split())


def test_memoised_step_times_equal_a_fresh_models_bit_for_bit():
    # context_free_s memoises its tokens-only part and its lm_head part by count (servesim/roofline.py), and
    # step_subps and DrafterCost.step_subps read their memos inline: every (tokens, logits) pair, asked in
    # any order of a long-lived model, must give the exact float of a model that never saw another pair
    hw, m = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    pairs = [(tokens, logits) for tokens in (0, 1, 7, 64, 300, 4096) for logits in (0, 1, 4, 64, 256)]
    rng = np.random.default_rng(np.random.SeedSequence(3))
    order = [pairs[i % len(pairs)] for i in rng.permutation(2 * len(pairs))]  # each pair twice, shuffled
    shared = build_step_time_model(hw, m, 1, "calibrated", speculative=True)
    seen = {pair: shared.context_free_s(*pair) for pair in order}
    for pair in pairs:
        fresh = build_step_time_model(hw, m, 1, "calibrated", speculative=True)
        assert seen[pair] == fresh.context_free_s(*pair), pair
        assert shared.step_subps(*pair, 1000, 5000, 3) == fresh.step_subps(*pair, 1000, 5000, 3), pair
        assert shared.step_subps(*pair, 1000, 5000, 3) == (fresh.base_subps(*pair, 3) + fresh.kv_subps_per_token * 1000
                                                          + fresh.attn_subps_per_pair * 5000)
