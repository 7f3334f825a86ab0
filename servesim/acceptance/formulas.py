"""Closed forms of speculative decoding under the i.i.d. acceptance model (seed lesson, Examples 3, 4, 8).

Model (Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding",
ICML 2023, section 3): each of the ``k`` drafted tokens is accepted with probability ``alpha``,
independently, as long as every earlier draft of the round was accepted. A round always adds the
target's own token, so it yields ``1 + alpha + ... + alpha^k`` tokens on average.

With per-position conditional rates ``c_i`` (EAGLE papers' n-alpha) instead of one ``alpha``, the
unconditional rate of position ``i`` is ``p_i = c_1 * ... * c_i`` (vLLM's "per-position acceptance
rate") and the mean acceptance length is ``1 + sum(p_i)`` (vLLM ``v1/spec_decode/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "expected_tokens_per_pass",
    "speedup",
    "best_k",
    "unconditional_from_conditional",
    "mean_acceptance_length",
]


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens (accepted drafts + the target's token) per target pass.

    ``(1 - alpha^(k+1)) / (1 - alpha)``, and ``k + 1`` when ``alpha == 1`` (lesson, Example 3;
    Leviathan et al. 2023, eq. 1).

    Args:
        alpha: per-token acceptance probability in [0, 1].
        k: number of drafted tokens per round (``num_speculative_tokens``), >= 0.

    Raises:
        ValueError: alpha outside [0, 1] or k < 0.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(alpha: float, k: int, draft_cost: float) -> float:
    """Speedup over plain decoding when one draft step costs ``draft_cost`` target steps.

    ``expected_tokens_per_pass(alpha, k) / (1 + k * draft_cost)`` (lesson, Example 4; Leviathan et al.
    2023). Assumes verifying ``k + 1`` positions costs one decode step (memory-bound regime).

    Args:
        alpha: acceptance probability in [0, 1].
        k: drafted tokens per round, >= 0 (``k = 0`` means no speculation, speedup 1).
        draft_cost: time of one draft step / time of one target step (dimensionless, >= 0).
    """
    if draft_cost < 0:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost}")
    return expected_tokens_per_pass(alpha, k) / (1.0 + k * draft_cost)


def best_k(alpha: float, draft_cost: float, k_max: int = 32) -> tuple[int, float]:
    """The draft length in ``1..k_max`` with the highest :func:`speedup`, or ``(0, 1.0)`` if none beats 1.

    Ties keep the smallest k (strictly greater wins), as the lesson's Example 4 search does.

    Returns:
        ``(k, speedup)``; ``k = 0`` means "do not speculate".
    """
    best, best_s = 0, 1.0
    for k in range(1, k_max + 1):
        s = speedup(alpha, k, draft_cost)
        if s > best_s:
            best, best_s = k, s
    return best, best_s


def unconditional_from_conditional(conditional: Sequence[float] | np.ndarray) -> np.ndarray:
    """Unconditional per-position rates ``p_i = prod_{j<=i} c_j`` from conditional rates ``c``.

    Shape: ``(K,)`` -> ``(K,)`` (or ``(..., K)`` -> ``(..., K)``, along the last axis).
    """
    return np.cumprod(np.asarray(conditional, dtype=float), axis=-1)


def mean_acceptance_length(unconditional: Sequence[float] | np.ndarray) -> float:
    """vLLM's mean acceptance length ``1 + sum(p_i)`` (includes the bonus token), from unconditional rates."""
    return 1.0 + float(np.sum(np.asarray(unconditional, dtype=float)))
