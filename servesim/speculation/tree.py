"""Tree-shaped drafts (SpecInfer, Medusa, EAGLE): structure, attention mask, greedy verification, and an
expected-length model (lesson, Example 9).

A tree is given by its branching factor per depth, e.g. ``[2, 2]``: the root (the last accepted token)
has 2 children and each of them 2 more, ``1 + 2 + 4 = 7`` nodes, numbered breadth-first. One target pass
verifies every node; a node attends only to its ancestors (and the earlier context).

Cost-model view: a tree is ``k = depth`` draft positions with a verification width of ``num_nodes`` tokens
(the root included, as ``k + 1`` for a chain), and an equivalent per-position acceptance profile
(:func:`tree_acceptance`) that the engine samples like a chain's.

Expected-length model. Walking down the tree, depth ``d`` is accepted when the target's token is one of the
``b_d`` children of the node accepted at depth ``d - 1``. Its conditional probability is either
* ``coverage_d = 1 - (1 - a_d)^b_d`` from the chain's conditional rate ``a_d`` (default; treats the
  candidates as independent guesses, an optimistic approximation since a draft's top candidates are
  mutually exclusive), or
* ``coverage_d = sum_{j <= b_d} r_(d,j)`` from ``candidate_rates``: the probability that the target's token
  is the draft's j-th ranked candidate at depth ``d`` (exact when those rank probabilities are measured).
Then ``p_d = prod_{e <= d} coverage_e`` and the mean acceptance length is ``1 + sum_d p_d``.
Evidence (SpecDecode-Bench, SGLang): chain k=3 -> a 21-node tree raised AL 2.25 -> 2.92 while the per-token
acceptance rate fell 0.415 -> 0.095.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "tree_parents",
    "num_nodes",
    "node_depths",
    "ancestor_mask",
    "greedy_tree_verify",
    "TreeAcceptance",
    "tree_acceptance",
]


def _check_branching(branching: Sequence[int]) -> list[int]:
    b = [int(x) for x in branching]
    if not b or any(x < 1 for x in b):
        raise ValueError(f"branching must be a non-empty list of integers >= 1, got {list(branching)}")
    return b


def num_nodes(branching: Sequence[int]) -> int:
    """Nodes of a full tree including the root: ``1 + b1 + b1 b2 + ...``."""
    total, level = 1, 1
    for b in _check_branching(branching):
        level *= b
        total += level
    return total


def tree_parents(branching: Sequence[int]) -> np.ndarray:
    """Parent index of each node of a full tree, breadth-first, root first (parent -1); int ``(N,)``."""
    parents = [-1]
    frontier = [0]
    for b in _check_branching(branching):
        nxt = []
        for node in frontier:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return np.asarray(parents, dtype=np.int64)


def node_depths(parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """Depth of each node (root 0), int ``(N,)``; parents must precede children."""
    par = np.asarray(parents, dtype=np.int64)
    depth = np.zeros(par.size, dtype=np.int64)
    for i in range(1, par.size):
        if not 0 <= par[i] < i:
            raise ValueError(f"node {i}: parent must be an earlier node, got {par[i]}")
        depth[i] = depth[par[i]] + 1
    return depth


def ancestor_mask(parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """Tree attention mask: ``mask[i, j]`` is True iff node ``j`` is node ``i`` or one of its ancestors.

    Shape ``(N, N)`` bool (row = query node, column = key node).
    """
    par = np.asarray(parents, dtype=np.int64)
    node_depths(par)  # validates the order
    n = par.size
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        a = i
        while a != -1:
            mask[i, a] = True
            a = int(par[a])
    return mask


def greedy_tree_verify(parents: Sequence[int] | np.ndarray, tokens: Sequence[Hashable],
                       target_next: Mapping[int, Hashable] | Sequence[Hashable]) -> tuple[list[int], list[Hashable]]:
    """Walk down from the root while the target's choice is a child's token.

    Args:
        parents: ``(N,)`` parent per node (root first).
        tokens: token of each node (the root's is the last accepted token).
        target_next: the target's greedy choice after each node (from one pass over all nodes).

    Returns:
        ``(path, added)``: accepted node ids (root excluded) and the tokens added to the output (the
        accepted tokens then the target's own token): ``len(added) = len(path) + 1``.
    """
    par = np.asarray(parents, dtype=np.int64)
    children: dict[int, list[int]] = {}
    for i in range(1, par.size):
        children.setdefault(int(par[i]), []).append(i)
    path: list[int] = []
    added: list[Hashable] = []
    cur = 0
    while True:
        want = target_next[cur]
        nxt = next((c for c in children.get(cur, []) if tokens[c] == want), None)
        added.append(want)
        if nxt is None:
            return path, added
        path.append(nxt)
        cur = nxt


@dataclass(frozen=True)
class TreeAcceptance:
    """Expected acceptance of a tree draft, in the engine's terms.

    Attributes:
        depth: draft positions ``k`` (= number of depths).
        verify_width: tokens verified in one pass (nodes incl. the root).
        conditional: ``(depth,)`` probability that depth ``d`` is accepted given depth ``d-1`` was.
        unconditional: ``(depth,)`` per-position acceptance ``p_d``.
    """

    depth: int
    verify_width: int
    conditional: np.ndarray
    unconditional: np.ndarray

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + sum p_d`` tokens per target pass."""
        return 1.0 + float(self.unconditional.sum())

    @property
    def acceptance_rate(self) -> float:
        """Accepted tokens per drafted (non-root) node."""
        return float(self.unconditional.sum()) / (self.verify_width - 1)

    def to_profile(self, name: str, source: str, method: str | None = None):  # -> AcceptanceProfile
        """An :class:`~servesim.speculation.profile.AcceptanceProfile` with these conditional rates."""
        from servesim.speculation.profile import AcceptanceProfile

        return AcceptanceProfile(
            name=name, method=method, source=source, conditional_acceptance=[float(x) for x in self.conditional],
            notes=f"tree draft: {self.depth} positions, verify width {self.verify_width} tokens",
        )


def tree_acceptance(branching: Sequence[int], chain_conditional: Sequence[float] | None = None,
                    candidate_rates: Sequence[Sequence[float]] | None = None) -> TreeAcceptance:
    """Expected acceptance of a full tree with the given branching (see the module docstring).

    Args:
        branching: children per node at each depth, e.g. ``[2, 2]``.
        chain_conditional: the chain's conditional rates ``a_d`` (last one repeats if shorter).
        candidate_rates: per depth, probabilities that the target's token is the draft's 1st, 2nd, ...
            candidate (each row sums to <= 1, needs at least ``b_d`` entries).

    Raises:
        ValueError: neither or both rate inputs, rates outside [0, 1], too few candidate rates.
    """
    b = _check_branching(branching)
    if (chain_conditional is None) == (candidate_rates is None):
        raise ValueError("give exactly one of chain_conditional and candidate_rates")
    cov = np.empty(len(b))
    if chain_conditional is not None:
        a = np.asarray(chain_conditional, dtype=float)
        if a.size == 0 or np.any((a < 0) | (a > 1)):
            raise ValueError("chain_conditional must be non-empty rates in [0, 1]")
        for d, bd in enumerate(b):
            ad = a[min(d, a.size - 1)]
            cov[d] = 1.0 - (1.0 - ad) ** bd
    else:
        assert candidate_rates is not None
        if len(candidate_rates) < len(b):
            raise ValueError(f"candidate_rates needs {len(b)} depths, got {len(candidate_rates)}")
        for d, bd in enumerate(b):
            r = np.asarray(candidate_rates[d], dtype=float)
            if r.size < bd or np.any(r < 0) or r.sum() > 1 + 1e-9:
                raise ValueError(f"candidate_rates[{d}] needs >= {bd} non-negative entries summing to <= 1")
            cov[d] = r[:bd].sum()
    return TreeAcceptance(depth=len(b), verify_width=num_nodes(b), conditional=cov, unconditional=np.cumprod(cov))
