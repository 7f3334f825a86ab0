"""Verification rules of speculative decoding on explicit tokens and distributions (lesson, Examples 1, 2, 5).

* Greedy verification: accept the longest prefix of the draft equal to the target's greedy choices, then
  append the target's own choice at the first mismatch (or after the last draft). The output equals plain
  greedy decoding token for token.
* Speculative sampling's ratio rule (Leviathan et al. 2023, Chen et al. 2023): accept a draft token ``x``
  (sampled from ``q``) with probability ``min(1, p(x)/q(x))``; on rejection sample from the residual
  ``max(0, p - q) / sum(max(0, p - q))``. The emitted token is distributed exactly as ``p``; the acceptance
  probability is ``sum(min(p, q))``. vLLM's ``RejectionSampler`` follows this rule.
* llama.cpp's match rule (``common_sampler_sample_and_accept_n`` in ``common/sampling.cpp``): sample ``y``
  from the target and accept the draft token iff ``y == x``; acceptance probability ``p(x)``.

All random draws come from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T", bound=Hashable)

__all__ = [
    "GreedyRound",
    "GreedyDecodeResult",
    "greedy_verify",
    "greedy_decode",
    "speculative_greedy_decode",
    "ratio_acceptance",
    "residual_distribution",
    "ratio_rule_sample",
    "match_acceptance",
    "match_rule_sample",
]


@dataclass(frozen=True)
class GreedyRound(Generic[T]):
    """One target pass of greedy speculation: the draft, how many drafts were accepted, tokens added."""

    draft: list[T]
    accepted: int
    added: list[T]


@dataclass
class GreedyDecodeResult(Generic[T]):
    """Output of :func:`speculative_greedy_decode`.

    Attributes:
        output: the whole sequence, starting with the given context.
        rounds: one :class:`GreedyRound` per target pass.
    """

    output: list[T]
    rounds: list[GreedyRound[T]] = field(default_factory=list)

    @property
    def target_passes(self) -> int:
        return len(self.rounds)

    @property
    def drafted(self) -> int:
        return sum(len(r.draft) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)


def greedy_verify(draft: Sequence[T], target_choices: Sequence[T]) -> tuple[int, list[T]]:
    """Greedy verification of one round.

    Args:
        draft: the ``k`` drafted tokens ``d_1..d_k``.
        target_choices: the target's greedy choice after ``[last, d_1..d_i]`` for ``i = 0..k``
            (``k + 1`` tokens, all from one target pass).

    Returns:
        ``(accepted, added)``: the number of accepted drafts ``a`` (longest agreeing prefix) and the
        ``a + 1`` tokens appended to the output (``d_1..d_a`` then ``target_choices[a]``).

    Raises:
        ValueError: ``len(target_choices) != len(draft) + 1``.
    """
    if len(target_choices) != len(draft) + 1:
        raise ValueError(
            f"target_choices must have len(draft) + 1 = {len(draft) + 1} entries, got {len(target_choices)}"
        )
    a = 0
    while a < len(draft) and draft[a] == target_choices[a]:
        a += 1
    return a, [*draft[:a], target_choices[a]]


def greedy_decode(target_next: Callable[[list[T]], T], context: Sequence[T], eos: T,
                  max_tokens: int = 100_000) -> list[T]:
    """Plain greedy decoding: one target call per token until ``eos`` (included) or ``max_tokens``."""
    out = list(context)
    for _ in range(max_tokens):
        if out and out[-1] == eos:
            break
        out.append(target_next(out))
    return out


def speculative_greedy_decode(
    target_next: Callable[[list[T]], T],
    draft_next: Callable[[list[T]], T],
    context: Sequence[T],
    k: int,
    eos: T,
    max_tokens: int = 100_000,
) -> GreedyDecodeResult[T]:
    """Greedy speculative decoding with a chain draft of length ``k`` (lesson, Example 2).

    Each round calls ``draft_next`` ``k`` times (each call feeding on the previous guess), asks the target
    for its choice after each draft prefix (what one verification pass over ``k + 1`` positions yields),
    and applies :func:`greedy_verify`. Stops when the last token is ``eos``.

    Args:
        target_next: the target's greedy choice given the whole sequence so far.
        draft_next: the draft's guess given the sequence so far (including earlier guesses).
        context: tokens already generated.
        k: drafted tokens per round, >= 1.
        eos: end-of-sequence token.
        max_tokens: safety bound on the output length (tokens).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    result: GreedyDecodeResult[T] = GreedyDecodeResult(output=list(context))
    out = result.output
    while not (out and out[-1] == eos) and len(out) < max_tokens:
        proposal: list[T] = []
        for _ in range(k):
            proposal.append(draft_next(out + proposal))
        choices = [target_next(out + proposal[:i]) for i in range(k + 1)]
        a, added = greedy_verify(proposal, choices)
        out.extend(added)
        result.rounds.append(GreedyRound(draft=proposal, accepted=a, added=added))
    return result


