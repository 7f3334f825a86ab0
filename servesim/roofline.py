"""Step time from the roofline: bytes against bandwidth, FLOPs against peak compute, with the measured shape.

One engine step runs one forward pass of the target model over ``T`` scheduled tokens (prefill chunks,
decode tokens and draft tokens to verify) of ``R`` requests. In the ``calibrated`` mode its duration is,
per GPU of a tensor-parallel group of size ``TP`` (weights, FLOPs and KV bytes divided by TP)::

    t = t_step                                               step_overhead_s (CPU/engine, per step)
        + R * t_req                                          per_request_s (input preparation, metadata)
        + G(W_lin(T), F_lin * T, 4 L)                        linear layers (GEMMs)
        + L * (n_ew * t_ew + T * B_ew / (eta_ew * BW))       non-GEMM per-token operators
        + G(W_lm, F_lm * n_logits, 1)                        lm_head over the logit positions
        + n_logits * V * 4 B * s / (eta_bw * BW)             sampler (+ rejection sampler when speculating)
        + KV_bytes_per_token * sum_i ctx_i / (eta_kv * BW)   attention: KV read once per request
        + F_attn_pair * sum_i pairs_i / (eta_c * P)          attention: score and value FLOPs
        + t_allreduce(T)                                     tensor parallelism

with the GEMM time of a group of ``n`` GEMMs reading ``W`` bytes of weights and doing ``F`` FLOPs::

    G(W, F, n) = ((W / (eta_bw BW))^p + (F / (eta_c P))^p)^(1/p) + n * t_gemm

a smooth maximum of the two roofs: it equals the memory floor at few tokens and the compute line at many,
and between them (near the ridge point, where verify batches of ``batch x (1 + k)`` tokens live) costs up
to ``2^(1/p)`` times the plain ``max``, as measured GEMMs do. The parameters, all fields of the hardware
card (see ``hardware/README.md``):

* ``bandwidth_efficiency`` (eta_bw), ``compute_efficiency`` (eta_c), ``gemm_transition_exponent`` (p),
  ``gemm_launch_s`` (t_gemm): fitted per GPU class to the linear-layer times of Vidur's operator
  profiles (``docs/reference/kernel-profiles/``, every model, token count 1-4096 and TP degree) by
  ``experiments/calibration/fit_kernel_profiles.py``.
* ``elementwise_bandwidth_efficiency`` (eta_ew) and ``elementwise_launch_s`` (t_ew): fitted the same way
  to the profiles' non-GEMM operators (two RMSNorms, rotary embedding, activation, residual add:
  ``n_ew = 5`` per layer). ``B_ew`` is their bytes moved per token and layer (:func:`elementwise_bytes_per_token`).
* ``sampler_passes_per_logit`` (s): full passes over one position's fp32 logits (``V x 4`` bytes) by the
  sampler (vLLM ``v1/sample/sampler.py``: logits written by the lm_head, then temperature, softmax/log-softmax
  and the argmax or sampling read them); ``rejection_sampler_passes_per_logit`` is added for a speculative
  engine (``v1/sample/rejection_sampler.py``: target probabilities, acceptance test and recovered
  distribution over every verified position), on every step of a speculative engine (also those whose
  requests carry no drafts: a simplification).
* ``attention_bandwidth_efficiency`` (eta_kv): the KV-cache read (no attention profiles were available).
* ``per_request_s`` (t_req) and ``step_overhead_s`` (t_step): CPU work per scheduled request and per step,
  fitted to batch-1 and small-batch decode measurements (``experiments/calibration/``).

``W_lin(T)`` is the bytes of the transformer layers' matrices read by a pass over ``T`` tokens; embedding
lookups read ``T`` rows only and are neglected; ``W_lm = V x D`` bytes of the lm_head.

MoE models. The routed experts are not in ``G(W_lin, ...)`` (which keeps attention, dense and shared MLPs
and the router, with one router GEMM launch per MoE layer): they run in fused MoE kernels,
:func:`moe_time_s`::

        + smooth_max(n(T) W_e / (eta_moe BW), F_e T / (eta_c P), p)     experts touched, their FLOPs
        + L_moe (t_moe_layer + n(T) t_moe_expert)                        routing, sort, reduction; per expert

with ``n(T) = E (1 - (1 - k/E)^T)`` the expected number of distinct experts ``T`` tokens touch per MoE
layer under uniform routing (:func:`expert_coverage`), ``W_e`` the bytes of one expert over the ``L_moe``
MoE layers, ``F_e`` the routed FLOPs per token, and the card's ``moe_bandwidth_efficiency``,
``moe_layer_overhead_s`` and ``moe_expert_overhead_s``, fitted for the H100 class to vLLM's fused-MoE kernel
times (``docs/reference/moe-kernels/``, ``experiments/calibration/fit_moe_kernels.py``).

Sliding-window layers (gpt-oss: 18 of 36 layers, ``W`` = 128 tokens). Each new token attends ``min(position
+ 1, W)`` keys and each request reads ``min(ctx, W)`` tokens of those layers' KV; servesim takes the bound
``W`` (exact once a request's context reaches ``W``, i.e. every decode step after a prompt of ``W`` tokens)::

        + T * W * F_pair_sliding / (eta_c P)                              per scheduled token
        + R * W * KV_bytes_per_token_sliding / (eta_kv BW)                per scheduled request

so both stay constant over a run of identical decode steps (the per-request term is folded into the
integer ``request_subps_per_request``) and the closed forms of run mode stay exact; ``min(ctx, W)`` itself is
not linear in the context and is therefore not used. ``ctx_i`` is the number of tokens request ``i`` attends over (its computed
tokens plus the new ones), read once per request per step also when it verifies ``1 + k`` tokens;
``pairs_i = q c + q (q + 1) / 2`` causal (query, key) pairs for ``q`` new tokens after ``c`` computed;
``n_logits`` the positions whose logits are computed (one per sampling request, ``1 + k`` when verifying).
``t_allreduce`` is two ring all-reduces per layer of ``T x hidden`` activations:
``2 L (latency + 2 (TP-1)/TP * T * D * b / (eta_ic * BW_ic / 2))``.

The ``ideal`` mode is the seed lesson's form (Example 12), unchanged: efficiency 1, no overhead, no KV
traffic, no attention, sampler or all-reduce term, ``t = max(W / BW, (F_lin T + F_lm n_logits) / P)``.

Exactness. The engine's clock is integer picoseconds plus a remainder below one picosecond, kept in
sub-picosecond units of ``2^-16`` ps (:data:`SUBPS_PER_PS`). A step's duration is an integer of those
units, ``d = base(T, n_logits, R) + kv * sum ctx + attn * sum pairs`` with integer coefficients
(:class:`StepTimeModel`: ``tokens_subps``, ``request_subps_per_request``, ``kv_subps_per_token``,
``attn_subps_per_pair``), each rounded once from its exact value. A run of identical decode steps
therefore has durations ``D0 + j * Delta`` exactly (``T``, ``n_logits`` and ``R`` are constant over it):
the run's end is ``t0 + floor((rem0 + n D0 + Delta n(n-1)/2) / 2^16)`` ps with the new remainder carried
on, one division, exactly what adding the steps one at a time gives, so the fast path sums a run in
closed form and agrees bit for bit with stepping. Every time the engine reports (step starts, token
emissions, a step's duration in ps) is a difference of that floored clock: a step lasts its exact
duration in sub-picoseconds, seen at whole picoseconds. The coefficients' relative rounding error is at
most ``0.5 / (c * 2^16)`` for a coefficient of ``c`` ps: below 1e-6 for every shipped card, model and TP
degree 1-8, drafter heads' KV included (``tests/test_step_time_exactness.py``; at most 4.0e-7, the
attention coefficient of Llama-3.2-1B on 8 MI300X; the smallest coefficient, 10.4 ps per pair on 8 B200s,
erred by 3.9% in whole picoseconds); :attr:`StepTimeModel.coefficient_rounding_error` reports a model's
largest. Rounding the context-free part ``base`` once per ``(T, n_logits)`` errs by at most 2^-17 ps a
step, and the floored clock shifts a time by less than 1 ps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

PS_PER_S = 10**12
"""Picoseconds per second: the engine's integer clock unit."""

