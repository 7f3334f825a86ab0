"""``speculative_config``: vLLM's ``--speculative-config`` keys, plus servesim's acceptance and cost keys.

vLLM's keys and semantics (``vllm/config/speculative.py``): ``method``, ``num_speculative_tokens``,
``model``, ``prompt_lookup_min``/``prompt_lookup_max`` (n-gram; both 5 when neither is given, the
missing one equal to the other), ``draft_tensor_parallel_size``, ``num_speculative_tokens_per_batch_size``
(vLLM >= 0.24), and V0's ``disable_by_batch_size`` (the whole step runs without speculation when the
number of running requests is >= the threshold; ignored by vLLM V1, honoured by servesim).

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
  Example 9). vLLM V1 drafts chains; this is servesim's extension.
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

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servesim.speculation.schedule import validate_schedule

SpecMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp", "suffix"]

DEFAULT_PROFILES = {
    "eagle": "eagle-llama3.1-8b-sharegpt-k5",
    "eagle3": "eagle3-llama3.1-8b-mtbench-k7",
    "ngram": "ngram-llama3.1-8b-sharegpt-k3",
    "mtp": "mtp-deepseek-v3-k1-high",
}

LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "medusa")
"""Methods for which vLLM reserves ``num_speculative_tokens`` lookahead KV slots per request (not n-gram)."""


class SpeculativeConfig(BaseModel):
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
        if self.num_speculative_tokens is None:
            raise ValueError(
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter"
            )
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
        if self.acceptance is None and self.method not in DEFAULT_PROFILES:
            raise ValueError(
                f"method '{self.method}' has no default acceptance profile: set 'acceptance' (a profile name in "
                "workloads/acceptance/, a path, per-position rates, or {alpha: ...})"
            )
        return self

    @property
    def lookahead_slots(self) -> int:
        """KV slots reserved per running request beyond its scheduled tokens (vLLM's num_lookahead_tokens)."""
        return int(self.num_speculative_tokens) if self.method in LOOKAHEAD_METHODS else 0

    @property
    def drafts_may_be_empty(self) -> bool:
        """Proposers that can find no match and draft nothing in a round (n-gram, suffix)."""
        return self.method in ("ngram", "suffix")


def effective_profile(spec: SpeculativeConfig, profile):
    """The acceptance profile the engine should use: ``profile`` at the config's sampling temperature.

    ``T = 0`` (greedy) returns ``profile`` unchanged (both verification rules accept exactly when the
    argmaxes agree). ``T > 0`` returns ``profile.at_temperature(T, spec.verification_rule, ...)``: each
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
    if spec.temperature <= 0.0:
        return profile
    model = {}
    if spec.target_top_probability is not None:
        model["target_top_probability"] = spec.target_top_probability
    return profile.at_temperature(spec.temperature, spec.verification_rule, **model)
