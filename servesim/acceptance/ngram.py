"""Prompt-lookup (n-gram) drafting against a known answer, as vLLM's ``ngram`` method (lesson, Example 6).

Proposer: for ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``, take the last ``n`` tokens of
the history (prompt + answer generated so far), find an earlier occurrence (the most recent one by default,
as in the lesson; ``prefer="earliest"`` takes the first), and propose up to ``k`` tokens that followed it
(fewer when the history ends sooner). The first ``n`` that matches wins; no match gives an empty draft.

Target: the known answer plays the greedy target. A round accepts the longest prefix of the draft equal to
the next answer tokens and then appends the target's own token (nothing past the answer's end), so one
round is one target pass.

Counting convention (stated, and used in the profile written): per-position rates are over ALL rounds,
a round with an empty draft counting as a draft with nothing accepted (SpecDecode-Bench's "no match counted
as a draft"); ``no_match_probability`` is the share of such rounds. vLLM's own counters skip steps without
a draft; :attr:`NgramStats.per_position_given_draft` gives that form.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["NgramIndex", "propose", "NgramRound", "simulate_request", "NgramStats", "aggregate"]

Prefer = Literal["most_recent", "earliest"]


class NgramIndex:
    """Incremental index of the n-grams of a growing history, for ``min_n <= n <= max_n``."""

    def __init__(self, max_n: int, min_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.history: list[Hashable] = []
        self._starts: dict[int, dict[tuple, list[int]]] = {n: {} for n in range(min_n, max_n + 1)}

    def extend(self, tokens: Sequence[Hashable]) -> None:
        """Append tokens to the history and index the n-grams they complete."""
        for tok in tokens:
            self.history.append(tok)
            end = len(self.history)
            for n, table in self._starts.items():
                if end >= n:
                    table.setdefault(tuple(self.history[end - n:end]), []).append(end - n)

    def propose(self, k: int, prefer: Prefer = "most_recent") -> list[Hashable]:
        """The draft (at most ``k`` tokens) for the current history; ``[]`` when no n-gram matches."""
        h = self.history
        length = len(h)
        for n in range(self.max_n, self.min_n - 1, -1):
            if length < n + 1:
                continue
            starts = self._starts[n].get(tuple(h[length - n:]), [])
            earlier = [j for j in (starts if prefer == "earliest" else reversed(starts)) if j < length - n]
            if earlier:
                j = earlier[0]
                return list(h[j + n:min(j + n + k, length)])
        return []


def propose(history: Sequence[Hashable], k: int, max_n: int, min_n: int | None = None,
            prefer: Prefer = "most_recent") -> list[Hashable]:
    """One n-gram draft for ``history`` (see the module docstring); ``min_n`` defaults to ``max_n``."""
    idx = NgramIndex(max_n, max_n if min_n is None else min_n)
    idx.extend(history)
    return idx.propose(k, prefer)


@dataclass(frozen=True)
class NgramRound:
    """One target pass: the draft proposed and how many of its tokens the target accepted."""

    draft: list[Hashable]
    accepted: int


def simulate_request(prompt: Sequence[Hashable], answer: Sequence[Hashable], k: int, max_n: int,
                     min_n: int | None = None, prefer: Prefer = "most_recent") -> list[NgramRound]:
    """Replay greedy n-gram speculation of ``answer`` after ``prompt``; one :class:`NgramRound` per pass.

    Args:
        prompt, answer: token sequences (text tokens or ids).
        k: ``num_speculative_tokens`` (>= 1).
        max_n, min_n: ``prompt_lookup_max`` and ``prompt_lookup_min`` (``min_n`` defaults to ``max_n``,
            vLLM's rule when only the maximum is given).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    idx = NgramIndex(max_n, max_n if min_n is None else min_n)
    idx.extend(prompt)
    rounds: list[NgramRound] = []
    out = 0
    while out < len(answer):
        draft = idx.propose(k, prefer)
        a = 0
        while a < len(draft) and out + a < len(answer) and draft[a] == answer[out + a]:
            a += 1
        add = min(a + 1, len(answer) - out)
        idx.extend(answer[out:out + add])
        out += add
        rounds.append(NgramRound(draft=draft, accepted=a))
    return rounds


@dataclass
class NgramStats:
    """Counters over many requests, vLLM-style (``v1/spec_decode/metrics.py``) plus no-match rounds.

    Attributes:
        k: drafts per round requested.
        rounds: target passes (all rounds). no_match_rounds: rounds with an empty draft.
        drafted_tokens, accepted_tokens: totals (tokens).
        accepted_per_pos: ``(k,)`` rounds whose first ``i + 1`` drafts were accepted.
        per_request_mean_accepted: mean accepted drafts per round, one entry per request.
    """

    k: int
    rounds: int = 0
    no_match_rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    per_request_mean_accepted: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.accepted_per_pos.size == 0:
            self.accepted_per_pos = np.zeros(self.k, dtype=np.int64)

    def add(self, rounds: list[NgramRound]) -> None:
        """Count one request's rounds."""
        for r in rounds:
            self.rounds += 1
            self.no_match_rounds += not r.draft
            self.drafted_tokens += len(r.draft)
            self.accepted_tokens += r.accepted
            self.accepted_per_pos[: r.accepted] += 1
        if rounds:
            self.per_request_mean_accepted.append(sum(r.accepted for r in rounds) / len(rounds))

    @property
    def per_position(self) -> np.ndarray:
        """Unconditional per-position rates over all rounds, ``(k,)``."""
        return self.accepted_per_pos / max(self.rounds, 1)

    @property
    def per_position_given_draft(self) -> np.ndarray:
        """Rates over rounds with a non-empty draft (vLLM's counters), ``(k,)``."""
        return self.accepted_per_pos / max(self.rounds - self.no_match_rounds, 1)

    @property
    def no_match_probability(self) -> float:
        return self.no_match_rounds / max(self.rounds, 1)

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + accepted / rounds`` over all rounds (tokens per target pass)."""
        return 1.0 + self.accepted_tokens / max(self.rounds, 1)

    def spread(self, percentiles: Sequence[float] = (10, 50, 90)) -> dict[str, float]:
        """Per-request mean accepted drafts per round: min, percentiles, max."""
        x = np.asarray(self.per_request_mean_accepted, dtype=float)
        if x.size == 0:
            return {}
        out = {"min": float(x.min())}
        out.update({f"p{p:g}": float(np.percentile(x, p)) for p in percentiles})
        out["max"] = float(x.max())
        return out


def aggregate(pairs: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]], k: int, max_n: int,
              min_n: int | None = None, prefer: Prefer = "most_recent") -> NgramStats:
    """Run :func:`simulate_request` over ``(prompt, answer)`` pairs and count the rounds."""
    stats = NgramStats(k=k)
    for prompt, answer in pairs:
        stats.add(simulate_request(prompt, answer, k, max_n, min_n, prefer))
    return stats
