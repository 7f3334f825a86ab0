"""Tests of servesim.cards: derived model numbers vs the reference tables, hardware cards, loading, errors."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.cards import (
    ModelCard,
    available_hardware,
    available_models,
    clear_card_cache,
    load_hardware,
    load_model,
    vllm_default_scheduler_limits,
)
from servesim.errors import ConfigError

DATA = Path(__file__).parent / "data" / "cards"
REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"  # the repository's own copy
MODELS_CSV = REFERENCE / "models.csv"
GPUS_CSV = REFERENCE / "gpus.csv"

# models.csv's name -> card stem
STEM_OF_TABLE_NAME = {
    "Llama-3.1-8B": "llama-3.1-8b",
    "Llama-3.1-70B": "llama-3.1-70b",
    "Llama-3.1-405B": "llama-3.1-405b",
    "Llama-3.2-1B": "llama-3.2-1b",
    "Qwen3-0.6B": "qwen3-0.6b",
    "Qwen3-8B": "qwen3-8b",
    "Qwen3-32B": "qwen3-32b",
    "Mixtral-8x7B": "mixtral-8x7b",
    "DeepSeek-V3": "deepseek-v3",
    "gpt-oss-120b": "gpt-oss-120b",
}


def _matches_table(derived: float, table: str) -> bool:
    """True when ``derived`` (in params) is within 1 % of the table's figure in billions, or rounds to it.

    The table writes 2 decimals for most models but whole billions for DeepSeek-V3 ("671", "37"); a figure
    given to 0 decimals only says the value rounds to it, so that is the check there.
    """
    value = float(table)
    decimals = len(table.split(".")[1]) if "." in table else 0
    billions = derived / 1e9
    return abs(billions - value) <= 0.01 * value or round(billions, decimals) == value


def _check_model_against_table(stem: str, total: str, active: str, kv: int) -> None:
    card = load_model(stem)
    assert _matches_table(card.total_params, total), (stem, card.total_params, total)
    assert _matches_table(card.active_params, active), (stem, card.active_params, active)
    assert card.kv_bytes_per_token == kv


def test_model_cards_match_reference_csv() -> None:
    with MODELS_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    checked = 0
    for row in rows:
        stem = STEM_OF_TABLE_NAME.get(row["model"])
        if stem is None:
            continue
        total = row["total_params_b"].split()[0]  # DeepSeek-V3: "671 (+14 MTP on HF = 685)"
        _check_model_against_table(stem, total, row["active_params_b"], int(row["kv_bytes_per_token_bf16"]))
        card = load_model(stem)
        assert card.num_hidden_layers == int(row["num_hidden_layers"])
        assert card.hidden_size == int(row["hidden_size"])
        assert card.vocab_size == int(row["vocab_size"])
        assert card.tie_word_embeddings == (row["tie_word_embeddings"] == "true")
        checked += 1
    assert checked == len(STEM_OF_TABLE_NAME)


def test_every_shipped_model_card_loads_and_states_a_source() -> None:
    names = available_models()
    assert set(STEM_OF_TABLE_NAME.values()) | {"lesson-8b-fp16"} <= set(names)
    for name in names:
        card = load_model(name)
        assert card.source
        assert card.weight_bytes > 0 and card.max_model_len > 0


# ---------------------------------------------------------------------------------------------- dense GQA


def test_llama_8b_closed_forms() -> None:
    m = load_model("llama-3.1-8b")
    layers, d, inter, heads, kv_heads, hd, vocab = 32, 4096, 14336, 32, 8, 128, 128256
    matmul_per_layer = d * heads * hd * 2 + 2 * d * kv_heads * hd + 3 * d * inter
    assert m.linear_flops_per_token == 2 * layers * matmul_per_layer
    assert m.lm_head_flops_per_token == 2 * d * vocab
    assert m.attention_flops_per_pair == 4 * layers * heads * hd
    assert m.embedding_params == vocab * d and m.lm_head_params == vocab * d
    assert m.bytes_per_weight == 2.0
    assert m.weight_bytes == 2 * m.total_params  # every weight bf16
    assert m.weight_bytes == pytest.approx(16.06e9, rel=1e-3)  # the figure hardware/README.md calibrates with
    assert m.weight_bytes_read(1) == m.weight_bytes
    assert m.num_active_experts(8) == 0.0
    arr = m.weight_bytes_read(np.array([[1, 2], [300, 4096]]))
    assert arr.shape == (2, 2) and np.all(arr == m.weight_bytes)
    assert m.kv_bytes_for_context(1000) == 131072 * 1000
    np.testing.assert_array_equal(m.kv_bytes_for_context(np.array([0, 5])), [0.0, 5 * 131072.0])


def test_tied_embedding_counted_once() -> None:
    m = load_model("llama-3.2-1b")
    assert m.lm_head_params == 0.0
    untied = m.model_copy(update={"tie_word_embeddings": False})
    untied = ModelCard.model_validate(untied.model_dump())  # fresh cached properties
    assert untied.total_params - m.total_params == 128256 * 2048
    # The lm_head matmul is computed either way.
    assert m.lm_head_flops_per_token == untied.lm_head_flops_per_token == 2 * 2048 * 128256


def test_qwen3_head_dim_is_not_hidden_over_heads() -> None:
    m = load_model("qwen3-0.6b")
    assert m.resolved_head_dim == 128 != 1024 // 16
    assert m.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2


@pytest.mark.parametrize("tp, per_gpu", [(1, 131072), (2, 65536), (4, 32768), (8, 16384), (16, 16384), (32, 16384)])
def test_kv_bytes_per_gpu_split_the_kv_heads_then_replicate_them(tp, per_gpu) -> None:
    """vLLM ``get_num_kv_heads``: max(1, 8 KV heads // TP) per GPU: Llama-3.1-8B's KV per token per GPU
    halves with each TP doubling up to 8 GPUs, then stays at one head (2 x 32 x 1 x 128 x 2 B)."""
    m = load_model("llama-3.1-8b")
    assert m.kv_heads_per_gpu(tp) == max(1, 8 // tp)
    assert m.kv_bytes_per_token_per_gpu(tp) == per_gpu


@pytest.mark.parametrize("tp", [1, 8, 16])
def test_mla_latent_is_whole_on_every_gpu(tp) -> None:
    """MLA (DeepSeek-V3): one latent of kv_lora_rank + rope dims per token and layer, held by every GPU of
    the group (vLLM: get_num_kv_heads is 1), so its KV per GPU does not fall with TP."""
    m = load_model("deepseek-v3")
    assert m.kv_bytes_per_token_per_gpu(tp) == 61 * (512 + 64) * 2 == m.kv_bytes_per_token


def test_explicit_card_kv_is_split_by_tp() -> None:
    m = load_model("lesson-8b-fp16")  # explicit: num_params and kv_bytes_per_token 131072
    assert m.is_explicit and m.kv_bytes_per_token_per_gpu(4) == 32768.0


def test_fp8_kv_cache_halves_kv_bytes() -> None:
    m = ModelCard.model_validate({**load_model("llama-3.1-8b").model_dump(), "kv_cache_dtype": "fp8"})
    assert m.kv_bytes_per_token == 65536


# ---------------------------------------------------------------------------------------------- MoE


def test_mixtral_experts_touched_and_bytes_read() -> None:
    m = load_model("mixtral-8x7b")
    assert m.num_moe_layers == 32
    assert m.num_active_experts(0) == 0.0
    assert m.num_active_experts(1) == 2.0
    assert m.num_active_experts(3) == 6.0
    assert m.num_active_experts(4) == 8.0
    assert m.num_active_experts(1000) == 8.0
    np.testing.assert_array_equal(m.num_active_experts(np.array([1, 2, 5])), [2.0, 4.0, 8.0])
    # One token reads exactly the weights a token uses: 2 bytes x active params (Mistral counts the
    # embedding as active, and servesim counts the whole embedding table as read).
    assert m.weight_bytes_read(1) == pytest.approx(2 * m.active_params, rel=1e-12)
    assert m.weight_bytes_read(4) == pytest.approx(m.weight_bytes, rel=1e-12)
    assert m.weight_bytes_read(10**6) == pytest.approx(m.weight_bytes, rel=1e-12)
    # Expected experts touched under uniform routing: E (1 - (1 - k/E)^T).
    assert m.num_active_experts(1, expected=True) == pytest.approx(2.0)
    assert m.num_active_experts(2, expected=True) == pytest.approx(8 * (1 - 0.75**2))
    assert m.num_active_experts(200, expected=True) == pytest.approx(8.0)
    # Linear FLOPs use 2 of 8 experts.
    expert = 3 * 4096 * 14336
    attn = 4096 * 4096 * 2 + 2 * 4096 * 1024
    assert m.linear_flops_per_token == 2 * 32 * (attn + 2 * expert + 4096 * 8)


def test_expected_experts_touched_matches_simulated_uniform_routing() -> None:
    m = load_model("mixtral-8x7b")
    rng = np.random.default_rng(np.random.SeedSequence(20240611))
    tokens, trials = 3, 20000
    # Each token picks 2 distinct experts of 8 uniformly at random.
    picks = np.argsort(rng.random((trials, tokens, 8)), axis=2)[:, :, :2]
    touched = np.array([len(np.unique(p)) for p in picks.reshape(trials, -1)])
    expected = m.num_active_experts(tokens, expected=True)  # 8 (1 - 0.75^3) = 4.625
    sem = touched.std() / math.sqrt(trials)
    assert abs(touched.mean() - expected) < 4 * sem
    assert 4 * sem < 0.05 * expected  # the interval is narrow enough to catch a 5 % error


@given(st.lists(st.integers(min_value=0, max_value=5000), min_size=2, max_size=20))
def test_moe_bytes_read_is_monotone_and_bounded(tokens: list[int]) -> None:
    for stem in ("mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"):
        m = load_model(stem)
        t = np.sort(np.array(tokens))
        for expected in (False, True):
            read = m.weight_bytes_read(t, expected=expected)
            assert np.all(np.diff(read) >= 0)
            assert np.all(read <= m.weight_bytes * (1 + 1e-12))
            assert np.all(read >= m.non_expert_weight_bytes * (1 - 1e-12))


def test_deepseek_v3_mla() -> None:
    m = load_model("deepseek-v3")
    assert m.attention == "mla"
    assert m.resolved_head_dim == 128 + 64
    assert m.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70272
    assert m.kv_bytes_per_token_sliding == 0
    assert m.attention_flops_per_pair == 2 * 61 * 128 * (128 + 64 + 128)
    assert m.num_moe_layers == 58
    assert m.num_active_experts(1) == 8.0 and m.num_active_experts(32) == 256.0
    assert m.num_nextn_predict_layers == 1
    # FP8 body, BF16 embedding and lm_head: ~ 1 byte per weight + 1 more per embedding/lm_head weight
    # (norms and router are also BF16: +0.02 %).
    vocab_x_hidden = 129280 * 7168
    assert m.weight_bytes == pytest.approx(m.total_params + 2 * vocab_x_hidden, rel=1e-3)
    # One token reads the non-expert weights plus 8 of 256 routed experts per MoE layer.
    routed_per_layer = 256 * 3 * 7168 * 2048
    assert m.weight_bytes_read(1) == pytest.approx(m.non_expert_weight_bytes + 58 * routed_per_layer * 8 / 256)
    assert m.weight_bytes_read(np.array([32, 64])) == pytest.approx([m.weight_bytes] * 2)


def test_gpt_oss_sliding_window_and_mxfp4() -> None:
    m = load_model("gpt-oss-120b")
    assert m.sliding_window == 128 and m.sliding_window_layers == 18
    assert m.kv_bytes_per_token == 2 * 18 * 8 * 64 * 2 == 36864
    assert m.kv_bytes_per_token_sliding * 128 == 4718592  # "sliding layers add at most 4718592 B per sequence"
    assert m.kv_bytes_for_context(10) == 10 * 36864 * 2
    assert m.kv_bytes_for_context(1000) == 1000 * 36864 + 128 * 36864
    assert m.attention_flops_per_pair == m.attention_flops_per_pair_sliding == 4 * 18 * 64 * 64
    # Experts MXFP4: 4.25 bits per weight; everything else BF16.
    experts = 36 * 128 * 3 * 2880 * 2880
    assert m.routed_expert_weight_bytes == pytest.approx(experts * 0.53125)
    assert m.weight_bytes == pytest.approx(experts * 0.53125 + (m.total_params - experts) * 2, rel=1e-12)
    assert m.weight_bytes_read(32) == pytest.approx(m.weight_bytes)  # 32 x 4 = 128 experts


# ---------------------------------------------------------------------------------------------- lesson


def test_lesson_card_example_12() -> None:
    m = load_model("lesson-8b-fp16")
    assert m.is_explicit
    assert m.weight_bytes == 16e9
    assert m.linear_flops_per_token == 16e9
    assert m.lm_head_flops_per_token == 0.0 and m.attention_flops_per_pair == 0.0
    assert m.kv_bytes_per_token == 131072
    assert m.weight_bytes_read(np.array([1, 640])).tolist() == [16e9, 16e9]
    hw = load_hardware("lesson-h100-sxm")
    memory_s = m.weight_bytes / hw.memory_bandwidth_bytes_per_s
    assert memory_s * 1e3 == pytest.approx(4.776, abs=1e-3)  # "a plain step reads 16 GB in 4.78 ms"
    crossover = memory_s * hw.peak_flops("bf16") / m.linear_flops_per_token
    assert f"{crossover:.0f}" == "295"  # "compute-bound above 295 tokens per step"


def test_explicit_card_rules() -> None:
    with pytest.raises(Exception, match="kv_bytes_per_token"):
        ModelCard.model_validate({"name": "x", "num_params": 1e9, "max_model_len": 10})
    with pytest.raises(Exception, match="hidden_size: not allowed"):
        ModelCard.model_validate(
            {"name": "x", "num_params": 1e9, "kv_bytes_per_token": 10, "hidden_size": 8, "max_model_len": 10}
        )


def test_an_explicit_card_without_kv_bytes_is_refused_naming_the_field(tmp_path: Path) -> None:
    # kv_bytes_per_token: 0 was accepted, then the run stopped with "engine.max_num_batched_tokens: x does not
    # fit on 1 x H100 SXM ... lower engine.max_num_batched_tokens": advice that cannot help
    (tmp_path / "m.yaml").write_text(json.dumps({"name": "x", "num_params": 8e9, "kv_bytes_per_token": 0,
                                                 "max_model_len": 8192}))
    with pytest.raises(ConfigError) as excinfo:
        load_model("m.yaml", base_dir=tmp_path)
    assert _one_line_error(excinfo) == (f"{tmp_path / 'm.yaml'}: kv_bytes_per_token: Input should be greater than 0 "
                                        "(got 0)")


# ---------------------------------------------------------------------------------------------- hardware


def test_hardware_cards_match_embedded_numbers() -> None:
    h = load_hardware("h100-sxm")
    assert h.name == "H100 SXM" and h.vendor == "NVIDIA"
    assert h.memory_bytes == 80e9
    assert h.memory_bandwidth_bytes_per_s == 3.35e12
    assert h.peak_flops_per_s == {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "int8": 1979e12}
    assert h.interconnect_bandwidth_bytes_per_s == 900e9
    assert h.interconnect_bandwidth_per_direction_bytes_per_s == 450e9
    assert (h.default_max_num_batched_tokens, h.default_max_num_seqs) == (8192, 1024)
    a100 = load_hardware("A100 80GB SXM")
    assert "fp8" not in a100.peak_flops_per_s
    with pytest.raises(ConfigError, match="no entry for 'fp8'"):
        a100.peak_flops("fp8")
    assert load_hardware("l40s").interconnect_bandwidth_bytes_per_s is None


def test_hardware_cards_match_reference_csv() -> None:
    with GPUS_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 12
    by_name = {normalize(load_hardware(n).name): load_hardware(n) for n in available_hardware()}
    for row in rows:
        key = normalize(row["name"].split(" (")[0])
        card = by_name[key]
        assert card.vendor == row["vendor"]
        assert card.memory_bytes == pytest.approx(float(row["memory_gb"]) * 1e9, rel=1e-12)
        assert card.memory_bandwidth_bytes_per_s == pytest.approx(float(row["mem_bw_tb_s"]) * 1e12, rel=1e-12)
        for dtype, col in (("bf16", "bf16_dense_tflops"), ("fp16", "fp16_dense_tflops"),
                           ("fp8", "fp8_dense_tflops"), ("int8", "int8_dense_tops")):
            if row[col].strip():
                assert card.peak_flops_per_s[dtype] == pytest.approx(float(row[col]) * 1e12, rel=1e-12)
            else:
                assert dtype not in card.peak_flops_per_s
        bidir = row["scaleup_bw_gb_s_bidir"].strip()
        if bidir:
            assert card.interconnect_bandwidth_bytes_per_s == pytest.approx(float(bidir) * 1e9, rel=1e-12)
        else:
            assert card.interconnect_bandwidth_bytes_per_s is None


def normalize(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


@pytest.mark.parametrize(
    ("stem", "expected"),
    [
        ("h100-sxm", (8192, 1024)),
        ("h100-pcie", (8192, 1024)),
        ("h200-sxm", (8192, 1024)),
        ("a100-80gb-sxm", (2048, 256)),
        ("a100-40gb-sxm", (2048, 256)),
        ("l40s", (2048, 256)),
        ("l4", (2048, 256)),
        ("b200", (16384, 1024)),
        ("mi300x", (16384, 1024)),
        ("mi325x", (16384, 1024)),
    ],
)
def test_vllm_scheduler_defaults(stem: str, expected: tuple[int, int]) -> None:
    card = load_hardware(stem)
    assert (card.default_max_num_batched_tokens, card.default_max_num_seqs) == expected
    assert vllm_default_scheduler_limits(card.name, card.memory_bytes) == expected


def test_vllm_defaults_filled_when_absent() -> None:
    card = load_hardware({"name": "X", "vendor": "Y", "memory_bytes": 141e9,
                          "memory_bandwidth_bytes_per_s": 4.8e12, "peak_flops_per_s": {"bf16": 1e15}})
    assert (card.default_max_num_batched_tokens, card.default_max_num_seqs) == (8192, 1024)
    assert card.bandwidth_efficiency == 0.80 and card.compute_efficiency == 0.70
    assert card.step_overhead_s == 1.72e-3 and card.allreduce_latency_s == 10e-6


def test_vllm_defaults_filled_for_memory_written_in_exponent_form(tmp_path) -> None:
    # YAML 1.1 reads `memory_bytes: 80e9` (no dot) as a string; the card reads it as the number (README:
    # a number may be written 1e4), so vLLM's defaults are filled from it as from 8.0e+10
    card_file = tmp_path / "gpu.yaml"
    card_file.write_text("name: MyGPU\nvendor: NVIDIA\nmemory_bytes: 80e9\nmemory_bandwidth_bytes_per_s: 3.35e+12\n"
                         "peak_flops_per_s: {bf16: 9.895e+14}\n")
    card = load_hardware(str(card_file))
    assert card.memory_bytes == 80e9
    assert (card.default_max_num_batched_tokens, card.default_max_num_seqs) == vllm_default_scheduler_limits(
        "MyGPU", 80e9) == (8192, 1024)
    for written in ("24e9", "2.4E+10"):  # below vLLM's 70 GiB line: the smaller defaults
        small = load_hardware({"name": "X", "vendor": "Y", "memory_bytes": written,
                               "memory_bandwidth_bytes_per_s": 4.8e12, "peak_flops_per_s": {"bf16": 1e15}})
        assert (small.default_max_num_batched_tokens, small.default_max_num_seqs) == (2048, 256), written


def test_step_overhead_calibration_llama_8b_h100() -> None:
    # vLLM PR 16937: Llama-3.1-8B BF16 on one H100 decodes at 133 tok/s at batch 1, i.e. ~7.5 ms per step.
    # The calibrated step: the kernel-profile GEMM shape (weights 4.79 ms at the fitted full bandwidth plus
    # 128 GEMM launches), the non-GEMM operators, the lm_head and sampler, and the fitted 1.72 ms overhead.
    from servesim.roofline import build_step_time_model

    h, m = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    weights_s = m.weight_bytes_read(1) / h.effective_memory_bandwidth_bytes_per_s
    assert weights_s == pytest.approx(16.06e9 / 3.35e12, rel=1e-3)
    st = build_step_time_model(h, m, 1)
    assert st.step_s(1, 1, 225, 225, 1) == pytest.approx(1 / 133, rel=0.02)


def test_every_shipped_hardware_card_states_a_source() -> None:
    names = available_hardware()
    assert {"h100-sxm", "h200-sxm", "a100-80gb-sxm", "l40s", "b200", "mi300x"} <= set(names)
    for name in names:
        card = load_hardware(name)
        assert card.source and 0 < card.bandwidth_efficiency <= 1


# ---------------------------------------------------------------------------------------------- loading


def test_load_by_name_display_name_case_and_object() -> None:
    a = load_hardware("h100-sxm")
    assert load_hardware("H100 SXM") is a
    assert load_hardware("H100-SXM") is a
    assert load_hardware(a) is a
    m = load_model("Llama-3.1-8B")
    assert load_model("llama-3.1-8b") is m
    assert load_model(m) is m


def test_load_path_relative_to_base_dir_and_inline(tmp_path: Path) -> None:
    m = load_model("tiny-model.yaml", base_dir=DATA)
    assert m.name == "Tiny-GQA" and m.resolved_head_dim == 16
    assert load_model(DATA / "tiny-model.yaml").total_params == m.total_params
    inline = load_model({"name": "inline", "num_params": 1e9, "kv_bytes_per_token": 1024, "max_model_len": 64})
    assert inline.weight_bytes == 2e9
    shutil.copy(DATA / "tiny-model.yaml", tmp_path / "my.yml")
    assert load_model("./my.yml", base_dir=tmp_path).name == "Tiny-GQA"


def test_cards_path_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "gpus").mkdir()
    shutil.copy(DATA / "tiny-model.yaml", tmp_path / "models" / "tiny.yaml")
    monkeypatch.setenv("SERVESIM_CARDS_PATH", str(tmp_path))
    try:
        assert available_models() == ["tiny"]
        assert load_model("tiny").name == "Tiny-GQA"
        assert load_model("Tiny-GQA").name == "Tiny-GQA"
        with pytest.raises(ConfigError, match="unknown model card 'llama-3.1-8b'"):
            load_model("llama-3.1-8b")
    finally:
        monkeypatch.delenv("SERVESIM_CARDS_PATH")
        clear_card_cache()
    assert "llama-3.1-8b" in available_models()


def test_an_install_without_the_clones_cards_says_where_they_live(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a non-editable install (pip install .) has the package but not the clone's hardware/ folder
    import servesim.cards.loading as loading

    monkeypatch.delenv("SERVESIM_CARDS_PATH", raising=False)
    monkeypatch.setattr(loading, "_repo_hardware_dir", lambda: tmp_path / "hardware")
    clear_card_cache()
    try:
        with pytest.raises(ConfigError) as excinfo:
            load_hardware("h100-sxm", source="run.yaml: hardware")
        msg = _one_line_error(excinfo)
        assert msg.startswith("run.yaml: hardware: unknown hardware card 'h100-sxm'")
        assert "none found - the shipped cards live in the clone's hardware/ folder" in msg
        assert "pip install -e ." in msg and "$SERVESIM_CARDS_PATH" in msg
    finally:
        clear_card_cache()


def test_hf_config_json_matches_shipped_card() -> None:
    hf = load_model(DATA / "llama-like" / "config.json")
    ship = load_model("llama-3.1-8b")
    assert hf.name == "llama-like"  # folder name when the config has no _name_or_path
    assert hf.weight_dtype == "bf16" and hf.resolved_head_dim == 128
    assert hf.total_params == ship.total_params
    assert hf.kv_bytes_per_token == ship.kv_bytes_per_token == 131072
    assert hf.max_model_len == 131072
    assert load_model("llama-like", base_dir=DATA).total_params == hf.total_params  # folder with config.json


def _hf_from_card(card: ModelCard) -> dict:
    return {
        "num_hidden_layers": card.num_hidden_layers,
        "hidden_size": card.hidden_size,
        "intermediate_size": card.intermediate_size,
        "num_attention_heads": card.num_attention_heads,
        "num_key_value_heads": card.num_key_value_heads,
        "vocab_size": card.vocab_size,
        "tie_word_embeddings": card.tie_word_embeddings,
        "max_position_embeddings": card.max_model_len,
        "torch_dtype": "bfloat16",
    }


def test_hf_config_deepseek_like_mla_moe_fp8(tmp_path: Path) -> None:
    ship = load_model("deepseek-v3")
    cfg = _hf_from_card(ship) | {
        "_name_or_path": "deepseek-ai/DeepSeek-V3",
        "model_type": "deepseek_v3",
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = load_model(tmp_path / "config.json")
    assert hf.name == "deepseek-ai/DeepSeek-V3" and hf.hf_repo == "deepseek-ai/DeepSeek-V3"
    assert hf.attention == "mla" and hf.weight_dtype == "fp8" and hf.resolved_embedding_dtype == "bf16"
    assert hf.total_params == ship.total_params
    assert hf.kv_bytes_per_token == 70272
    assert hf.weight_bytes == ship.weight_bytes


def test_hf_config_gpt_oss_like_sliding_and_mxfp4(tmp_path: Path) -> None:
    ship = load_model("gpt-oss-120b")
    cfg = _hf_from_card(ship) | {
        "model_type": "gpt_oss",
        "head_dim": 64,
        "num_local_experts": 128,
        "experts_per_token": 4,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "quantization_config": {"quant_method": "mxfp4"},
    }
    (tmp_path / "gpt.json").write_text(json.dumps(cfg))
    hf = load_model(tmp_path / "gpt.json")
    assert hf.name == "gpt"
    assert (hf.sliding_window, hf.sliding_window_layers) == (128, 18)
    assert hf.total_params == ship.total_params
    assert hf.weight_bytes == ship.weight_bytes
    assert hf.kv_bytes_per_token == 36864


def test_hf_config_without_sliding_window_use(tmp_path: Path) -> None:
    cfg = _hf_from_card(load_model("qwen3-8b")) | {
        "model_type": "qwen3", "head_dim": 128, "sliding_window": None, "use_sliding_window": False,
    }
    (tmp_path / "q.json").write_text(json.dumps(cfg))
    hf = load_model(tmp_path / "q.json")
    assert hf.qk_norm and hf.sliding_window_layers == 0
    assert hf.total_params == load_model("qwen3-8b").total_params


# ---------------------------------------------------------------------------------------------- errors


def _one_line_error(excinfo: pytest.ExceptionInfo[ConfigError]) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_bad_model_card_names_file_and_field() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_model(DATA / "bad-model.yaml")
    msg = _one_line_error(excinfo)
    assert "bad-model.yaml" in msg and "num_hidden_layers" in msg and "'many'" in msg


def test_bad_hardware_card_names_file_and_field() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_hardware("bad-hardware.yaml", base_dir=DATA)
    msg = _one_line_error(excinfo)
    assert "bad-hardware.yaml" in msg and "memory_gb: unknown key" in msg


@pytest.mark.parametrize("peak", [-1.0, 0.0])
def test_a_peak_flops_that_is_not_positive_is_refused_naming_the_file_and_dtype(tmp_path: Path, peak: float) -> None:
    # a negative peak ran silently as if compute were free (the same latencies as a peak of 1e300), and a
    # zero peak ended in a ZeroDivisionError traceback when the step time was built
    card = {"name": "X", "vendor": "Y", "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 3.35e12,
            "peak_flops_per_s": {"bf16": peak, "fp8": 1.979e15}}
    (tmp_path / "gpu.yaml").write_text(json.dumps(card))
    with pytest.raises(ConfigError) as excinfo:
        load_hardware("gpu.yaml", base_dir=tmp_path)
    assert _one_line_error(excinfo) == (f"{tmp_path / 'gpu.yaml'}: peak_flops_per_s.bf16: Input should be greater "
                                        f"than 0 (got {peak!r})")


@pytest.mark.parametrize("field, value, message", [
    # a card in the datasheet's units ran into "does not fit ... in 0.92 x 0.0 GB" (naming tensor_parallel_size)
    # or a step-time overflow ("roofline: the KV-cache read time per context token is 4.89e+04 s")
    ("memory_bytes", 80, "memory_bytes: expected bytes, at least 1e+08 (vendor GB x 1e9: 80 GB is 8.0e+10) (got 80)"),
    ("memory_bandwidth_bytes_per_s", 3.35,
     "memory_bandwidth_bytes_per_s: expected bytes/s, at least 1e+09 (3.35 TB/s is 3.35e+12) (got 3.35)"),
    ("peak_flops_per_s", {"bf16": 989.5, "fp8": 1.979e15},
     "peak_flops_per_s: bf16: expected FLOP/s, at least 1e+09 (989.5 TFLOP/s is 9.895e+14) (got 989.5)"),
])
def test_a_card_written_in_datasheet_units_is_refused_naming_the_unit(tmp_path: Path, field, value, message) -> None:
    card = {"name": "X", "vendor": "Y", "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 3.35e12,
            "peak_flops_per_s": {"bf16": 9.895e14}, field: value}
    (tmp_path / "gpu.yaml").write_text(json.dumps(card))
    with pytest.raises(ConfigError) as excinfo:
        load_hardware("gpu.yaml", base_dir=tmp_path)
    assert _one_line_error(excinfo) == f"{tmp_path / 'gpu.yaml'}: {message}"


def test_unknown_name_lists_available_cards() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_hardware("H1000", source="run.yaml: hardware")
    msg = _one_line_error(excinfo)
    assert msg.startswith("run.yaml: hardware: unknown hardware card 'H1000'")
    assert "h100-sxm" in msg and "mi300x" in msg
    with pytest.raises(ConfigError) as excinfo:
        load_model("llama-9")
    assert "llama-3.1-8b" in _one_line_error(excinfo)


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_model("nope.yaml", base_dir=tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as excinfo:
        load_model(tmp_path / "config.json")
    assert "line 1" in _one_line_error(excinfo)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError) as excinfo:
        load_model(tmp_path)
    assert "num_hidden_layers: required key is missing" in _one_line_error(excinfo)


def test_architecture_card_validation_messages() -> None:
    base = {"name": "x", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_model_len": 64}
    cases = [
        ({"kv_bytes_per_token": 5}, "kv_bytes_per_token: derived from the architecture"),
        ({"num_key_value_heads": 3}, "num_key_value_heads: must divide"),
        ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok: expected 1 to num_experts 4"),
        ({"num_experts_per_tok": 2}, "num_experts: required"),
        ({"sliding_window_layers": 1}, "sliding_window: required key is missing"),
        ({"sliding_window_layers": 3, "sliding_window": 8}, "sliding_window_layers: expected at most"),
        ({"attention": "mla"}, "kv_lora_rank: required key is missing"),
        ({"weight_dtype": "fp7"}, "weight_dtype"),
    ]
    for extra, expected in cases:
        with pytest.raises(ConfigError) as excinfo:
            load_model({**base, **extra}, source="cards.yaml: model")
        msg = _one_line_error(excinfo)
        assert msg.startswith("cards.yaml: model:") and expected in msg, msg
    no_arch = dict(base)
    del no_arch["vocab_size"]
    with pytest.raises(ConfigError, match="vocab_size: required key is missing"):
        load_model(no_arch)


def test_hf_config_reads_qwen_mtp_layers_as_mtp_modules(tmp_path) -> None:
    """Qwen3.5/3.6 configs name their MTP layers mtp_num_hidden_layers: read as num_nextn_predict_layers
    (MTP speculation needs them)."""
    import json

    config = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "torch_dtype": "bfloat16",
              "max_position_embeddings": 512, "mtp_num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(str(tmp_path / "config.json")).num_nextn_predict_layers == 1


# ---------------------------------------------------------------------------------------------- exact counts
@pytest.mark.parametrize("stem, total", [
    # the published checkpoints' safetensors total_size / 2 bytes (bf16): 16,060,522,496 B, 141,107,412,992 B,
    # 93,405,585,408 B; every weight counted, norms included (two per layer plus the final one)
    ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496),
    ("mixtral-8x7b", 46_702_792_704),
])
def test_total_params_equal_the_published_checkpoints(stem, total) -> None:
    assert load_model(stem).total_params == total


def test_gpt_oss_biases_and_norms_by_hand() -> None:
    # gpt-oss-120b (mlp_bias, attention_bias): D = 2880, L = 36, E = 128 experts of width F = 2880, 64 q heads
    # and 8 KV heads of 64. Each expert has gate+up bias 2F and down bias D; the router a bias of E per layer.
    # Per layer: two RMSNorms 2D, attention biases (64 + 2 x 8) x 64 + D; one final norm D.
    pc = load_model("gpt-oss-120b").param_counts
    D, L, E, F = 2880, 36, 128, 2880
    assert pc.routed_experts_bias == L * E * (2 * F + D) == 39_813_120
    assert pc.other == L * (2 * D + (64 + 2 * 8) * 64 + D) + D + L * E == 502_848
    assert pc.router_matmul == L * D * E


def test_qwen3_qk_norm_weights_by_hand() -> None:
    # Qwen3-8B: 36 layers, D = 4096, head_dim 128; per layer two RMSNorms (2D) and the q and k norms (2 x 128);
    # one final norm
    assert load_model("qwen3-8b").param_counts.other == 36 * (2 * 4096 + 2 * 128) + 4096 == 308_224


def test_deepseek_v3_mla_and_shared_expert_counts_by_hand() -> None:
    # DeepSeek-V3 (config_671B.json): D = 7168, 61 layers of which the first 3 dense, 128 heads, q_lora_rank
    # 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, one shared expert of width 2048 per MoE layer
    pc = load_model("deepseek-v3").param_counts
    D, L, H, qr, kvr, nope, rope, v = 7168, 61, 128, 1536, 512, 128, 64, 128
    per_layer = (D * qr + qr * H * (nope + rope)  # q_a, q_b
                 + D * (kvr + rope)  # kv_a: the latent and the shared rotary key
                 + kvr * H * (nope + v)  # kv_b
                 + H * v * D)  # o
    assert pc.attention_matmul == L * per_layer
    assert pc.shared_experts_matmul == (L - 3) * 3 * D * 2048
    assert pc.dense_mlp_matmul == 3 * 3 * D * 18432
    # norms: two per layer, the q_a and kv_a norms (qr, kvr), the final norm
    assert pc.other == L * (2 * D + qr + kvr) + D
    assert load_model("deepseek-v3").kv_bytes_per_token == L * (kvr + rope) * 2  # bf16 latent + rotary key


def test_hf_config_of_a_multimodal_model_names_text_config(tmp_path: Path) -> None:
    # Llama 4 / Gemma 3 keep the language model's numbers under text_config: the error names it (it had read
    # "num_hidden_layers: required key is missing", as if the file were broken)
    text = _hf_from_card(load_model("llama-3.1-8b"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama4", "text_config": text, "vision_config": {"hidden_size": 1408}}))
    with pytest.raises(ConfigError) as excinfo:
        load_model(path)
    msg = _one_line_error(excinfo)
    assert msg.startswith(f"{path}: num_hidden_layers: required key is missing at the top level")
    assert "under text_config (a multimodal model)" in msg and "write a model card YAML" in msg
    # a config missing the key everywhere keeps the plain message
    path.write_text(json.dumps({k: v for k, v in text.items() if k != "hidden_size"}))
    with pytest.raises(ConfigError, match=r"config\.json: hidden_size: required key is missing \(Hugging Face"):
        load_model(path)


def test_a_json_file_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    # json.loads keeps the last value silently (a config.json with num_hidden_layers twice read the second);
    # duplicate keys are refused in YAML configs and --speculative-config, and now in every JSON input read
    # through load_json (Hugging Face config.json, JSON cards) and in vllm bench results
    from servesim.analysis.bench_replay import read_bench_result

    text = json.dumps(_hf_from_card(load_model("llama-3.1-8b")))
    path = tmp_path / "config.json"
    path.write_text(text[:-1] + ', "num_hidden_layers": 16}')
    with pytest.raises(ConfigError) as excinfo:
        load_model(path)
    assert _one_line_error(excinfo) == (f"{path}: num_hidden_layers: key given twice in one JSON object (expected "
                                        "each key once; JSON readers keep the last value silently)")
    path.write_text(text)
    assert load_model(path).num_hidden_layers == 32  # the same file with the key once
    bench = tmp_path / "result.json"
    bench.write_text('{"completed": 10, "request_rate": 2, "completed": 12}')
    with pytest.raises(ConfigError, match=r"result\.json: completed: key given twice in one JSON object"):
        read_bench_result(bench)
    bench.write_text('{"completed": 1, "completed": 2}\n{"completed": 10, "duration": 3}\n')
    with pytest.raises(ConfigError, match=r"result\.json: completed: key given twice"):  # JSON lines: the first
        read_bench_result(bench)


def test_json_errors_stay_one_line_for_odd_keys_and_overlong_integers(tmp_path: Path) -> None:
    # a key holding a newline is shown quoted (it split the one-line error in two), and an integer of more
    # digits than int() converts (4,300) is invalid JSON in one line, not int()'s ValueError as a traceback
    from servesim.acceptance.logs import parse_llamacpp
    from servesim.acceptance.vocab import load_vocab
    from servesim.cli.acceptance import read_pairs
    from servesim.cli.run import parse_overrides
    from servesim.errors import ServesimError

    text = json.dumps(_hf_from_card(load_model("llama-3.1-8b")))
    path = tmp_path / "config.json"
    path.write_text(text[:-1] + ', "a\\nb": 1, "a\\nb": 2}')
    with pytest.raises(ConfigError) as excinfo:
        load_model(path)
    assert _one_line_error(excinfo).startswith(f"{path}: 'a\\nb': key given twice in one JSON object")
    path.write_text(text[:-1] + ', "": 1, "": 2}')
    with pytest.raises(ConfigError, match=r"config\.json: '': key given twice"):
        load_model(path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"\\t": 0, "\\t": 1}}}')
    with pytest.raises(ConfigError) as excinfo:
        load_vocab(tmp_path)
    assert "'\\t': key given twice" in _one_line_error(excinfo)
    digits = "1" * 5000
    path.write_text(text.replace('"num_hidden_layers": 32', f'"num_hidden_layers": {digits}'))
    with pytest.raises(ConfigError) as excinfo:
        load_model(path)
    assert _one_line_error(excinfo).startswith(f"{path}: invalid JSON (Exceeds the limit")
    (tmp_path / "tokenizer.json").write_text(f'{{"model": {{"type": "BPE", "vocab": {{"a": {digits}}}}}}}')
    with pytest.raises(ConfigError, match=r"tokenizer\.json: invalid JSON \(Exceeds the limit"):
        load_vocab(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(f'{{"prompt": "a b", "answer": "c", "n": {digits}}}\n')
    with pytest.raises(ServesimError, match=r"pairs\.jsonl: line 1: invalid JSON \(Exceeds the limit"):
        read_pairs(pairs)
    timings = tmp_path / "timings.jsonl"
    timings.write_text(f'{{"timings": {{"draft_n": {digits}, "draft_n_accepted": 2, "predicted_n": 9}}}}\n')
    with pytest.raises(ServesimError, match=r"timings\.jsonl: line 1: invalid JSON \(Exceeds the limit"):
        parse_llamacpp(timings, 3)
    with pytest.raises(ConfigError, match=r"^--speculative-config: invalid JSON \(Exceeds the limit"):
        parse_overrides([], f'{{"method": "ngram", "num_speculative_tokens": {digits}}}')


def test_every_json_reader_refuses_a_key_given_twice(tmp_path: Path) -> None:
    # the same rule in each reader of JSON input: vllm bench results for calibrate, prompt/answer pairs for
    # `servesim acceptance`, llama.cpp timings, a tokenizer.json for check-draft, Mooncake rows
    from servesim.acceptance.logs import parse_llamacpp
    from servesim.acceptance.vocab import load_vocab
    from servesim.analysis.calibrate import read_vllm_bench_json
    from servesim.cli.acceptance import read_pairs
    from servesim.errors import TraceError
    from servesim.workload.mooncake import read_mooncake_jsonl

    bench = tmp_path / "bench.json"
    bench.write_text('{"completed": 10, "completed": 12}')
    with pytest.raises(ConfigError, match=r"^.*bench\.json: completed: key given twice in one JSON object"):
        read_vllm_bench_json(bench)
    bench.write_text('{"completed": 10}\n{"max_concurrency": 1, "max_concurrency": 2}\n')  # JSON lines
    with pytest.raises(ConfigError, match=r"bench\.json: line 2: max_concurrency: key given twice"):
        read_vllm_bench_json(bench)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "a b", "answer": "c", "answer": "d"}\n')
    with pytest.raises(TraceError, match=r"pairs\.jsonl: line 1: key 'answer' given twice \(expected each key once\)"):
        read_pairs(pairs)
    timings = tmp_path / "timings.jsonl"
    timings.write_text('{"timings": {"draft_n": 3, "draft_n": 4, "draft_n_accepted": 2, "predicted_n": 9}}\n')
    with pytest.raises(TraceError, match=r"timings\.jsonl: line 1: key 'draft_n' given twice"):
        parse_llamacpp(timings, 3)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0, "a": 1}}}')
    with pytest.raises(ConfigError, match=r"tokenizer\.json: a: key given twice in one JSON object"):
        load_vocab(tmp_path)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3, "output_length": 4}\n')
    with pytest.raises(TraceError, match=r"trace\.jsonl: line 1: key 'output_length' given twice"):
        read_mooncake_jsonl(trace)


def test_json_nested_too_deeply_to_read_is_one_line(tmp_path: Path) -> None:
    # json.loads raises RecursionError past Python's recursion limit: each JSON reader says so in one line
    from servesim.cli.run import parse_overrides
    from servesim.errors import TraceError
    from servesim.workload.mooncake import read_mooncake_jsonl

    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "config.json"
    path.write_text('{"x": ' + deep + "}")
    with pytest.raises(ConfigError) as excinfo:
        load_model(path)
    assert _one_line_error(excinfo) == f"{path}: invalid JSON (collections nested too deeply to read)"
    with pytest.raises(ConfigError, match=r"^--speculative-config: invalid JSON \(collections nested too deeply"):
        parse_overrides([], '{"method": "eagle", "x": ' + deep + "}")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"x": ' + deep + "}\n")
    with pytest.raises(TraceError, match=r"trace\.jsonl: line 2: .*nested too deeply to read"):
        read_mooncake_jsonl(trace)
