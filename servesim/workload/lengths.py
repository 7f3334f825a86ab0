"""Token-length distributions: declarative configs and the runtime samplers they build.

Every distribution draws integers (tokens) and exposes ``mean()`` and ``variance()`` in closed form so
tests can compare samples with theory. Samples are clipped to ``[lo, hi]`` with ``lo = max(1, min)`` (a
request always has >= 1 token) and ``hi = max`` (no upper bound when unset).

Exactness of ``mean()``/``variance()``:

* ``fixed``, ``uniform``, ``empirical``: exact for the clipped integer distribution.
* ``lognormal``: a continuous draw ``X`` is rounded to the nearest integer, then clipped. ``mean()`` is
  the exact mean of the clipped continuous variable ``clip(X, lo, hi)`` (partial moments of the lognormal:
  ``E[X^k; a < X < b] = exp(k mu + k^2 s^2 / 2) [Phi((ln b - mu - k s^2)/s) - Phi((ln a - mu - k s^2)/s)]``,
  e.g. Johnson, Kotz & Balakrishnan, *Continuous Univariate Distributions* vol. 1, ch. 14); rounding
  changes it by far less than 0.5 token when the density is smooth on the scale of one token.
  ``variance()`` adds Sheppard's correction ``1/12 * P(lo < X < hi)`` for the rounding.
"""

from __future__ import annotations

from abc import abstractmethod

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Protocol, Union

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.workload.rawtrace import MAX_TOKEN_COUNT


TraceFormat = Literal["auto", "azure", "mooncake"]


# ----------------------------------------------------------------------------------------- runtime


class LengthDistribution(Protocol):
    """A sampler of token counts (int64 >= 1) with closed-form moments."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` token counts, int64, shape ``(n,)``."""
        ...

    def mean(self) -> float:
        """Mean of a draw (tokens)."""
        ...

    def variance(self) -> float:
        """Variance of a draw (tokens^2)."""
        ...

    def describe(self) -> str:
        """A short human-readable label, e.g. ``lognormal(mean 1000, cv 1)``."""
        ...


def _bounds_text(lo: int, hi: int | None) -> str:
    parts = []
    if lo > 1:
        parts.append(f"min {lo}")
    if hi is not None:
        parts.append(f"max {hi}")
    return f" [{', '.join(parts)}]" if parts else ""


@dataclass(frozen=True)
class FixedLength:
    """Always ``clip(value, lo, hi)`` tokens."""

    value: int
    lo: int = 1
    hi: int | None = None

    def _v(self) -> int:
        v = max(self.value, self.lo)
        return v if self.hi is None else min(v, self.hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self._v(), dtype=np.int64)

    def mean(self) -> float:
        return float(self._v())

    def variance(self) -> float:
        return 0.0

    def describe(self) -> str:
        return f"fixed {self.value}{_bounds_text(self.lo, self.hi)}"


def _sum_k(p: int, q: int) -> int:
    """Sum of the integers p..q (0 when q < p)."""
    return (p + q) * (q - p + 1) // 2 if q >= p else 0


def _sum_k2(p: int, q: int) -> int:
    """Sum of k^2 for k = p..q (0 when q < p)."""

    def s(m: int) -> int:
        return m * (m + 1) * (2 * m + 1) // 6

    return s(q) - s(p - 1) if q >= p else 0


@dataclass(frozen=True)
class UniformLength:
    """Uniform over the integers ``low..high`` (both inclusive), then clipped to ``[lo, hi]``.

    Unclipped: mean ``(low + high) / 2``, variance ``((high - low + 1)^2 - 1) / 12``; clipped moments are
    computed exactly from sums of ``k`` and ``k^2``.
    """

    low: int
    high: int
    lo: int = 1
    hi: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.integers(self.low, self.high, endpoint=True, size=n, dtype=np.int64)
        return np.clip(x, self.lo, self.hi)

    def _moments(self) -> tuple[float, float]:
        a = self.lo
        b = self.high if self.hi is None else self.hi
        n = self.high - self.low + 1
        below = max(0, min(self.high, a - 1) - self.low + 1)
        above = max(0, self.high - max(self.low, b + 1) + 1)
        p, q = max(self.low, a), min(self.high, b)
        s1 = below * a + above * b + _sum_k(p, q)
        s2 = below * a * a + above * b * b + _sum_k2(p, q)
        m = s1 / n
        return m, s2 / n - m * m

    def mean(self) -> float:
        return self._moments()[0]

    def variance(self) -> float:
        return self._moments()[1]

    def describe(self) -> str:
        return f"uniform {self.low}..{self.high}{_bounds_text(self.lo, self.hi)}"


