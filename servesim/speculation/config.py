"""``speculative_config``: vLLM's ``--speculative-config`` keys, plus servesim's acceptance and cost keys.

vLLM's keys and semantics (``vllm/config/speculative.py``): ``method``, ``num_speculative_tokens``,
``model``, ``prompt_lookup_min``/``prompt_lookup_max`` (n-gram; both 5 when neither is given, the
missing one equal to the other), ``draft_tensor_parallel_size``, ``num_speculative_tokens_per_batch_size``
(vLLM >= 0.24), and V0's ``disable_by_batch_size`` (the whole step runs without speculation when the
number of running requests is >= the threshold; ignored by vLLM V1, honoured by servesim).

Limits on ``num_speculative_tokens`` (vLLM 0.32): at least 1 (``Field(gt=0)`` in ``config/speculative.py``);
at most 128, the most drafts per request its rejection sampler verifies in one step (``MAX_SPEC_LEN`` in
``v1/sample/rejection_sampler.py``; vLLM accepts a larger value and fails at the first step); and for
``mtp``, above the model's number of MTP modules (``num_nextn_predict_layers``, vLLM's ``n_predict``) it must
be a multiple of it (:meth:`SpeculativeConfig.check_target`). ``suffix`` without it takes 24 (vLLM's
``suffix_decoding_max_tree_depth``).

Synthetic acceptance (vLLM 0.32, ``config/speculative.py``): ``rejection_sample_method: synthetic`` with
exactly one of ``synthetic_acceptance_rates`` (per-position UNconditional rates ``p_1 >= p_2 >= ...``, one per
speculative token, each in [0, 1]) or ``synthetic_acceptance_length`` (a mean acceptance length ``L`` in
``[1, K + 1]``, resolved as vLLM resolves it to the minimum-variance rates ``[1] * floor(L - 1) + [frac(L -
1)] + [0, ...]``, cut to ``K``). vLLM then accepts draft position ``i`` with the conditional rate ``p_i /
p_(i-1)`` whatever the sampling temperature; servesim uses the resolved rates as the acceptance profile
(:meth:`SpeculativeConfig.synthetic_profile`), so the JSON of a synthetic vLLM benchmark drives servesim
unchanged. ``standard`` (the default) uses the ``acceptance`` profile; ``block`` (block verification) is
not modelled. With synthetic acceptance an n-gram or suffix proposer is taken to draft in every round.

servesim's own keys (vLLM has no equivalent):

* ``acceptance``: the acceptance profile (a name in ``workloads/acceptance/``, a path, an inline mapping,
  a list of per-position rates, or ``{alpha: 0.7}``). Default per method: eagle -> EAGLE Llama-3.1-8B
  ShareGPT, eagle3 -> EAGLE-3 MT-Bench, ngram -> n-gram ShareGPT, mtp -> DeepSeek-V3 MTP; draft_model,
  medusa and suffix need one.
* ``draft_cost``: the seed lesson's simple cost mode: one draft step costs ``draft_cost`` x a plain target
  decode step of the same batch (Leviathan et al.'s c). Replaces the drafter roofline.
* ``ngram_cpu_s_per_request``: CPU time of the n-gram proposer per request per step (s; default 10 us).
* ``draft_pass_overhead_s``: fixed CPU/launch overhead of each drafter forward pass (s; default 0.61 ms,
  fitted so that EAGLE on Llama-3.1-8B/H100 at batch 1 matches vLLM PR 16937: 201.7, 198 and 169.9
  tok/s at K = 2, 4, 7; experiments/calibration/fit_batch1_overheads.py). Everything of a pass that grows
  with the batch is in the drafter's own step-time model (servesim.speculation.costs).
  Ignored by the ``ideal`` roofline.
* ``draft_tree``: a tree-shaped draft (branching factor per depth, e.g. ``[2, 2]``: 2 + 4 = 6 draft
  tokens verified per round, depth 2), as EAGLE/Medusa/SpecInfer draw it. Each round verifies all the
  tree's nodes (the verify width, its cost in the step) and accepts at most depth drafts, with the
  per-depth acceptance ``1 - (1 - a_d)^b_d`` of :mod:`servesim.speculation.tree` (the seed lesson's
  Example 9). vLLM V1 drafts chains; this is servesim's extension. At most 128 draft nodes (vLLM's
  ``MAX_SPEC_LEN``, the most drafts per request its rejection sampler verifies in one step).
* ``draft_head``: for eagle/eagle3/medusa/mtp, the drafter's shape as a model-card mapping (default: one
  decoder layer of the target's width, reusing its embedding and lm_head).
* ``temperature``: the requests' sampling temperature (default 0 = greedy). With ``T > 0`` the acceptance
  profile (measured greedy) is converted by :func:`effective_profile` with servesim's peakedness model
  (:mod:`servesim.speculation.temperature`; the seed lesson's Examples 5 and 10).
* ``verification_rule``: ``ratio`` (speculative sampling, vLLM's rejection sampler; the default) or
  ``match`` (llama.cpp's server: accept iff the target's sample equals the draft's token; what
  :mod:`servesim.speculation.llamacpp` sets). Both are the same at ``T = 0``.
* ``target_top_probability``: the temperature model's target top-token probability at ``T = 1`` (default
  0.75, :data:`~servesim.speculation.temperature.DEFAULT_TARGET_TOP_PROBABILITY`).
* ``draft_budget_limit``: llama.cpp's rule that a draft never exceeds the request's remaining output budget
  minus one token (``get_n_draft_max``), so a request's last round drafts fewer. Set from llama.cpp flags;
  for the engine to honour it, its drafts per request per round must be ``min(k, remaining_output - 1)``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.errors import SettingError
from servesim.speculation.schedule import validate_schedule

SpecMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp", "suffix"]

DEFAULT_PROFILES = {
    "eagle": "eagle-llama3.1-8b-sharegpt-k5",
    "eagle3": "eagle3-llama3.1-8b-mtbench-k7",
    "ngram": "ngram-llama3.1-8b-sharegpt-k3",
    "mtp": "mtp-deepseek-v3-k1-high",
}

LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
"""Methods for which vLLM 0.32 reserves ``num_speculative_tokens`` lookahead KV slots per request
(``VllmConfig.num_lookahead_tokens``: the EAGLE family, MTP and draft models; not n-gram, not Medusa)."""

SUFFIX_DECODING_MAX_TREE_DEPTH = 24
"""vLLM's default ``suffix_decoding_max_tree_depth``: ``num_speculative_tokens`` of ``suffix`` when not given."""

