"""llama.cpp's speculative flags (seed lesson, Example 10): the flag mapping, the draft budget limit and the
match rule, reproducing the lesson's printed numbers."""

from __future__ import annotations

import math

import pytest

from servesim.cli.run import parse_overrides
from servesim.input_files import validate
from servesim.errors import ConfigError
from servesim.speculation.config import SpeculativeConfig
from servesim.speculation.llamacpp import (
    draft_budget,
    mean_acceptance_length,
    parse_llamacpp_flags,
    replay_request,
)
from servesim.speculation.temperature import acceptance_at_temperature

EXAMPLE_10_SERVER = "--spec-type draft-simple -md tiny-random-qwen2vocab-f32.gguf --spec-model-card qwen3-0.6b " \
                    "--spec-draft-n-max 4"


def test_defaults_are_the_lessons():
    # --spec-type defaults to none, which ignores the draft flags: refused rather than run plain unnoticed
    with pytest.raises(ConfigError, match=r"^--llama-cpp-spec: --spec-type defaults to none \(no speculation\), "
                                          r"which ignores -md, --spec-draft-n-max: give --spec-type \(e.g. "
                                          r"draft-simple\), or --spec-type none to run without speculation$"):
        parse_llamacpp_flags("--spec-draft-n-max 4 -md qwen3-0.6b")
    assert parse_llamacpp_flags("--temp 0.5") is None  # a flag of every type: plain decoding, as llama.cpp
    with pytest.raises(ConfigError, match="--llama-cpp-spec: no flags given"):  # "$FLAGS" unset: not silently none
        parse_llamacpp_flags("")
    assert parse_llamacpp_flags("--spec-type none --spec-draft-n-max 4") is None
    spec = parse_llamacpp_flags("--spec-type draft-simple -md qwen3-0.6b")
    assert spec["num_speculative_tokens"] == 3  # --spec-draft-n-max default
    ngram = parse_llamacpp_flags("--spec-type ngram-simple")
    assert (ngram["prompt_lookup_min"], ngram["prompt_lookup_max"], ngram["num_speculative_tokens"]) == (12, 12, 48)


def test_flag_mapping():
    spec = parse_llamacpp_flags(EXAMPLE_10_SERVER)
    assert spec == {"method": "draft_model", "num_speculative_tokens": 4, "model": "qwen3-0.6b",
                    "verification_rule": "match", "draft_budget_limit": True}
    ngram = parse_llamacpp_flags("--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8")
    assert (ngram["method"], ngram["prompt_lookup_min"], ngram["prompt_lookup_max"]) == ("ngram", 3, 3)
    assert ngram["num_speculative_tokens"] == 8
    assert parse_llamacpp_flags("--spec-type=draft-eagle3 --spec-draft-n-max=5")["method"] == "eagle3"
    mtp = parse_llamacpp_flags(["--spec-type", "draft-mtp", "--spec-draft-n-max", "1", "--temp", "0.8"])
    assert (mtp["method"], mtp["num_speculative_tokens"], mtp["temperature"]) == ("mtp", 1, 0.8)
    assert parse_llamacpp_flags("--spec-type ngram-mod --spec-acceptance 0.6")["acceptance"] == {"alpha": 0.6}
    # every mapping validates as a SpeculativeConfig (draft_model needs an acceptance profile)
    for text in (EXAMPLE_10_SERVER + " --spec-acceptance 0.7", "--spec-type ngram-simple --spec-ngram-simple-size-n 3",
                 "--spec-type draft-eagle3", "--spec-type draft-mtp"):
        cfg = validate(SpeculativeConfig, parse_llamacpp_flags(text), "test")
        assert cfg.verification_rule == "match" and cfg.draft_budget_limit


