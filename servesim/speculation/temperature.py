"""Acceptance versus sampling temperature: a documented "peakedness" model.

A greedy per-position profile gives, at each draft position, the probability ``c`` that the draft's most
likely token equals the target's (greedy verification accepts exactly then). At temperature ``T > 0`` the
acceptance depends on the whole distributions and on the verification rule (lesson, Examples 5 and 10):

* ratio rule (speculative sampling, vLLM's ``RejectionSampler`` with ``draft_sample_method="probabilistic"``):
  the draft samples from ``q_T`` and the acceptance is ``sum(min(p_T, q_T))``;
* match rule (llama.cpp's server, ``common_sampler_sample_and_accept_n``): the draft proposes its most likely
  token ``x`` and the acceptance is ``p_T(x)``. vLLM's default ``draft_sample_method="greedy"`` treats the
  draft as one-hot, for which the ratio rule's ``min(1, p(x)/1)`` is also ``p_T(x)``: use ``rule="match"``
  (or ``draft_sharpness=inf``) for vLLM with default settings.

Assumptions (servesim's model, not a published one):

1. Ranked logits fall linearly, so the target's distribution at temperature ``T`` is geometric over the
   ranked tokens: ``p_T(j) = (1 - r) r^j``, ``r = (1 - pi)^(1/T)``, where ``pi`` is the target's top-token
   probability at ``T = 1`` (``target_top_probability``; a large vocabulary is approximated as infinite).
2. The draft has the same form, ``draft_sharpness`` ``lam >= 1`` times more peaked: ``s = r^lam``
   (``lam = inf``: one-hot). ``lam >= 1`` guarantees ``match <= ratio`` (the draft's top token has
   ``q >= p``, so ``min(p(x), q(x)) = p(x)``).
3. With probability ``c`` the draft ranks tokens like the target (agree); otherwise its top token is the
   target's runner-up and vice versa (the top two swapped).

Closed forms (``j*`` = first rank where the sharper ``q`` falls below ``p``):
agree: ratio ``1 - r^j* + s^j*``, match ``1 - r``; disagree: ratio ``min(p_0, q_1) + min(p_1, q_0) +
r^2 - r^J + s^J`` with ``J = max(2, j*)``, match ``(1 - r) r``. Acceptance at ``T`` is
``c * agree + (1 - c) * disagree``.

Limits: ``T -> 0`` gives ``c`` under both rules (the greedy profile). The match rule falls with ``T``
whenever the disagreement term is small (``c (1 - r) + (1 - c)(1 - r) r`` decreases for ``c`` above
about 0.5); for small ``c`` acceptance can rise with ``T`` because the draft's token is the target's
runner-up, which gains mass. The ratio rule falls much less and is not monotone at large ``T`` (its agree
term tends to the overlap of two geometric laws whose widths differ by ``lam``). With an identical draft
(``c = 1``, ``lam = 1``) the ratio rule accepts everything at any ``T``, while the match rule accepts
``1 - r``: nearly nothing for a flat (random-weight) model, as in Example 10 (1 of 146 at T = 0.8).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["DEFAULT_TARGET_TOP_PROBABILITY", "DEFAULT_DRAFT_SHARPNESS", "acceptance_at_temperature"]

DEFAULT_TARGET_TOP_PROBABILITY = 0.75
DEFAULT_DRAFT_SHARPNESS = 2.0


def _overlap_terms(r: float, s: float) -> tuple[float, float]:
    """(agree overlap, disagree overlap) of geometric p (ratio r) and sharper q (ratio s <= r)."""
    p0, p1 = 1.0 - r, (1.0 - r) * r
    if s <= 0.0:  # one-hot draft
        return p0, p1
    q0, q1 = 1.0 - s, (1.0 - s) * s
    if s >= r:
        j_star = 0
    else:
        j_star = max(0, math.ceil(math.log(q0 / p0) / math.log(r / s) - 1e-12))
    agree = 1.0 - r**j_star + s**j_star
    big_j = max(2, j_star)
    disagree = min(p0, q1) + min(p1, q0) + (r**2 - r**big_j) + s**big_j
    return min(agree, 1.0), min(disagree, 1.0)


def acceptance_at_temperature(
    greedy_rates: Sequence[float] | np.ndarray | float,
    temperature: float,
    rule: Literal["ratio", "match"] = "ratio",
    target_top_probability: float = DEFAULT_TARGET_TOP_PROBABILITY,
    draft_sharpness: float = DEFAULT_DRAFT_SHARPNESS,
) -> np.ndarray:
    """Per-position conditional acceptance at temperature ``T`` from greedy conditional rates.

    Args:
        greedy_rates: conditional acceptance rates at ``T = 0`` (probability the argmaxes agree), shape
            ``(K,)`` or a scalar.
        temperature: sampling temperature ``T >= 0`` (0 = greedy, returns the input).
        rule: ``"ratio"`` (speculative sampling, sum(min(p_T, q_T))) or ``"match"`` (p_T(x_draft)).
        target_top_probability: the target's top-token probability at ``T = 1``, in (0, 1).
        draft_sharpness: ``lam >= 1``; the draft's ratio is ``r^lam`` (``inf`` = one-hot draft).

    Returns:
        Conditional rates at ``T``, float array with the shape of ``greedy_rates``.

    Raises:
        ValueError: ``T < 0``, unknown rule, rates outside [0, 1], ``pi`` outside (0, 1), ``lam < 1``.
    """
    c = np.asarray(greedy_rates, dtype=float)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if rule not in ("ratio", "match"):
        raise ValueError(f"rule must be 'ratio' or 'match', got {rule!r}")
    if np.any((c < 0) | (c > 1)):
        raise ValueError("greedy rates must be in [0, 1]")
    if not 0.0 < target_top_probability < 1.0:
        raise ValueError(f"target_top_probability must be in (0, 1), got {target_top_probability}")
    if not draft_sharpness >= 1.0:
        raise ValueError(f"draft_sharpness must be >= 1, got {draft_sharpness}")
    if temperature == 0.0:
        return c.copy()
    log_r = math.log1p(-target_top_probability) / temperature
    r = math.exp(log_r)
    if rule == "match":
        agree, disagree = 1.0 - r, (1.0 - r) * r
    else:
        s = 0.0 if math.isinf(draft_sharpness) else math.exp(draft_sharpness * log_r)
        agree, disagree = _overlap_terms(r, s)
    return c * agree + (1.0 - c) * disagree