MAX_SPEC_LEN = 128
"""Most draft tokens per request vLLM 0.32's rejection sampler verifies in one step
(``MAX_SPEC_LEN`` in ``vllm/v1/sample/rejection_sampler.py``): the upper limit of ``num_speculative_tokens``."""


def synthetic_rates_from_length(length: float, num_speculative_tokens: int) -> list[float]:
    """vLLM's resolution of ``synthetic_acceptance_length`` into per-position unconditional rates.

    The minimum-variance schedule of ``SpeculativeConfig._acceptance_length_to_rates`` (vLLM 0.32,
    ``config/speculative.py``): ``L - 1`` drafts are accepted on average, so the first ``floor(L - 1)``
    positions are always accepted, the next one with probability ``frac(L - 1)``, the rest never; the list
    is cut to ``num_speculative_tokens`` entries.

    Args:
        length: mean acceptance length (tokens per verification round, bonus token included), in
            ``[1, num_speculative_tokens + 1]`` (checked by the caller).
        num_speculative_tokens: K, >= 1.

    Returns:
        ``K`` unconditional rates, e.g. ``(2.5, 4) -> [1.0, 0.5, 0.0, 0.0]``.
    """
    accepted = length - 1.0
    full = int(accepted)
    return ([1.0] * full + [accepted - full] + [0.0] * (num_speculative_tokens - full - 1))[:num_speculative_tokens]