def _phi(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True)
class LognormalLength:
    """``rint(exp(N(mu, sigma^2)))`` clipped to ``[lo, hi]`` (see the module docstring for the moments).

    Unclipped: mean ``exp(mu + sigma^2/2)``, median ``exp(mu)``, cv ``sqrt(exp(sigma^2) - 1)``.
    """

    mu: float
    sigma: float
    lo: int = 1
    hi: int | None = None
    label: str = ""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(rng.lognormal(self.mu, self.sigma, size=n))
        # without a max, draws beyond MAX_TOKEN_COUNT (an infinite one too) are cut there, not cast to garbage
        return np.clip(x, self.lo, self.hi if self.hi is not None else MAX_TOKEN_COUNT).astype(np.int64)

    def _clipped_moment(self, k: int) -> float:
        mu, s = self.mu, self.sigma
        a, b = float(self.lo), (math.inf if self.hi is None else float(self.hi))
        za = (math.log(a) - mu) / s
        zb = math.inf if b == math.inf else (math.log(b) - mu) / s
        inner = math.exp(k * mu + k * k * s * s / 2) * (_phi(zb - k * s) - _phi(za - k * s))
        tail_b = 0.0 if b == math.inf else b**k * (1.0 - _phi(zb))
        return a**k * _phi(za) + inner + tail_b

    def mean(self) -> float:
        return self._clipped_moment(1)

    def variance(self) -> float:
        m1 = self._clipped_moment(1)
        m2 = self._clipped_moment(2)
        a = (math.log(self.lo) - self.mu) / self.sigma
        b = math.inf if self.hi is None else (math.log(self.hi) - self.mu) / self.sigma
        return m2 - m1 * m1 + (_phi(b) - _phi(a)) / 12.0

    def describe(self) -> str:
        inner = self.label or f"mu {self.mu:g}, sigma {self.sigma:g}"
        return f"lognormal({inner}){_bounds_text(self.lo, self.hi)}"


@dataclass(frozen=True)
class EmpiricalLength:
    """Resamples (with replacement, uniformly) from ``values`` (int64, already clipped)."""

    values: np.ndarray
    label: str = "empirical"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.shape[0], size=n)]

    def mean(self) -> float:
        return float(self.values.mean())

    def variance(self) -> float:
        return float(self.values.var())

    def describe(self) -> str:
        return self.label


@dataclass(frozen=True)
class EmpiricalPairs:
    """Resamples (prompt, output) pairs jointly, keeping their correlation (int64 arrays, shape ``(M,)``)."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    label: str = "empirical pairs"

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` pairs: two int64 arrays of shape ``(n,)`` (same row indices)."""
        idx = rng.integers(0, self.prompt_tokens.shape[0], size=n)
        return self.prompt_tokens[idx], self.output_tokens[idx]


# ----------------------------------------------------------------------------------------- configs


def resolve_path(path: str, base_dir: Path | None) -> Path:
    """``path`` relative to ``base_dir`` (the folder of the config file) unless absolute; ``~`` expanded."""
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


