"""Hardware card: one accelerator's vendor peaks and servesim's calibration factors.

The peaks are the vendor's DENSE numbers (no 2:4 sparsity) at boost clock, from
``docs/reference/gpus.csv`` (NVIDIA, AMD and Intel datasheets; see ``hardware/README.md``). What a
real server reaches is modelled by separate, named calibration fields, never folded into the peaks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from servesim.input_models import InputModel, number_value
from servesim.errors import ConfigError

#: Compute types a card may list a peak for.
ComputeDtype = Literal["bf16", "fp16", "fp8", "int8"]

_GIB = 2**30

#: The least value of a card field in its base unit, the unit and an example: below it, the value was written
#: in the datasheet's unit (GB, TB/s, TFLOP/s). No accelerator has less than 100 MB, 1 GB/s or 1 GFLOP/s.
_BASE_UNITS = {
    "memory_bytes": (1e8, "bytes", "vendor GB x 1e9: 80 GB is 8.0e+10"),
    "memory_bandwidth_bytes_per_s": (1e9, "bytes/s", "3.35 TB/s is 3.35e+12"),
    "peak_flops_per_s": (1e9, "FLOP/s", "989.5 TFLOP/s is 9.895e+14"),
}


def vllm_default_scheduler_limits(name: str, memory_bytes: float) -> tuple[int, int]:
    """vLLM's OpenAI-API-server defaults ``(max_num_batched_tokens, max_num_seqs)`` for one GPU.

    Rule (``vllm/engine/arg_utils.py``, summarised in ``docs/reference/vllm-semantics.md``):
    >= 160 GiB of device memory (B200, MI300X, MI325X): 16384 / 1024; >= 70 GiB and not an A100 (H100,
    H200, Gaudi 3): 8192 / 1024; otherwise (A100, L40S, L4 and smaller): 2048 / 256.

    Args:
        name: the GPU's display name (only checked for "A100").
        memory_bytes: device memory in bytes.
    """
    gib = memory_bytes / _GIB
    if gib >= 160:
        return 16384, 1024
    if gib >= 70 and "a100" not in name.lower():
        return 8192, 1024
    return 2048, 256


class HardwareCard(InputModel):
    """One accelerator (a single GPU): vendor peaks plus calibration factors.

    All quantities are per GPU, in bytes, bytes/s, FLOP/s and seconds.

    Raises (on validation):
        pydantic.ValidationError: a missing or out-of-range field (wrapped into a one-line ``ConfigError``
        by :func:`servesim.input_files.validate`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Display name, e.g. 'H100 SXM'.")
    vendor: str = Field(description="NVIDIA, AMD, Intel, ...")
    memory_bytes: float = Field(gt=0, description="Device memory in bytes (vendor GB x 1e9).")
    memory_bandwidth_bytes_per_s: float = Field(gt=0, description="Peak HBM/GDDR bandwidth in bytes/s.")
    peak_flops_per_s: dict[ComputeDtype, Annotated[float, Field(gt=0)]] = Field(
        min_length=1,
        description="Dense (no 2:4 sparsity) tensor-core peak FLOP/s (OP/s for int8) per compute type; "
        "types the GPU does not support are absent (no fp8 on A100).",
    )
    interconnect_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Scale-up link (NVLink, Infinity Fabric, RoCE) bandwidth in bytes/s, the BIDIRECTIONAL "
        "total as the vendor states it (per direction is half: NVLink 4's 900e9 is 450e9 each way). None: "
        "no scale-up link (L40S, L4); a tensor-parallel group then all-reduces over PCIe Gen4 x16, 64e9 "
        "bidirectional (servesim.roofline.PCIE_LINK_BYTES_PER_S).",
    )
    bandwidth_efficiency: float = Field(
        default=0.80,
        gt=0,
        le=1,
        description="Share of peak memory bandwidth reached reading the weights in the GEMMs (memory roof of "
        "the smooth maximum, with gemm_launch_s per kernel), fitted per GPU class to Vidur's GEMM profiles "
        "(docs/reference/kernel-profiles/); also the sampler's bandwidth.",
    )
    attention_bandwidth_efficiency: float = Field(
        default=0.80,
        gt=0,
        le=1,
        description="Share of peak memory bandwidth reached reading the KV cache in attention (decode, verify "
        "and prefill chunks). No attention profiles were available; 0.80 is the middle of the 0.63-0.86 that "
        "memory-bound kernels reach in Vidur's H100 profiles (docs/reference/roofline.md).",
    )
    compute_efficiency: float = Field(
        default=0.70,
        gt=0,
        le=1,
        description="Share of peak FLOP/s reached by GEMMs (compute roof of the smooth maximum) and attention, "
        "fitted per GPU class to Vidur's GEMM profiles (docs/reference/kernel-profiles/).",
    )
    step_overhead_s: float = Field(
        default=1.72e-3,
        ge=0,
        description="Per-step CPU/engine overhead in seconds, fitted so that Llama-3.1-8B BF16 on an H100 SXM "
        "decodes at vLLM's measured 133 tok/s at batch 1 (PR 16937; experiments/calibration/"
        "fit_batch1_overheads.py) once the kernel-profile step time (5.8 ms at a 225-token context) is in; "
        "vLLM V1 blog: 1-1.5 ms of CPU overhead per step. Same value on other GPUs (no better source).",
    )
    gemm_transition_exponent: float = Field(
        default=1.232,
        ge=1,
        le=16,
        description="p of the smooth maximum ((W/(eta_bw BW))^p + (F/(eta_c P))^p)^(1/p) that gives a group of "
        "GEMMs its time between the memory floor and the compute line (1: their sum; large: their max). "
        "Fitted per GPU class to Vidur's GEMM profiles (docs/reference/kernel-profiles/, "
        "experiments/calibration/fit_kernel_profiles.py); default: the H100 fit.",
    )
    gemm_launch_s: float = Field(
        default=6.89e-6,
        ge=0,
        description="Fixed time per GEMM kernel in seconds (launch, ramp-up and tail of a wave), fitted with "
        "the three other GEMM fields; default: the H100 fit.",
    )
    elementwise_bandwidth_efficiency: float = Field(
        default=0.583,
        gt=0,
        le=1,
        description="Share of peak memory bandwidth reached by the non-GEMM per-token operators (RMSNorm, "
        "rotary, activation, residual add), fitted to Vidur's profiles of them; default: the H100 fit.",
    )
    elementwise_launch_s: float = Field(
        default=2.50e-6,
        ge=0,
        description="Fixed time per non-GEMM kernel in seconds (5 per decoder layer), fitted with "
        "elementwise_bandwidth_efficiency; default: the H100 fit.",
    )
    moe_bandwidth_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Share of peak memory bandwidth reached reading the routed experts' weights in a fused "
        "MoE kernel (the memory roof of the expert GEMMs; servesim.roofline.moe_time_s). None: "
        "bandwidth_efficiency (no MoE kernel measurement for this GPU). H100 class: fitted to vLLM's "
        "benchmark_moe.py kernel times on an H100 (docs/reference/moe-kernels/, "
        "experiments/calibration/fit_moe_kernels.py).",
    )
    moe_layer_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Fixed time per MoE layer and step in seconds: the fused MoE kernel's routing (top-k, "
        "token sort and alignment), activation and reduction kernels, beyond the two grouped GEMMs' "
        "gemm_launch_s; fitted with moe_bandwidth_efficiency; 0 when no MoE kernel measurement exists for "
        "this GPU.",
    )
    moe_expert_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Fixed time per routed expert touched, per MoE layer and step, in seconds: each touched "
        "expert is its own small GEMM tile group (pipeline ramp-up and tail of a few rows), fitted with "
        "moe_bandwidth_efficiency; 0 when no MoE kernel measurement exists for this GPU.",
    )
    sampler_passes_per_logit: float = Field(
        default=4.0,
        ge=0,
        description="Full passes over one logit position's fp32 logits (vocab x 4 bytes) by the lm_head output "
        "and vLLM's sampler (v1/sample/sampler.py: write, temperature, log-softmax/softmax, argmax or "
        "sample), at bandwidth_efficiency.",
    )
    rejection_sampler_passes_per_logit: float = Field(
        default=3.0,
        ge=0,
        description="Extra passes per verified position of vLLM's rejection sampler "
        "(v1/sample/rejection_sampler.py: target probabilities, acceptance test, recovered distribution).",
    )
    per_request_s: float = Field(
        default=0.0,
        ge=0,
        description="CPU time per scheduled request and step in seconds (input preparation, attention metadata, "
        "detokenisation), fitted to small-batch decode steps (experiments/calibration/).",
    )
    interconnect_efficiency: float = Field(
        default=0.70,
        gt=0,
        le=1,
        description="Share of the per-direction interconnect bandwidth reached by all-reduce.",
    )
    allreduce_latency_s: float = Field(
        default=10e-6, ge=0, description="Fixed latency of one all-reduce in seconds."
    )
    default_max_num_batched_tokens: int = Field(
        gt=0,
        description="vLLM OpenAI API server's default token budget per step on this GPU "
        "(filled from vllm_default_scheduler_limits when absent).",
    )
    default_max_num_seqs: int = Field(
        gt=0,
        description="vLLM OpenAI API server's default max running requests on this GPU "
        "(filled from vllm_default_scheduler_limits when absent).",
    )
    source: str = Field(default="", description="Where the numbers come from.")

    @field_validator("memory_bytes", "memory_bandwidth_bytes_per_s", "peak_flops_per_s")
    @classmethod
    def _in_base_units(cls, value: Any, info: Any) -> Any:
        # a card written in the datasheet's units (80 GB, 3.35 TB/s, 989.5 TFLOP/s) passed as bytes and FLOP/s
        # and ended in "does not fit ... in 0.92 x 0.0 GB" or a step-time overflow naming no field of the card
        least, unit, example = _BASE_UNITS[info.field_name]
        expected = f"expected {unit}, at least {least:g} ({example})"
        if not isinstance(value, dict):
            if value < least:
                raise ValueError(expected)
            return value
        for dtype, peak in value.items():  # the message names the entry (the formatter shows no mapping)
            if peak < least:
                raise ValueError(f"{dtype}: {expected} (got {peak!r})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _fill_vllm_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and (
            "default_max_num_batched_tokens" not in data or "default_max_num_seqs" not in data
        ):
            mem = number_value(data.get("memory_bytes"))  # 80e9 is a string to YAML 1.1, a number to the card
            if mem is not None and mem > 0:
                tokens, seqs = vllm_default_scheduler_limits(str(data.get("name", "")), mem)
                data = {
                    "default_max_num_batched_tokens": tokens,
                    "default_max_num_seqs": seqs,
                    **data,
                }
        return data

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for compute type ``dtype`` (``bf16``, ``fp16``, ``fp8``, ``int8``).

        Raises:
            ConfigError: the card lists no peak for ``dtype`` (e.g. fp8 on an A100).
        """
        try:
            return self.peak_flops_per_s[dtype]  # type: ignore[index]
        except KeyError:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise ConfigError(
                f"hardware card {self.name!r}: peak_flops_per_s: no entry for {dtype!r} (has {have})"
            ) from None

    @property
    def interconnect_bandwidth_per_direction_bytes_per_s(self) -> float | None:
        """Per-direction scale-up bandwidth in bytes/s (half the bidirectional total), or None."""
        if self.interconnect_bandwidth_bytes_per_s is None:
            return None
        return self.interconnect_bandwidth_bytes_per_s / 2.0

    @property
    def effective_memory_bandwidth_bytes_per_s(self) -> float:
        """``memory_bandwidth_bytes_per_s x bandwidth_efficiency`` in bytes/s."""
        return self.memory_bandwidth_bytes_per_s * self.bandwidth_efficiency

    @property
    def resolved_moe_bandwidth_efficiency(self) -> float:
        """``moe_bandwidth_efficiency``, or ``bandwidth_efficiency`` when the card gives none."""
        if self.moe_bandwidth_efficiency is None:
            return self.bandwidth_efficiency
        return self.moe_bandwidth_efficiency