SUBPS_BITS = 16
"""Bits of the engine clock below one picosecond: step durations are integers of ``2^-16`` ps."""

SUBPS_PER_PS = 1 << SUBPS_BITS
"""Sub-picosecond units per picosecond (65,536): the unit of step durations and step-time coefficients."""

SUBPS_MASK = SUBPS_PER_PS - 1
"""``x & SUBPS_MASK``: the part of a time ``x`` (sub-picosecond units) below one picosecond."""

SUBPS_PER_S = PS_PER_S * SUBPS_PER_PS
"""Sub-picosecond units per second."""

LOGIT_BYTES = 4
"""Bytes per logit element: vLLM computes and samples logits in fp32."""

ELEMENTWISE_OPS_PER_LAYER = 5
"""Non-GEMM operators of one decoder layer as profiled by Vidur: input and post-attention RMSNorm, rotary
embedding, activation (SiLU-and-mul), residual add (``docs/reference/kernel-profiles/SOURCES.md``)."""

GEMMS_PER_LAYER = 4
"""GEMMs of one decoder layer: fused QKV, attention output, fused gate+up, down projection."""

PCIE_LINK_BYTES_PER_S = 64e9
"""Link of a tensor-parallel group on a card without a scale-up link (``interconnect_bandwidth_bytes_per_s``
unset: L40S, L4): PCIe Gen4 x16, 64 GB/s bidirectional (32 GB/s each way), at ``interconnect_efficiency``."""


