"""What drafting costs in an engine step, following vLLM V1.

The drafter runs in the same engine step, after the target's forward pass and rejection sampling:

* ``draft_model``, EAGLE, EAGLE-3, Medusa and MTP: one drafter pass over all the step's tokens (it must
  see the prompt chunks and the accepted tokens to keep its own KV cache), then ``k - 1`` passes of one
  token per sampling request. Each pass is timed with the same roofline as the target, from the drafter's
  own weights and KV (no second per-step overhead: it is the same engine step)::

      t_draft = t_pass(T tokens) + (k - 1) * t_pass(n requests) + k * (kv_draft * sum(ctx) + t_launch)

  A draft model is a model card (its weights and KV cache share the GPU memory and the KV block pool). An
  EAGLE/EAGLE-3/Medusa/MTP head is, by default, one decoder layer of the target's shape plus the target's
  lm_head (which it reads but does not store twice); ``draft_head`` overrides it with any model card.
  The per-pass GEMM, non-GEMM, lm_head and sampler times all grow with the pass's tokens (the first pass
  over the step's tokens, passes 2..k over one token per request); the only constant is the named
  ``draft_pass_overhead_s`` per pass (fitted to vLLM PR 16937's EAGLE-1 batch-1 points,
  ``experiments/calibration/fit_batch1_overheads.py``): the proposer's CPU work and launches per pass.
* ``ngram``/``suffix``: a CPU proposer after the bookkeeping: ``n requests * ngram_cpu_s_per_request``.
* The seed lesson's simple mode (``draft_cost = c``): ``k * c * t_target_decode(n requests)``, where the
  target decode step is the context-free part of a plain decode step of the same batch (Example 12).

All times are integers of 2^-16 ps (sub-picoseconds) so that runs of steps stay exact (see
:mod:`servesim.roofline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from servesim.roofline import SUBPS_PER_S, StepTimeModel, build_step_time_model, subps_coefficient


@dataclass(slots=True)
class DrafterCost:
    """Per-step drafting time (integer 2^-16 ps) and the drafter's memory footprint.

    Attributes:
        kind: ``"model"`` (roofline of a drafter), ``"simple"`` (c x target step) or ``"cpu"`` (n-gram).
        weight_bytes_per_gpu: drafter weights stored on each GPU (bytes; lm_head shared with the target
            is not counted twice).
        kv_bytes_per_token_per_gpu: drafter KV bytes per token per GPU, stored in the same block pool.
        kv_subps_per_draft_token: 2^-16 ps per context token per drafter pass (0 for "simple" and "cpu").
        cpu_subps_per_request: n-gram proposer time per request (2^-16 ps).
        pass_overhead_subps: ``draft_pass_overhead_s`` per drafter pass (2^-16 ps).
    """

    kind: str
    weight_bytes_per_gpu: float = 0.0
    kv_bytes_per_token_per_gpu: float = 0.0
    kv_subps_per_draft_token: int = 0
    draft_model: StepTimeModel | None = None
    target: StepTimeModel | None = None
    c: float = 0.0
    cpu_subps_per_request: int = 0
    pass_overhead_subps: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    def const_subps(self, num_tokens: int, num_requests: int, k: int) -> int:
        """Context-independent drafting time of a step (2^-16 ps) proposing ``k`` tokens for ``num_requests``."""
        if k <= 0 or num_requests <= 0:
            return 0
        key = (num_tokens, num_requests, k)
        v = self._cache.get(key)
        if v is None:
            if self.kind == "cpu":
                v = num_requests * self.cpu_subps_per_request
            elif self.kind == "simple":
                v = k * round(self.c * self.target.base_subps(num_requests, num_requests, num_requests))
            else:
                d = self.draft_model
                # base_subps(T, R, 0) is tokens_subps(T, R): no per-request term
                v = (d.tokens_subps(num_tokens, num_requests) + (k - 1) * d.tokens_subps(num_requests, num_requests)
                     + k * self.pass_overhead_subps)
            self._cache[key] = v
        return v

    def step_subps(self, num_tokens: int, num_requests: int, k: int, ctx_tokens: int) -> int:
        """Drafting time of one step (2^-16 ps); ``ctx_tokens`` = sum of the requests' attended contexts."""
        if k <= 0 or num_requests <= 0:
            return 0
        v = self._cache.get((num_tokens, num_requests, k))  # const_subps inline on a hit (one call per step)
        if v is None:
            v = self.const_subps(num_tokens, num_requests, k)
        return v + k * self.kv_subps_per_draft_token * ctx_tokens


