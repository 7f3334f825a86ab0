"""Fit the H100 card's MoE kernel fields to vLLM's fused-MoE kernel times on an H100.

Reads ``docs/reference/moe-kernels/h100_fused_moe.csv`` (vLLM ``benchmarks/kernels/benchmark_moe.py`` runs
published in vLLM pull requests, see its SOURCES.md: one MoE layer's ``fused_moe`` call, CUDA graphs,
random router logits, i.e. uniform routing) and fits

* ``moe_bandwidth_efficiency``, ``moe_layer_overhead_s`` and ``moe_expert_overhead_s`` of
  :func:`servesim.roofline.moe_time_s`,

with the H100 card's ``compute_efficiency``, ``gemm_transition_exponent`` and ``gemm_launch_s`` (two
grouped GEMMs per layer) held at their dense kernel-profile fit, and the experts touched from
:func:`servesim.roofline.expert_coverage` (uniform routing, as the benchmark draws it). Least squares of
the log of predicted / measured over the points with at most ``FIT_MAX_TOKENS`` tokens: the memory-bound
range where decode and verify steps live. Above it the fused MoE kernels' compute efficiency varies with
the expert shape (the small Qwen3-30B-A3B experts reach a third of what the 7168-wide Mixtral ones do), which
one compute efficiency cannot describe; the script prints those errors too. The values in
``hardware/gpus/h100-sxm.yaml`` (and the other H100-class cards) come from this run:

    python experiments/calibration/fit_moe_kernels.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from servesim.cards import ModelCard, load_hardware  # noqa: E402
from servesim.cards.dtypes import bytes_per_element  # noqa: E402
from servesim.roofline import expert_coverage, moe_time_s  # noqa: E402

DATA = ROOT / "docs" / "reference" / "moe-kernels" / "h100_fused_moe.csv"
FIT_MAX_TOKENS = 128
GROUPED_GEMMS_PER_LAYER = 2  # gate+up and down, each one grouped GEMM over the touched experts


def layer_card(row) -> ModelCard:
    """A one-layer card with the benchmark's expert shape (only the MoE fields are used)."""
    return ModelCard(name=str(row["shape"]), num_hidden_layers=1, hidden_size=int(row["hidden_size"]),
                     intermediate_size=int(row["intermediate_size"]), num_attention_heads=1,
                     num_key_value_heads=1, vocab_size=1, num_experts=int(row["num_experts"]),
                     num_experts_per_tok=int(row["top_k"]), max_model_len=1)


def predict_s(hardware, row) -> float:
    """Predicted time (s) of one benchmark row: moe_time_s of one layer plus its grouped GEMMs' launches."""
    card = layer_card(row)
    tokens = float(row["num_tokens"])
    touched = expert_coverage(card, tokens)
    params = 3.0 * float(row["hidden_size"]) * float(row["intermediate_size"])  # gated expert: w13 + w2
    dtype = str(row["weight_dtype"])
    peak = hardware.peak_flops(dtype)
    flops = 2.0 * tokens * float(row["top_k"]) * params
    return (moe_time_s(hardware, touched * params * bytes_per_element(dtype), flops, touched, 1, peak)
            + GROUPED_GEMMS_PER_LAYER * hardware.gemm_launch_s)


def with_fields(hardware, values):
    eta, layer_us, expert_us = values
    return hardware.model_copy(update={"moe_bandwidth_efficiency": float(eta),
                                       "moe_layer_overhead_s": float(layer_us) * 1e-6,
                                       "moe_expert_overhead_s": float(expert_us) * 1e-6})


def relative_errors(hardware, data: pd.DataFrame) -> np.ndarray:
    """predicted / measured - 1 for every row of ``data``."""
    pred = np.array([predict_s(hardware, row) for _, row in data.iterrows()])
    return pred / (data["kernel_time_us"].to_numpy() * 1e-6) - 1.0


def fit(hardware, data: pd.DataFrame) -> tuple[float, float, float]:
    """(moe_bandwidth_efficiency, moe_layer_overhead_s, moe_expert_overhead_s) fitted to ``data``."""
    sel = data[data["num_tokens"] <= FIT_MAX_TOKENS]

    def residuals(values):
        return np.log1p(relative_errors(with_fields(hardware, values), sel))

    res = least_squares(residuals, [0.8, 20.0, 0.5], bounds=([0.1, 0.0, 0.0], [1.0, 500.0, 50.0]))
    eta, layer_us, expert_us = res.x
    return float(eta), float(layer_us) * 1e-6, float(expert_us) * 1e-6


def main() -> None:
    data = pd.read_csv(DATA)
    hardware = load_hardware("h100-sxm")
    eta, layer_s, expert_s = fit(hardware, data)
    print(f"moe_bandwidth_efficiency: {eta:.3f}")
    print(f"moe_layer_overhead_s: {layer_s:.3e}")
    print(f"moe_expert_overhead_s: {expert_s:.3e}")
    fitted = with_fields(hardware, (eta, layer_s * 1e6, expert_s * 1e6))
    errors = relative_errors(fitted, data)
    for shape, group in data.groupby("shape", sort=False):
        e = errors[group.index.to_numpy()]
        cells = " ".join(f"{int(t)}:{x * 100:+.0f}%" for t, x in zip(group["num_tokens"], e))
        print(f"{shape}: {cells}")
    inside = data["num_tokens"].to_numpy() <= FIT_MAX_TOKENS
    print(f"fit range (<= {FIT_MAX_TOKENS} tokens): max |error| {np.abs(errors[inside]).max() * 100:.1f}%")


if __name__ == "__main__":
    main()