def smooth_max(a: float, b: float, exponent: float) -> float:
    """``(a^p + b^p)^(1/p)`` for ``a, b >= 0``: ``max(a, b)`` as ``p -> inf``, ``a + b`` at ``p = 1``."""
    if a <= 0.0 or b <= 0.0:
        return a if b <= 0.0 else b
    hi, lo = (a, b) if a >= b else (b, a)
    return hi * (1.0 + (lo / hi) ** exponent) ** (1.0 / exponent)


def gemm_time_s(hardware, weight_bytes: float, flops: float, num_gemms: float, peak_flops_per_s: float) -> float:
    """Time (s) of ``num_gemms`` GEMMs reading ``weight_bytes`` bytes and doing ``flops`` FLOPs on one GPU.

    ``G = smooth_max(W / (eta_bw BW), F / (eta_c P), p) + num_gemms * gemm_launch_s`` with the card's
    ``bandwidth_efficiency``, ``compute_efficiency``, ``gemm_transition_exponent`` and ``gemm_launch_s``
    (fitted to Vidur's GEMM profiles, ``docs/reference/kernel-profiles/``).

    Args:
        hardware: a :class:`servesim.cards.HardwareCard`.
        weight_bytes: bytes of weights read (per GPU).
        flops: FLOPs of the GEMMs (per GPU); 0 gives the launch cost only.
        num_gemms: kernels launched.
        peak_flops_per_s: the dense tensor peak for the compute type (FLOP/s).
    """
    memory = weight_bytes / (hardware.bandwidth_efficiency * hardware.memory_bandwidth_bytes_per_s)
    compute = flops / (hardware.compute_efficiency * peak_flops_per_s)
    return smooth_max(memory, compute, hardware.gemm_transition_exponent) + num_gemms * hardware.gemm_launch_s


def moe_time_s(hardware, expert_bytes: float, flops: float, experts_touched: float, num_moe_layers: int,
               peak_flops_per_s: float) -> float:
    """Time (s) of the routed experts' fused MoE kernels of one forward pass on one GPU.

    ``M = smooth_max(W_e / (eta_moe BW), F_e / (eta_c P), p) + L_moe (t_moe_layer + n t_moe_expert)``
    with the card's ``moe_bandwidth_efficiency`` (eta_moe; ``bandwidth_efficiency`` when unset),
    ``compute_efficiency``, ``gemm_transition_exponent``, ``moe_layer_overhead_s`` (t_moe_layer) and
    ``moe_expert_overhead_s`` (t_moe_expert): the touched experts' weights against the MoE kernel's
    bandwidth, their FLOPs against the compute line, a fixed cost per MoE layer (routing, sort and
    alignment, activation, reduction: beyond the two grouped GEMMs' ``gemm_launch_s``, which the step time
    counts with the layer's other GEMMs) and one per touched expert (each is its own small GEMM). The H100-class values were fitted to vLLM's ``benchmark_moe.py`` kernel times
    (``docs/reference/moe-kernels/``, ``experiments/calibration/fit_moe_kernels.py``) over 1-128 tokens,
    the memory-bound range of decode and verify steps.

    Args:
        hardware: a :class:`servesim.cards.HardwareCard`.
        expert_bytes: bytes of the touched experts' weights read (per GPU, all MoE layers).
        flops: FLOPs of the routed experts (per GPU, all MoE layers).
        experts_touched: distinct experts touched per MoE layer (see :func:`expert_coverage`).
        num_moe_layers: layers with routed experts (L_moe).
        peak_flops_per_s: the dense tensor peak for the compute type (FLOP/s).
    """
    bw = hardware.resolved_moe_bandwidth_efficiency * hardware.memory_bandwidth_bytes_per_s
    memory = expert_bytes / bw
    compute = flops / (hardware.compute_efficiency * peak_flops_per_s)
    overheads = num_moe_layers * (hardware.moe_layer_overhead_s + experts_touched * hardware.moe_expert_overhead_s)
    return smooth_max(memory, compute, hardware.gemm_transition_exponent) + overheads


