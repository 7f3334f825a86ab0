"""The seed lesson's token-level mechanisms fed to the engine: temperature (Examples 5/10), the greedy
toy's acceptance (Examples 1/2), n-gram profiles (Example 6), draft vocabularies (Example 7), draft trees
(Example 9) and llama.cpp's flags (Example 10)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servesim import simulate
from servesim.cli import main
from servesim.speculation.config import SpeculativeConfig, effective_profile
from servesim.acceptance.formulas import expected_tokens_per_pass
from servesim.speculation.profile import load_profile
from servesim.acceptance.verify import speculative_greedy_decode

ROOT = Path(__file__).resolve().parents[1]
EAGLE = "eagle-llama3.1-8b-sharegpt-k3"


def closed_loop(spec, *, concurrency=8, num_requests=64, prompt=100, output=2000) -> dict:
    return {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "workload": {"type": "closed_loop", "concurrency": concurrency, "num_requests": num_requests,
                     "prompt_tokens": {"type": "fixed", "value": prompt},
                     "output_tokens": {"type": "fixed", "value": output}},
        "speculative_config": spec,
    }


def spec_cfg(t: float, rule: str = "ratio", **extra) -> SpeculativeConfig:
    return SpeculativeConfig(method="eagle", num_speculative_tokens=3, acceptance=EAGLE, temperature=t,
                             verification_rule=rule, **extra)


# ---------------------------------------------------------------------- temperature (Examples 5 and 10)
def test_greedy_config_keeps_the_profile():
    prof = load_profile(EAGLE)
    assert effective_profile(spec_cfg(0.0), prof) is prof
    for rule in ("ratio", "match"):
        near = effective_profile(spec_cfg(1e-4, rule), prof)  # T -> 0: r = 0.25^(1/T) -> 0
        np.testing.assert_allclose(near.conditional(), prof.conditional(), atol=1e-12)


def test_match_never_beats_ratio_and_acceptance_falls_with_temperature():
    prof = load_profile(EAGLE)
    greedy = prof.mean_acceptance_length(3)
    previous = greedy
    for t in (0.25, 0.5, 1.0, 1.5):
        ratio = effective_profile(spec_cfg(t, "ratio"), prof)
        match = effective_profile(spec_cfg(t, "match"), prof)
        assert np.all(match.conditional() <= ratio.conditional() + 1e-12)
        if t <= 1.0:  # the ratio rule is not monotone at large T (temperature.py's documented limits)
            assert ratio.mean_acceptance_length(3) <= greedy
        assert match.mean_acceptance_length(3) < previous  # c ~ 0.6 > 0.5: the match rule falls with T
        previous = match.mean_acceptance_length(3)
    # a flatter target (smaller top-token probability) loses more
    flat = effective_profile(spec_cfg(1.0, "match", target_top_probability=0.3), prof)
    assert flat.mean_acceptance_length(3) < effective_profile(spec_cfg(1.0, "match"), prof).mean_acceptance_length(3)


def test_temperature_reaches_the_engine():
    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": EAGLE, "temperature": 1.0,
            "verification_rule": "match", "target_top_probability": 0.3}
    result = simulate(closed_loop(spec, num_requests=40))
    assert result.info["acceptance_profile"].endswith("@T=1,match")
    expected = effective_profile(spec_cfg(1.0, "match", target_top_probability=0.3), load_profile(EAGLE))
    sd = result.summary["spec_decode"]
    n = sd["num_drafts"]
    for got, p in zip(sd["per_position_acceptance_rate"], expected.unconditional_extended(3)):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)  # binomial 4 sigma


# ---------------------------------------------------------------------- Examples 1 and 2
def test_example_2_acceptance_as_an_engine_profile():
    text = ("for i in range ( n ) : total += i ; for j in range ( m ) : total += j ; return total").split()
    table = {"for": "i", "i": "in", "in": "range", "range": "(", "(": "len", "n": ")", ")": ":", ":": "total",
             "total": "+=", "+=": "1", ";": "for", "return": "total"}
    res = speculative_greedy_decode(lambda s: text[len(s)] if len(s) < len(text) else "<eos>",
                                    lambda s: table.get(s[-1], "<unk>"), ["for"], 4, "<eos>")
    assert (res.accepted, res.drafted, res.target_passes) == (15, 44, 11)
    alpha = round(res.accepted / res.drafted, 3)
    assert alpha == 0.341
    spec = {"method": "draft_model", "num_speculative_tokens": 4, "draft_cost": 0.05, "acceptance": {"alpha": alpha}}
    sd = simulate(closed_loop(spec, num_requests=48)).summary["spec_decode"]
    assert sd["num_drafts"] > 50_000
    # (1 - a^5) / (1 - a) = 1.5105; 1% is > 4 standard errors at this many rounds
    assert sd["mean_acceptance_length"] == pytest.approx(expected_tokens_per_pass(alpha, 4), rel=0.01)


# ---------------------------------------------------------------------- Example 6
def test_example_6_ngram_profile_feeds_a_run(tmp_path):
    out = tmp_path / "pairs.yaml"
    assert main(["acceptance", "ngram", "--input", str(ROOT / "workloads/examples/ngram-pairs.jsonl"),
                 "--n", "2", "--k", "8", "--out", str(out)]) == 0
    spec = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 2,
            "acceptance": str(out)}
    result = simulate(closed_loop(spec, num_requests=32))
    assert result.info["acceptance_profile"] == "pairs"
    prof = load_profile(out)
    sd = result.summary["spec_decode"]
    n = sd["num_drafts"]  # vLLM counts rounds with a draft only
    for got, p in zip(sd["per_position_acceptance_rate"], prof.unconditional_given_draft()):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)


# ---------------------------------------------------------------------- Example 7
def test_example_7_check_draft_before_using_it(capsys):
    vocab = ROOT / "tests" / "data" / "vocab"
    assert main(["check-draft", str(vocab / "target"), str(vocab / "draft-padded")]) == 0
    assert main(["check-draft", str(vocab / "target"), str(vocab / "draft-other-family")]) == 1
    assert "differs" in capsys.readouterr().out


# ---------------------------------------------------------------------- Example 9
def _throughput(spec, batch):
    cfg = closed_loop(spec, concurrency=batch, num_requests=2 * batch, prompt=256, output=256)
    return simulate(cfg).summary["output_throughput"]


def test_example_9_wide_trees_win_small_batches_and_lose_large_ones():
    chain = {"method": "eagle", "num_speculative_tokens": 2, "acceptance": EAGLE}
    tree = {"method": "eagle", "draft_tree": [4, 4], "acceptance": EAGLE}
    assert _throughput(tree, 1) > 1.2 * _throughput(chain, 1)  # more accepted per memory-bound pass
    assert _throughput(tree, 128) < 0.8 * _throughput(chain, 128)  # 21 verified positions per request


# ---------------------------------------------------------------------- Example 10
def test_example_10_llama_cpp_flags_through_the_cli(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(closed_loop(None, concurrency=1, num_requests=2, output=200)))
    flags = "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8"
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet",
                 f"--llama-cpp-spec={flags}"]) == 0
    setup = json.loads((tmp_path / "o" / "summary.json").read_text())["setup"]
    assert (setup["speculative_method"], setup["num_speculative_tokens"]) == ("ngram", 8)
    assert main(["run", str(cfg), "--out", str(tmp_path / "p"), "--quiet", "--no-plot",
                 "--llama-cpp-spec=--spec-type none"]) == 0
    assert "speculative_method" not in json.loads((tmp_path / "p" / "summary.json").read_text())["setup"]
