"""The temperature model: limits, rule ordering, closed forms against brute-force sums, Example 10."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.speculation.profile import AcceptanceProfile, load_profile
from servesim.speculation.temperature import acceptance_at_temperature

GRID_C = [0.05, 0.3, 0.6, 0.9, 1.0]
GRID_T = [0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0]


def _brute(c: float, temperature: float, pi: float, lam: float) -> tuple[float, float]:
    """Direct sums over 200,000 ranked tokens (independent of the closed forms)."""
    j = np.arange(200_000)
    r = (1 - pi) ** (1 / temperature)
    s = r**lam
    p, q = (1 - r) * r**j, (1 - s) * s**j
    q_swapped = q.copy()
    q_swapped[[0, 1]] = q[[1, 0]]
    ratio = c * np.minimum(p, q).sum() + (1 - c) * np.minimum(p, q_swapped).sum()
    match = c * p[0] + (1 - c) * p[1]  # draft proposes its top: target's top (agree) or runner-up
    return float(ratio), float(match)


def _check_against_brute_force(pi, lam, temperatures, rules):
    """Each closed form of ``rules`` equals the brute-force sum at draft concentrations 0.3 and 0.9."""
    kw = {"target_top_probability": pi, "draft_sharpness": lam}
    for c in (0.3, 0.9):
        for t in temperatures:
            brute = dict(zip(("ratio", "match"), _brute(c, t, pi, lam)))
            for rule in rules:
                assert acceptance_at_temperature(c, t, rule, **kw) == pytest.approx(brute[rule], abs=1e-9)


@pytest.mark.parametrize("pi", [0.5, 0.75, 0.95])
@pytest.mark.parametrize("lam", [1.0, 1.5, 3.0])
def test_closed_forms_match_brute_force(pi, lam):
    _check_against_brute_force(pi, lam, (0.3, 1.0, 2.0), ("ratio", "match"))


@pytest.mark.parametrize("pi, lam", [(0.2, 1.5), (0.1, 2.0)])
def test_closed_forms_match_brute_force_where_the_overlap_crosses_deep_in_the_ranks(pi, lam):
    # a flat target (top probability 0.1-0.2) at T >= 1: the draft's sharper distribution falls below the
    # target's only after rank 4 to 26, so the disagree overlap has its middle part r^2 - r^J (J > 2)
    _check_against_brute_force(pi, lam, (1.0, 2.0, 4.0), ("ratio",))


def test_zero_temperature_is_greedy():
    c = np.array([0.9, 0.7, 0.5])
    for rule in ("ratio", "match"):
        assert np.array_equal(acceptance_at_temperature(c, 0.0, rule), c)
        assert np.allclose(acceptance_at_temperature(c, 1e-3, rule), c, atol=1e-9)


@pytest.mark.parametrize("lam", [1.0, 1.3, 2.0, 5.0, float("inf")])
@pytest.mark.parametrize("pi", [0.3, 0.75, 0.95])
def test_match_never_exceeds_ratio(lam, pi):
    for t in GRID_T:
        ratio = acceptance_at_temperature(GRID_C, t, "ratio", target_top_probability=pi, draft_sharpness=lam)
        match = acceptance_at_temperature(GRID_C, t, "match", target_top_probability=pi, draft_sharpness=lam)
        assert np.all(match <= ratio + 1e-12)


def test_one_hot_draft_makes_ratio_equal_match():
    c = np.array([0.9, 0.6])
    for t in GRID_T:
        assert np.allclose(acceptance_at_temperature(c, t, "ratio", draft_sharpness=float("inf")),
                           acceptance_at_temperature(c, t, "match"))


def test_acceptance_falls_with_temperature():
    ts = np.linspace(0.0, 1.5, 16)
    match = np.array([acceptance_at_temperature([0.6, 0.9, 1.0], t, "match") for t in ts])
    ratio = np.array([acceptance_at_temperature([0.9, 1.0], t, "ratio") for t in ts])
    assert np.all(np.diff(match, axis=0) < 0)
    assert np.all(np.diff(ratio, axis=0) < 0)
    # and the match rule loses more than the ratio rule
    at1 = acceptance_at_temperature([0.9], 1.0, "ratio")[0] - acceptance_at_temperature([0.9], 1.0, "match")[0]
    assert at1 > 0.05


def test_example10_random_model_as_its_own_draft():
    # identical draft and target: greedy acceptance 1 (31 of 31 in the lesson)
    flat = {"target_top_probability": 1 / 151_936, "draft_sharpness": 1.0}
    assert acceptance_at_temperature([1.0], 0.0, "match", **flat)[0] == 1.0
    # at T = 0.8 the match rule accepts almost nothing (1 of 146 in the lesson) ...
    assert 0.0 < acceptance_at_temperature([1.0], 0.8, "match", **flat)[0] < 0.01
    # ... while the ratio rule would accept every draft of an identical model
    assert acceptance_at_temperature([1.0], 0.8, "ratio", **flat)[0] == pytest.approx(1.0)


def test_profile_at_temperature():
    prof = load_profile("eagle-llama3.1-8b-sharegpt-k3")
    hot = prof.at_temperature(1.0, rule="match")
    assert isinstance(hot, AcceptanceProfile)
    assert hot.mean_acceptance_length() < prof.at_temperature(1.0, rule="ratio").mean_acceptance_length()
    assert prof.at_temperature(1.0, rule="ratio").mean_acceptance_length() < prof.mean_acceptance_length()
    assert np.allclose(prof.at_temperature(0.0).unconditional(), prof.unconditional())
    ngram = AcceptanceProfile(source="s", method="ngram", per_position_acceptance=[0.4, 0.3],
                              no_match_probability=0.5)
    cold = ngram.at_temperature(0.0, rule="match")
    assert np.allclose(cold.unconditional(), ngram.unconditional())
    assert cold.no_match_probability == 0.5


def test_bad_arguments():
    for kwargs in ({"temperature": -1.0}, {"temperature": 1.0, "rule": "other"},
                   {"temperature": 1.0, "draft_sharpness": 0.5}, {"temperature": 1.0, "target_top_probability": 1.0}):
        with pytest.raises(ValueError):
            acceptance_at_temperature([0.5], **kwargs)