def expert_coverage(model, num_tokens: float) -> float:
    """Distinct routed experts touched per MoE layer by a pass over ``num_tokens`` tokens (0 if dense).

    Each token picks ``k = num_experts_per_tok`` of ``E = num_experts`` experts; with routing independent
    and uniform across tokens an expert is missed by all ``T`` tokens with probability ``(1 - k/E)^T``, so
    the expected number touched is ``E (1 - (1 - k/E)^T)`` (the occupancy problem, "balls into bins":
    Feller, An Introduction to Probability Theory and Its Applications, vol. 1, 3rd ed., 1968, ch. II.11
    and IV.2). It is below the upper bound ``min(T k, E)`` whenever two tokens share an expert: 28.7 of
    128 for a batch of 8 gpt-oss tokens (bound 32), 92 for a verify step of 8 x 5 tokens (bound 128).
    Routing is in fact correlated within a request's consecutive tokens (Liang et al., "Not All Models
    Suit Expert Offloading: On Local Routing Consistency of Mixture-of-Expert Models", arXiv 2505.16056,
    2025, measure it for 20 MoE models), which would make verify steps touch fewer experts still; no
    published coverage measurement for the served models was found, so the uniform expectation is used.
    vLLM's ``benchmark_moe.py`` draws random router logits, i.e. uniform routing, which is what the MoE
    kernel fields were fitted with.
    """
    return model.num_active_experts(num_tokens, expected=True)


def elementwise_time_s(hardware, bytes_moved: float, num_ops: float) -> float:
    """Time (s) of ``num_ops`` memory-bound non-GEMM kernels moving ``bytes_moved`` bytes on one GPU:
    ``num_ops * elementwise_launch_s + bytes / (elementwise_bandwidth_efficiency * BW)``."""
    bw = hardware.elementwise_bandwidth_efficiency * hardware.memory_bandwidth_bytes_per_s
    return num_ops * hardware.elementwise_launch_s + bytes_moved / bw


def elementwise_bytes_per_token(hidden_size: int, q_heads: int, kv_heads: int, head_dim: int,
                                mlp_width: float, tensor_parallel_size: int, act_bytes: int = 2,
                                gated_mlp: bool = True) -> float:
    """Bytes one token moves per decoder layer through the non-GEMM operators, per GPU.

    Two RMSNorms (read and write ``D``: ``2 x 2 D b``), the residual add (read ``2 D``, write ``D``:
    ``3 D b``), both on the full width on every TP rank; rotary embedding on this rank's q and k heads (read
    and write: ``2 (H_q + H_kv) d b / TP``); the activation (gated: read ``2 F``, write ``F``; else read and
    write ``F``: ``3 F b / TP`` or ``2 F b / TP``), ``b`` bytes per activation element (bf16: 2).
    """
    tp = tensor_parallel_size
    full = (4 * hidden_size + 3 * hidden_size) * act_bytes
    rope = 2 * (q_heads + kv_heads) * head_dim * act_bytes / tp
    act = (3 if gated_mlp else 2) * mlp_width * act_bytes / tp
    return full + rope + act