class SpeculativeConfig(InputModel):
    """A validated ``speculative_config`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    method: SpecMethod | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1)
    model: str | dict[str, Any] | None = None
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    num_speculative_tokens_per_batch_size: list[list[int]] | None = None
    disable_by_batch_size: int | None = Field(default=None, ge=2)
    acceptance: Any = None
    draft_cost: float | None = Field(default=None, ge=0.0)
    ngram_cpu_s_per_request: float = Field(default=10e-6, ge=0.0)
    draft_pass_overhead_s: float = Field(default=0.61e-3, ge=0.0)
    draft_head: dict[str, Any] | None = None
    draft_tree: list[int] | None = None
    temperature: float = Field(default=0.0, ge=0.0)
    verification_rule: Literal["ratio", "match"] = "ratio"
    target_top_probability: float | None = Field(default=None, gt=0.0, lt=1.0)
    draft_budget_limit: bool = False
    rejection_sample_method: Literal["standard", "synthetic", "block"] = "standard"
    synthetic_acceptance_rates: list[float] | None = None
    synthetic_acceptance_length: float | None = None

    @model_validator(mode="after")
    def _vllm_rules(self) -> SpeculativeConfig:
        if self.method is None:
            # vLLM detects the method from the draft model, falling back to draft_model.
            if self.model is None:
                raise ValueError("method is required when no speculative model is given (e.g. 'ngram' or 'mtp')")
            self.method = "draft_model"
        if self.draft_tree is not None:
            if not self.draft_tree or any(b < 1 for b in self.draft_tree):
                raise ValueError("draft_tree must list the branching factor (>= 1) of each depth, e.g. [2, 2]")
            if self.method in ("ngram", "suffix"):
                raise ValueError(f"draft_tree needs a model-based drafter, not method '{self.method}'")
            if self.num_speculative_tokens is None:
                self.num_speculative_tokens = len(self.draft_tree)
            if self.num_speculative_tokens != len(self.draft_tree):
                raise ValueError(
                    f"num_speculative_tokens={self.num_speculative_tokens} must equal the depth of draft_tree "
                    f"({len(self.draft_tree)})"
                )
            if self.num_speculative_tokens_per_batch_size is not None:
                raise ValueError("draft_tree cannot be combined with num_speculative_tokens_per_batch_size")
            from servesim.speculation.tree import num_nodes

            drafts = num_nodes(self.draft_tree) - 1  # every node but the root is a draft the step verifies
            if drafts > MAX_SPEC_LEN:
                raise ValueError(
                    f"draft_tree {self.draft_tree} drafts {drafts} tokens per request and step, more than the "
                    f"{MAX_SPEC_LEN} vLLM's rejection sampler verifies (MAX_SPEC_LEN): give fewer branches"
                )
        if self.num_speculative_tokens is None and self.method == "suffix":
            # vLLM: suffix decoding drafts up to its tree depth, num_speculative_tokens defaults to it
            self.num_speculative_tokens = SUFFIX_DECODING_MAX_TREE_DEPTH
        if self.num_speculative_tokens is None:
            raise ValueError(
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter"
            )
        if self.num_speculative_tokens > MAX_SPEC_LEN:
            raise ValueError(
                f"num_speculative_tokens={self.num_speculative_tokens} exceeds {MAX_SPEC_LEN}, the most drafts per "
                "request vLLM's rejection sampler verifies in one step (MAX_SPEC_LEN)"
            )
        self._resolve_synthetic()
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo = hi = 5
            elif lo is None:
                lo = hi
            elif hi is None:
                hi = lo
            if lo > hi:
                raise ValueError(f"prompt_lookup_max={hi} must be larger than or equal to prompt_lookup_min={lo}")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
        elif self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError("prompt_lookup_min/prompt_lookup_max apply only to method 'ngram'")
        if self.method == "draft_model" and self.model is None and self.draft_cost is None:
            raise ValueError("method 'draft_model' needs 'model' (a model card) or servesim's 'draft_cost'")
        if self.method in ("ngram", "mtp") and isinstance(self.model, dict):
            raise ValueError(f"method '{self.method}' takes no draft model")
        if self.num_speculative_tokens_per_batch_size is not None:
            validate_schedule(self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens)
        if self.acceptance is None and self.method not in DEFAULT_PROFILES and not self.synthetic:
            raise ValueError(
                f"method '{self.method}' has no default acceptance profile: set 'acceptance' (a profile name in "
                "workloads/acceptance/, a path, per-position rates, or {alpha: ...})"
            )
        return self

    def _resolve_synthetic(self) -> None:
        """vLLM's ``_resolve_synthetic_acceptance_rates``: exactly one of the rates or the length, validated,
        consolidated into ``synthetic_acceptance_rates`` (the length is then cleared, as vLLM does)."""
        rates, length = self.synthetic_acceptance_rates, self.synthetic_acceptance_length
        n = int(self.num_speculative_tokens)
        if self.rejection_sample_method == "block":
            raise ValueError(
                "rejection_sample_method 'block' (block verification) is not modelled by servesim: use 'standard' "
                "with an acceptance profile measured under it, or 'synthetic'"
            )
        if self.rejection_sample_method != "synthetic":
            if rates is not None or length is not None:
                raise ValueError(
                    "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                    "rejection_sample_method='synthetic'"
                )
            return
        if (rates is None) == (length is None):
            raise ValueError(
                "rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
                "synthetic_acceptance_length"
            )
        if self.acceptance is not None:
            raise ValueError(
                "acceptance cannot be combined with rejection_sample_method='synthetic' (the synthetic rates are "
                "the acceptance): remove one"
            )
        if self.draft_tree is not None:
            raise ValueError("draft_tree cannot be combined with rejection_sample_method='synthetic' (vLLM drafts chains)")
        if rates is not None:
            if len(rates) != n:
                raise ValueError(f"synthetic_acceptance_rates must have length {n} (num_speculative_tokens), got {rates}")
            if not all(0.0 <= r <= 1.0 for r in rates):
                raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}")
            if any(rates[i] > rates[i - 1] for i in range(1, n)):
                raise ValueError(
                    f"synthetic_acceptance_rates must be non-increasing (unconditional per-position rates), got {rates}"
                )
            self.synthetic_acceptance_rates = [float(r) for r in rates]
        else:
            if not 1.0 <= length <= float(n + 1):
                raise ValueError(f"synthetic_acceptance_length must be in [1, {n + 1}], got {length}")
            self.synthetic_acceptance_rates = synthetic_rates_from_length(length, n)
        self.synthetic_acceptance_length = None

    @property
    def synthetic(self) -> bool:
        """vLLM's synthetic rejection sampling is on (``rejection_sample_method: synthetic``)."""
        return self.rejection_sample_method == "synthetic"

    def synthetic_profile(self):
        """The acceptance profile of synthetic rejection sampling, or None when it is off.

        Returns:
            An :class:`~servesim.speculation.profile.AcceptanceProfile` whose ``per_position_acceptance`` are
            the resolved ``synthetic_acceptance_rates`` (unconditional, one per speculative token; vLLM's
            kernel accepts position ``i`` with ``p_i / p_(i-1)``, which servesim's sampling reproduces), every
            round drafting (no no-match rounds).
        """
        if not self.synthetic:
            return None
        from servesim.speculation.profile import AcceptanceProfile

        return AcceptanceProfile(
            name=f"synthetic (mean acceptance length {1.0 + sum(self.synthetic_acceptance_rates):.4g})",
            source="speculative_config.synthetic_acceptance_* (vLLM rejection_sample_method='synthetic')",
            method=self.method,
            per_position_acceptance=list(self.synthetic_acceptance_rates),
        )

    def check_target(self, model) -> None:
        """vLLM's rules for MTP: the target must have MTP modules, and above their number
        (``num_nextn_predict_layers``, vLLM's ``n_predict``) ``num_speculative_tokens`` must be a multiple of
        it (the modules are reused in turn).

        Args:
            model: the target's model card (its ``num_nextn_predict_layers``; an explicit card, which has no
                architecture, is not checked).

        Raises:
            SettingError: ``mtp`` on a target without MTP modules (vLLM runs MTP only from a checkpoint's own
                MTP layers), or ``speculative_config.num_speculative_tokens`` not divisible by their count.
        """
        n_predict = int(getattr(model, "num_nextn_predict_layers", 0) or 0)
        k = int(self.num_speculative_tokens)
        if self.method == "mtp" and n_predict == 0 and not getattr(model, "is_explicit", False):
            raise SettingError(
                f"speculative_config.method: mtp needs a target with MTP modules, and model "
                f"{getattr(model, 'name', '?')} has none (num_nextn_predict_layers: 0 in its card): vLLM drafts "
                "with the MTP layers of the target's own checkpoint; use eagle, eagle3, ngram or a draft model, or "
                "a model card that declares num_nextn_predict_layers"
            )
        if self.method == "mtp" and n_predict > 0 and k > n_predict and k % n_predict:
            raise SettingError(
                f"speculative_config.num_speculative_tokens: {k} must be divisible by n_predict={n_predict} "
                f"(the MTP modules of model {getattr(model, 'name', '?')})"
            )

    @property
    def lookahead_slots(self) -> int:
        """KV slots reserved per running request beyond its scheduled tokens (vLLM's num_lookahead_tokens)."""
        return int(self.num_speculative_tokens) if self.method in LOOKAHEAD_METHODS else 0

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Token-budget slots each scheduled request takes beyond its scheduled tokens (vLLM 0.32's
        ``SpeculativeConfig.max_num_new_slots_for_drafting``): 1 for ``draft_model`` (the draft model's
        autoregressive input keeps one unsliced token), 0 for every other method servesim supports."""
        return 1 if self.method == "draft_model" else 0

    def num_prefill_lookahead_tokens(self, num_mtp_layers: int) -> int:
        """vLLM 0.32's ``VllmConfig.num_prefill_lookahead_tokens``: prompt tokens past a prefill chunk that
        the drafter reads. ``num_speculative_tokens`` for MTP with several layers (``min(num_mtp_layers,
        num_speculative_tokens) > 1``: a chunk then never ends within that many tokens of the prompt's
        end), 1 for the other EAGLE-family methods (no effect on chunks), 0 otherwise.

        Args:
            num_mtp_layers: the target's ``num_nextn_predict_layers`` (0 or 1 = one MTP layer).
        """
        if self.method not in ("eagle", "eagle3", "mtp"):
            return 0
        if self.method == "mtp" and min(max(num_mtp_layers, 1), self.num_speculative_tokens) > 1:
            return int(self.num_speculative_tokens)
        return 1

    @property
    def drafts_may_be_empty(self) -> bool:
        """Proposers that can find no match and draft nothing in a round (n-gram, suffix)."""
        return self.method in ("ngram", "suffix")


def effective_profile(spec: SpeculativeConfig, profile):
    """The acceptance profile the engine should use: ``profile`` at the config's sampling temperature.

    ``T = 0`` (greedy: both verification rules accept exactly when the argmaxes agree) and synthetic
    acceptance (vLLM's synthetic kernels ignore the temperature) return ``profile`` unchanged. ``T > 0`` returns ``profile.at_temperature(T, spec.verification_rule, ...)``: each
    conditional rate given a match goes through
    :func:`servesim.speculation.temperature.acceptance_at_temperature` (servesim's documented peakedness
    model, not a published formula), the no-match share is kept. Apply it before a draft-tree conversion
    (the tree's per-depth acceptance ``1 - (1 - a_d)^b_d`` then uses the tempered chain rates).

    Args:
        spec: a validated :class:`SpeculativeConfig`.
        profile: an :class:`~servesim.speculation.profile.AcceptanceProfile` measured with greedy sampling.

    Returns:
        An :class:`~servesim.speculation.profile.AcceptanceProfile` (named ``...@T=<T>,<rule>`` when converted).
    """
    if spec.temperature <= 0.0 or spec.synthetic:
        return profile
    model = {}
    if spec.target_top_probability is not None:
        model["target_top_probability"] = spec.target_top_probability
    return profile.at_temperature(spec.temperature, spec.verification_rule, **model)