class _LengthBase(InputModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    min: int | None = Field(None, ge=1, le=MAX_TOKEN_COUNT,
                            description="clip draws below this up to it (tokens); default 1")
    max: int | None = Field(None, ge=1, le=MAX_TOKEN_COUNT,
                            description="clip draws above this down to it (tokens); default none")

    @model_validator(mode="after")
    def _check_bounds(self) -> _LengthBase:
        if self.min is not None and self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def _lo(self) -> int:
        return self.min if self.min is not None else 1

    @abstractmethod
    def build(self, base_dir: Path | None = None) -> LengthDistribution:  # pragma: no cover - abstract
        """The runtime sampler (with ``sample``, ``mean()``, ``variance()``); paths relative to ``base_dir``.

        Raises:
            TraceError: an empirical distribution's trace file is missing or malformed.
        """


class FixedLengthConfig(_LengthBase):
    """``{type: fixed, value}``: every request has ``value`` tokens."""

    type: Literal["fixed"]
    value: int = Field(ge=1, le=MAX_TOKEN_COUNT, description="tokens")

    def build(self, base_dir: Path | None = None) -> FixedLength:
        return FixedLength(self.value, self._lo(), self.max)


class UniformLengthConfig(_LengthBase):
    """``{type: uniform, low, high}``: integers ``low..high``, both inclusive (tokens)."""

    type: Literal["uniform"]
    low: int = Field(ge=1, le=MAX_TOKEN_COUNT, description="smallest value, inclusive (tokens)")
    high: int = Field(ge=1, le=MAX_TOKEN_COUNT, description="largest value, inclusive (tokens)")

    @model_validator(mode="after")
    def _check_range(self) -> UniformLengthConfig:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def build(self, base_dir: Path | None = None) -> UniformLength:
        return UniformLength(self.low, self.high, self._lo(), self.max)


class LognormalLengthConfig(_LengthBase):
    """``{type: lognormal, mean, cv}`` or ``{type: lognormal, median, sigma}`` (tokens).

    ``mean``/``cv`` are those of the unclipped continuous distribution: ``sigma^2 = ln(1 + cv^2)``,
    ``mu = ln(mean) - sigma^2 / 2``; ``median``/``sigma``: ``mu = ln(median)``.
    """

    type: Literal["lognormal"]
    mean: float | None = Field(None, gt=0, le=MAX_TOKEN_COUNT, description="mean before clipping (tokens)")
    cv: float | None = Field(None, gt=0, description="coefficient of variation before clipping")
    median: float | None = Field(None, gt=0, le=MAX_TOKEN_COUNT, description="median before clipping (tokens)")
    sigma: float | None = Field(None, gt=0, description="standard deviation of ln(tokens)")

    @model_validator(mode="after")
    def _check_params(self) -> LognormalLengthConfig:
        by_mean = self.mean is not None or self.cv is not None
        by_median = self.median is not None or self.sigma is not None
        if by_mean == by_median or (by_mean and (self.mean is None or self.cv is None)) or (
            by_median and (self.median is None or self.sigma is None)
        ):
            raise ValueError("give either mean and cv, or median and sigma")
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """Parameters of the underlying normal of ln(tokens)."""
        if self.median is not None and self.sigma is not None:
            return math.log(self.median), self.sigma
        assert self.mean is not None and self.cv is not None
        # log1p(cv^2) = 2 ln(cv) to double precision where cv^2 would overflow
        s2 = math.log1p(self.cv**2) if self.cv < 1e150 else 2.0 * math.log(self.cv)
        return math.log(self.mean) - s2 / 2, math.sqrt(s2)

    def build(self, base_dir: Path | None = None) -> LognormalLength:
        mu, sigma = self.mu_sigma()
        if self.median is not None:
            label = f"median {self.median:g}, sigma {self.sigma:g}"
        else:
            label = f"mean {self.mean:g}, cv {self.cv:g}"
        return LognormalLength(mu, sigma, self._lo(), self.max, label)


class EmpiricalLengthConfig(_LengthBase):
    """``{type: empirical, path, format, column}``: resample one column of a trace file."""

    type: Literal["empirical"]
    path: str = Field(description="trace file, relative to the config file's folder")
    format: TraceFormat = "auto"
    column: Literal["prompt", "output"] = Field(description="which token column to resample")

    def build(self, base_dir: Path | None = None) -> EmpiricalLength:
        from servesim.workload.trace import read_trace  # the trace parsers load only when a file is read

        raw = read_trace(resolve_path(self.path, base_dir), self.format, require_sorted=False)  # order unused
        col = raw.prompt_tokens if self.column == "prompt" else raw.output_tokens
        values = np.clip(col, self._lo(), self.max)
        label = f"empirical {self.column} of {Path(self.path).name}{_bounds_text(self._lo(), self.max)}"
        return EmpiricalLength(values, label)


LengthConfig = Annotated[
    Union[FixedLengthConfig, UniformLengthConfig, LognormalLengthConfig, EmpiricalLengthConfig],
    Field(discriminator="type"),
]
"""A token-length distribution (discriminated on ``type``: fixed, uniform, lognormal, empirical)."""


class EmpiricalPairsConfig(InputModel):
    """``lengths: {type: empirical, path, format}``: resample (prompt, output) pairs jointly from a trace.

    Token counts of 0 in the file are raised to 1 (as when replaying the trace).
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    type: Literal["empirical"]
    path: str = Field(description="trace file, relative to the config file's folder")
    format: TraceFormat = "auto"

    def build(self, base_dir: Path | None = None) -> EmpiricalPairs:
        from servesim.workload.trace import read_trace

        raw = read_trace(resolve_path(self.path, base_dir), self.format, require_sorted=False)  # order unused
        return EmpiricalPairs(
            np.maximum(raw.prompt_tokens, 1),
            np.maximum(raw.output_tokens, 1),
            f"(prompt, output) pairs of {Path(self.path).name}",
        )
