"""Step time from the roofline: bytes against bandwidth, FLOPs against peak compute.

One engine step runs one forward pass of the target model over ``T`` scheduled tokens (prefill chunks,
decode tokens and draft tokens to verify) of a batch of requests. Its duration is modelled as::

    t = t_overhead
        + max(W(T) / (eta_bw * BW),  (F_lin * T + F_lm * n_logits) / (eta_c * P))   # weights vs. linear layers
        + KV_bytes_per_token * sum_i ctx_i / (eta_bw * BW)                            # KV read once per request
        + F_attn_pair * sum_i pairs_i / (eta_c * P)                                    # attention FLOPs
        + t_allreduce(T)                                                               # tensor parallelism

where, per GPU of a tensor-parallel group of size TP, weights, KV bytes and FLOPs are divided by TP;
``W(T)`` is the weight bytes read (MoE: the experts touched, ``min(T * top_k, E)``); ``ctx_i`` is the
number of tokens request ``i`` attends over in the step (its computed tokens plus the new ones), read
once per request per step also when it verifies ``1 + k`` tokens; ``pairs_i`` is the number of causal
(query, key) pairs of its new tokens: ``q * c + q * (q + 1) / 2`` for ``q`` new tokens after ``c``
computed ones; ``n_logits`` the positions whose logits are computed (one per sampling request, ``1 + k``
when verifying drafts). ``t_allreduce`` is two ring all-reduces per layer of ``T x hidden`` activations:
``2 L (latency + 2 (TP-1)/TP * T * D * b / (eta_ic * BW_ic / 2))``. Sources: ``docs/reference/roofline.md``
(the project's reference notes); Vidur's profiled H100 efficiencies; vLLM V1 per-step overhead.

The ``ideal`` mode is the seed lesson's form (Example 12): efficiency 1, no overhead, no KV traffic, no
attention or all-reduce term, ``t = max(W / BW, T * F_token / P)``.

Exactness. Durations are integers of picoseconds: ``d = base_ps(T, n_logits) + kv_ps * sum ctx +
attn_ps * sum pairs`` with integer per-token and per-pair coefficients (rounded once, relative error
below 1e-4). A run of identical decode steps therefore has durations ``D0 + j * Delta`` exactly, and the
fast path can sum a run in closed form and still agree bit for bit with stepping one step at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

PS_PER_S = 10**12
"""Picoseconds per second: the engine's integer clock unit."""


@dataclass
class StepTimeModel:
    """Integer-picosecond step-time model for one model on one tensor-parallel group.

    Build it with :func:`build_step_time_model`. Call :meth:`step_ps` for any step, or use
    ``base_ps(T, n_logits)`` plus the linear coefficients for runs of decode steps.

    Attributes:
        mode: ``"calibrated"`` or ``"ideal"``.
        kv_ps_per_token: time to read one context token's KV cache, per GPU (ps per token).
        attn_ps_per_pair: time of the attention FLOPs of one (query, key) pair (ps per pair).
        decode_ps_per_token: ``kv_ps_per_token + attn_ps_per_pair``: the growth of a decode step's
            time per context token (a decode token attends over its context once).
    """

    mode: str
    weight_read_s: object  # callable T -> seconds for the weight read (vectorisable)
    linear_s_per_token: float
    lm_head_s_per_logit: float
    overhead_s: float
    allreduce_fixed_s: float
    allreduce_s_per_token: float
    kv_ps_per_token: int
    attn_ps_per_pair: int
    _base_cache: dict = field(default_factory=dict, repr=False)

    @property
    def decode_ps_per_token(self) -> int:
        return self.kv_ps_per_token + self.attn_ps_per_pair

    def base_s(self, num_tokens: int, num_logits: int) -> float:
        """Step time without the context-dependent terms (s): overhead, max(weights, linear), all-reduce."""
        weights = self.weight_read_s(num_tokens)
        compute = self.linear_s_per_token * num_tokens + self.lm_head_s_per_logit * num_logits
        allreduce = self.allreduce_fixed_s + self.allreduce_s_per_token * num_tokens if num_tokens else 0.0
        return self.overhead_s + max(weights, compute) + allreduce

    def base_ps(self, num_tokens: int, num_logits: int) -> int:
        """:meth:`base_s` rounded to integer picoseconds (cached per (tokens, logits))."""
        key = (num_tokens, num_logits)
        v = self._base_cache.get(key)
        if v is None:
            v = round(self.base_s(num_tokens, num_logits) * PS_PER_S)
            self._base_cache[key] = v
        return v

    def step_ps(self, num_tokens: int, num_logits: int, kv_tokens: int, attn_pairs: int) -> int:
        """Duration of one step (integer ps).

        Args:
            num_tokens: tokens scheduled in the step (T).
            num_logits: positions whose logits are computed (sampling requests, 1 + k when verifying).
            kv_tokens: sum over scheduled requests of the tokens attended over (context incl. new).
            attn_pairs: sum over scheduled requests of causal (query, key) pairs.
        """
        return self.base_ps(num_tokens, num_logits) + self.kv_ps_per_token * kv_tokens + self.attn_ps_per_pair * attn_pairs

    def step_s(self, num_tokens: int, num_logits: int, kv_tokens: int, attn_pairs: int) -> float:
        """Duration of one step in seconds (see :meth:`step_ps`)."""
        return self.step_ps(num_tokens, num_logits, kv_tokens, attn_pairs) / PS_PER_S

    def compute_bound_tokens(self) -> float:
        """Tokens per step above which the linear layers take longer than the weight read (dense models)."""
        per_token = self.linear_s_per_token + self.lm_head_s_per_logit
        return self.weight_read_s(1) / per_token if per_token > 0 else math.inf


