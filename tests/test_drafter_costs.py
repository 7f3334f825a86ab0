"""Drafter costs on the step-time model: an EAGLE head is one target layer plus the lm_head, timed like the
target's layers; the only constant per pass is draft_pass_overhead_s."""

from __future__ import annotations

import pytest

from servesim.cards import load_hardware, load_model
from servesim.roofline import PS_PER_S, SUBPS_PER_S, build_step_time_model
from servesim.speculation.config import SpeculativeConfig
from servesim.speculation.costs import build_drafter, head_card


@pytest.fixture(scope="module")
def eagle():
    hw, target = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3)
    st = build_step_time_model(hw, target, 1, speculative=True)
    return hw, target, spec, build_drafter(spec, hw, target, 1, "calibrated", st)


def test_default_head_is_one_target_layer_sharing_embedding_and_lm_head(eagle):
    _, target, _, drafter = eagle
    head = load_model(head_card(target))
    assert head.num_hidden_layers == 1 and head.hidden_size == target.hidden_size
    assert head.kv_bytes_per_token == target.kv_bytes_per_token // target.num_hidden_layers
    layer_bytes = (target.weight_bytes - 2 * target.vocab_size * target.hidden_size * 2) / target.num_hidden_layers
    assert drafter.weight_bytes_per_gpu == pytest.approx(layer_bytes, rel=1e-3)


def test_draft_passes_are_the_head_on_the_step_model_plus_the_named_overhead(eagle):
    hw, target, spec, drafter = eagle
    head = build_step_time_model(hw, load_model(head_card(target)), 1, step_overhead=False)
    overhead = round(spec.draft_pass_overhead_s * SUBPS_PER_S)
    for tokens, requests, k in ((1, 1, 3), (512, 64, 3), (1024, 256, 2)):
        expected = head.base_subps(tokens, requests, 0) + (k - 1) * head.base_subps(requests, requests, 0) + k * overhead
        assert drafter.const_subps(tokens, requests, k) == expected


def test_no_constant_stands_in_for_what_grows_with_the_batch(eagle):
    _, _, spec, drafter = eagle
    overhead = round(spec.draft_pass_overhead_s * SUBPS_PER_S)

    def variable(batch):  # drafting time of a verify step of batch x 4 tokens, minus the fixed overheads
        return drafter.const_subps(4 * batch, batch, 3) - 3 * overhead

    growth = [variable(b) for b in (1, 8, 32, 64, 128, 256)]
    assert all(b > a for a, b in zip(growth, growth[1:]))
    # at 256 requests the head's passes cost 2.5 times their batch-1 time (lm_head over 256 rows,
    # the sampler over 256 x vocab logits, a 1,024-token first pass)
    assert growth[-1] > 2 * growth[0]


def test_simple_draft_cost_is_c_times_the_targets_plain_decode_step():
    # the lesson's draft_cost = c: k * c * t_decode(n), t_decode(n) the context-free part of a plain decode
    # step of n requests: n tokens, n logits and n scheduled requests (the card's per_request_s included)
    hw = load_hardware("h100-sxm").model_copy(update={"per_request_s": 3e-6})  # 3 us of CPU per request
    target = load_model("llama-3.1-8b")
    st = build_step_time_model(hw, target, 1, speculative=True)
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft_cost=0.05, acceptance={"alpha": 0.7})
    drafter = build_drafter(spec, hw, target, 1, "calibrated", st)
    assert st.request_subps_per_request == round(3e-6 * SUBPS_PER_S)
    for requests, k in ((1, 4), (64, 3)):
        decode = st.tokens_subps(requests, requests) + requests * st.request_subps_per_request
        assert drafter.const_subps(requests * (k + 1), requests, k) == k * round(0.05 * decode)
        assert drafter.step_subps(requests * (k + 1), requests, k, 10_000) == k * round(0.05 * decode)  # no KV term
