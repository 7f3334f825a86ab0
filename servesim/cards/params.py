"""Parameter counts of a decoder-only transformer, broken down by what they cost.

Counting rules (every weight of the checkpoint; biases and norms included, rotary tables excluded):

- Embedding ``vocab x hidden``; lm_head another ``vocab x hidden`` unless ``tie_word_embeddings``.
- GQA attention per layer: q ``hidden x heads x head_dim``, k and v ``hidden x kv_heads x head_dim`` each,
  o ``heads x head_dim x hidden``; ``attention_bias`` adds ``(heads + 2 kv_heads) x head_dim + hidden``;
  ``qk_norm`` (Qwen3) adds ``2 x head_dim``. Attention sinks (gpt-oss, ``heads`` per layer) are ignored.
- MLA attention per layer (DeepSeek-V2/V3): q_a ``hidden x q_lora_rank`` + norm ``q_lora_rank`` + q_b
  ``q_lora_rank x heads x (qk_nope + qk_rope)`` (or q ``hidden x heads x (qk_nope + qk_rope)`` without
  q_lora_rank); kv_a ``hidden x (kv_lora_rank + qk_rope)`` + norm ``kv_lora_rank``; kv_b
  ``kv_lora_rank x heads x (qk_nope + v_head_dim)``; o ``heads x v_head_dim x hidden``.
- Gated MLP (SwiGLU: gate, up, down): ``3 x hidden x intermediate`` per dense layer and per expert;
  ``mlp_bias`` adds ``2 x intermediate + hidden`` per MLP/expert and ``num_experts`` to the router.
- MoE layer: ``num_experts`` routed experts of ``moe_intermediate_size``, ``num_shared_experts`` shared
  experts of the same size, a router ``hidden x num_experts``. The first ``first_k_dense_replace`` layers
  are dense (DeepSeek), all others MoE.
- Two RMSNorms (``hidden`` each) per layer and one final norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from servesim.cards.model import ModelCard


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (numbers of weights) of a whole model, grouped by cost.

    ``*_matmul`` groups are matrix weights (2 FLOPs per weight per token); ``other`` holds norms and
    biases, which cost bytes but (almost) no FLOPs. ``routed_experts_*`` cover ALL routed experts of all
    MoE layers; a token touches ``num_experts_per_tok / num_experts`` of them.
    """

    input_embedding: float
    lm_head: float  # 0 when the embedding is tied
    attention_matmul: float
    dense_mlp_matmul: float
    shared_experts_matmul: float
    router_matmul: float
    routed_experts_matmul: float
    routed_experts_bias: float
    other: float  # norms and non-expert biases

    @property
    def routed_experts(self) -> float:
        """All routed-expert weights (matrices and biases)."""
        return self.routed_experts_matmul + self.routed_experts_bias

    @property
    def total(self) -> float:
        """Every weight of the model (embedding counted once when tied)."""
        return (
            self.input_embedding
            + self.lm_head
            + self.attention_matmul
            + self.dense_mlp_matmul
            + self.shared_experts_matmul
            + self.router_matmul
            + self.routed_experts
            + self.other
        )


def count_params(card: ModelCard) -> ParamCounts:
    """Count the parameters of an architecture card (see the module docstring for the rules).

    Raises:
        ValueError: ``card`` is an explicit card (no architecture).
    """
    if card.is_explicit:
        raise ValueError("an explicit model card has no architecture to count")
    L = card.num_hidden_layers
    D = card.hidden_size
    H = card.num_attention_heads
    assert L is not None and D is not None and H is not None and card.vocab_size is not None
    n_moe = card.num_moe_layers
    n_dense = L - n_moe

    # Attention, per layer.
    other_per_layer = 2 * D
    if card.attention == "mla":
        nope, rope, v = card.qk_nope_head_dim, card.qk_rope_head_dim, card.v_head_dim
        kvr = card.kv_lora_rank
        assert nope is not None and rope is not None and v is not None and kvr is not None
        if card.q_lora_rank:
            qr = card.q_lora_rank
            attn = D * qr + qr * H * (nope + rope)
            other_per_layer += qr
        else:
            attn = D * H * (nope + rope)
        attn += D * (kvr + rope) + kvr * H * (nope + v) + H * v * D
        other_per_layer += kvr
    else:
        d = card.resolved_head_dim
        kvh = card.num_key_value_heads
        assert kvh is not None
        attn = D * H * d + 2 * D * kvh * d + H * d * D
        if card.attention_bias:
            other_per_layer += (H + 2 * kvh) * d + D
        if card.qk_norm:
            other_per_layer += 2 * d

    # MLPs.
    inter = card.intermediate_size
    assert inter is not None
    dense_mlp = 3 * D * inter * n_dense
    mlp_bias_dense = (2 * inter + D) * n_dense if card.mlp_bias else 0
    E = card.num_experts
    moe_inter = card.resolved_moe_intermediate_size
    expert = 3 * D * moe_inter
    expert_bias = (2 * moe_inter + D) if card.mlp_bias else 0
    routed = expert * E * n_moe
    routed_bias = expert_bias * E * n_moe
    shared = expert * card.num_shared_experts * n_moe
    shared_bias = expert_bias * card.num_shared_experts * n_moe
    router = D * E * n_moe
    router_bias = E * n_moe if card.mlp_bias else 0

    embed = card.vocab_size * D
    return ParamCounts(
        input_embedding=float(embed),
        lm_head=0.0 if card.tie_word_embeddings else float(embed),
        attention_matmul=float(attn * L),
        dense_mlp_matmul=float(dense_mlp),
        shared_experts_matmul=float(shared),
        router_matmul=float(router),
        routed_experts_matmul=float(routed),
        routed_experts_bias=float(routed_bias),
        other=float(other_per_layer * L + D + mlp_bias_dense + shared_bias + router_bias),
    )