def head_card(target) -> dict:
    """Default EAGLE/EAGLE-3/Medusa/MTP head: one decoder layer of the target plus its lm_head.

    An architecture card with the target's shape and ``num_hidden_layers: 1`` (a MoE target gives a MoE
    layer; no sliding window, no MTP modules), so each pass is timed like the target's layers: the layer's
    GEMMs over the pass's tokens, its non-GEMM operators, the lm_head and sampler over one position per
    request (vLLM ``v1/spec_decode/eagle.py`` computes the drafter's logits at each request's last
    position only), and the layer's KV read. The embedding and lm_head are the target's (shared, not
    stored twice: see :func:`build_drafter`). An explicit target (no architecture) gives an explicit head:
    ``num_params / layers``.
    """
    if target.is_explicit:
        layers = max(int(getattr(target, "num_hidden_layers", 1) or 1), 1)
        return {
            "name": f"{target.name}-draft-head",
            "num_params": float(target.linear_flops_per_token) / 2.0 / layers,
            "kv_bytes_per_token": float(target.kv_bytes_per_token) / layers,
            "weight_dtype": str(target.weight_dtype),
            "max_model_len": int(target.max_model_len),
            "source": "servesim default drafter head: one target decoder layer",
        }
    data = target.model_dump(exclude_none=True, by_alias=True)
    data.update(name=f"{target.name}-draft-head", num_hidden_layers=1, first_k_dense_replace=0,
                num_nextn_predict_layers=0,
                source="servesim default drafter head: one target decoder layer + the target's lm_head")
    data.pop("sliding_window", None)
    data.pop("sliding_window_layers", None)
    data.pop("hf_repo", None)
    return data


def build_drafter(spec, hardware, target, tensor_parallel_size: int, mode: str, target_step: StepTimeModel,
                  base_dir: Path | None = None) -> DrafterCost:
    """The drafting cost model of a :class:`~servesim.speculation.config.SpeculativeConfig`.

    Raises:
        ConfigError: the draft model card cannot be loaded.
    """
    if spec.draft_cost is not None:
        return DrafterCost(kind="simple", target=target_step, c=float(spec.draft_cost))
    if spec.method in ("ngram", "suffix"):
        return DrafterCost(kind="cpu", cpu_subps_per_request=subps_coefficient(spec.ngram_cpu_s_per_request * SUBPS_PER_S)[0])
    from servesim.cards import load_model

    tp = int(spec.draft_tensor_parallel_size or tensor_parallel_size)
    if spec.method == "draft_model":
        card = load_model(spec.model, base_dir=base_dir, source="speculative_config.model")
        weights = float(card.weight_bytes) / tp
    else:
        card = load_model(spec.draft_head if spec.draft_head is not None else head_card(target), base_dir=base_dir,
                          source="speculative_config.draft_head")
        shared = 0.0  # the default head reads the target's embedding and lm_head: not stored twice
        if spec.draft_head is None and not card.is_explicit:
            from servesim.cards.dtypes import bytes_per_element

            pc = card.param_counts
            shared = (pc.input_embedding + pc.lm_head) * bytes_per_element(card.resolved_embedding_dtype)
        weights = max(float(card.weight_bytes) - shared, 0.0) / tp
    # same engine step as the target pass: no second per-step or per-request overhead
    model = build_step_time_model(hardware, card, tp, mode, step_overhead=False)
    return DrafterCost(
        kind="model",
        weight_bytes_per_gpu=weights,
        kv_bytes_per_token_per_gpu=card.kv_bytes_per_token_per_gpu(tp),
        kv_subps_per_draft_token=model.kv_subps_per_token,
        draft_model=model,
        pass_overhead_subps=0 if mode == "ideal" else round(spec.draft_pass_overhead_s * SUBPS_PER_S),
    )