@pytest.mark.parametrize("flags, words", [
    ("--spec-type draft-simple --draft-p-min 0.5", ["--draft-p-min"]),
    ("--spec-type eagle", ["--spec-type", "eagle"]),
    ("--spec-type draft-simple -md tiny.gguf", ["tiny.gguf", "--spec-model-card"]),
    ("--spec-type draft-simple", ["-md"]),
    ("--spec-type draft-dflash", ["draft-dflash"]),
    ("--spec-type draft-simple -md x --spec-draft-n-max four", ["--spec-draft-n-max", "four"]),
    ("--spec-type draft-simple -md", ["-md", "value"]),
    # what Python's int() and float() take and llama.cpp's stoi/stof read otherwise (1_0 -> 1) or refuse
    ("--spec-type draft-simple -md x --spec-draft-n-max 1_0", ["--spec-draft-n-max", "'1_0'", "integer"]),
    ("--spec-type draft-simple -md x --spec-draft-n-max \uff13", ["--spec-draft-n-max", "integer"]),
    ("--spec-type ngram-simple --spec-ngram-simple-size-n 2.0", ["--spec-ngram-simple-size-n", "'2.0'"]),
    ("--spec-type ngram-simple --temp nan", ["--temp", "'nan'", "number >= 0"]),
    ("--spec-type ngram-simple --temp inf", ["--temp", "'inf'"]),
    ("--spec-type ngram-simple --temp 1e400", ["--temp", "'1e400'"]),
    ("--spec-type ngram-simple --temp 0_5", ["--temp", "'0_5'"]),
    # more digits than int() converts (4,300): one line, not int()'s ValueError as a traceback
    ("--spec-type draft-simple -md x --spec-draft-n-max " + "9" * 5000, ["--spec-draft-n-max", "integer",
                                                                        "(5000 characters)"]),
    ("--spec-type ngram-simple --spec-ngram-simple-size-m " + "1" * 101, ["--spec-ngram-simple-size-m"]),
])
def test_errors_are_one_line_and_name_the_flag(flags, words):
    with pytest.raises(ConfigError) as err:
        parse_llamacpp_flags(flags)
    text = str(err.value)
    assert "\n" not in text and text.startswith("--llama-cpp-spec")
    for w in words:
        assert w in text


def test_run_option_is_exclusive_with_vllms_json_and_precedes_set():
    with pytest.raises(ConfigError, match="mutually exclusive"):
        parse_overrides([], '{"method": "ngram", "num_speculative_tokens": 3}', "--spec-type ngram-simple")
    out = parse_overrides(["speculative_config.acceptance=0.5"], None, EXAMPLE_10_SERVER)
    assert [key for key, _ in out] == ["speculative_config", "speculative_config.acceptance"]  # --set after


def test_draft_budget_limit():
    assert draft_budget(4, 39) == 4
    assert draft_budget(4, 4) == 3  # remaining budget minus one
    assert draft_budget(4, 1) == 0


def test_example_10_greedy_request():
    """40 tokens, 31 drafted and accepted in 8 rounds: 7 x 4 + 3 = 31, mean len 1 + 31/8 = 4.875 -> 4.88."""
    k = parse_llamacpp_flags(EXAMPLE_10_SERVER)["num_speculative_tokens"]
    rounds = replay_request(40, k, lambda j, d, rem: d)  # identical draft, greedy: every draft accepted
    assert len(rounds) == 8
    assert [r.drafted for r in rounds] == [4] * 7 + [3]
    assert sum(r.drafted for r in rounds) == 31 == sum(r.accepted for r in rounds)
    assert 1 + sum(r.tokens for r in rounds) == 40  # the first token comes from the prompt pass
    assert mean_acceptance_length(rounds) == 4.875
    assert f"{mean_acceptance_length(rounds):.2f}" == "4.88"


def test_example_10_sampled_request():
    """T = 0.8: 1 of 146 drafts accepted, 38 rounds for 39 tokens, mean len 1 + 1/38 = 1.03."""
    k = parse_llamacpp_flags(EXAMPLE_10_SERVER + " --temp 0.8")["num_speculative_tokens"]
    # 146 = 35 x 4 + 3 + 2 + 1 under the budget limit: the one accepted draft is the last round's
    rounds = replay_request(40, k, lambda j, d, rem: 1 if rem == 2 else 0)
    assert len(rounds) == 38
    assert sum(r.drafted for r in rounds) == 146
    assert sum(r.accepted for r in rounds) == 1
    assert mean_acceptance_length(rounds) == pytest.approx(1 + 1 / 38, abs=1e-15)
    assert f"{mean_acceptance_length(rounds):.2f}" == "1.03"
    # accepting the draft in any earlier round would give 38 rounds with 142 drafted, not the printed 146
    early = replay_request(40, k, lambda j, d, rem: 1 if j == 0 else 0)
    assert (len(early), sum(r.drafted for r in early)) == (38, 142)
    # without the budget limit every round would draft 4: 38 x 4 = 152
    assert 38 * k == 152


def test_example_10_match_rule_with_identical_draft():
    """The tiny model as its own draft: the ratio rule accepts everything at any T, the match rule accepts
    ``1 - r`` with ``r = (1 - pi)^(1/T)``, nearly nothing for a flat 151,936-token distribution."""
    pi = 1 / 151_936
    ratio = acceptance_at_temperature(1.0, 0.8, "ratio", target_top_probability=pi, draft_sharpness=1.0)
    match = acceptance_at_temperature(1.0, 0.8, "match", target_top_probability=pi, draft_sharpness=1.0)
    assert float(ratio) == pytest.approx(1.0, abs=1e-12)
    assert float(match) == pytest.approx(1 - math.exp(math.log1p(-pi) / 0.8), rel=1e-12)
    assert float(match) < 1 / 146  # the lesson measured 1 accepted of 146 drafts
