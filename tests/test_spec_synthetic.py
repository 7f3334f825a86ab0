"""vLLM 0.32's speculative-config limits and synthetic acceptance (``rejection_sample_method: synthetic``).

Expected values are vLLM 0.32's own (``vllm/config/speculative.py``: ``_resolve_synthetic_acceptance_rates``,
``_acceptance_length_to_rates``; ``vllm/v1/spec_decode/utils.py``: ``unconditional_to_conditional_rates``;
``vllm/v1/sample/rejection_sampler.py``: ``MAX_SPEC_LEN = 128``), worked out by hand below and checked once
against that vLLM by running those functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from servesim import simulate
from servesim.input_files import validate
from servesim.errors import ConfigError
from servesim.speculation.config import MAX_SPEC_LEN, SpeculativeConfig, synthetic_rates_from_length

ROOT = Path(__file__).resolve().parents[1]


def spec(**kw) -> SpeculativeConfig:
    return validate(SpeculativeConfig, {"method": "eagle", **kw}, "speculative_config")


# ------------------------------------------------------------------ num_speculative_tokens limits
def test_num_speculative_tokens_limits():
    assert MAX_SPEC_LEN == 128
    assert spec(num_speculative_tokens=1).num_speculative_tokens == 1
    assert spec(num_speculative_tokens=128).num_speculative_tokens == 128  # vLLM's largest
    assert spec(num_speculative_tokens=33).num_speculative_tokens == 33  # vLLM accepts 33 too
    with pytest.raises(ConfigError, match=r"num_speculative_tokens=129 exceeds 128"):
        spec(num_speculative_tokens=129)
    with pytest.raises(ConfigError, match=r"num_speculative_tokens=1000 exceeds 128"):
        spec(num_speculative_tokens=1000)
    with pytest.raises(ConfigError, match=r"num_speculative_tokens"):
        spec(num_speculative_tokens=0)
    with pytest.raises(ConfigError, match=r"num_speculative_tokens must be provided"):
        spec()
    # suffix decoding defaults to its tree depth, 24 (vLLM's suffix_decoding_max_tree_depth)
    suffix = validate(SpeculativeConfig, {"method": "suffix", "acceptance": {"alpha": 0.5}}, "speculative_config")
    assert suffix.num_speculative_tokens == 24


@pytest.mark.parametrize("k, ok", [(1, True), (2, True), (3, True), (6, True), (9, True), (4, False), (5, False), (7, False)])
def test_mtp_num_speculative_tokens_must_divide_by_the_mtp_modules(k, ok):
    # vLLM: with n_predict = 3 MTP modules, k <= 3 is fine, above it k must be a multiple of 3
    card = SimpleNamespace(name="three-mtp", num_nextn_predict_layers=3)
    s = validate(SpeculativeConfig, {"method": "mtp", "num_speculative_tokens": k}, "speculative_config")
    if ok:
        s.check_target(card)
    else:
        with pytest.raises(ConfigError, match=rf"num_speculative_tokens: {k} must be divisible by n_predict=3"):
            s.check_target(card)
    # one MTP module (DeepSeek-V3) divides every k; eagle is never checked
    s.check_target(SimpleNamespace(name="dsv3", num_nextn_predict_layers=1))
    spec(num_speculative_tokens=k).check_target(card)


def test_mtp_divisibility_is_checked_by_a_run():
    import yaml

    card = yaml.safe_load((ROOT / "hardware" / "models" / "deepseek-v3.yaml").read_text())
    card["num_nextn_predict_layers"] = 2  # as if the model shipped two MTP modules
    cfg = {
        "hardware": "h200-sxm",
        "tensor_parallel_size": 8,
        "model": card,
        "workload": {"type": "closed_loop", "concurrency": 1, "num_requests": 1,
                     "prompt_tokens": {"type": "fixed", "value": 10}, "output_tokens": {"type": "fixed", "value": 10}},
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
    }
    with pytest.raises(ConfigError, match=r"speculative_config.num_speculative_tokens: 3 must be divisible by n_predict=2"):
        simulate(cfg)


# ------------------------------------------------------------------ synthetic acceptance: resolution
@pytest.mark.parametrize(
    "length, k, rates",
    [
        # L - 1 drafts accepted on average: floor(L - 1) positions at 1, the next at frac(L - 1), the rest 0
        (2.5, 4, [1.0, 0.5, 0.0, 0.0]),
        (1.0, 3, [0.0, 0.0, 0.0]),
        (4.0, 3, [1.0, 1.0, 1.0]),  # L = K + 1: [1]*3 + [0] cut to 3
        (3.0, 3, [1.0, 1.0, 0.0]),
        (1.25, 1, [0.25]),
        (2.0, 1, [1.0]),
    ],
)
def test_acceptance_length_resolves_as_vllm(length, k, rates):
    assert synthetic_rates_from_length(length, k) == rates
    s = spec(num_speculative_tokens=k, rejection_sample_method="synthetic", synthetic_acceptance_length=length)
    assert s.synthetic_acceptance_rates == rates
    assert s.synthetic_acceptance_length is None  # consolidated into the rates, as vLLM does
    profile = s.synthetic_profile()
    assert profile.mean_acceptance_length(k) == pytest.approx(length, abs=1e-12)


def test_fractional_length_keeps_vllm_float_value():
    # 3.7 - 1 = 2.7; 2.7 - 2 = 0.7000000000000002 in binary floating point, as vLLM computes it
    assert spec(num_speculative_tokens=3, rejection_sample_method="synthetic",
                synthetic_acceptance_length=3.7).synthetic_acceptance_rates == [1.0, 1.0, 2.7 - 2]


def test_rates_are_unconditional_and_convert_as_vllm():
    s = spec(num_speculative_tokens=3, rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.6, 0.3])
    profile = s.synthetic_profile()
    assert profile.unconditional().tolist() == [0.9, 0.6, 0.3]
    # vLLM's kernel accepts position i with c_i = p_i / p_(i-1): 0.9, 0.6/0.9, 0.3/0.6
    assert profile.conditional() == pytest.approx([0.9, 2 / 3, 0.5], abs=1e-15)
    assert profile.mean_acceptance_length(3) == pytest.approx(2.8, abs=1e-12)
    # p_(i-1) = 0 gives c_i = 0 (vLLM: "p / q if q > 0.0 else 0.0")
    zero = spec(num_speculative_tokens=3, rejection_sample_method="synthetic",
                synthetic_acceptance_rates=[0.5, 0.0, 0.0]).synthetic_profile()
    assert zero.conditional().tolist() == [0.5, 0.0, 0.0]
    assert spec(num_speculative_tokens=3).synthetic_profile() is None  # standard rejection sampling


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"synthetic_acceptance_rates": [0.5, 0.6]}, r"synthetic_acceptance_rates must be non-increasing"),
        ({"synthetic_acceptance_rates": [0.5]}, r"synthetic_acceptance_rates must have length 2"),
        ({"synthetic_acceptance_rates": [1.1, 0.5]}, r"entries must be in \[0, 1\]"),
        ({"synthetic_acceptance_rates": [0.5, -0.1]}, r"entries must be in \[0, 1\]"),
        ({}, r"requires exactly one of synthetic_acceptance_rates or synthetic_acceptance_length"),
        ({"synthetic_acceptance_rates": [0.5, 0.4], "synthetic_acceptance_length": 2.0}, r"requires exactly one of"),
        ({"synthetic_acceptance_length": 3.5}, r"synthetic_acceptance_length must be in \[1, 3\], got 3.5"),
        ({"synthetic_acceptance_length": 0.5}, r"synthetic_acceptance_length must be in \[1, 3\], got 0.5"),
        ({"synthetic_acceptance_length": 2.0, "acceptance": {"alpha": 0.7}}, r"acceptance cannot be combined"),
        ({"synthetic_acceptance_length": 2.0, "draft_tree": [2, 2]}, r"draft_tree cannot be combined"),
    ],
)
def test_bad_synthetic_settings_are_one_line_errors(extra, message):
    with pytest.raises(ConfigError, match=message) as err:
        spec(num_speculative_tokens=2, rejection_sample_method="synthetic", **extra)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("speculative_config")


def test_synthetic_keys_need_the_synthetic_method():
    with pytest.raises(ConfigError, match=r"only valid with rejection_sample_method='synthetic'"):
        spec(num_speculative_tokens=2, synthetic_acceptance_length=2.0)
    with pytest.raises(ConfigError, match=r"only valid with rejection_sample_method='synthetic'"):
        spec(num_speculative_tokens=2, rejection_sample_method="standard", synthetic_acceptance_rates=[0.5, 0.4])
    with pytest.raises(ConfigError, match=r"'block' \(block verification\) is not modelled"):
        spec(num_speculative_tokens=2, rejection_sample_method="block")
    with pytest.raises(ConfigError, match=r"rejection_sample_method"):
        spec(num_speculative_tokens=2, rejection_sample_method="fast")


def test_synthetic_needs_no_acceptance_profile_for_any_method():
    # draft_model and medusa have no default profile: synthetic rates are enough
    s = validate(SpeculativeConfig, {"method": "medusa", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
                                     "synthetic_acceptance_length": 2.0}, "speculative_config")
    assert s.synthetic_acceptance_rates == [1.0, 0.0]


# ------------------------------------------------------------------ synthetic acceptance: in the engine
def closed_loop(spec_config: dict, *, num_requests=16, output=400, mode="run", temperature=None) -> dict:
    if temperature is not None:
        spec_config = {**spec_config, "temperature": temperature}
    return {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "workload": {"type": "closed_loop", "concurrency": 4, "num_requests": num_requests,
                     "prompt_tokens": {"type": "fixed", "value": 100}, "output_tokens": {"type": "fixed", "value": output}},
        "speculative_config": spec_config,
        "simulation": {"mode": mode},
    }


VLLM_JSON = '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3, ' \
            '"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 3.0}'


@pytest.mark.parametrize("mode", ["run", "step"])
def test_deterministic_synthetic_rates_accept_exactly(mode):
    # length 3.0 at K = 3 -> rates [1, 1, 0]: every round accepts exactly 2 of its 3 drafts
    sd = simulate(closed_loop(json.loads(VLLM_JSON), mode=mode)).summary["spec_decode"]
    assert sd["num_drafts"] > 1000
    assert sd["per_position_acceptance_rate"] == [1.0, 1.0, 0.0]
    assert sd["mean_acceptance_length"] == 3.0
    assert sd["num_draft_tokens"] == 3 * sd["num_drafts"]
    assert sd["num_accepted_tokens"] == 2 * sd["num_drafts"]


def test_synthetic_rates_are_sampled_per_position():
    rates = [0.8, 0.5, 0.2]
    cfg = closed_loop({"method": "eagle", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                       "synthetic_acceptance_rates": rates}, num_requests=64, output=4000)
    sd = simulate(cfg).summary["spec_decode"]
    n = sd["num_drafts"]
    assert n > 100_000
    for got, p in zip(sd["per_position_acceptance_rate"], rates):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)  # binomial 4 sigma, about 0.005 here


def test_synthetic_acceptance_ignores_the_temperature():
    # vLLM's greedy and random rejection kernels both use the synthetic rates
    base = {"method": "eagle", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.7, 0.4, 0.2]}
    greedy = simulate(closed_loop(base)).summary["spec_decode"]
    hot = simulate(closed_loop(base, temperature=1.0)).summary["spec_decode"]
    assert hot == greedy
    # while a measured profile does change with the temperature
    profile = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": [0.7, 0.4, 0.2]}
    assert simulate(closed_loop(profile, temperature=1.0)).summary["spec_decode"] != \
        simulate(closed_loop(profile)).summary["spec_decode"]


def test_vllm_benchmark_json_drives_the_cli(tmp_path, capsys):
    from servesim.cli import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(closed_loop({"method": "eagle", "num_speculative_tokens": 2}, num_requests=4, output=60)))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet", "--speculative-config", VLLM_JSON]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spec_decode"]["per_position_acceptance_rate"] == [1.0, 1.0, 0.0]
    capsys.readouterr()
    bad = VLLM_JSON.replace('"synthetic_acceptance_length": 3.0', '"synthetic_acceptance_rates": [0.4, 0.6, 0.1]')
    assert main(["run", str(cfg), "--out", str(tmp_path / "bad"), "--no-plot", "--speculative-config", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("servesim: error: ") and "synthetic_acceptance_rates must be non-increasing" in err


def test_tune_k_keeps_the_synthetic_rates_cut_to_each_k():
    from servesim.analysis.tune_k import fixed_k_spec, tuned_spec, vllm_speculative_config

    spec = {"method": "eagle", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.8, 0.5, 0.2]}
    assert fixed_k_spec(spec, 2)["synthetic_acceptance_rates"] == [0.8, 0.5]
    assert fixed_k_spec(spec, 0) is None
    table = [[1, 8, 2], [9, 64, 1]]
    assert tuned_spec(spec, table)["synthetic_acceptance_rates"] == [0.8, 0.5]
    out = vllm_speculative_config(spec, table)
    assert out == {"method": "eagle", "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.8, 0.5],
                   "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": table}
    for k in (1, 2, 3):  # every point validates: one rate per speculative token, as vLLM requires
        assert spec_ok(fixed_k_spec(spec, k))


def spec_ok(data) -> bool:
    return validate(SpeculativeConfig, data, "speculative_config").synthetic_acceptance_rates == data["synthetic_acceptance_rates"]


def test_tune_k_refuses_k_beyond_the_synthetic_rates(tmp_path):
    from servesim.analysis.tune_k import tune_k
    from servesim.config.models import SimConfig

    cfg = validate(SimConfig, closed_loop({"method": "eagle", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
                                           "synthetic_acceptance_length": 2.5}), "run.yaml")
    with pytest.raises(ConfigError, match=r"--k-max: 3 exceeds num_speculative_tokens = 2"):
        tune_k(cfg, tmp_path, k_max=3)


@pytest.mark.parametrize("tree, drafts", [([1000, 1000, 1000], 1001001000), ([2, 2, 2, 2, 2, 2, 2], 254),
                                          ([8, 16], 136)])
def test_a_draft_tree_of_more_nodes_than_vllm_verifies_is_refused(tree, drafts):
    # every node but the root is a draft the step verifies: at most MAX_SPEC_LEN of them per request
    with pytest.raises(ConfigError) as err:
        spec(method="eagle", draft_tree=tree)
    assert str(err.value) == (f"speculative_config: draft_tree {tree} drafts {drafts} tokens per request and step, "
                              f"more than the {MAX_SPEC_LEN} vLLM's rejection sampler verifies (MAX_SPEC_LEN): "
                              "give fewer branches")


@pytest.mark.parametrize("tree", [[2, 2, 2, 2, 2, 2], [8, 15], [128]])  # 126, 128, 128 drafts: the limit holds
def test_a_draft_tree_within_the_limit_is_accepted(tree):
    assert spec(method="eagle", draft_tree=tree).draft_tree == tree
