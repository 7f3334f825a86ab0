"""Per-position acceptance profiles: what fraction of drafted tokens the target accepts, by draft position.

Conventions (``docs/reference/acceptance-profiles.md``, vLLM ``v1/spec_decode/metrics.py``):

* ``per_position_acceptance`` holds vLLM's UNconditional rates ``p_i``: the share of rounds in which the
  first ``i`` drafts were all accepted. They are non-increasing. Mean acceptance length
  ``AL(k) = 1 + sum_{i<=k} p_i`` (includes the bonus token).
* ``conditional_acceptance`` holds ``c_i = p_i / p_(i-1)`` (EAGLE papers' "n-alpha"); ``p_i = c_1 ... c_i``.
  Either may be given; :meth:`AcceptanceProfile.unconditional` and :meth:`AcceptanceProfile.conditional`
  convert exactly (``c_i = 0`` where ``p_(i-1) = 0``).
* Beyond the profile's ``K`` positions the LAST conditional rate repeats: ``p_(K+j) = p_K * c_K^j``
  (a geometric tail, the i.i.d. model of Leviathan et al. 2023 for the extra positions).

No-match rounds (n-gram / suffix proposers). ``no_match_probability`` ``m`` is the share of rounds in which
the proposer finds no match and drafts nothing. With ``rates_include_no_match: true`` (the default, and the
convention of SpecDecode-Bench's "no match counted as a draft" rows and of ``servesim acceptance ngram``)
``p_i`` is taken over ALL rounds, a no-match round counting as a draft with nothing accepted, so
``p_1 <= 1 - m``. With ``false`` the rates are over rounds with at least one drafted token only; this is what
vLLM's own counters report (``num_drafts`` grows only for steps with a draft), and
:meth:`~AcceptanceProfile.unconditional` converts them to the all-rounds form ``p_i * (1 - m)``.
When sampling with one uniform ``u`` per round, ``u >= 1 - m`` is the no-match round
(:meth:`~AcceptanceProfile.draft_is_empty`).

Per-request heterogeneity (switch ``heterogeneity.enabled``). SpecDecode-Bench reports per-request mean
accepted spans of 2.7-7.4 (EAGLE), 1.1-15.0 (n-gram), 5.6-18.3 (draft model) on InstructCoder with
Llama-3-70B. servesim draws one factor ``f`` per request (:meth:`~AcceptanceProfile.request_factors`) and
multiplies the conditional rates given a match by it: ``c_i' = min(1, f * c_i)``.

* ``{type: lognormal, sigma: s}``: ``f = exp(s Z - s^2 / 2)``, ``Z ~ N(0, 1)``, so ``E[f] = 1``.
* ``{type: beta, concentration: kappa}``: the request's top conditional rate ``a ~ Beta(kappa c*, kappa (1 -
  c*))`` with ``c* = max_i c_i``, and ``f = a / c*``: ``E[f] = 1`` and ``f c_i <= 1`` without clipping.

With the beta law ``E[f] = 1`` keeps the population's position-1 rate exactly and deeper positions
average ``E[f^i] p_i >= p_i`` (Jensen): heterogeneity lengthens the average accepted run. With the lognormal
law, factors above ``1 / c_i`` are clipped at rate 1, which lowers the population means somewhat. :meth:`~AcceptanceProfile.
expected_unconditional` gives the population means (closed form for beta, Gauss-Hermite for lognormal).

Context decay (switch ``context_decay.enabled``). Acceptance falls as the context grows: native MTP on
Qwen3.6-27B, position-1 acceptance 93.5% -> 72.1% (vLLM issue 47602); MagicDec self-speculation 0.84 at 4K
-> 0.79 at 100K. servesim scales the position-1 conditional rate (hence every ``p_i``) by
:meth:`~ContextDecay.scale` of the context length in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.input_files import load_yaml, validate
from servesim.errors import ConfigError
from servesim.shipped import shipped_dir

__all__ = [
    "SPEC_METHODS",
    "BetaHeterogeneity",
    "LognormalHeterogeneity",
    "ContextDecay",
    "AcceptanceProfile",
    "sample_accepted",
    "load_profile",
    "profiles_dir",
    "available_profiles",
]

SpecMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp", "suffix", "dflash", "dspark"]
SPEC_METHODS: tuple[str, ...] = SpecMethod.__args__  # type: ignore[attr-defined]
_TOL = 1e-9


class BetaHeterogeneity(InputModel):
    """Per-request factor from a beta law on the request's top conditional rate (see module docstring)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")
    type: Literal["beta"]
    concentration: float = Field(gt=0, description="kappa = alpha + beta of the beta law (larger = less spread)")
    enabled: bool = True
    source: str | None = None


