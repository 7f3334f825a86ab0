"""Acceptance statistics from serving logs: vLLM log lines, vLLM Prometheus counters, llama.cpp timings.

Three sources, one result (:class:`SpecDecodeCounts`), turned into an
:class:`~servesim.speculation.profile.AcceptanceProfile` by :meth:`SpecDecodeCounts.to_profile`.

**vLLM log lines** (``vllm/v1/spec_decode/metrics.py``; ``docs/reference/vllm-semantics.md``). Each logging interval
prints, with the counters reset after each line::

    SpecDecoding metrics: Mean acceptance length: 2.65, Accepted throughput: 82.50 tokens/s, Drafted
    throughput: 150.00 tokens/s, Accepted: 1650 tokens, Drafted: 3000 tokens, Per-position acceptance
    rate: 0.750, 0.530, 0.370, Avg Draft acceptance rate: 55.0%

A line does not print the number of drafts ``N`` (steps x requests with at least one draft token), so
:func:`parse_vllm_log` recovers it. The per-position rates are ``a_i / N`` with ``sum_i a_i = accepted``,
so ``N = accepted / sum_i p_i`` (within the 3-decimal print rounding). When every draft had ``k`` tokens
(EAGLE, MTP, draft models) ``N = drafted / k`` exactly (the seed lesson's Example 11: 3000 / 3 = 1000);
this is used when it agrees with the rate-based value within the rounding, else (n-gram drafts shorter
than ``k``) the rate-based value is used. Intervals are then pooled by weighting with their drafts:
``a_i = round(p_i N)`` are summed over lines and divided by the summed ``N``.

**vLLM Prometheus** text exposition (``/metrics``): counters ``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens`` and
``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}`` (``_total`` suffix optional; samples with
other labels, e.g. several engines, are summed; positions are 0-based in vLLM, 1-based labels are also
accepted). Give a scrape taken before the run as ``baseline`` to count only the run.

vLLM counts only steps with at least one draft, so profiles from vLLM have
``rates_include_no_match: false`` (n-gram steps without a match are not in the rates; the share of them is
not in the counters).

**llama.cpp** gives per-request totals only: the ``timings`` object of each response (``draft_n`` drafted,
``draft_n_accepted`` accepted, ``predicted_n`` generated tokens) or the server log line
``draft acceptance = 0.00685 (    1 accepted /   146 generated), mean len =  1.03`` (seed lesson Example 10).
The number of drafting rounds of a request is ``predicted_n - 1 - accepted`` (the first token comes from
the prompt pass and each round yields its accepted drafts plus one target token: 40 - 1 - 31 = 8 in
Example 10), or from the log ``accepted / (mean len - 1)`` (the integer in the print-rounding interval,
at least ``generated / k``; ``generated / k`` when nothing was accepted). With no per-position counts the
profile is the i.i.d. model: a constant conditional rate ``alpha`` fitted so that the pooled mean
acceptance length ``1 + accepted / rounds`` equals ``1 + alpha + ... + alpha^k`` at the server's draft
length ``k`` (``--spec-draft-n-max``, default 3), i.e. the profile reproduces the measured mean acceptance
length exactly at that ``k`` and extrapolates geometrically (Leviathan et al. 2023).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servesim.errors import TraceError
from servesim.input_files import shown_value
from servesim.json_objects import loads_line
from servesim.speculation.config import MAX_SPEC_LEN
from servesim.speculation.profile import AcceptanceProfile

__all__ = [
    "SpecDecodeCounts",
    "parse_vllm_log",
    "parse_vllm_log_lines",
    "parse_prometheus",
    "parse_prometheus_text",
    "parse_llamacpp",
    "fit_constant_alpha",
]

_RATE_DECIMALS = 3  # vLLM prints per-position rates with 3 decimals
_AL_DECIMALS = 2  # mean acceptance length: vLLM and llama.cpp print 2 decimals


@dataclass
class SpecDecodeCounts:
    """Pooled speculative-decoding counters.

    Attributes:
        num_drafts: drafts N (vLLM: request-steps with >= 1 draft token; llama.cpp: drafting rounds).
        num_draft_tokens: draft tokens proposed.
        num_accepted_tokens: draft tokens accepted.
        accepted_per_position: ``(k,)`` counts: drafts whose first ``i + 1`` tokens were accepted; None
            when the source has only totals (llama.cpp).
        k: draft length (``num_speculative_tokens``).
        source: the file(s) read.
        kind: ``"vllm-log"``, ``"vllm-prometheus"`` or ``"llamacpp"``.
        notes: how the counts were derived (for the profile's ``notes``).
    """

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int] | None
    k: int
    source: str
    kind: str
    notes: list[str] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + accepted / drafts`` (tokens per draft, bonus token included)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def draft_acceptance_rate(self) -> float:
        """``accepted / draft tokens`` (fraction)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_position_acceptance(self) -> np.ndarray | None:
        """Unconditional per-position acceptance rates ``a_i / N``, shape ``(k,)``, or None."""
        if self.accepted_per_position is None or not self.num_drafts:
            return None
        return np.asarray(self.accepted_per_position, dtype=float) / self.num_drafts

    def fitted_alpha(self) -> float:
        """Constant conditional rate with ``1 + sum_{i<=k} alpha^i`` = :attr:`mean_acceptance_length`."""
        return fit_constant_alpha(self.mean_acceptance_length, self.k)

    def summary_lines(self) -> list[str]:
        """Human-readable lines: drafts, tokens, mean acceptance length, rates."""
        lines = [
            f"drafts: {self.num_drafts}, drafted: {self.num_draft_tokens} tokens, accepted: "
            f"{self.num_accepted_tokens} tokens (k = {self.k})",
            f"mean acceptance length: {self.mean_acceptance_length:.4f}",
            f"draft acceptance rate: {100 * self.draft_acceptance_rate:.2f}%",
        ]
        rates = self.per_position_acceptance
        if rates is not None:
            lines.append("per-position acceptance rate: " + ", ".join(f"{r:.4f}" for r in rates))
        else:
            lines.append(f"fitted constant conditional rate alpha at k = {self.k}: {self.fitted_alpha():.4f}")
        return lines

    def to_profile(self, name: str, *, method: str | None = None, model: str | None = None,
                   dataset: str | None = None) -> AcceptanceProfile:
        """The :class:`AcceptanceProfile` of these counts.

        Per-position unconditional rates when the source has them (``rates_include_no_match: false``: vLLM
        counts only steps with a draft); otherwise ``conditional_acceptance: [alpha]`` fitted at ``k``.

        Raises:
            TraceError: no drafts were counted, or the counts make no acceptance profile (per-position
                rates that rise with the position, or a rate above 1).
        """
        if self.num_drafts <= 0 or self.num_draft_tokens <= 0:
            raise TraceError(f"{self.source}: no speculative drafts counted (is speculative decoding enabled?)")
        stats = (f"{self.num_drafts} drafts, {self.num_draft_tokens} draft tokens, {self.num_accepted_tokens} "
                 f"accepted; mean acceptance length {self.mean_acceptance_length:.4f}, draft acceptance rate "
                 f"{100 * self.draft_acceptance_rate:.2f}%, num_speculative_tokens {self.k}")
        notes = "; ".join([stats, *self.notes])
        common = dict(name=name, method=method, model=model, dataset=dataset,
                      source=f"{self.kind} {self.source} via servesim acceptance")
        from pydantic import ValidationError

        from servesim.input_files import format_validation_error

        rates = self.per_position_acceptance
        try:
            if rates is not None:
                return AcceptanceProfile(**common, notes=notes,
                                         per_position_acceptance=[round(float(r), 6) for r in rates],
                                         rates_include_no_match=False)
            alpha = self.fitted_alpha()
            notes += (f"; only totals available: constant conditional rate alpha = {alpha:.6f} FITTED so that "
                      f"1 + alpha + ... + alpha^{self.k} equals the mean acceptance length")
            return AcceptanceProfile(**common, notes=notes, conditional_acceptance=[round(alpha, 6)],
                                     rates_include_no_match=False)
        except ValidationError as exc:  # counts no acceptance profile can hold (rates that rise, a rate > 1)
            raise TraceError(format_validation_error(exc, f"{self.source}: the counts")) from None


def fit_constant_alpha(mean_length: float, k: int) -> float:
    """The ``alpha`` in [0, 1] with ``1 + alpha + alpha^2 + ... + alpha^k = mean_length`` (bisection).

    Clipped: 0 for ``mean_length <= 1``, 1 for ``mean_length >= k + 1``. Formula: Leviathan et al. 2023
    (i.i.d. acceptance; the expected tokens per round ``(1 - alpha^(k+1)) / (1 - alpha)``).

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    if mean_length <= 1.0:
        return 0.0
    if mean_length >= k + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    powers = np.arange(1, k + 1)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if 1.0 + float(np.sum(mid**powers)) < mean_length:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff")
    except FileNotFoundError:
        raise TraceError(f"{path}: file not found") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read file ({exc.strerror})") from None


# ------------------------------------------------------------------------------------------ vLLM log
_SPEC_MARK = "SpecDecoding metrics:"
_NUM = r"(\d+(?:\.\d+)?)"
_RE_ACCEPTED = re.compile(r"Accepted:\s*(\d+)\s*tokens")
_RE_DRAFTED = re.compile(r"Drafted:\s*(\d+)\s*tokens")
_RE_MEAN_LEN = re.compile(r"Mean acceptance length:\s*" + _NUM)
#: What follows the rates when a rate is not a number (``nan``, ``inf``, ``-0.1``), up to the next comma.
_RE_NOT_A_RATE = re.compile(r"\s*(?!Avg)[^,\s][^,]*")
_RE_PER_POS = re.compile(r"Per-position acceptance rate:\s*(\d+(?:\.\d+)?(?:\s*,\s*\d+(?:\.\d+)?)*)")


def _line_drafts(accepted: int, drafted: int, rates: list[float], mean_len: float | None,
                 where: str) -> tuple[int, str]:
    """Drafts N of one log line and how it was found (see the module docstring)."""
    k = len(rates)
    total = sum(rates)
    by_k = drafted / k
    if accepted == 0 or total <= 0:
        if mean_len is not None and accepted > 0 and mean_len > 1:
            return round(accepted / (mean_len - 1.0)), "mean acceptance length"
        return math.ceil(by_k), "Drafted / k (no accepted token to cross-check)"
    by_rates = accepted / total
    half = 0.5 * 10.0 ** (-_RATE_DECIMALS)
    tol = by_rates * (k * half) / total + 1.0
    if abs(by_k - by_rates) <= tol and by_k == int(by_k):
        return int(by_k), "Drafted / k"
    if by_rates > drafted + tol or by_rates < by_k - tol:
        raise TraceError(f"{where}: Accepted/Drafted/per-position rates are inconsistent (drafts from rates "
                         f"{by_rates:.1f}, from Drafted / k {by_k:.1f})")
    return round(by_rates), "Accepted / sum of per-position rates (drafts shorter than k)"


def parse_vllm_log_lines(lines: list[str], source: str) -> SpecDecodeCounts:
    """Pool the ``SpecDecoding metrics:`` lines among ``lines`` (other lines are ignored).

    Args:
        lines: the log's lines (line numbers in errors count from 1).
        source: the file name to put in errors and in the result.

    Raises:
        TraceError: no such line, a line without ``Accepted``/``Drafted``/per-position rates, lines with
        different numbers of positions, or inconsistent numbers (each message names the file and line).
    """
    drafts = drafted = accepted = 0
    per_pos: np.ndarray | None = None
    how: set[str] = set()
    n_lines = 0
    for no, line in enumerate(lines, start=1):
        if _SPEC_MARK not in line:
            continue
        text = line.split(_SPEC_MARK, 1)[1]
        where = f"{source}: line {no}"
        m_acc, m_dr, m_pos = _RE_ACCEPTED.search(text), _RE_DRAFTED.search(text), _RE_PER_POS.search(text)
        for m, what in ((m_acc, "'Accepted: N tokens'"), (m_dr, "'Drafted: N tokens'"),
                        (m_pos, "'Per-position acceptance rate: ...'")):
            if m is None:
                raise TraceError(f"{where}: SpecDecoding metrics line without {what}")
        acc, dr = int(m_acc.group(1)), int(m_dr.group(1))
        rates = [float(x) for x in m_pos.group(1).split(",")]
        after = text[m_pos.end():].lstrip()
        if after.startswith(",") and _RE_NOT_A_RATE.match(after[1:]):  # the number pattern stopped at it
            bad = after[1:].split(",", 1)[0].strip()
            raise TraceError(f"{where}: per-position acceptance rate {len(rates) + 1}: expected a number from 0 "
                             f"to 1 (got {shown_value(bad)}); vLLM's line holds one rate per position")
        m_len = _RE_MEAN_LEN.search(text)
        if per_pos is None:
            per_pos = np.zeros(len(rates), dtype=np.int64)
        elif len(rates) != len(per_pos):
            raise TraceError(f"{where}: {len(rates)} per-position rates, expected {len(per_pos)} like the "
                             "earlier lines (one num_speculative_tokens per log)")
        n_lines += 1
        if dr == 0:
            continue
        n, method = _line_drafts(acc, dr, rates, float(m_len.group(1)) if m_len else None, where)
        how.add(method)
        drafts += n
        drafted += dr
        accepted += acc
        per_pos += np.array([round(r * n) for r in rates], dtype=np.int64)
    if per_pos is None:
        raise TraceError(f"{source}: no '{_SPEC_MARK}' lines found (expected vLLM's spec-decode log lines, "
                         "logged when speculative decoding is on and stats logging is not disabled)")
    notes = [f"{n_lines} 'SpecDecoding metrics' log lines pooled by drafts; drafts per line from "
             + " / ".join(sorted(how)) if how else f"{n_lines} log lines without drafts"]
    return SpecDecodeCounts(drafts, drafted, accepted, [int(x) for x in per_pos], len(per_pos), source,
                            "vllm-log", notes)


def parse_vllm_log(path: str | Path) -> SpecDecodeCounts:
    """Read a vLLM server log and pool its ``SpecDecoding metrics:`` lines (see :func:`parse_vllm_log_lines`).

    Raises:
        TraceError: missing file or any error of :func:`parse_vllm_log_lines`.
    """
    p = Path(path)
    return parse_vllm_log_lines(_read_text(p).splitlines(), str(p))


# ------------------------------------------------------------------------------------------ Prometheus
_PROM_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_PREFIX = "vllm:spec_decode_"
_TOTALS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
#: Largest share by which the per-position accepted counts may differ from the accepted total (a scrape
#: taken between vLLM's two updates of one step): 1%.
ACCEPTED_SUM_TOLERANCE = 0.01
_PER_POS = "num_accepted_tokens_per_pos"


def _prom_samples(text: str, source: str) -> dict[str, dict[str, float]]:
    """``{counter: {position or "": summed value}}`` of the spec-decode counters in an exposition."""
    out: dict[str, dict[str, float]] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or not line.startswith(_PREFIX):
            continue
        m = _PROM_SAMPLE.match(line)
        if m is None:
            raise TraceError(f"{source}: line {no}: expected 'name{{labels}} value' (got {shown_value(line)})")
        name = m.group(1)[len(_PREFIX):]
        if name.endswith("_created"):
            continue
        if name.endswith("_total"):
            name = name[: -len("_total")]
        if name not in _TOTALS and name != _PER_POS:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            raise TraceError(f"{source}: line {no}: {m.group(1)}: expected a number (got {m.group(3)!r})") from None
        if value < 0:  # a counter only grows from 0 (a baseline's larger value is checked on the difference)
            raise TraceError(f"{source}: line {no}: {m.group(1)}: expected a count >= 0 (got {value:g})")
        labels = dict(_PROM_LABEL.findall(m.group(2) or ""))
        key = ""
        if name == _PER_POS:
            key = labels.get("position", "")
            if not key.isdigit():
                raise TraceError(f"{source}: line {no}: {m.group(1)}: expected a label position=\"<int>\"")
        bucket = out.setdefault(name, {})
        bucket[key] = bucket.get(key, 0.0) + value
    return out


def parse_prometheus_text(text: str, source: str, baseline: str | None = None,
                          baseline_source: str = "baseline") -> SpecDecodeCounts:
    """Spec-decode counters from Prometheus text exposition (minus a ``baseline`` scrape if given).

    Raises:
        TraceError: a counter is missing, a malformed sample, positions that are not 0..k-1 (or 1..k), a
        baseline larger than the scrape, or per-position counts that do not sum to the accepted total
        (within :data:`ACCEPTED_SUM_TOLERANCE`).
    """
    now = _prom_samples(text, source)
    before = _prom_samples(baseline, baseline_source) if baseline is not None else {}
    for name in (*_TOTALS, _PER_POS):
        if name not in now:
            raise TraceError(f"{source}: counter {_PREFIX}{name} not found (expected vLLM's /metrics output "
                             "with speculative decoding on)")

    def delta(name: str, key: str = "") -> int:
        v = now[name].get(key, 0.0) - before.get(name, {}).get(key, 0.0)
        if not math.isfinite(v):
            raise TraceError(f"{source}: {_PREFIX}{name}: expected a finite count (got {v})")
        if v < 0:
            raise TraceError(f"{source}: {_PREFIX}{name}: smaller than in {baseline_source} (server restarted?)")
        return int(round(v))

    positions = sorted(int(p) for p in now[_PER_POS])
    start = positions[0]
    if start not in (0, 1) or positions != list(range(start, start + len(positions))):
        raise TraceError(f"{source}: {_PREFIX}{_PER_POS}: positions {positions} are not 0..k-1")
    per_pos = [delta(_PER_POS, str(p)) for p in positions]
    accepted = delta("num_accepted_tokens")
    # vLLM adds a step's accepted tokens to the total and 1 to each accepted position together
    # (vllm/v1/spec_decode/metrics.py), so the positions sum to the total; a scrape taken between the two
    # may miss one step's share, while counters of different servers or runs differ by far more
    if abs(sum(per_pos) - accepted) > ACCEPTED_SUM_TOLERANCE * max(accepted, sum(per_pos), 1):
        raise TraceError(f"{source}: {_PREFIX}{_PER_POS} sums to {sum(per_pos)} accepted tokens over its "
                         f"{len(per_pos)} positions, {_PREFIX}num_accepted_tokens counts {accepted} (expected the "
                         "same count: both from one server and run" + (", the baseline too" if baseline is not None
                                                                       else "") + ")")
    notes = ["vLLM Prometheus counters" + (f" minus {baseline_source}" if baseline is not None else "")]
    return SpecDecodeCounts(delta("num_drafts"), delta("num_draft_tokens"), accepted,
                            per_pos, len(per_pos), source, "vllm-prometheus", notes)


def parse_prometheus(path: str | Path, baseline: str | Path | None = None) -> SpecDecodeCounts:
    """Read a ``/metrics`` scrape (and optionally a scrape from before the run) into pooled counters.

    Raises:
        TraceError: see :func:`parse_prometheus_text`; missing files.
    """
    p = Path(path)
    base_text = _read_text(Path(baseline)) if baseline is not None else None
    return parse_prometheus_text(_read_text(p), str(p), base_text, str(baseline) if baseline else "baseline")


# ------------------------------------------------------------------------------------------ llama.cpp
_RE_LLAMACPP = re.compile(
    r"draft acceptance\s*=\s*" + _NUM + r"\s*\(\s*(\d+)\s+accepted\s*/\s*(\d+)\s+generated\s*\)"
    r"(?:\s*,\s*mean len\s*=\s*" + _NUM + ")?"
)


def _rounds_from_mean_len(accepted: int, generated: int, mean_len: float | None, k: int) -> int:
    """Drafting rounds of one request from the log line (see the module docstring)."""
    floor_rounds = math.ceil(generated / k) if generated else 0
    if accepted == 0 or mean_len is None or mean_len <= 1.0:
        return max(floor_rounds, 1 if generated else 0)
    half = 0.5 * 10.0 ** (-_AL_DECIMALS)
    lo = accepted / (mean_len + half - 1.0)
    hi = accepted / (mean_len - half - 1.0) if mean_len - half > 1.0 else math.inf
    lo_i, hi_i = max(math.ceil(lo), floor_rounds), min(math.floor(hi), generated) if generated else math.floor(hi)
    best = round(accepted / (mean_len - 1.0))
    if lo_i <= hi_i:
        best = min(max(best, lo_i), hi_i)
    return max(best, floor_rounds)


def _timings_of(obj: Any) -> dict | None:
    if not isinstance(obj, dict):
        return None
    t = obj.get("timings")
    if isinstance(t, dict):
        return t
    return obj if "draft_n" in obj else None


def parse_llamacpp(path: str | Path, k: int) -> SpecDecodeCounts:
    """Pool llama.cpp speculative statistics from JSON lines of responses or a server log.

    Args:
        path: a file of JSON objects, one a line, each a ``/completion`` response with ``timings`` (or
            the ``timings`` object itself), or a ``llama-server`` log with ``draft acceptance = ...`` lines.
        k: the server's draft length (``--spec-draft-n-max``; llama.cpp's default is 3).

    Raises:
        TraceError: no usable response/line, invalid JSON (the line is named), negative or inconsistent
            counts (accepted > drafted, more drafts than ``k`` a round allows in the predicted tokens), ``k``
            outside 1..128.
    """
    p = Path(path)
    if not 1 <= k <= MAX_SPEC_LEN:
        raise TraceError(f"--k: expected the draft length (--spec-draft-n-max) from 1 to "
                         f"{MAX_SPEC_LEN}, the most num_speculative_tokens servesim takes (got {k})")
    lines = _read_text(p).splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    drafted = accepted = rounds = used = skipped = 0
    how = ""
    if first.startswith("{") or first.startswith("["):
        how = "timings of JSON responses (rounds = predicted_n - 1 - draft_n_accepted)"
        for no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{p}: line {no}"
            obj = loads_line(line, where)
            t = _timings_of(obj)
            if t is None or t.get("draft_n") in (None, 0):
                skipped += 1
                continue
            g, a = t.get("draft_n"), t.get("draft_n_accepted", 0)
            for key, val in (("draft_n", g), ("draft_n_accepted", a)):
                if not isinstance(val, int) or isinstance(val, bool) or val < 0:
                    raise TraceError(f"{where}: timings.{key}: expected an integer >= 0 (got {val!r})")
            if a > g:
                raise TraceError(f"{where}: timings.draft_n_accepted = {a} exceeds draft_n = {g}")
            n = t.get("predicted_n")
            if isinstance(n, int) and not isinstance(n, bool) and n - 1 - a < math.ceil(g / k):
                # each round emits 1 + its accepted drafts: n - 1 - a rounds after the first token, each
                # drafting at most k, cannot have drafted g
                rounds_max = n - 1 - a
                least = f"at least {math.ceil(g / rounds_max)}" if rounds_max > 0 else "none"
                raise TraceError(
                    f"{where}: {g} drafts ({a} accepted) in {n} predicted tokens need more than --k {k} drafts a "
                    f"round: it has at most {max(rounds_max, 0)} rounds, so the draft length (--spec-draft-n-max) "
                    f"is {least}")
            if isinstance(n, int) and not isinstance(n, bool):
                r = n - 1 - a
            else:
                r = math.ceil(g / k)
                how = "timings of JSON responses (rounds = predicted_n - 1 - draft_n_accepted, or draft_n / k)"
            drafted, accepted, rounds, used = drafted + g, accepted + a, rounds + r, used + 1
    else:
        how = "llama-server 'draft acceptance' log lines (rounds = accepted / (mean len - 1))"
        for no, line in enumerate(lines, start=1):
            m = _RE_LLAMACPP.search(line)
            if m is None:
                continue
            a, g = int(m.group(2)), int(m.group(3))
            if a > g:
                raise TraceError(f"{p}: line {no}: {a} accepted exceeds {g} generated")
            if g == 0:
                skipped += 1
                continue
            mean_len = float(m.group(4)) if m.group(4) else None
            drafted, accepted, used = drafted + g, accepted + a, used + 1
            rounds += _rounds_from_mean_len(a, g, mean_len, k)
    if used == 0:
        raise TraceError(f"{p}: no llama.cpp speculative statistics found (expected JSON responses with "
                         "timings.draft_n / draft_n_accepted, or 'draft acceptance = ...' log lines)")
    notes = [f"{used} llama.cpp requests pooled from {how}"
             + (f"; {skipped} without drafts skipped" if skipped else "")]
    return SpecDecodeCounts(rounds, drafted, accepted, None, k, str(p), "llamacpp", notes)