@dataclass(slots=True)
class StepTimeModel:
    """Step-time model for one model on one tensor-parallel group, in integer sub-picoseconds.

    Build it with :func:`build_step_time_model`. Call :meth:`step_subps` for any step, or use
    ``base_subps(T, n_logits, R)`` plus the linear coefficients for runs of decode steps. Durations and
    coefficients are integers of ``2^-16`` ps (:data:`SUBPS_PER_PS`; see the module's "Exactness").

    Attributes:
        mode: ``"calibrated"`` or ``"ideal"``.
        kv_subps_per_token: time to read one context token's KV cache, per GPU (2^-16 ps per token).
        attn_subps_per_pair: time of the attention FLOPs of one (query, key) pair (2^-16 ps per pair).
        decode_subps_per_token: ``kv_subps_per_token + attn_subps_per_pair``: the growth of a decode step's
            time per context token (a decode token attends over its context once).
        request_subps_per_request: ``per_request_s`` of the card (2^-16 ps per scheduled request).
        coefficient_rounding_errors: relative error of each integer coefficient against its exact value
            (``"kv"``, ``"attention"``, ``"request"``; 0 for a zero coefficient).
        coefficient_rounding_error: the largest of them.
    """

    mode: str
    context_free_s: object  # callable (tokens, logits) -> seconds without the per-request term
    linear_s_per_token: float
    lm_head_s_per_logit: float
    weight_read_s: object  # callable T -> seconds for the weight read at the effective bandwidth
    kv_subps_per_token: int
    attn_subps_per_pair: int
    request_subps_per_request: int = 0
    coefficient_rounding_errors: dict = field(default_factory=dict)
    _base_cache: dict = field(default_factory=dict, repr=False)

    @property
    def decode_subps_per_token(self) -> int:
        return self.kv_subps_per_token + self.attn_subps_per_pair

    @property
    def coefficient_rounding_error(self) -> float:
        return max(self.coefficient_rounding_errors.values(), default=0.0)

    @property
    def kv_ps_per_token(self) -> float:
        """The KV coefficient in ps per token (exactly the integer coefficient, as a float)."""
        return self.kv_subps_per_token / SUBPS_PER_PS

    @property
    def attn_ps_per_pair(self) -> float:
        """The attention coefficient in ps per (query, key) pair (the integer coefficient, as a float)."""
        return self.attn_subps_per_pair / SUBPS_PER_PS

    def base_s(self, num_tokens: int, num_logits: int, num_requests: int) -> float:
        """Step time without the context-dependent terms (s): everything but the KV read and attention
        FLOPs, for ``num_tokens`` scheduled tokens, ``num_logits`` logit positions and ``num_requests``
        scheduled requests (see :meth:`base_subps`)."""
        return self.base_subps(num_tokens, num_logits, num_requests) / SUBPS_PER_S

    def tokens_subps(self, num_tokens: int, num_logits: int) -> int:
        """The part of :meth:`base_subps` that depends on tokens and logits only (integer 2^-16 ps, cached)."""
        key = (num_tokens, num_logits)
        v = self._base_cache.get(key)
        if v is None:
            v = round(self.context_free_s(num_tokens, num_logits) * SUBPS_PER_S)
            self._base_cache[key] = v
        return v

    def base_subps(self, num_tokens: int, num_logits: int, num_requests: int) -> int:
        """Context-free step time (integer 2^-16 ps): ``tokens_subps(T, n_logits) + request_subps_per_request * R``."""
        v = self._base_cache.get((num_tokens, num_logits))  # the engine's hot path: no second call on a hit
        if v is None:
            v = self.tokens_subps(num_tokens, num_logits)
        return v + self.request_subps_per_request * num_requests

    def step_subps(self, num_tokens: int, num_logits: int, kv_tokens: int, attn_pairs: int,
                   num_requests: int = 0) -> int:
        """Duration of one step (integer 2^-16 ps).

        Args:
            num_tokens: tokens scheduled in the step (T).
            num_logits: positions whose logits are computed (sampling requests, 1 + k when verifying).
            kv_tokens: sum over scheduled requests of the tokens attended over (context incl. new).
            attn_pairs: sum over scheduled requests of causal (query, key) pairs.
            num_requests: requests scheduled in the step (R; the engine always passes it, 0 leaves out
                the per-request term).
        """
        # base_subps inline (the engine's hot path: one call per step; integer sums, so the same value)
        v = self._base_cache.get((num_tokens, num_logits))
        if v is None:
            v = self.tokens_subps(num_tokens, num_logits)
        return (v + self.request_subps_per_request * num_requests + self.kv_subps_per_token * kv_tokens
                + self.attn_subps_per_pair * attn_pairs)

    def step_s(self, num_tokens: int, num_logits: int, kv_tokens: int, attn_pairs: int, num_requests: int = 0) -> float:
        """Duration of one step in seconds (see :meth:`step_subps`)."""
        return self.step_subps(num_tokens, num_logits, kv_tokens, attn_pairs, num_requests) / SUBPS_PER_S

    def compute_bound_tokens(self) -> float:
        """Tokens per step above which the linear layers' compute line passes the weight read (dense)."""
        per_token = self.linear_s_per_token + self.lm_head_s_per_logit
        return self.weight_read_s(1) / per_token if per_token > 0 else math.inf


#: Largest step-time coefficient (2^-16 ps per token, pair or request): 2^46 ps (about 70 s, the longest
#: engine step, ``servesim.wiring.MAX_STEP_S``) for a single unit.
MAX_COEFFICIENT_SUBPS = float(2**46 * SUBPS_PER_PS)