class LognormalHeterogeneity(InputModel):
    """Per-request factor ``exp(sigma Z - sigma^2/2)`` on the conditional rates (mean 1)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")
    type: Literal["lognormal"]
    sigma: float = Field(ge=0, description="standard deviation of log(factor)")
    enabled: bool = True
    source: str | None = None


Heterogeneity = Annotated[BetaHeterogeneity | LognormalHeterogeneity, Field(discriminator="type")]


class ContextDecay(InputModel):
    """Position-1 acceptance scale as a function of context length (tokens).

    ``linear``: ``scale = max(floor, 1 - per_token * max(0, ctx - reference_tokens))``.
    ``exponential``: ``scale = max(floor, exp(-per_token * max(0, ctx - reference_tokens)))``.
    ``reference_tokens`` is the context length at which the profile was measured (scale 1 at or below it).
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")
    shape: Literal["linear", "exponential"] = "linear"
    per_token: float = Field(ge=0, description="relative loss per context token (1/tokens)")
    floor: float = Field(default=0.0, ge=0, le=1, description="smallest scale (fraction of the profile's rate)")
    reference_tokens: int = Field(default=0, ge=0, description="context length (tokens) where scale = 1")
    enabled: bool = True
    source: str | None = None

    def scale(self, ctx_tokens: np.ndarray | Sequence[float] | float) -> np.ndarray:
        """Scale factor in [floor, 1] for each context length; shape of ``ctx_tokens``."""
        ctx = np.asarray(ctx_tokens, dtype=float)
        extra = np.maximum(ctx - self.reference_tokens, 0.0)
        if self.shape == "linear":
            s = 1.0 - self.per_token * extra
        else:
            s = np.exp(-self.per_token * extra)
        return np.clip(s, self.floor, 1.0)


