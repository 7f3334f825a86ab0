"""vLLM's batch-size-dependent number of speculative tokens (``num_speculative_tokens_per_batch_size``).

Semantics of vLLM >= 0.24 (``vllm/config/speculative.py``): a list of ``[range_start, range_end, k]``
with inclusive ranges, the first starting at 1, ranges not overlapping and increasing; a batch size in a
gap between ranges inherits the k of the previous range; sizes beyond the last range inherit the last k;
the effective k is ``min(k, num_speculative_tokens)``. "Batch size" is the number of requests scheduled in
the step, prefills included, and the k chosen in a step is used for the drafts verified in the NEXT step.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def validate_schedule(schedule: Sequence[Sequence[int]], num_speculative_tokens: int) -> list[tuple[int, int, int]]:
    """Check a schedule and return it as tuples.

    Raises:
        ValueError: with vLLM-like wording, if an entry is not ``[start, end, k]``, the first range does
            not start at 1, a range is empty, ranges overlap or are out of order, or a k is negative.
    """
    out: list[tuple[int, int, int]] = []
    for i, entry in enumerate(schedule):
        if len(entry) != 3:
            raise ValueError(f"num_speculative_tokens_per_batch_size[{i}] must be [range_start, range_end, k], got {list(entry)}")
        start, end, k = (int(x) for x in entry)
        if start > end:
            raise ValueError(f"num_speculative_tokens_per_batch_size[{i}]: range_start {start} > range_end {end}")
        if k < 0:
            raise ValueError(f"num_speculative_tokens_per_batch_size[{i}]: k must be >= 0, got {k}")
        if i == 0 and start != 1:
            raise ValueError("num_speculative_tokens_per_batch_size: the first range must start at 1")
        if out and start <= out[-1][1]:
            raise ValueError(
                f"num_speculative_tokens_per_batch_size[{i}]: ranges must not overlap and must be increasing "
                f"({start} <= previous range_end {out[-1][1]})"
            )
        out.append((start, end, k))
    if not out:
        raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
    return out


class KSchedule:
    """k as a function of the batch size (see the module docstring).

    Args:
        num_speculative_tokens: the static K (upper bound of every k).
        schedule: vLLM's ``num_speculative_tokens_per_batch_size`` or None (k = K always).
    """

    def __init__(self, num_speculative_tokens: int, schedule: Sequence[Sequence[int]] | None = None) -> None:
        self.K = int(num_speculative_tokens)
        self.entries = validate_schedule(schedule, self.K) if schedule is not None else None
        self._starts = [e[0] for e in self.entries] if self.entries else []
        self._cache: dict[int, int] = {}

    def k_for(self, batch_size: int) -> int:
        """Speculative tokens per request for a step after one that scheduled ``batch_size`` requests."""
        if self.entries is None:
            return self.K
        k = self._cache.get(batch_size)
        if k is None:
            i = bisect_right(self._starts, batch_size) - 1
            k = min(self.entries[max(i, 0)][2], self.K)
            self._cache[batch_size] = k
        return k
