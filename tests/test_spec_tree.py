"""Tree drafts: Example 9's tree, mask and walk; the expected-length model."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.speculation.tree import (
    ancestor_mask,
    greedy_tree_verify,
    node_depths,
    num_nodes,
    tree_acceptance,
    tree_parents,
)
from servesim.acceptance.verify import greedy_verify

MASK9 = """\
0 range  1 . . . . . .
1 (      1 1 . . . . .
2 of     1 . 1 . . . .
3 len    1 1 . 1 . . .
4 n      1 1 . . 1 . .
5 n      1 . 1 . . 1 .
6 the    1 . 1 . . . 1"""
TOKENS9 = ["range", "(", "of", "len", "n", "n", "the"]
TARGET9 = {0: "(", 1: "n", 2: "x", 3: "(", 4: ")", 5: ")", 6: "end"}


def test_example9_structure_and_mask():
    parents = tree_parents([2, 2])
    assert list(parents) == [-1, 0, 0, 1, 1, 2, 2]
    assert num_nodes([2, 2]) == 7 and num_nodes([3]) == 4 and num_nodes([4, 2, 2]) == 29
    assert list(node_depths(parents)) == [0, 1, 1, 2, 2, 2, 2]
    mask = ancestor_mask(parents)
    rows = []
    for i in range(7):
        rows.append(f"{i} {TOKENS9[i]:<6}" + "".join(" 1" if m else " ." for m in mask[i]))
    assert "\n".join(rows) == MASK9


def test_example9_walk_beats_chain():
    path, added = greedy_tree_verify(tree_parents([2, 2]), TOKENS9, TARGET9)
    assert path == [1, 4]
    assert added == ["(", "n", ")"]
    assert len(added) == 3
    accepted, chain_added = greedy_verify(["(", "len"], ["(", "n", "("])
    assert accepted == 1 and chain_added == ["(", "n"]


def test_chain_tree_equals_chain_profile():
    acc = tree_acceptance([1, 1, 1], chain_conditional=[0.8, 0.6, 0.5])
    assert acc.verify_width == 4 and acc.depth == 3
    assert np.allclose(acc.unconditional, [0.8, 0.48, 0.24])
    assert acc.mean_acceptance_length == pytest.approx(2.52)


def test_branching_coverage_models():
    acc = tree_acceptance([2, 2], chain_conditional=[0.6])
    assert np.allclose(acc.conditional, [0.84, 0.84])
    assert acc.mean_acceptance_length == pytest.approx(1 + 0.84 + 0.84**2)
    assert acc.acceptance_rate == pytest.approx((0.84 + 0.84**2) / 6)
    ranked = tree_acceptance([2, 1], candidate_rates=[[0.6, 0.2, 0.1], [0.7, 0.1]])
    assert np.allclose(ranked.conditional, [0.8, 0.7])
    prof = ranked.to_profile("tree", source="test")
    assert prof.mean_acceptance_length() == pytest.approx(1 + 0.8 + 0.56)
    # a wider tree accepts more per pass but each drafted node is accepted less often
    chain = tree_acceptance([1, 1, 1], chain_conditional=[0.6])
    tree = tree_acceptance([4, 2, 2], chain_conditional=[0.6])
    assert tree.mean_acceptance_length > chain.mean_acceptance_length
    assert tree.acceptance_rate < chain.acceptance_rate


def test_tree_monte_carlo_matches_model():
    # independent-candidates model: each of b children matches with probability a, independently
    rng = np.random.default_rng(np.random.SeedSequence(5))
    a, branching, n = 0.5, [3, 2], 100_000
    depth_ok = np.ones(n, dtype=bool)
    accepted = np.zeros(n)
    for b in branching:
        hit = (rng.random((n, b)) < a).any(axis=1)
        depth_ok &= hit
        accepted += depth_ok
    model = tree_acceptance(branching, chain_conditional=[a])
    assert abs(accepted.mean() - model.unconditional.sum()) < 0.01


def test_bad_inputs():
    with pytest.raises(ValueError):
        tree_parents([2, 0])
    with pytest.raises(ValueError):
        tree_acceptance([2])
    with pytest.raises(ValueError):
        tree_acceptance([3], candidate_rates=[[0.5, 0.2]])
    with pytest.raises(ValueError):
        ancestor_mask([-1, 2, 0])