def _check_dist(x: np.ndarray | Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D distribution, got shape {arr.shape}")
    if np.any(arr < 0) or not np.isclose(arr.sum(), 1.0, atol=1e-9):
        raise ValueError(f"{name} must be non-negative and sum to 1 (sum is {arr.sum()})")
    return arr


def ratio_acceptance(p: np.ndarray | Sequence[float], q: np.ndarray | Sequence[float]) -> float:
    """Acceptance probability of the ratio rule, ``sum_x min(p(x), q(x))`` (shapes ``(V,)``)."""
    p_, q_ = _check_dist(p, "p"), _check_dist(q, "q")
    if p_.shape != q_.shape:
        raise ValueError(f"p and q must have the same shape, got {p_.shape} and {q_.shape}")
    return float(np.minimum(p_, q_).sum())


def residual_distribution(p: np.ndarray | Sequence[float], q: np.ndarray | Sequence[float]) -> np.ndarray:
    """The ratio rule's resampling distribution ``max(0, p - q)`` normalised to sum 1, shape ``(V,)``.

    When ``p == q`` the residual is empty (rejection never happens); the function then returns ``p``.
    """
    p_, q_ = _check_dist(p, "p"), _check_dist(q, "q")
    r = np.maximum(p_ - q_, 0.0)
    s = r.sum()
    return p_.copy() if s <= 0 else r / s


def ratio_rule_sample(p: np.ndarray | Sequence[float], q: np.ndarray | Sequence[float],
                      rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` independent single-position rounds of speculative sampling (vectorised).

    The draft samples ``x ~ q``; the target accepts with probability ``min(1, p(x)/q(x))``; otherwise a
    token is drawn from :func:`residual_distribution`.

    Returns:
        ``(tokens, accepted)``: int array ``(n,)`` of emitted token ids, bool array ``(n,)``.
    """
    p_, q_ = _check_dist(p, "p"), _check_dist(q, "q")
    v = p_.size
    x = rng.choice(v, size=n, p=q_)
    ratio = np.minimum(1.0, p_[x] / q_[x])
    accepted = rng.random(n) < ratio
    tokens = x.copy()
    n_rej = int((~accepted).sum())
    if n_rej:
        tokens[~accepted] = rng.choice(v, size=n_rej, p=residual_distribution(p_, q_))
    return tokens, accepted


def match_acceptance(p: np.ndarray | Sequence[float], draft_token: int) -> float:
    """Acceptance probability of llama.cpp's match rule for a proposed token: ``p(draft_token)``."""
    return float(_check_dist(p, "p")[draft_token])


def match_rule_sample(p: np.ndarray | Sequence[float], draft_token: int | np.ndarray,
                      rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rounds of the match rule: the target samples ``y ~ p``; the draft token is accepted iff equal.

    The emitted token is always the target's sample, so the output follows ``p`` exactly.

    Returns:
        ``(tokens, accepted)``: int array ``(n,)``, bool array ``(n,)``.
    """
    p_ = _check_dist(p, "p")
    y = rng.choice(p_.size, size=n, p=p_)
    return y, y == np.asarray(draft_token)
