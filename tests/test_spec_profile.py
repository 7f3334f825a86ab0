"""Acceptance profiles: conventions, shipped files, sampling, heterogeneity, context decay, loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ConfigError
from servesim.speculation.profile import (
    AcceptanceProfile,
    ContextDecay,
    available_profiles,
    load_profile,
    profiles_dir,
    sample_accepted,
)

# name -> (K, AL printed in docs/reference/acceptance-profiles.md)
TABLE = {
    "eagle-llama3.1-8b-sharegpt-k3": (3, 2.25),
    "eagle-llama3.1-8b-sharegpt-k5": (5, 2.48),
    "eagle-llama3.1-8b-gsm8k-k3": (3, 2.39),
    "eagle-llama3.1-8b-cnndm-k3": (3, 2.33),
    "eagle-llama3.1-8b-instructcoder-k5": (5, 2.63),
    "ngram-llama3.1-8b-sharegpt-k3": (3, 1.40),
    "ngram-cnndm-k3": (3, 1.33),
    "ngram-instructcoder-k5": (5, 2.29),
    "ngram-code-editing-matched-k5": (5, 4.59),
    "eagle3-llama3.1-8b-mtbench-k7": (7, 3.53),
    "eagle3-llamacpp-k3": (3, 2.92),
    "mtp-deepseek-v3-k1-low": (1, 1.85),
    "mtp-deepseek-v3-k1-high": (1, 1.90),
    "mtp-qwen3.6-27b-k3": (3, 3.41),
    "dspark-llama3.2-1b-humaneval-k8": (8, 4.57),
    "dspark-llama3.2-1b-creative-k8": (8, 2.64),
    "lesson-separate-draft-model": (4, 2.773),
    "lesson-independent-heads": (4, 2.561),
    "lesson-feature-level-head": (4, 3.305),
    "lesson-mtp-85": (1, 1.85),
    "lesson-mtp-90": (1, 1.90),
}


def test_every_table_row_is_shipped_with_its_al():
    assert set(TABLE) <= set(available_profiles())
    for name, (k, al) in TABLE.items():
        prof = load_profile(name)
        assert prof.name == name
        assert prof.source.strip()
        assert prof.num_positions == k
        digits = len(str(al).split(".")[1])
        assert abs(prof.mean_acceptance_length() - al) <= 10 ** -digits / 2 + 1e-9, name
        assert prof.illustrative == name.startswith("lesson-")


def test_every_shipped_file_loads():
    for name in available_profiles():
        assert load_profile(name).unconditional().shape[0] >= 1


def test_conversions_exact():
    prof = AcceptanceProfile(source="t", conditional_acceptance=[0.7, 0.7, 0.7, 0.7])
    assert np.allclose(prof.unconditional(), [0.7, 0.49, 0.343, 0.2401], atol=1e-15)
    back = AcceptanceProfile(source="t", per_position_acceptance=list(prof.unconditional()))
    assert np.allclose(back.conditional(), [0.7] * 4, atol=1e-15)
    zero = AcceptanceProfile(source="t", per_position_acceptance=[0.5, 0.0, 0.0])
    assert np.array_equal(zero.conditional(), [0.5, 0.0, 0.0])


def test_example11_metrics_line():
    prof = AcceptanceProfile(source="lesson Example 11", per_position_acceptance=[0.750, 0.530, 0.370])
    assert prof.mean_acceptance_length() == pytest.approx(2.65, abs=1e-12)
    assert prof.mean_acceptance_length(2) == pytest.approx(2.28, abs=1e-12)


def test_extrapolation_repeats_last_conditional_rate():
    prof = AcceptanceProfile(source="t", per_position_acceptance=[0.8, 0.6, 0.3])
    p = prof.unconditional_extended(5)
    assert np.allclose(p[:3], [0.8, 0.6, 0.3])
    assert p[3] == pytest.approx(0.3 * 0.5) and p[4] == pytest.approx(0.3 * 0.25)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            prof.mean_acceptance_length(bad)


@pytest.mark.parametrize("data", [
    {"source": "s"},
    {"source": "s", "per_position_acceptance": [0.5], "conditional_acceptance": [0.5]},
    {"source": "s", "per_position_acceptance": [0.5, 0.6]},
    {"source": "s", "per_position_acceptance": [1.2]},
    {"per_position_acceptance": [0.5]},
    {"source": "s", "per_position_acceptance": [0.5], "typo": 1},
    {"source": "s", "per_position_acceptance": [0.8], "no_match_probability": 0.5},
])
def test_invalid_profiles_give_one_line(data, tmp_path):
    f = tmp_path / "bad.yaml"
    import yaml
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_profile(str(f))
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg


def test_sample_accepted_prefix_property_and_rates():
    rng = np.random.default_rng(np.random.SeedSequence(1))
    prof = load_profile("eagle-llama3.1-8b-sharegpt-k5")
    u = rng.random(200_000)
    a5 = prof.sample_accepted(u, 5)
    for k in range(1, 6):
        assert np.array_equal(prof.sample_accepted(u, k), np.minimum(k, a5))
    p = prof.unconditional()
    for i in range(5):
        share = (a5 >= i + 1).mean()
        assert abs(share - p[i]) < 4 * np.sqrt(p[i] * (1 - p[i]) / u.size)
    k_var = rng.integers(0, 6, size=u.size)
    assert np.array_equal(prof.sample_accepted(u, k_var), np.minimum(k_var, a5))


def test_sample_accepted_extrapolates_and_validates():
    u = np.array([0.0, 0.5, 0.99])
    assert list(sample_accepted(u, 6, np.array([1.0]))) == [6, 6, 6]
    assert list(sample_accepted(u, 0, np.array([0.9]))) == [0, 0, 0]
    with pytest.raises(ValueError):
        sample_accepted(u, -1, np.array([0.5]))


def test_no_match_conventions():
    all_rounds = AcceptanceProfile(source="s", method="ngram", per_position_acceptance=[0.4, 0.3],
                                   no_match_probability=0.5)
    drafted_only = AcceptanceProfile(source="s", method="ngram", per_position_acceptance=[0.8, 0.6],
                                     no_match_probability=0.5, rates_include_no_match=False)
    assert np.allclose(all_rounds.unconditional(), drafted_only.unconditional())
    assert np.allclose(all_rounds.unconditional_given_draft(), [0.8, 0.6])
    u = np.random.default_rng(np.random.SeedSequence(3)).random(100_000)
    empty = all_rounds.draft_is_empty(u)
    assert abs(empty.mean() - 0.5) < 0.006
    assert np.all(all_rounds.sample_accepted(u, 2)[empty] == 0)


def test_heterogeneity_factors_and_population_means():
    rng = np.random.default_rng(np.random.SeedSequence(11))
    base = {"source": "s", "conditional_acceptance": [0.8, 0.7, 0.6]}
    for het in ({"type": "lognormal", "sigma": 0.3}, {"type": "beta", "concentration": 8.0}):
        prof = AcceptanceProfile(**base, heterogeneity=het)
        f = prof.request_factors(rng, 200_000)
        assert abs(f.mean() - 1.0) < 0.01
        rates = prof.conditional_rates(3, factors=f)
        assert rates.shape == (200_000, 3) and rates.max() <= 1.0
        acc = prof.sample_accepted(rng.random(f.size), 3, factors=f)
        expected = prof.expected_unconditional(3)
        for i in range(3):
            assert abs((acc >= i + 1).mean() - expected[i]) < 0.006
        if het["type"] == "beta":  # no clipping: position 1 keeps its mean, deeper positions gain (Jensen)
            assert expected[0] == pytest.approx(0.8, abs=1e-12)
            assert expected[2] > prof.unconditional()[2]
        else:  # lognormal factors above 1/c are clipped at rate 1, which lowers the mean
            assert expected[0] < 0.8
    off = AcceptanceProfile(**base, heterogeneity={"type": "beta", "concentration": 8.0, "enabled": False})
    assert np.array_equal(off.request_factors(rng, 5), np.ones(5))
    beta = AcceptanceProfile(**base, heterogeneity={"type": "beta", "concentration": 8.0})
    assert np.all(beta.request_factors(rng, 10_000) * 0.8 <= 1.0 + 1e-12)


def test_context_decay():
    lin = ContextDecay(per_token=1e-5, floor=0.5, reference_tokens=4096)
    assert np.allclose(lin.scale([0, 4096, 14096, 200_000]), [1.0, 1.0, 0.9, 0.5])
    exp = ContextDecay(shape="exponential", per_token=1e-4)
    assert exp.scale(10_000) == pytest.approx(np.exp(-1.0))
    prof = AcceptanceProfile(source="s", per_position_acceptance=[0.84, 0.6],
                             context_decay={"per_token": 1e-5, "reference_tokens": 4096})
    rates = prof.conditional_rates(2, ctx_tokens=np.array([4096, 14096]))
    assert np.allclose(np.cumprod(rates, axis=1), [[0.84, 0.6], [0.84 * 0.9, 0.6 * 0.9]])
    off = prof.model_copy(update={"context_decay": ContextDecay(per_token=1e-5, enabled=False)})
    assert np.array_equal(off.scale_at_context([1e6]), [1.0])


def test_load_profile_forms(tmp_path):
    assert load_profile({"alpha": 0.7}).mean_acceptance_length(4) == pytest.approx(2.7731, abs=1e-12)
    assert load_profile(0.7).conditional()[0] == pytest.approx(0.7)
    lst = load_profile([0.75, 0.53, 0.37])
    assert lst.mean_acceptance_length() == pytest.approx(2.65)
    inline = load_profile({"per_position_acceptance": [0.5], "method": "mtp"}, source="run.yaml: spec")
    assert inline.method == "mtp"
    f = tmp_path / "mine.yaml"
    f.write_text("source: me\nconditional_acceptance: [0.9]\n")
    assert load_profile("mine.yaml", base_dir=tmp_path).name == "mine"
    assert load_profile(Path(f)).conditional()[0] == pytest.approx(0.9)
    with pytest.raises(ConfigError, match="unknown acceptance profile"):
        load_profile("no-such-profile")
    with pytest.raises(ConfigError):
        load_profile({"alpha": 1.5})
    assert profiles_dir().name == "acceptance" and profiles_dir().parent.name == "workloads"


def test_an_install_without_the_clones_profiles_says_where_they_live(tmp_path, monkeypatch):
    # a non-editable install (pip install .) has the package but not the clone's workloads/acceptance/
    import servesim.speculation.profile as profile

    monkeypatch.setattr(profile, "profiles_dir", lambda: tmp_path / "acceptance")
    with pytest.raises(ConfigError) as excinfo:
        profile.load_profile("eagle-llama3.1-8b-sharegpt-k3", source="run.yaml: speculative_config.acceptance")
    message = str(excinfo.value)
    assert message.startswith("run.yaml: speculative_config.acceptance: unknown acceptance profile "
                              "'eagle-llama3.1-8b-sharegpt-k3' (expected one of: none shipped beside this install")
    assert "workloads/acceptance/" in message and "pip install -e ." in message


def test_unconditional_rates_may_not_rise_even_slightly():
    # p_i = P(first i drafts accepted) can only fall with i: a rise of 0.001 is refused, equal rates are fine
    from servesim.speculation.profile import AcceptanceProfile

    AcceptanceProfile(per_position_acceptance=[0.6, 0.6, 0.3], source="hand-made")
    with pytest.raises(ValueError, match="non-increasing"):
        AcceptanceProfile(per_position_acceptance=[0.6, 0.601], source="hand-made")
