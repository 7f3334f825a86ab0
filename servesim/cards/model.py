"""Model card: a model's architecture numbers and the quantities the roofline needs from them.

Two kinds of card:

- an **architecture** card gives the numbers of the model's ``config.json`` (layers, hidden size, heads,
  experts, MLA ranks, ...); parameters, bytes, KV bytes and FLOPs are derived (formulas on each property,
  counting rules in :mod:`servesim.cards.params`);
- an **explicit** card gives only ``num_params`` and ``kv_bytes_per_token`` (the seed lesson's idealised
  "8B FP16 model"). Then every FLOP is a linear-layer FLOP: ``linear_flops_per_token = 2 x num_params``,
  ``lm_head_flops_per_token = 0`` and ``attention_flops_per_pair = 0``; all weights are read every step.

Field names follow Hugging Face ``config.json`` keys where one exists.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal, overload

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from servesim.input_models import InputModel
from servesim.cards.dtypes import (
    FLOAT_ACTIVATION_DTYPES,
    KVCacheDtype,
    WeightDtype,
    bytes_per_element,
)
from servesim.cards.params import ParamCounts, count_params

TokenCount = int | float | np.integer | NDArray[np.integer] | NDArray[np.floating]
_SCALARS = (int, float, np.integer, np.floating)

_ARCH_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "vocab_size",
)
_OPTIONAL_ARCH_FIELDS = (
    "num_key_value_heads",
    "head_dim",
    "moe_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
)
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _card_error(message: str) -> PydanticCustomError:
    # A model-level error whose text starts with the field it is about ("field: what was expected").
    return PydanticCustomError("model_card", message)


class ModelCard(InputModel):
    """A served model: architecture (or explicit totals), storage dtypes, context limit.

    Units: parameters are counts of weights, bytes are bytes, FLOPs are floating-point operations
    (a multiply-add = 2 FLOPs). Per-token quantities are per token of a forward pass.

    Raises (on validation):
        pydantic.ValidationError: a missing, contradictory or out-of-range field (wrapped into a one-line
        ``ConfigError`` by :func:`servesim.input_files.validate`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="Display name, e.g. 'Llama-3.1-8B'.")
    hf_repo: str | None = Field(default=None, description="Hugging Face repository id.")

    # Explicit card.
    num_params: float | None = Field(
        default=None, gt=0, description="Explicit card only: total parameters (weights)."
    )
    explicit_kv_bytes_per_token: int | None = Field(
        default=None,
        gt=0,
        alias="kv_bytes_per_token",
        description="Explicit card only (YAML key ``kv_bytes_per_token``): KV-cache bytes per token.",
    )

    # Architecture card.
    num_hidden_layers: int | None = Field(default=None, gt=0, description="Transformer layers.")
    hidden_size: int | None = Field(default=None, gt=0, description="Model width.")
    intermediate_size: int | None = Field(
        default=None, gt=0, description="Dense-MLP intermediate size (gated MLP)."
    )
    num_attention_heads: int | None = Field(default=None, gt=0, description="Query heads.")
    num_key_value_heads: int | None = Field(
        default=None, gt=0, description="KV heads (GQA); equal to the query heads for plain MHA."
    )
    head_dim: int | None = Field(
        default=None, gt=0, description="GQA head size; default hidden_size / num_attention_heads."
    )
    vocab_size: int | None = Field(default=None, gt=0, description="Vocabulary size.")
    tie_word_embeddings: bool = Field(default=False, description="lm_head shares the embedding.")
    attention: Literal["gqa", "mla"] = Field(
        default="gqa", description="gqa (also MHA/MQA) or mla (multi-head latent attention)."
    )
    attention_bias: bool = Field(default=False, description="q/k/v/o projections have biases.")
    mlp_bias: bool = Field(default=False, description="MLP/expert projections and router have biases.")
    qk_norm: bool = Field(default=False, description="RMSNorm on q and k per head (Qwen3).")

    num_experts: int = Field(default=0, ge=0, description="Routed experts per MoE layer; 0 = dense.")
    num_experts_per_tok: int = Field(default=0, ge=0, description="Routed experts per token (top-k).")
    moe_intermediate_size: int | None = Field(
        default=None, gt=0, description="Intermediate size of one expert; default intermediate_size."
    )
    num_shared_experts: int = Field(default=0, ge=0, description="Always-active experts per MoE layer.")
    first_k_dense_replace: int = Field(
        default=0, ge=0, description="The first k layers are dense (DeepSeek); the rest are MoE."
    )

    q_lora_rank: int | None = Field(default=None, gt=0, description="MLA query low-rank size (optional).")
    kv_lora_rank: int | None = Field(default=None, gt=0, description="MLA compressed KV (latent) size.")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, description="MLA rotary part of q/k head.")
    qk_nope_head_dim: int | None = Field(default=None, gt=0, description="MLA non-rotary part of q/k head.")
    v_head_dim: int | None = Field(default=None, gt=0, description="MLA value head size.")

    sliding_window: int | None = Field(default=None, gt=0, description="Sliding-window size in tokens.")
    sliding_window_layers: int = Field(
        default=0, ge=0, description="How many layers use the sliding window (the others attend fully)."
    )
    num_nextn_predict_layers: int = Field(
        default=0, ge=0, description="Multi-token-prediction (MTP) modules shipped with the model."
    )
    input_embedding_in_active_params: bool = Field(
        default=True,
        description="The vendor's counting convention for active parameters: Meta, Qwen and Mistral "
        "count the input embedding, DeepSeek (37B) and OpenAI (gpt-oss 5.13B) leave it out. Affects "
        "only active_params, never FLOPs or bytes.",
    )

    weight_dtype: WeightDtype = Field(
        default="bf16", description="Storage type of the transformer layers' matrices."
    )
    expert_weight_dtype: WeightDtype | None = Field(
        default=None, description="Storage type of routed experts; default weight_dtype (gpt-oss: mxfp4)."
    )
    embedding_dtype: WeightDtype | None = Field(
        default=None,
        description="Storage type of embedding, lm_head, norms, biases and router; default weight_dtype "
        "when that is a float type, else bf16 (quantised checkpoints keep these in 16 bits).",
    )
    kv_cache_dtype: KVCacheDtype = Field(
        default="auto",
        description="KV-cache storage type (vLLM --kv-cache-dtype); auto = weight_dtype when that is a "
        "float type, else bf16.",
    )
    max_model_len: int = Field(gt=0, description="Longest context (prompt + output) in tokens.")
    source: str = Field(default="", description="Where the numbers come from.")

    # ------------------------------------------------------------------ validation

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelCard:
        if self.num_params is not None:
            self._check_explicit()
        else:
            self._check_architecture()
        return self

    def _check_explicit(self) -> None:
        if self.explicit_kv_bytes_per_token is None:
            raise _card_error("kv_bytes_per_token: required key is missing (an explicit card has num_params)")
        for field in _ARCH_FIELDS + _OPTIONAL_ARCH_FIELDS:
            if getattr(self, field) is not None:
                raise _card_error(
                    f"{field}: not allowed in an explicit card (num_params and kv_bytes_per_token given)"
                )
        structure = {
            "num_experts": self.num_experts,
            "sliding_window_layers": self.sliding_window_layers,
            "attention": self.attention == "mla",
        }
        for field, value in structure.items():
            if value:
                raise _card_error(f"{field}: not allowed in an explicit card (num_params given)")

    def _check_architecture(self) -> None:
        if self.explicit_kv_bytes_per_token is not None:
            raise _card_error(
                "kv_bytes_per_token: derived from the architecture; give it only together with num_params"
            )
        for field in _ARCH_FIELDS:
            if getattr(self, field) is None:
                raise _card_error(f"{field}: required key is missing (or give num_params and kv_bytes_per_token)")
        layers = self.num_hidden_layers
        assert layers is not None and self.hidden_size is not None and self.num_attention_heads is not None
        if self.attention == "mla":
            for field in _MLA_FIELDS:
                if getattr(self, field) is None:
                    raise _card_error(f"{field}: required key is missing (attention is mla)")
            if self.sliding_window_layers:
                raise _card_error("sliding_window_layers: not supported with mla attention")
        else:
            if self.num_key_value_heads is None:
                raise _card_error("num_key_value_heads: required key is missing (attention is gqa)")
            if self.num_attention_heads % self.num_key_value_heads:
                raise _card_error(
                    f"num_key_value_heads: must divide num_attention_heads {self.num_attention_heads} "
                    f"(got {self.num_key_value_heads})"
                )
            if self.head_dim is None and self.hidden_size % self.num_attention_heads:
                raise _card_error("head_dim: required key is missing (hidden_size is not a multiple of heads)")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise _card_error(
                    f"num_experts_per_tok: expected 1 to num_experts {self.num_experts} "
                    f"(got {self.num_experts_per_tok})"
                )
            if self.first_k_dense_replace > layers:
                raise _card_error(
                    f"first_k_dense_replace: expected at most num_hidden_layers {layers} "
                    f"(got {self.first_k_dense_replace})"
                )
        elif self.num_experts_per_tok or self.num_shared_experts:
            raise _card_error("num_experts: required (> 0) when num_experts_per_tok or num_shared_experts is set")
        if self.sliding_window_layers > layers:
            raise _card_error(
                f"sliding_window_layers: expected at most num_hidden_layers {layers} "
                f"(got {self.sliding_window_layers})"
            )
        if self.sliding_window_layers and self.sliding_window is None:
            raise _card_error("sliding_window: required key is missing (sliding_window_layers > 0)")

    # ------------------------------------------------------------------ structure

    @property
    def is_explicit(self) -> bool:
        """True for an explicit card (``num_params`` given, no architecture)."""
        return self.num_params is not None

    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts."""
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with routed experts: ``num_hidden_layers - first_k_dense_replace`` (0 if dense)."""
        if not self.num_experts or self.num_hidden_layers is None:
            return 0
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def resolved_head_dim(self) -> int:
        """Query/key head size: GQA ``head_dim`` (default hidden/heads); MLA ``qk_nope + qk_rope``.

        Raises:
            ValueError: explicit card.
        """
        if self.is_explicit:
            raise ValueError(f"model card {self.name!r} is explicit: no head_dim")
        if self.attention == "mla":
            assert self.qk_nope_head_dim is not None and self.qk_rope_head_dim is not None
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.head_dim is not None:
            return self.head_dim
        assert self.hidden_size is not None and self.num_attention_heads is not None
        return self.hidden_size // self.num_attention_heads

    @property
    def resolved_moe_intermediate_size(self) -> int:
        """Intermediate size of one expert (``moe_intermediate_size``, default ``intermediate_size``)."""
        if self.moe_intermediate_size is not None:
            return self.moe_intermediate_size
        return self.intermediate_size or 0

    @property
    def num_full_attention_layers(self) -> int:
        """Layers attending to the whole context: ``num_hidden_layers - sliding_window_layers``."""
        return (self.num_hidden_layers or 0) - self.sliding_window_layers

    # ------------------------------------------------------------------ parameters

    @cached_property
    def param_counts(self) -> ParamCounts:
        """Parameter breakdown (see :mod:`servesim.cards.params`).

        Raises:
            ValueError: explicit card (use ``total_params``).
        """
        return count_params(self)

    @property
    def total_params(self) -> float:
        """Every weight of the model (tied embedding counted once; MTP modules NOT included)."""
        if self.num_params is not None:
            return self.num_params
        return self.param_counts.total

    @property
    def embedding_params(self) -> float:
        """Weights of the input embedding table, ``vocab_size x hidden_size`` (0 for an explicit card)."""
        return 0.0 if self.is_explicit else self.param_counts.input_embedding

    @property
    def lm_head_params(self) -> float:
        """Weights of an untied lm_head, ``vocab_size x hidden_size`` (0 when tied or explicit)."""
        return 0.0 if self.is_explicit else self.param_counts.lm_head

    @property
    def active_params(self) -> float:
        """Parameters a token uses, in the vendor's convention.

        ``total_params - routed experts x (1 - num_experts_per_tok / num_experts)``, minus the input
        embedding when ``input_embedding_in_active_params`` is False and the embedding is not tied
        (DeepSeek-V3: 37B, gpt-oss-120b: 5.13B; see SOURCES.md of the reference tables).
        """
        if self.num_params is not None:
            return self.num_params
        pc = self.param_counts
        active = pc.total - pc.routed_experts * (1.0 - self._routed_fraction_per_token)
        if not self.input_embedding_in_active_params and not self.tie_word_embeddings:
            active -= pc.input_embedding
        return active

    @cached_property
    def active_matmul_params(self) -> float:
        """Matrix weights a token multiplies in the transformer layers, embedding and lm_head excluded.

        Attention + dense MLPs + shared experts + router + ``num_experts_per_tok / num_experts`` of the
        routed experts. Explicit card: ``num_params``.
        """
        if self.num_params is not None:
            return self.num_params
        pc = self.param_counts
        return (
            pc.attention_matmul
            + pc.dense_mlp_matmul
            + pc.shared_experts_matmul
            + pc.router_matmul
            + pc.routed_experts_matmul * self._routed_fraction_per_token
        )

    @property
    def _routed_fraction_per_token(self) -> float:
        return self.num_experts_per_tok / self.num_experts if self.num_experts else 0.0

    # ------------------------------------------------------------------ bytes

    @property
    def resolved_embedding_dtype(self) -> str:
        """Storage type of embedding, lm_head, norms, biases, router (see ``embedding_dtype``)."""
        if self.embedding_dtype is not None:
            return self.embedding_dtype
        return self.weight_dtype if self.weight_dtype in FLOAT_ACTIVATION_DTYPES else "bf16"

    @property
    def resolved_expert_weight_dtype(self) -> str:
        """Storage type of the routed experts (``expert_weight_dtype``, default ``weight_dtype``)."""
        return self.expert_weight_dtype or self.weight_dtype

    @property
    def resolved_kv_cache_dtype(self) -> str:
        """KV-cache storage type with ``auto`` resolved (weight_dtype if a float type, else bf16)."""
        if self.kv_cache_dtype != "auto":
            return self.kv_cache_dtype
        return self.weight_dtype if self.weight_dtype in FLOAT_ACTIVATION_DTYPES else "bf16"

    @property
    def bytes_per_weight(self) -> float:
        """Bytes per weight of ``weight_dtype`` (block scales included), e.g. 2.0 for bf16."""
        return bytes_per_element(self.weight_dtype)

    @property
    def kv_bytes_per_element(self) -> int:
        """Bytes per KV-cache element of the resolved ``kv_cache_dtype``."""
        return int(bytes_per_element(self.resolved_kv_cache_dtype))

    @cached_property
    def _weight_bytes_split(self) -> tuple[float, float]:
        # (bytes read whatever the batch: non-expert weights, bytes of ALL routed experts)
        if self.num_params is not None:
            return self.num_params * self.bytes_per_weight, 0.0
        pc = self.param_counts
        emb_b = bytes_per_element(self.resolved_embedding_dtype)
        w_b = self.bytes_per_weight
        exp_b = bytes_per_element(self.resolved_expert_weight_dtype)
        fixed = (pc.input_embedding + pc.lm_head + pc.router_matmul + pc.other + pc.routed_experts_bias) * emb_b
        fixed += (pc.attention_matmul + pc.dense_mlp_matmul + pc.shared_experts_matmul) * w_b
        return fixed, pc.routed_experts_matmul * exp_b

    @property
    def weight_bytes(self) -> float:
        """Every weight byte of the model in bytes: embeddings, all experts, lm_head, norms, biases.

        Each group is counted in its own storage type (``weight_dtype``, ``expert_weight_dtype``,
        ``embedding_dtype``). MTP modules are not included.
        """
        fixed, experts = self._weight_bytes_split
        return fixed + experts

    @property
    def non_expert_weight_bytes(self) -> float:
        """Bytes of every weight except the routed experts (read by every forward pass)."""
        return self._weight_bytes_split[0]

    @property
    def routed_expert_weight_bytes(self) -> float:
        """Bytes of all routed experts of all MoE layers (0 for a dense model)."""
        return self._weight_bytes_split[1]

    @overload
    def num_active_experts(self, num_tokens: int | float | np.integer, expected: bool = ...) -> float: ...
    @overload
    def num_active_experts(self, num_tokens: NDArray, expected: bool = ...) -> NDArray[np.float64]: ...
    def num_active_experts(self, num_tokens: TokenCount, expected: bool = False) -> float | NDArray[np.float64]:
        """Routed experts touched per MoE layer by a forward pass over ``num_tokens`` tokens.

        Default (upper bound, every token picks experts no other token picked):
        ``min(num_tokens x num_experts_per_tok, num_experts)``. With ``expected=True``, the mean under
        independent uniform routing: ``E x (1 - (1 - k/E)^num_tokens)`` (``docs/reference/roofline.md``).
        0 for a dense model.

        Args:
            num_tokens: tokens in the forward pass (>= 0); a scalar or a numpy array of any shape.

        Returns:
            A float for a scalar, else a float64 array of the same shape.
        """
        E, k = float(self.num_experts), float(self.num_experts_per_tok)
        if isinstance(num_tokens, _SCALARS):  # fast path for the engine's per-step calls
            t = float(num_tokens)
            if not self.num_experts:
                return 0.0
            return E * (1.0 - (1.0 - k / E) ** t) if expected else min(t * k, E)
        n = np.asarray(num_tokens, dtype=np.float64)
        if not self.num_experts:
            out = np.zeros_like(n)
        elif expected:
            out = E * (1.0 - (1.0 - k / E) ** n)
        else:
            out = np.minimum(n * k, E)
        return float(out) if out.ndim == 0 else out

    @overload
    def weight_bytes_read(self, num_tokens: int | float | np.integer, expected: bool = ...) -> float: ...
    @overload
    def weight_bytes_read(self, num_tokens: NDArray, expected: bool = ...) -> NDArray[np.float64]: ...
    def weight_bytes_read(self, num_tokens: TokenCount, expected: bool = False) -> float | NDArray[np.float64]:
        """Weight bytes read by one forward pass over ``num_tokens`` tokens, in bytes.

        ``non_expert_weight_bytes + routed_expert_weight_bytes x num_active_experts(num_tokens) /
        num_experts``: every non-expert weight (attention, dense MLPs, shared experts, router, norms,
        embedding table and lm_head) once, plus per MoE layer the routed experts touched (see
        :meth:`num_active_experts`). Dense model: ``weight_bytes`` whatever ``num_tokens``. The whole input
        embedding table is counted although a pass reads only ``num_tokens`` rows of it (a conservative
        simplification that the calibrated ``step_overhead_s`` was fitted with).

        Args:
            num_tokens: tokens in the forward pass (>= 0); a scalar or a numpy array of any shape.

        Returns:
            A float for a scalar, else a float64 array of the same shape.
        """
        fixed, experts = self._weight_bytes_split
        if isinstance(num_tokens, _SCALARS):
            if not self.num_experts:
                return fixed
            return fixed + experts * self.num_active_experts(float(num_tokens), expected) / self.num_experts
        n = np.asarray(num_tokens, dtype=np.float64)
        if self.num_experts:
            out = fixed + experts * np.asarray(self.num_active_experts(n, expected)) / self.num_experts
        else:
            out = np.full(n.shape, fixed)
        return float(out) if out.ndim == 0 else out

    # ------------------------------------------------------------------ KV cache

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token of context over the full-attention layers, in bytes.

        GQA: ``2 x (layers - sliding_window_layers) x num_key_value_heads x head_dim x kv bytes``;
        MLA: ``layers x (kv_lora_rank + qk_rope_head_dim) x kv bytes`` (one latent per token per layer);
        explicit card: the given ``kv_bytes_per_token``. Sliding-window layers are in
        :attr:`kv_bytes_per_token_sliding`. Source: ``docs/reference/SOURCES.md``, ``docs/reference/roofline.md``.
        """
        if self.explicit_kv_bytes_per_token is not None:
            return self.explicit_kv_bytes_per_token
        b = self.kv_bytes_per_element
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return (self.num_hidden_layers or 0) * (self.kv_lora_rank + self.qk_rope_head_dim) * b
        assert self.num_key_value_heads is not None
        return 2 * self.num_full_attention_layers * self.num_key_value_heads * self.resolved_head_dim * b

    @cached_property
    def kv_bytes_per_token_sliding(self) -> int:
        """KV-cache bytes per token over the sliding-window layers (held for at most ``sliding_window``
        tokens): ``2 x sliding_window_layers x num_key_value_heads x head_dim x kv bytes``; 0 if none."""
        if not self.sliding_window_layers:
            return 0
        assert self.num_key_value_heads is not None
        return 2 * self.sliding_window_layers * self.num_key_value_heads * self.resolved_head_dim * (
            self.kv_bytes_per_element
        )

    def kv_heads_per_gpu(self, tensor_parallel_size: int) -> int:
        """KV heads each GPU of a tensor-parallel group holds: ``max(1, num_key_value_heads // TP)`` (vLLM
        ``ModelConfig.get_num_kv_heads``: the heads are split, and replicated once TP exceeds them); 1 with
        MLA (one latent per token, held whole by every GPU). Raises ``ValueError`` for an explicit card
        (no architecture)."""
        if self.is_explicit:
            raise ValueError(f"{self.name}: an explicit card has no KV heads")
        if self.attention == "mla":
            return 1
        assert self.num_key_value_heads is not None
        return max(1, self.num_key_value_heads // int(tensor_parallel_size))

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int) -> float:
        """KV-cache bytes per token of context on each GPU of a tensor-parallel group (full-attention layers).

        GQA: ``2 x layers x kv_heads_per_gpu x head_dim x kv bytes`` (``kv_bytes_per_token / TP`` while TP
        divides the KV heads; one head per GPU beyond, replicated); MLA: ``kv_bytes_per_token``, not divided
        (vLLM keeps the whole latent on every GPU: ``get_num_kv_heads`` is 1); explicit card:
        ``kv_bytes_per_token / TP`` (the seed lesson's idealised split). Sliding-window layers:
        :meth:`kv_bytes_per_token_sliding_per_gpu`. Source: vLLM 0.32 ``vllm/config/model.py``
        (``get_num_kv_heads``), ``v1/kv_cache_interface.py`` (page size per layer).
        """
        tp = int(tensor_parallel_size)
        if self.is_explicit:
            return float(self.kv_bytes_per_token) / tp
        if self.attention == "mla":
            return float(self.kv_bytes_per_token)
        assert self.num_key_value_heads is not None
        return float(2 * self.num_full_attention_layers * self.kv_heads_per_gpu(tp) * self.resolved_head_dim
                     * self.kv_bytes_per_element)

    def kv_bytes_per_token_sliding_per_gpu(self, tensor_parallel_size: int) -> float:
        """:attr:`kv_bytes_per_token_sliding` on each GPU of a tensor-parallel group (the heads split as in
        :meth:`kv_bytes_per_token_per_gpu`); 0 without sliding-window layers."""
        if not self.sliding_window_layers:
            return 0.0
        return float(2 * self.sliding_window_layers * self.kv_heads_per_gpu(tensor_parallel_size)
                     * self.resolved_head_dim * self.kv_bytes_per_element)

    @overload
    def kv_bytes_for_context(self, num_tokens: int | float | np.integer) -> float: ...
    @overload
    def kv_bytes_for_context(self, num_tokens: NDArray) -> NDArray[np.float64]: ...
    def kv_bytes_for_context(self, num_tokens: TokenCount) -> float | NDArray[np.float64]:
        """KV-cache bytes held (and read by one decode step) for a context of ``num_tokens`` tokens.

        ``kv_bytes_per_token x n + kv_bytes_per_token_sliding x min(n, sliding_window)``, in bytes.
        Vectorised: a numpy array gives a float64 array of the same shape.
        """
        if isinstance(num_tokens, _SCALARS):
            t = float(num_tokens)
            sliding = min(t, float(self.sliding_window or 0)) if self.sliding_window_layers else 0.0
            return self.kv_bytes_per_token * t + self.kv_bytes_per_token_sliding * sliding
        n = np.asarray(num_tokens, dtype=np.float64)
        out = self.kv_bytes_per_token * n
        if self.sliding_window_layers:
            assert self.sliding_window is not None
            out = out + self.kv_bytes_per_token_sliding * np.minimum(n, float(self.sliding_window))
        return float(out) if np.ndim(out) == 0 else out

    # ------------------------------------------------------------------ FLOPs

    @cached_property
    def linear_flops_per_token(self) -> float:
        """FLOPs per token of the transformer layers' matrices: ``2 x active_matmul_params``.

        Embedding (a lookup) and lm_head are excluded; explicit card: ``2 x num_params``.
        """
        return 2.0 * self.active_matmul_params

    @property
    def lm_head_flops_per_token(self) -> float:
        """FLOPs of the lm_head for one token whose logits are computed: ``2 x hidden_size x vocab_size``
        (0 for an explicit card, whose FLOPs are all in ``linear_flops_per_token``)."""
        if self.is_explicit:
            return 0.0
        assert self.hidden_size is not None and self.vocab_size is not None
        return 2.0 * self.hidden_size * self.vocab_size

    @cached_property
    def attention_flops_per_pair(self) -> float:
        """Attention FLOPs per (query token, key token) pair, summed over the full-attention layers.

        GQA: ``4 x layers x num_attention_heads x head_dim`` (QK^T and PV, 2 FLOPs per multiply-add each);
        MLA, naive (non-absorbed) form as in prefill: ``2 x layers x heads x (qk_nope + qk_rope +
        v_head_dim)``. Sliding-window layers are in :attr:`attention_flops_per_pair_sliding` (their key
        count is capped at ``sliding_window``). Explicit card: 0. Source: ``docs/reference/roofline.md``.
        """
        if self.is_explicit:
            return 0.0
        H = self.num_attention_heads
        assert H is not None
        if self.attention == "mla":
            assert self.v_head_dim is not None
            return 2.0 * (self.num_hidden_layers or 0) * H * (self.resolved_head_dim + self.v_head_dim)
        return 4.0 * self.num_full_attention_layers * H * self.resolved_head_dim

    @property
    def attention_flops_per_pair_sliding(self) -> float:
        """Like :attr:`attention_flops_per_pair` over the sliding-window layers only:
        ``4 x sliding_window_layers x num_attention_heads x head_dim`` (0 if none)."""
        if not self.sliding_window_layers:
            return 0.0
        assert self.num_attention_heads is not None
        return 4.0 * self.sliding_window_layers * self.num_attention_heads * self.resolved_head_dim