class AcceptanceProfile(InputModel):
    """A named per-position acceptance profile (one YAML file in ``workloads/acceptance/``).

    Give exactly one of ``per_position_acceptance`` (unconditional ``p_i``, non-increasing, in [0, 1]) and
    ``conditional_acceptance`` (``c_i`` in [0, 1]). ``K`` = their length. See the module docstring for
    the conventions, extrapolation beyond ``K``, no-match rounds, heterogeneity and context decay.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    name: str | None = None
    method: SpecMethod | None = Field(default=None, description="vLLM speculative method name")
    source: str = Field(min_length=1, description="citation of the measurement")
    dataset: str | None = None
    model: str | None = None
    notes: str | None = None
    illustrative: bool = Field(default=False, description="true for made-up teaching numbers, not measurements")
    per_position_acceptance: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(default=None, min_length=1)
    conditional_acceptance: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(default=None, min_length=1)
    no_match_probability: float | None = Field(default=None, ge=0, le=1)
    rates_include_no_match: bool = True
    heterogeneity: Heterogeneity | None = None
    context_decay: ContextDecay | None = None

    @model_validator(mode="after")
    def _check(self) -> AcceptanceProfile:
        if (self.per_position_acceptance is None) == (self.conditional_acceptance is None):
            raise ValueError("give exactly one of per_position_acceptance and conditional_acceptance")
        if self.per_position_acceptance is not None:
            p = np.asarray(self.per_position_acceptance)
            if np.any(np.diff(p) > _TOL):
                raise ValueError(
                    f"per_position_acceptance must be non-increasing, got {list(self.per_position_acceptance)}"
                )
        m = self.no_match_probability or 0.0
        if self.rates_include_no_match and m > 0 and self._raw_unconditional()[0] > 1.0 - m + 1e-6:
            raise ValueError(
                f"position-1 rate {self._raw_unconditional()[0]} exceeds 1 - no_match_probability = {1 - m}"
                " (set rates_include_no_match: false if the rates count only rounds with a draft)"
            )
        return self

    # ------------------------------------------------------------------ conversions
    @property
    def num_positions(self) -> int:
        """K, the number of positions given in the profile."""
        rates = self.per_position_acceptance or self.conditional_acceptance
        assert rates is not None
        return len(rates)

    def _raw_unconditional(self) -> np.ndarray:
        if self.per_position_acceptance is not None:
            return np.asarray(self.per_position_acceptance, dtype=float)
        return np.cumprod(np.asarray(self.conditional_acceptance, dtype=float))

    @property
    def _match_share(self) -> float:
        return 1.0 - (self.no_match_probability or 0.0)

    def unconditional(self) -> np.ndarray:
        """Unconditional per-position rates over ALL rounds (no-match rounds included), shape ``(K,)``."""
        p = self._raw_unconditional()
        return p if self.rates_include_no_match else p * self._match_share

    def conditional(self) -> np.ndarray:
        """Conditional rates ``c_i = p_i / p_(i-1)`` (``c_1 = p_1``; 0 where ``p_(i-1) = 0``), shape ``(K,)``."""
        return _conditional_from_unconditional(self.unconditional())

    def unconditional_given_draft(self) -> np.ndarray:
        """Rates over rounds with at least one drafted token (vLLM's counters), shape ``(K,)``."""
        share = self._match_share
        return self.unconditional() / share if share > 0 else np.zeros(self.num_positions)

    def _match_conditional(self, k: int) -> np.ndarray:
        """Conditional rates given a match, extended to ``k`` positions by repeating the last one."""
        c = _conditional_from_unconditional(self.unconditional_given_draft())
        return _extend(c, k)

    def conditional_extended(self, k: int) -> np.ndarray:
        """Conditional rates for positions ``1..k`` (repeat the last rate beyond K), shape ``(k,)``.

        Raises:
            ValueError: ``k <= 0``.
        """
        _check_k(k)
        c = self._match_conditional(k)
        c[0] *= self._match_share
        return c

    def unconditional_extended(self, k: int) -> np.ndarray:
        """Unconditional rates for positions ``1..k`` (geometric tail beyond K), shape ``(k,)``."""
        return np.cumprod(self.conditional_extended(k))

    def mean_acceptance_length(self, k: int | None = None) -> float:
        """``1 + sum_{i<=k} p_i`` (tokens per round incl. the bonus token); ``k`` defaults to K.

        Raises:
            ValueError: ``k <= 0``.
        """
        return 1.0 + float(self.unconditional_extended(self.num_positions if k is None else k).sum())

    # ------------------------------------------------------------------ heterogeneity and context
    def _heterogeneity_on(self) -> bool:
        return self.heterogeneity is not None and self.heterogeneity.enabled

    def request_factors(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """One heterogeneity factor per request, shape ``(n,)`` (all 1.0 when heterogeneity is off).

        Multiply the conditional rates given a match by it (as :meth:`conditional_rates` does).
        """
        h = self.heterogeneity
        if h is None or not h.enabled:
            return np.ones(n)
        if isinstance(h, LognormalHeterogeneity):
            return np.exp(h.sigma * rng.standard_normal(n) - 0.5 * h.sigma**2)
        c_star = float(self._match_conditional(self.num_positions).max())
        if c_star <= 0.0 or c_star >= 1.0:
            return np.ones(n)
        a = rng.beta(h.concentration * c_star, h.concentration * (1.0 - c_star), size=n)
        return a / c_star

    def scale_at_context(self, ctx_tokens: np.ndarray | Sequence[float] | float) -> np.ndarray:
        """Position-1 scale factor at each context length (tokens); ones when context decay is off."""
        d = self.context_decay
        if d is None or not d.enabled:
            return np.ones_like(np.asarray(ctx_tokens, dtype=float))
        return d.scale(ctx_tokens)

    def conditional_rates(self, k: int, factors: np.ndarray | None = None,
                          ctx_tokens: np.ndarray | None = None) -> np.ndarray:
        """Per-request conditional rates over all rounds for positions ``1..k``.

        ``c_1 = (1 - m) * min(1, f * s(ctx) * c1|match)``, ``c_i = min(1, f * c_i|match)`` for ``i > 1``.

        Args:
            k: positions, >= 1.
            factors: ``(n,)`` from :meth:`request_factors`, or None (factor 1).
            ctx_tokens: ``(n,)`` context lengths in tokens, or None (no decay).

        Returns:
            ``(k,)`` when both are None, else ``(n, k)``.
        """
        _check_k(k)
        c = self._match_conditional(k)
        if factors is None and ctx_tokens is None:
            c[0] *= self._match_share
            return c
        n = len(factors) if factors is not None else len(np.asarray(ctx_tokens))
        f = np.ones(n) if factors is None else np.asarray(factors, dtype=float)
        rates = np.minimum(1.0, f[:, None] * c[None, :])
        if ctx_tokens is not None:
            rates[:, 0] = np.minimum(1.0, rates[:, 0] * self.scale_at_context(ctx_tokens))
        rates[:, 0] *= self._match_share
        return rates

    def expected_unconditional(self, k: int | None = None, ctx_tokens: float | None = None) -> np.ndarray:
        """Population-mean unconditional rates under heterogeneity (and context ``ctx_tokens``), ``(k,)``."""
        k = self.num_positions if k is None else k
        _check_k(k)
        c = self._match_conditional(k)
        share = self._match_share * (float(self.scale_at_context(ctx_tokens)) if ctx_tokens is not None else 1.0)
        h = self.heterogeneity
        if h is None or not h.enabled:
            return share * np.cumprod(c)
        if isinstance(h, BetaHeterogeneity):
            c_star = float(self._match_conditional(self.num_positions).max())
            if c_star <= 0.0 or c_star >= 1.0:
                return share * np.cumprod(c)
            al, be = h.concentration * c_star, h.concentration * (1.0 - c_star)
            j = np.arange(k)
            moments = np.cumprod((al + j) / (al + be + j))  # E[a^i], i = 1..k
            return share * np.cumprod(c) * moments / c_star ** (j + 1)
        z, w = np.polynomial.hermite_e.hermegauss(96)
        w = w / w.sum()
        f = np.exp(h.sigma * z - 0.5 * h.sigma**2)
        rates = np.cumprod(np.minimum(1.0, f[:, None] * c[None, :]), axis=1)
        return share * (w @ rates)

    # ------------------------------------------------------------------ sampling
    def draft_is_empty(self, u: np.ndarray) -> np.ndarray:
        """Which rounds have an empty draft (no n-gram match): ``u >= 1 - no_match_probability``, ``(n,)`` bool."""
        return np.asarray(u) >= self._match_share

    def sample_accepted(self, u: np.ndarray, k: int | np.ndarray, factors: np.ndarray | None = None,
                        ctx_tokens: np.ndarray | None = None) -> np.ndarray:
        """Accepted drafts per round from one uniform per round; see :func:`sample_accepted`. ``(n,)`` int."""
        u = np.asarray(u, dtype=float)
        kmax = int(np.max(k)) if np.size(k) else 0
        if kmax <= 0:
            return np.zeros(u.shape, dtype=np.int64)
        rates = self.conditional_rates(kmax, factors, ctx_tokens)
        return sample_accepted(u, k, rates)

    # ------------------------------------------------------------------ temperature
    def at_temperature(self, temperature: float, rule: Literal["ratio", "match"] = "ratio",
                       **model: Any) -> AcceptanceProfile:
        """This (greedy) profile at sampling temperature ``temperature`` under a verification rule.

        Uses :func:`servesim.speculation.temperature.acceptance_at_temperature` on each conditional rate
        given a match; ``model`` passes its keyword parameters (``target_top_probability``,
        ``effective_vocab``, ``draft_sharpness``). The no-match share, heterogeneity and context decay are
        kept. Returns a new profile given by ``conditional_acceptance``.
        """
        from servesim.speculation.temperature import acceptance_at_temperature

        c = self._match_conditional(self.num_positions)
        c_t = acceptance_at_temperature(c, temperature, rule=rule, **model)
        share = self._match_share
        c_t = np.asarray(c_t, dtype=float)
        c_t[0] *= share
        data = self.model_dump()
        data.update(
            name=f"{self.name or 'profile'}@T={temperature:g},{rule}",
            per_position_acceptance=None,
            conditional_acceptance=[float(x) for x in c_t],
            rates_include_no_match=True,
            notes=((self.notes + " ") if self.notes else "")
            + f"Derived by servesim's temperature model (T={temperature:g}, {rule} rule).",
        )
        return AcceptanceProfile.model_validate(data)


# ---------------------------------------------------------------------- helpers
def _check_k(k: int) -> None:
    if int(k) <= 0:
        raise ValueError(f"k (num_speculative_tokens) must be >= 1, got {k}")


def _conditional_from_unconditional(p: np.ndarray) -> np.ndarray:
    prev = np.concatenate(([1.0], p[:-1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(prev > 0, p / np.where(prev > 0, prev, 1.0), 0.0)
    return np.clip(c, 0.0, 1.0)


def _extend(c: np.ndarray, k: int) -> np.ndarray:
    if k <= len(c):
        return c[:k].copy()
    return np.concatenate((c, np.full(k - len(c), c[-1])))


def sample_accepted(u: np.ndarray, k: int | np.ndarray, conditional_rates: np.ndarray) -> np.ndarray:
    """Number of accepted drafts per round from ONE uniform per round (vectorised).

    ``accepted = #{i <= k : u < p_i}`` with ``p = cumprod(conditional_rates)``. Because ``p_i`` is
    non-increasing this equals ``min(k, A(u))`` with ``A(u) = #{i : u < p_i}``: one uniform decides the
    accepted prefix for every ``k``, so ``k`` may change between rounds (batch-size schedules) and a
    request's draw stays consistent. ``P(accepted >= i) = p_i`` exactly.

    Args:
        u: uniforms in [0, 1), shape ``(n,)``.
        k: drafts per round, int or int array ``(n,)``, each >= 0 (0 = no speculation, 0 accepted).
        conditional_rates: ``(K,)`` shared or ``(n, K)`` per request; rates beyond column K repeat the
            last column.

    Returns:
        int64 array ``(n,)``.

    Raises:
        ValueError: negative ``k`` or mismatched shapes.
    """
    u = np.asarray(u, dtype=float)
    k_arr = np.broadcast_to(np.asarray(k, dtype=np.int64), u.shape)
    if np.any(k_arr < 0):
        raise ValueError("k must be >= 0")
    kmax = int(k_arr.max()) if k_arr.size else 0
    if kmax == 0:
        return np.zeros(u.shape, dtype=np.int64)
    c = np.asarray(conditional_rates, dtype=float)
    if c.ndim == 1:
        c = c[None, :]
    if c.shape[-1] < kmax:
        c = np.concatenate((c, np.repeat(c[:, -1:], kmax - c.shape[-1], axis=1)), axis=1)
    p = np.cumprod(c[:, :kmax], axis=1)
    if p.shape[0] not in (1, u.shape[0]):
        raise ValueError(f"conditional_rates has {p.shape[0]} rows for {u.shape[0]} uniforms")
    hits = (u[:, None] < p) & (np.arange(kmax)[None, :] < k_arr[:, None])
    return hits.sum(axis=1).astype(np.int64)


# ---------------------------------------------------------------------- loading
def profiles_dir() -> Path:
    """The shipped acceptance profiles' folder: the clone's ``workloads/acceptance`` or an installed
    package's copy of it (:func:`servesim.shipped.shipped_dir`)."""
    return shipped_dir("workloads/acceptance")


def available_profiles() -> list[str]:
    """Names (file stems) of the shipped profiles, sorted."""
    d = profiles_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _from_file(path: Path) -> AcceptanceProfile:
    data = load_yaml(path)
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": path.stem}
    return validate(AcceptanceProfile, data, str(path))


def load_profile(spec: Any, base_dir: str | Path | None = None, source: str = "acceptance") -> AcceptanceProfile:
    """Load an acceptance profile from any of the forms a config may use.

    Args:
        spec: an :class:`AcceptanceProfile`; a profile name (file stem in :func:`profiles_dir`); a path to a
            YAML file (relative paths resolve against ``base_dir``); an inline mapping of the profile's
            fields; the shorthand ``{alpha: 0.7}`` or a bare number (i.i.d. model: one conditional rate,
            repeated at every position); or a list of UNconditional per-position rates (vLLM convention).
        base_dir: directory of the config file that holds ``spec`` (for relative paths).
        source: what to name in errors when ``spec`` is inline (e.g. ``run.yaml: speculative_config``).

    Raises:
        ConfigError: unknown name, missing file, or invalid profile (one line naming file and field).
    """
    if isinstance(spec, AcceptanceProfile):
        return spec
    if isinstance(spec, bool):
        raise ConfigError(f"{source}: expected a profile name, path, mapping or list of rates (got {spec!r})")
    if isinstance(spec, (int, float)):
        spec = {"alpha": spec}
    if isinstance(spec, Path) or (isinstance(spec, str) and _looks_like_path(spec)):
        path = Path(spec)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.exists():  # name the setting that gave the path, and where a relative one was looked for
            relative = f" (a relative path is read from {base_dir})" if base_dir is not None else ""
            raise ConfigError(f"{source}: acceptance profile file not found: {path}{relative}")
        return _from_file(path)
    if isinstance(spec, str):
        path = profiles_dir() / f"{spec}.yaml"
        if not path.is_file():
            # a non-editable install (pip install .) has the package without the clone's workloads/ folder
            names = ", ".join(available_profiles()) or (
                "none shipped beside this install: the profiles live in the clone's workloads/acceptance/ "
                "folder; install the clone editable (pip install -e .) or give the profile file's path")
            raise ConfigError(f"{source}: unknown acceptance profile {spec!r} (expected one of: {names})")
        return _from_file(path)
    if isinstance(spec, dict) and set(spec) == {"alpha"}:
        alpha = spec["alpha"]
        data = {
            "name": f"alpha-{alpha}",
            "source": "inline shorthand {alpha: ...}: i.i.d. acceptance (Leviathan et al. 2023)",
            "conditional_acceptance": [alpha],
        }
        return validate(AcceptanceProfile, data, f"{source}.alpha")
    if isinstance(spec, dict) and "alpha" in spec:  # the shorthand with more keys: not a profile mapping either
        others = ", ".join(sorted(str(key) for key in spec if key != "alpha"))
        raise ConfigError(f"{source}: the shorthand {{alpha: RATE}} takes no other key (got {others}); give a "
                          "profile mapping (conditional_acceptance: [RATE], ...) for more")
    if isinstance(spec, (list, tuple)):
        data = {"name": "inline", "source": f"inline rates in {source}", "per_position_acceptance": list(spec)}
        return validate(AcceptanceProfile, data, source)
    if isinstance(spec, dict):
        data = {"source": f"inline profile in {source}", **spec}
        return validate(AcceptanceProfile, data, source)
    raise ConfigError(f"{source}: expected a profile name, path, mapping or list of rates (got {spec!r})")


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.endswith((".yaml", ".yml"))


def _fit_alpha(mean_length: float, k: int) -> float:
    """Constant conditional rate whose AL(k) equals ``mean_length`` (bisection; used to document fits)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        val = 1.0 + sum(mid**i for i in range(1, k + 1))
        lo, hi = (mid, hi) if val < mean_length else (lo, mid)
    return 0.5 * (lo + hi)