def subps_coefficient(exact_subps: float, what: str = "step-time") -> tuple[int, float]:
    """An integer coefficient (2^-16 ps per unit) from its exact value, and its relative rounding error.

    A positive coefficient is at least 1 (a cost never rounds to nothing); 0 stays 0 with error 0.

    Raises:
        SettingError: the coefficient is infinite, NaN or above :data:`MAX_COEFFICIENT_SUBPS` (a bandwidth
            or peak FLOP/s near zero on a card), named by ``what``.
    """
    if not exact_subps <= MAX_COEFFICIENT_SUBPS:
        from servesim.errors import SettingError

        raise SettingError(
            f"roofline: the {what} is {exact_subps / SUBPS_PER_PS / 1e12:.3g} s with these step-time settings "
            "(memory_bandwidth_bytes_per_s, peak_flops_per_s and the efficiencies of the hardware card or "
            f"roofline); servesim's steps take at most {MAX_COEFFICIENT_SUBPS / SUBPS_PER_PS / 1e12:.3g} s"
        )
    if exact_subps <= 0:
        return 0, 0.0
    value = max(1, round(exact_subps))
    return value, abs(value - exact_subps) / exact_subps


def compute_dtype(model, hardware) -> str:
    """The tensor-core dtype a model's matmuls run in on this GPU: its weight dtype if the GPU has a peak for
    it (fp8 on Hopper), else bf16 (e.g. fp8 weights on an A100 are dequantised to bf16).

    Raises:
        SettingError: 16-bit weights on a card that lists neither a bf16 nor an fp16 peak.
    """
    dtype = str(getattr(model, "weight_dtype", "bf16")).lower()
    peaks = hardware.peak_flops_per_s
    if dtype in peaks:
        return dtype
    if dtype in ("fp16", "bf16"):
        if "bf16" not in peaks and "fp16" not in peaks:
            from servesim.errors import SettingError

            raise SettingError(
                f"hardware: {hardware.name} lists no bf16 or fp16 peak in peak_flops_per_s (has "
                f"{', '.join(sorted(peaks))}), which the {dtype} weights of model {getattr(model, 'name', '?')} "
                "need: add one to the card, or give the model weights of a type it lists",
                depends_on=("model",),
            )
        return "bf16" if "bf16" in peaks else "fp16"
    return "bf16" if "bf16" in peaks else next(iter(peaks))


def _lm_head_and_embedding_bytes(model) -> tuple[float, float]:
    """(bytes of the lm_head GEMM's weights, bytes of embedding + untied lm_head inside weight_bytes_read)."""
    if model.is_explicit:
        return 0.0, 0.0
    from servesim.cards.dtypes import bytes_per_element

    emb_b = bytes_per_element(model.resolved_embedding_dtype)
    pc = model.param_counts
    return float(model.vocab_size) * float(model.hidden_size) * emb_b, (pc.input_embedding + pc.lm_head) * emb_b


def _model_elementwise_bytes(model, tp: int) -> float:
    """Non-GEMM bytes per token and layer (see :func:`elementwise_bytes_per_token`); 0 for explicit cards."""
    if model.is_explicit:
        return 0.0
    if model.num_experts:
        width = model.resolved_moe_intermediate_size * (model.num_experts_per_tok + model.num_shared_experts)
    else:
        width = float(model.intermediate_size or 0)
    return elementwise_bytes_per_token(int(model.hidden_size), int(model.num_attention_heads),
                                       int(model.num_key_value_heads or model.num_attention_heads),
                                       int(model.resolved_head_dim), width, tp)


