"""Verification rules and closed forms against the seed lesson's Examples 1-5 and 8."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.acceptance.formulas import (
    best_k,
    expected_tokens_per_pass,
    mean_acceptance_length,
    speedup,
    unconditional_from_conditional,
)
from servesim.speculation.profile import sample_accepted
from servesim.acceptance.verify import (
    greedy_decode,
    greedy_verify,
    match_acceptance,
    match_rule_sample,
    ratio_acceptance,
    ratio_rule_sample,
    residual_distribution,
    speculative_greedy_decode,
)

# ---------------------------------------------------------------- Example 1
TEXT1 = "for i in range ( n ) : total += i".split(" ")
DRAFT1 = {"for": "i", "i": "in", "in": "range", "range": "(", "(": "len", ")": ":", ":": "return",
          "total": "+=", "+=": "1"}


def test_example1_one_round():
    ctx = ["for", "i", "in"]
    proposal: list[str] = []
    prev = ctx[-1]
    for _ in range(4):
        prev = DRAFT1.get(prev, "<unk>")
        proposal.append(prev)
    assert proposal == ["range", "(", "len", "<unk>"]
    choices = [TEXT1[len(ctx) + i] for i in range(5)]
    assert choices == ["range", "(", "n", ")", ":"]
    accepted, added = greedy_verify(proposal, choices)
    assert accepted == 2
    assert added == ["range", "(", "n"]
    assert ctx + added == ["for", "i", "in", "range", "(", "n"]


def test_greedy_verify_rejects_wrong_length():
    with pytest.raises(ValueError):
        greedy_verify(["a"], ["a"])


def test_greedy_verify_all_accepted_takes_bonus():
    assert greedy_verify(["a", "b"], ["a", "b", "c"]) == (2, ["a", "b", "c"])


# ---------------------------------------------------------------- Example 2
TEXT2 = ("for i in range ( n ) : total += i ; for j in range ( m ) : total += j ; return total").split(" ")
DRAFT2 = {"for": "i", "i": "in", "in": "range", "range": "(", "(": "len", "n": ")", ")": ":", ":": "total",
          "total": "+=", "+=": "1", ";": "for", "return": "total"}


def _target2(ctx: list[str]) -> str:
    return TEXT2[len(ctx)] if len(ctx) < len(TEXT2) else "<eos>"


def _draft2(ctx: list[str]) -> str:
    return DRAFT2.get(ctx[-1], "<unk>")


def test_example2_whole_answer():
    res = speculative_greedy_decode(_target2, _draft2, ["for"], k=4, eos="<eos>")
    plain = greedy_decode(_target2, ["for"], eos="<eos>")
    assert res.output == plain
    assert len(plain) - 1 == 26
    assert res.target_passes == 11
    assert res.drafted == 44
    assert res.accepted == 15
    assert f"{res.accepted / res.drafted:.3f}" == "0.341"
    assert f"{(len(res.output) - 1) / res.target_passes:.2f}" == "2.36"
    assert [r.accepted for r in res.rounds] == [4, 4, 0, 1, 0, 2, 0, 3, 0, 0, 1]
    unk = ["<unk>"] * 4
    assert [r.draft for r in res.rounds] == [
        ["i", "in", "range", "("], [")", ":", "total", "+="], ["in", "range", "(", "len"],
        ["for", "i", "in", "range"], unk, ["range", "(", "len", "<unk>"], unk, [":", "total", "+=", "1"],
        unk, ["for", "i", "in", "range"], ["total", "+=", "1", "<unk>"],
    ]
    assert [len(r.added) for r in res.rounds] == [a + 1 for a in [4, 4, 0, 1, 0, 2, 0, 3, 0, 0, 1]]


# ---------------------------------------------------------------- Example 3
EX3 = """\
  0.5   1.500   1.750   1.938   1.996   2.000   2.000
  0.6   1.600   1.960   2.306   2.475   2.500   2.500
  0.7   1.700   2.190   2.773   3.199   3.326   3.333
  0.8   1.800   2.440   3.362   4.329   4.887   5.000
  0.9   1.900   2.710   4.095   6.126   8.332  10.000"""


def test_example3_table_exact():
    for line in EX3.splitlines():
        cols = line.split()
        alpha = float(cols[0])
        got = [f"{expected_tokens_per_pass(alpha, k):.3f}" for k in (1, 2, 4, 8, 16)]
        got.append(f"{1 / (1 - alpha):.3f}")
        assert got == cols[1:], alpha


def test_example3_worked_case_and_edges():
    assert expected_tokens_per_pass(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75, abs=1e-12)
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.3, 0) == 1.0
    with pytest.raises(ValueError):
        expected_tokens_per_pass(1.2, 3)


def test_example3_monte_carlo():
    rng = np.random.default_rng(np.random.SeedSequence(42))
    acc = sample_accepted(rng.random(100_000), 4, np.array([0.8]))
    assert abs((acc + 1).mean() - 3.3616) < 0.01


# ---------------------------------------------------------------- Example 4
EX4_BLOCK = """\
  k=1   tokens/pass 1.800  cost/round 1.1  speedup 1.636
  k=2   tokens/pass 2.440  cost/round 1.2  speedup 2.033
  k=3   tokens/pass 2.952  cost/round 1.3  speedup 2.271
  k=4   tokens/pass 3.362  cost/round 1.4  speedup 2.401
  k=6   tokens/pass 3.951  cost/round 1.6  speedup 2.470
  k=8   tokens/pass 4.329  cost/round 1.8  speedup 2.405
  k=12  tokens/pass 4.725  cost/round 2.2  speedup 2.148"""
EX4_BEST = """\
  0.02   k=6  2.17x   k=8  2.76x   k=11 3.82x   k=19 6.37x
  0.05   k=4  1.92x   k=6  2.35x   k=8  3.09x   k=13 4.67x
  0.10   k=3  1.67x   k=4  1.98x   k=6  2.47x   k=10 3.43x
  0.30   k=1  1.23x   k=2  1.37x   k=3  1.55x   k=5  1.87x
  1.00   k=0  1.00x   k=0  1.00x   k=0  1.00x   k=0  1.00x"""


def test_example4_first_block():
    for line in EX4_BLOCK.splitlines():
        cols = line.split()
        k = int(cols[0][2:])
        assert f"{expected_tokens_per_pass(0.8, k):.3f}" == cols[2]
        assert f"{1 + k * 0.1:.1f}" == cols[4]
        assert f"{speedup(0.8, k, 0.1):.3f}" == cols[6]


def test_example4_best_k_table():
    for line in EX4_BEST.splitlines():
        cols = line.split()
        c = float(cols[0])
        got = []
        for alpha in (0.6, 0.7, 0.8, 0.9):
            k, s = best_k(alpha, c, 32)
            got += [f"k={k}", f"{s:.2f}x"]
        expected = []
        for tok in cols[1:]:
            expected.append(tok)
        assert got == expected, c


# ---------------------------------------------------------------- Example 5
P5 = np.array([0.40, 0.10, 0.20, 0.15, 0.10, 0.05])
Q5 = np.array([0.20, 0.25, 0.35, 0.05, 0.10, 0.05])
CHI2_DF5_999 = 20.515  # 0.999 quantile of chi-square with 5 degrees of freedom (standard tables)


def test_example5_closed_forms():
    assert ratio_acceptance(P5, Q5) == pytest.approx(0.70, abs=1e-12)
    assert np.allclose(residual_distribution(P5, Q5), [2 / 3, 0, 0, 1 / 3, 0, 0])
    assert match_acceptance(P5, int(np.argmax(Q5))) == pytest.approx(0.200, abs=1e-12)
    # the arithmetic for "the": proposed and accepted 0.20, plus rejection share 0.30 x 0.667
    assert Q5[0] * 1.0 + (1 - 0.70) * (2 / 3) == pytest.approx(P5[0])


def _chi2(counts: np.ndarray, p: np.ndarray) -> float:
    n = counts.sum()
    return float(((counts - n * p) ** 2 / (n * p)).sum())


def test_example5_ratio_rule_sampling_keeps_p():
    rng = np.random.default_rng(np.random.SeedSequence(7))
    n = 100_000
    tokens, accepted = ratio_rule_sample(P5, Q5, rng, n)
    assert abs(accepted.mean() - 0.70) < 0.005  # sd 0.00145
    counts = np.bincount(tokens, minlength=6)
    assert _chi2(counts, P5) < CHI2_DF5_999
    # a 10% distortion (emitting q instead of p) would be rejected by the same test
    assert _chi2(np.bincount(rng.choice(6, size=n, p=Q5), minlength=6), P5) > CHI2_DF5_999


def test_example5_match_rule():
    rng = np.random.default_rng(np.random.SeedSequence(8))
    tokens, accepted = match_rule_sample(P5, int(np.argmax(Q5)), rng, 100_000)
    assert abs(accepted.mean() - 0.200) < 0.005  # sd 0.00126
    assert _chi2(np.bincount(tokens, minlength=6), P5) < CHI2_DF5_999


def test_distribution_validation():
    with pytest.raises(ValueError):
        ratio_acceptance([0.5, 0.6], [0.5, 0.5])


# ---------------------------------------------------------------- Example 8
EX8 = [
    ([0.70, 0.70, 0.70, 0.70], 0.10, "0.700 0.490 0.343 0.240", "2.773", "1.40", "1.98"),
    ([0.80, 0.60, 0.45, 0.30], 0.01, "0.800 0.480 0.216 0.065", "2.561", "1.04", "2.46"),
    ([0.85, 0.78, 0.72, 0.66], 0.03, "0.850 0.663 0.477 0.315", "3.305", "1.12", "2.95"),
    ([0.85], 0.0, "0.850", "1.850", "1.00", "1.85"),
    ([0.90], 0.0, "0.900", "1.900", "1.00", "1.90"),
]


@pytest.mark.parametrize(("cond", "cost", "perpos", "al", "round_cost", "spd"), EX8)
def test_example8_rows(cond, cost, perpos, al, round_cost, spd):
    p = unconditional_from_conditional(cond)
    assert " ".join(f"{x:.3f}" for x in p) == perpos
    length = mean_acceptance_length(p)
    assert f"{length:.3f}" == al
    assert f"{1 + len(cond) * cost:.2f}" == round_cost
    assert f"{length / (1 + len(cond) * cost):.2f}" == spd