def compute_dtype(model, hardware) -> str:
    """The tensor-core dtype a model's matmuls run in on this GPU: its weight dtype if the GPU has a peak for
    it (fp8 on Hopper), else bf16 (e.g. fp8 weights on an A100 are dequantised to bf16)."""
    dtype = str(getattr(model, "weight_dtype", "bf16")).lower()
    peaks = hardware.peak_flops_per_s
    if dtype in peaks:
        return dtype
    if dtype in ("fp16", "bf16"):
        return "bf16" if "bf16" in peaks else "fp16"
    return "bf16" if "bf16" in peaks else next(iter(peaks))


def build_step_time_model(
    hardware,
    model,
    tensor_parallel_size: int = 1,
    mode: Literal["calibrated", "ideal"] = "calibrated",
) -> StepTimeModel:
    """Build the step-time model of ``model`` served on ``tensor_parallel_size`` GPUs of ``hardware``.

    Args:
        hardware: a :class:`servesim.cards.HardwareCard` (bandwidth in B/s, peaks in FLOP/s, efficiency
            factors, per-step overhead in s).
        model: a :class:`servesim.cards.ModelCard` (weight bytes, FLOPs per token, KV bytes per token).
        tensor_parallel_size: TP degree; weights, KV and FLOPs are split evenly over the TP GPUs.
        mode: ``"calibrated"`` (efficiency factors, overhead, KV and attention terms, all-reduce) or
            ``"ideal"`` (the seed lesson's Example 12 form).

    Raises:
        ValueError: ``tensor_parallel_size`` < 1 or an unknown mode.
    """
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise ValueError("tensor_parallel_size must be >= 1")
    if mode not in ("calibrated", "ideal"):
        raise ValueError(f"unknown roofline mode {mode!r} (expected 'calibrated' or 'ideal')")
    peak = float(hardware.peak_flops_per_s[compute_dtype(model, hardware)])
    bw = float(hardware.memory_bandwidth_bytes_per_s)
    if mode == "ideal":
        eta_bw = eta_c = 1.0
        overhead = 0.0
    else:
        eta_bw = float(hardware.bandwidth_efficiency)
        eta_c = float(hardware.compute_efficiency)
        overhead = float(hardware.step_overhead_s)
    eff_bw = eta_bw * bw
    eff_peak = eta_c * peak

    def weight_read_s(num_tokens, _m=model, _tp=tp, _bw=eff_bw):
        return _m.weight_bytes_read(num_tokens) / _tp / _bw

    linear_s = float(model.linear_flops_per_token) / tp / eff_peak
    lm_head_s = float(model.lm_head_flops_per_token) / tp / eff_peak
    if mode == "ideal":
        kv_ps = attn_ps = 0
        ar_fixed = ar_per_token = 0.0
    else:
        kv_ps = max(1, round(float(model.kv_bytes_per_token) / tp / eff_bw * PS_PER_S))
        attn_ps = round(float(model.attention_flops_per_pair) / tp / eff_peak * PS_PER_S)
        if tp > 1:
            link = hardware.interconnect_bandwidth_bytes_per_s
            if not link:
                link = 64e9  # PCIe Gen4/5 x16 class fallback when the card names no scale-up link
            per_direction = float(link) / 2.0 * float(hardware.interconnect_efficiency)
            layers = int(getattr(model, "num_hidden_layers", 0) or 0)
            hidden = int(getattr(model, "hidden_size", 0) or 0)
            act_bytes = 2  # bf16 activations
            ar_fixed = 2 * layers * float(hardware.allreduce_latency_s)
            ar_per_token = 2 * layers * 2 * (tp - 1) / tp * hidden * act_bytes / per_direction
        else:
            ar_fixed = ar_per_token = 0.0
    return StepTimeModel(
        mode=mode,
        weight_read_s=weight_read_s,
        linear_s_per_token=linear_s,
        lm_head_s_per_logit=lm_head_s,
        overhead_s=overhead,
        allreduce_fixed_s=ar_fixed,
        allreduce_s_per_token=ar_per_token,
        kv_ps_per_token=kv_ps,
        attn_ps_per_pair=attn_ps,
    )