def build_step_time_model(
    hardware,
    model,
    tensor_parallel_size: int = 1,
    mode: Literal["calibrated", "ideal"] = "calibrated",
    speculative: bool = False,
    step_overhead: bool = True,
) -> StepTimeModel:
    """Build the step-time model of ``model`` served on ``tensor_parallel_size`` GPUs of ``hardware``.

    Args:
        hardware: a :class:`servesim.cards.HardwareCard` (bandwidth in B/s, peaks in FLOP/s, efficiency
            factors, launch and overhead times in s).
        model: a :class:`servesim.cards.ModelCard` (weight bytes, FLOPs per token, KV bytes per token).
        tensor_parallel_size: TP degree; weights, KV and FLOPs are split evenly over the TP GPUs.
        mode: ``"calibrated"`` (the formula of this module) or ``"ideal"`` (the seed lesson's Example 12).
        speculative: the engine verifies drafts: add the rejection sampler's passes per logit position.
        step_overhead: include ``step_overhead_s`` and ``per_request_s`` (False for a drafter's passes,
            which run inside the target's engine step).

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
    f_lin = float(model.linear_flops_per_token) / tp
    f_lm = float(model.lm_head_flops_per_token) / tp
    if mode == "ideal":
        def weight_read_s(num_tokens, _m=model, _tp=tp, _bw=bw):
            return _m.weight_bytes_read(num_tokens) / _tp / _bw

        def ideal_s(num_tokens, num_logits, _w=weight_read_s, _l=f_lin / peak, _h=f_lm / peak):
            return max(_w(num_tokens), _l * num_tokens + _h * num_logits)

        return StepTimeModel(mode=mode, context_free_s=ideal_s, linear_s_per_token=f_lin / peak,
                             lm_head_s_per_logit=f_lm / peak, weight_read_s=weight_read_s,
                             kv_subps_per_token=0, attn_subps_per_pair=0)
    eff_bw = float(hardware.bandwidth_efficiency) * bw
    eff_peak = float(hardware.compute_efficiency) * peak
    w_lm, w_outside = _lm_head_and_embedding_bytes(model)
    w_lm /= tp
    layers = int(getattr(model, "num_hidden_layers", 0) or 0)
    n_gemm = GEMMS_PER_LAYER * layers if layers else 1
    ew_bytes = _model_elementwise_bytes(model, tp) * layers
    ew_fixed = elementwise_time_s(hardware, 0.0, ELEMENTWISE_OPS_PER_LAYER * layers) if layers else 0.0
    ew_per_token = ew_bytes / (float(hardware.elementwise_bandwidth_efficiency) * bw)
    vocab = float(getattr(model, "vocab_size", 0) or 0)
    passes = float(hardware.sampler_passes_per_logit)
    if speculative:
        passes += float(hardware.rejection_sampler_passes_per_logit)
    sampler_per_logit = vocab * LOGIT_BYTES * passes / eff_bw
    overhead = float(hardware.step_overhead_s) if step_overhead else 0.0
    per_request = float(hardware.per_request_s) if step_overhead else 0.0
    if tp > 1:
        link = hardware.interconnect_bandwidth_bytes_per_s
        if not link:
            link = PCIE_LINK_BYTES_PER_S  # the card names no scale-up link
        per_direction = float(link) / 2.0 * float(hardware.interconnect_efficiency)
        hidden = int(getattr(model, "hidden_size", 0) or 0)
        act_bytes = 2  # bf16 activations
        ar_fixed = 2 * layers * float(hardware.allreduce_latency_s)
        ar_per_token = 2 * layers * 2 * (tp - 1) / tp * hidden * act_bytes / per_direction
    else:
        ar_fixed = ar_per_token = 0.0

    p = float(hardware.gemm_transition_exponent)
    launch = float(hardware.gemm_launch_s)
    inv_bw, inv_peak = 1.0 / eff_bw, 1.0 / eff_peak
    kv_bw = float(hardware.attention_bandwidth_efficiency) * bw
    per_token = ew_per_token + ar_per_token
    sliding_per_request = 0.0
    if not model.is_explicit and model.sliding_window_layers:
        # sliding-window layers: each new token attends min(position + 1, W) keys and a request's step reads
        # min(ctx, W) tokens of their KV; W is the bound (exact once ctx >= W, i.e. every decode step after
        # a prompt of W tokens), which keeps both terms constant over a run of identical decode steps
        window = float(model.sliding_window)
        per_token += window * float(model.attention_flops_per_pair_sliding) / tp * inv_peak
        sliding_per_request = window * model.kv_bytes_per_token_sliding_per_gpu(tp) / kv_bw
    lm_memory = w_lm * inv_bw
    moe = model.is_moe and not model.is_explicit

    if not moe:
        def linear_bytes(num_tokens, _m=model, _tp=tp, _out=w_outside):
            return (_m.weight_bytes_read(num_tokens) - _out) / _tp

        def weight_read_s(num_tokens, _lb=linear_bytes, _lm=w_lm, _bw=eff_bw):
            return (_lb(num_tokens) + _lm) / _bw

        fixed = ew_fixed + ar_fixed + n_gemm * launch
        # without routed experts a pass reads the same weight bytes at every token count (weight_bytes_read)
        same_bytes = linear_bytes(1) if not model.num_experts else None

        # the time's part that depends on the tokens alone and the lm_head's part, each memoised by its own
        # count: the sum is the same floating-point operations in the same order as without the memos, so the
        # same bits, and a (tokens, logits) pair not seen before (most of a run's mixed steps) costs two
        # lookups instead of two smooth maxima
        by_tokens: dict[int, float] = {}
        by_logits: dict[int, float] = {}

        def context_free_s(num_tokens, num_logits):
            # gemm_time_s and elementwise_time_s with the card's fields read once (the same arithmetic)
            t = by_tokens.get(num_tokens)
            if t is None:
                t = overhead
                if num_tokens:
                    read = same_bytes if same_bytes is not None else linear_bytes(num_tokens)
                    t += smooth_max(read * inv_bw, f_lin * num_tokens * inv_peak, p)
                    t += fixed + per_token * num_tokens
                by_tokens[num_tokens] = t
            if num_logits and (w_lm or f_lm):
                lm = by_logits.get(num_logits)
                if lm is None:
                    lm = (smooth_max(lm_memory, f_lm * num_logits * inv_peak, p) + launch
                          + sampler_per_logit * num_logits)
                    by_logits[num_logits] = lm
                t += lm
            return t
    else:
        # MoE: the routed experts run in fused MoE kernels (moe_time_s) over the experts the pass touches
        # (expert_coverage); the rest (attention, dense and shared MLPs, router) are GEMMs as above
        pc = model.param_counts
        num_experts, moe_layers = float(model.num_experts), int(model.num_moe_layers)
        f_experts = 2.0 * pc.routed_experts_matmul * model.num_experts_per_tok / num_experts / tp
        f_dense = f_lin - f_experts
        dense_bytes = (float(model.non_expert_weight_bytes) - w_outside) / tp
        bytes_per_expert = float(model.routed_expert_weight_bytes) / num_experts / tp  # one expert, all MoE layers
        inv_moe_bw = 1.0 / (float(hardware.resolved_moe_bandwidth_efficiency) * bw)
        moe_layer = moe_layers * float(hardware.moe_layer_overhead_s)
        moe_expert = moe_layers * float(hardware.moe_expert_overhead_s)
        # GEMM launches: GEMMS_PER_LAYER counts the fused MoE kernel's two grouped GEMMs per layer; each MoE
        # layer adds its router GEMM and, when it has shared experts, their two GEMMs
        moe_gemms = moe_layers * (1 + (2 if model.num_shared_experts else 0))
        fixed = ew_fixed + ar_fixed + (n_gemm + moe_gemms) * launch

        def weight_read_s(num_tokens, _m=model, _lm=w_lm):
            experts = bytes_per_expert * expert_coverage(_m, num_tokens)
            return (dense_bytes + _lm) * inv_bw + experts * inv_moe_bw

        def context_free_s(num_tokens, num_logits, _m=model):
            # moe_time_s with the card's fields read once (the same arithmetic)
            t = overhead
            if num_tokens:
                touched = expert_coverage(_m, num_tokens)
                t += smooth_max(dense_bytes * inv_bw, f_dense * num_tokens * inv_peak, p)
                t += smooth_max(bytes_per_expert * touched * inv_moe_bw, f_experts * num_tokens * inv_peak, p)
                t += moe_layer + moe_expert * touched
                t += fixed + per_token * num_tokens
            if num_logits and (w_lm or f_lm):
                t += smooth_max(lm_memory, f_lm * num_logits * inv_peak, p) + launch + sampler_per_logit * num_logits
            return t

    kv, kv_err = subps_coefficient(model.kv_bytes_per_token_per_gpu(tp) / kv_bw * SUBPS_PER_S,
                                   "KV-cache read time per context token")
    attn, attn_err = subps_coefficient(float(model.attention_flops_per_pair) / tp / eff_peak * SUBPS_PER_S,
                                       "attention time per (query, key) pair")
    request, request_err = subps_coefficient((per_request + sliding_per_request) * SUBPS_PER_S,
                                             "time per scheduled request")
    return StepTimeModel(
        mode=mode,
        context_free_s=context_free_s,
        linear_s_per_token=f_lin / eff_peak,
        lm_head_s_per_logit=f_lm / eff_peak,
        weight_read_s=weight_read_s,
        kv_subps_per_token=kv,
        attn_subps_per_pair=attn,
        request_subps_per_request=request,
        coefficient_rounding_errors={"kv": kv_err, "attention": attn_err, "request": request_err},
    )
