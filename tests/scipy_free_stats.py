"""Small statistics helpers so the tests need no scipy."""

from __future__ import annotations

# Two-sided 99% quantiles of Student's t (t_{0.995, df}), from standard tables.
_T995 = {
    1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
    11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921, 17: 2.898, 18: 2.878, 19: 2.861,
    20: 2.845, 21: 2.831, 22: 2.819, 23: 2.807, 24: 2.797, 25: 2.787, 26: 2.779, 27: 2.771, 28: 2.763,
    29: 2.756, 30: 2.750, 40: 2.704, 60: 2.660, 120: 2.617,
}


def t_quantile_99(df: int) -> float:
    """t_{0.995}(df): half-width multiplier of a two-sided 99% confidence interval."""
    if df in _T995:
        return _T995[df]
    # Between tabulated points use the next smaller df: its quantile is larger, so the interval is
    # conservative (wider), never too narrow.
    smaller = [k for k in _T995 if k <= df]
    return _T995[max(smaller)] if smaller else _T995[1]
