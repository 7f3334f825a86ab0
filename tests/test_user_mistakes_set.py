"""Mistakes that a ``--set`` made through a setting a check reads (not the one it names) name the file with
that ``--set``; mistakes of the file alone still name the file alone."""

from __future__ import annotations

import pytest

from servesim.cli import main

from test_cli import write_yaml
from test_robustness_cli import SMALL
from test_user_mistakes import refused_run

EAGLE = {"method": "eagle", "num_speculative_tokens": 2, "acceptance": {"alpha": 0.7}}


@pytest.mark.parametrize("override, message", [
    # "does not fit" reads the model, the GPU's memory fraction, the token budget...: it named the file alone
    ("model=llama-3.1-70b", "tensor_parallel_size: Llama-3.1-70B does not fit on 1 x H100 SXM: per GPU, "),
    # the weights fit in 21% of the card, the token budget's activations take the rest
    ("engine.gpu_memory_utilization=0.21", "engine.max_num_batched_tokens: Llama-3.1-8B does not fit on 1 x H100 "
                                           "SXM: "),
    # the requests longer than max_model_len are the workload's, the limit came from --set
    ("engine.max_model_len=50", "workload: 39 request(s) need more than max_model_len=50 tokens"),
    # a change of kind leaves the file's other keys wrong for the new kind
    ("workload.type=closed_loop", "workload.concurrency: required key is missing"),
])
def test_a_check_that_read_a_setting_set_gave_names_the_file_with_that_set(tmp_path, capsys, override, message):
    cfg, err = refused_run(tmp_path, capsys, "--set", override)
    key = override.split("=", 1)[0]
    assert err.startswith(f"servesim: error: {cfg} with --set {key}: {message}"), err


def test_the_same_check_failing_on_the_file_alone_names_the_file(tmp_path, capsys):
    config = {**SMALL, "engine": {"gpu_memory_utilization": 0.05}}
    cfg, err = refused_run(tmp_path, capsys, "--set", "seed=3", config=config)  # a --set the check never read
    # the weights (16.1 GB) fit the card but not 5% of it: the share vLLM may use is the setting named
    assert err.startswith(f"servesim: error: {cfg}: engine.gpu_memory_utilization: Llama-3.1-8B does not fit"), err


def test_a_does_not_fit_names_the_setting_that_tipped_it(tmp_path, capsys):
    # --set engine.gpu_memory_utilization=1e-30 was filed under tensor_parallel_size: the weights fit the card
    _, err = refused_run(tmp_path, capsys, "--set", "engine.gpu_memory_utilization=1e-30")
    assert err.startswith("servesim: error: --set: engine.gpu_memory_utilization: Llama-3.1-8B does not fit on 1 x "
                          "H100 SXM: "), err
    cfg, err = refused_run(tmp_path, capsys, "--set", "model=llama-3.1-70b")  # 141 GB of weights on an 80 GB card
    assert err.startswith(f"servesim: error: {cfg} with --set model: tensor_parallel_size: Llama-3.1-70B does "), err


def test_a_kind_given_by_set_with_a_wrong_value_elsewhere_names_the_file(tmp_path, capsys):
    # num_speculative_tokens 0 is the file's mistake whatever the method --set chose
    config = {**SMALL, "speculative_config": {**EAGLE, "num_speculative_tokens": 0}}
    cfg, err = refused_run(tmp_path, capsys, "--set", "speculative_config.method=eagle3", config=config)
    assert err.startswith(f"servesim: error: {cfg}: speculative_config.num_speculative_tokens: "), err


@pytest.mark.parametrize("key, word", [("model", "model"), ("hardware", "hardware")])
def test_a_missing_card_file_names_the_setting_and_where_it_was_looked_for(tmp_path, capsys, key, word):
    missing = f"{tmp_path / 'nope.yaml'} (a relative path is read from {tmp_path})"
    _, err = refused_run(tmp_path, capsys, "--set", f"{key}=nope.yaml")
    assert err == f"servesim: error: --set: {key}: {word} card file not found: {missing}\n"
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, key: "nope.yaml"})
    assert err == f"servesim: error: {cfg}: {key}: {word} card file not found: {missing}\n"


def test_a_missing_acceptance_profile_file_names_the_setting(tmp_path, capsys):
    missing = f"{tmp_path / 'nope.yaml'} (a relative path is read from {tmp_path})"
    config = {**SMALL, "speculative_config": EAGLE}
    _, err = refused_run(tmp_path, capsys, "--set", "speculative_config.acceptance=nope.yaml", config=config)
    assert err == (f"servesim: error: --set: speculative_config.acceptance: acceptance profile file not found: "
                   f"{missing}\n")


def test_tune_k_without_speculation_by_set_names_set(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": EAGLE})
    assert main(["tune-k", str(cfg), "--out", str(tmp_path / "o"), "--set", "speculative_config=null"]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: --set: speculative_config: tune-k needs a config "
                                              "with a speculative_config")


def test_capacity_max_requests_on_a_closed_loop_workload_gives_the_capacity_error(tmp_path, capsys):
    workload = {"type": "closed_loop", "concurrency": 2, "requests_per_client": 3,
                "prompt_tokens": {"type": "fixed", "value": 20}, "output_tokens": {"type": "fixed", "value": 5}}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=1", "--max-requests", "10",
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: workload.type: capacity search needs an open-loop "
                                       "workload (trace, poisson or gamma), not closed_loop\n")


def test_a_kv_cache_of_one_block_is_refused_as_not_fitting(tmp_path, capsys):
    # block 0 is vLLM's null block, so one block holds nothing: memory for one block, or
    # num_gpu_blocks_override: 1, stopped with the engine's "engine: block_size, max_num_seqs and
    # max_num_batched_tokens must be >= 1 and KV blocks >= 2", naming settings that were fine
    from servesim.cards import load_hardware, load_model

    model, gpu = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    block = model.kv_bytes_per_token_per_gpu(1) * 16
    reserve = 0.92 * gpu.memory_bytes - model.weight_bytes - 1.5 * block  # leaves room for one block and a half
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "engine": {"activation_reserve_bytes": reserve}})
    assert err.startswith(f"servesim: error: {cfg}: engine.max_num_batched_tokens: Llama-3.1-8B does not fit on "
                          "1 x H100 SXM: per GPU, its weights 16.1 GB + the activation reserve "), err
    _, err = refused_run(tmp_path, capsys, "--set", "engine.num_gpu_blocks_override=1")
    assert err == ("servesim: error: --set: engine.num_gpu_blocks_override: Input should be greater than or equal "
                   "to 2 (got 1)\n")


@pytest.mark.parametrize("assignment, found", [("engine.max_num_seqs.x=3", "a mapping"),
                                               ("engine.max_num_seqs=[8]", "a list"),
                                               ("engine.max_num_seqs={a: 1}", "a mapping")])
def test_a_mapping_or_list_where_a_number_belongs_says_what_it_got(tmp_path, capsys, assignment, found):
    # said "Input should be a valid integer" without the "(got ...)" every other value error has
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--set", assignment]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --set: engine.max_num_seqs: Input should be a valid "
                                       f"integer (got {found})\n")
