"""vLLM 0.32's per-method engine settings as servesim derives them from a config: async scheduling's
default, the drafting slots a draft model takes from the budget, the lookahead and prefill-lookahead slots.
(What the engine does with them is checked step by step against vLLM in ``test_golden_vllm.py``.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from servesim.input_files import validate
from servesim.config.models import SimConfig
from servesim.errors import ConfigError
from servesim.wiring import build_engine, resolve_async_scheduling
from servesim.speculation.config import SpeculativeConfig

ROOT = Path(__file__).resolve().parents[1]


def config(spec=None, engine=None, model="llama-3.1-8b", hardware="h100-sxm", tp=1) -> dict:
    return {
        "hardware": hardware,
        "model": model,
        "tensor_parallel_size": tp,
        "engine": engine or {},
        "workload": {"type": "poisson", "rate": 1.0, "num_requests": 4,
                     "prompt_tokens": {"type": "uniform", "low": 10, "high": 20},
                     "output_tokens": {"type": "uniform", "low": 5, "high": 10}},
        "speculative_config": spec,
    }


def spec_of(method: str, k: int = 3) -> SpeculativeConfig:
    extra = {"acceptance": {"alpha": 0.7}}
    if method == "draft_model":
        extra["draft_cost"] = 0.1
    return SpeculativeConfig.model_validate({"method": method, "num_speculative_tokens": k, **extra})


@pytest.mark.parametrize("method, expected", [
    (None, True), ("eagle", True), ("eagle3", True), ("mtp", True), ("draft_model", True),
    ("ngram", False), ("medusa", False), ("suffix", False),
])
def test_async_scheduling_default_follows_vllm(method, expected):
    # vLLM 0.32 (VllmConfig): on unless the speculative method cannot run asynchronously
    cfg = validate(SimConfig, config(), "test")
    assert resolve_async_scheduling(cfg, None if method is None else spec_of(method)) is expected


def test_async_scheduling_setting_wins_and_bad_combination_is_rejected():
    off = validate(SimConfig, config(engine={"async_scheduling": False}), "test")
    assert resolve_async_scheduling(off, spec_of("eagle")) is False
    on = validate(SimConfig, config(engine={"async_scheduling": True}), "test")
    with pytest.raises(ConfigError, match="engine.async_scheduling: .*'ngram'"):
        resolve_async_scheduling(on, spec_of("ngram"))
    llama_cpp = SpeculativeConfig.model_validate({"method": "eagle", "num_speculative_tokens": 3,
                                                  "draft_budget_limit": True})
    assert resolve_async_scheduling(validate(SimConfig, config(), "test"), llama_cpp) is False


@pytest.mark.parametrize("method, slots", [("draft_model", 1), ("eagle", 0), ("eagle3", 0), ("mtp", 0),
                                           ("ngram", 0), ("medusa", 0)])
def test_drafting_slots_per_method(method, slots):
    assert spec_of(method).max_num_new_slots_for_drafting == slots


@pytest.mark.parametrize("method, lookahead", [("eagle", 4), ("eagle3", 4), ("mtp", 4), ("draft_model", 4),
                                               ("ngram", 0), ("medusa", 0)])
def test_lookahead_slots_per_method(method, lookahead):
    assert spec_of(method, 4).lookahead_slots == lookahead


def test_prefill_lookahead_only_for_multi_layer_mtp():
    assert spec_of("mtp", 3).num_prefill_lookahead_tokens(3) == 3
    assert spec_of("mtp", 3).num_prefill_lookahead_tokens(1) == 1  # one MTP layer reused: no chunk rule
    assert spec_of("mtp", 1).num_prefill_lookahead_tokens(3) == 1  # min(layers, k) = 1
    assert spec_of("eagle", 3).num_prefill_lookahead_tokens(0) == 1
    assert spec_of("ngram", 3).num_prefill_lookahead_tokens(0) == 0
    assert spec_of("draft_model", 3).num_prefill_lookahead_tokens(0) == 0


def test_engine_gets_the_settings_from_the_config():
    card = yaml.safe_load((ROOT / "hardware" / "models" / "deepseek-v3.yaml").read_text())
    card["num_nextn_predict_layers"] = 3
    cfg = validate(SimConfig, config({"method": "mtp", "num_speculative_tokens": 3}, model=card,
                                     hardware="h200-sxm", tp=8), "test")
    engine, _, info = build_engine(cfg, ROOT, np.random.SeedSequence(0))
    assert (engine.prefill_lookahead, engine.draft_slots, engine.lookahead_slots, engine.async_scheduling) == (3, 0, 3, True)
    assert info["async_scheduling"] is True
    cfg = validate(SimConfig, config({"method": "draft_model", "num_speculative_tokens": 2, "draft_cost": 0.1,
                                      "acceptance": {"alpha": 0.7}}), "test")
    engine, _, info = build_engine(cfg, ROOT, np.random.SeedSequence(0))
    assert (engine.prefill_lookahead, engine.draft_slots, engine.lookahead_slots) == (0, 1, 2)
    engine, _, info = build_engine(validate(SimConfig, config({"method": "ngram", "num_speculative_tokens": 2}),
                                            "test"), ROOT, np.random.SeedSequence(0))
    assert (engine.draft_slots, engine.lookahead_slots, engine.async_scheduling, info["async_scheduling"]) == (0, 0, False, False)
    # a null block: one block fewer than vLLM's num_gpu_blocks holds requests' KV
    assert engine.total_blocks == info["kv_cache_blocks"] - 1


def test_budget_must_leave_a_token_beyond_the_drafting_slots():
    cfg = validate(SimConfig, config({"method": "draft_model", "num_speculative_tokens": 2, "draft_cost": 0.1,
                                      "acceptance": {"alpha": 0.7}},
                                     engine={"max_num_batched_tokens": 1, "max_num_seqs": 1}), "test")
    with pytest.raises(ConfigError, match="max_num_new_slots_for_drafting=1"):
        build_engine(cfg, ROOT, np.random.SeedSequence(0))


def test_kv_cache_blocks_follow_vllm_kv_heads_per_gpu():
    """Beyond 8 GPUs Llama-3.1-8B's 8 KV heads are replicated (one per GPU): the KV cache grows only by the
    weight memory freed, not twofold per TP doubling; DeepSeek-V3's MLA latent is held whole on every GPU."""
    from servesim.cards import load_hardware, load_model
    from servesim.engine.kv_cache import activation_reserve_bytes, kv_cache_blocks

    hw = load_hardware("h200-sxm")
    for name, tp, per_gpu in (("llama-3.1-8b", 8, 16384), ("llama-3.1-8b", 16, 16384), ("deepseek-v3", 8, 70272)):
        model = load_model(name)
        blocks = kv_cache_blocks(hw, model, tensor_parallel_size=tp, block_size=16, gpu_memory_utilization=0.9,
                                 max_num_batched_tokens=8192, max_num_seqs=256)
        free = (0.9 * float(hw.memory_bytes) - float(model.weight_bytes) / tp
                - activation_reserve_bytes(model, tp, 8192, 256))
        assert blocks == int(free // (per_gpu * 16)), (name, tp)


def test_kv_heads_and_tp_must_divide_one_another():
    card = {**yaml.safe_load((ROOT / "hardware" / "models" / "llama-3.1-8b.yaml").read_text()),
            "num_attention_heads": 24, "hidden_size": 3072}
    cfg = SimConfig.model_validate({**config(model=card, tp=6)})
    with pytest.raises(Exception, match=r"KV heads \(8\) and the tensor parallel size \(6\)"):
        build_engine(cfg, ROOT, np.random.SeedSequence(0))
