"""Fit the hardware cards' GEMM and non-GEMM fields to Vidur's operator profiles, per GPU class.

Reads the repository's copy of the profiles (``docs/reference/kernel-profiles/vidur/compute/<gpu>/``, see
its SOURCES.md) and, for each GPU class (``h100``, ``a100``), fits

* ``bandwidth_efficiency``, ``compute_efficiency``, ``gemm_transition_exponent`` and ``gemm_launch_s`` of
  :func:`servesim.roofline.gemm_time_s` to the four linear GEMMs of one decoder layer (their summed
  median time), and
* ``elementwise_bandwidth_efficiency`` and ``elementwise_launch_s`` of
  :func:`servesim.roofline.elementwise_time_s` to the layer's non-GEMM operators,

over every model, token count (1 to 4096) and TP degree in the files, by least squares of the log of
predicted / measured (every point counts alike; a minimax fit would trade the compute line at large
token counts for the kernel-selection spikes between 200 and 700 tokens). It prints the fitted values and the error range
per model and TP degree. The values in ``hardware/gpus/h100-*.yaml`` / ``a100-*.yaml`` come from this run:

    python experiments/calibration/fit_kernel_profiles.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from servesim.cards import load_hardware  # noqa: E402
from servesim.roofline import (  # noqa: E402
    ELEMENTWISE_OPS_PER_LAYER,
    GEMMS_PER_LAYER,
    elementwise_bytes_per_token,
    elementwise_time_s,
    gemm_time_s,
)

PROFILES = ROOT / "docs" / "reference" / "kernel-profiles" / "vidur" / "compute"
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
CARDS = {"h100": "h100-sxm", "a100": "a100-80gb-sxm"}
MAX_TOKENS = 4096


def load_profiles(gpu: str) -> pd.DataFrame:
    """One row per (model, TP degree, token count): the layer's GEMM and non-GEMM times (s) and shape.

    Columns: ``model, tp, tokens, gemm_s, elementwise_s, elementwise_ops, weight_bytes, flops_per_token,
    elementwise_bytes_per_token`` (per GPU, bf16). Repeated (tokens, TP) rows keep the faster one.
    """
    frames = []
    for path in sorted((PROFILES / gpu).glob("*/*/mlp.csv")):
        d = pd.read_csv(path)
        first = d.iloc[0]
        hidden, heads, kv_heads = int(first.n_embd), int(first.n_head), int(first.n_kv_head)
        ffn, gated = int(first.n_expanded_embd), bool(first.use_gated_mlp)
        head_dim = hidden // heads
        ew_ops = [op for op in ELEMENTWISE if f"time_stats.{op}.median" in d]
        d["gemm_s"] = sum(d[f"time_stats.{op}.median"] for op in GEMMS) * 1e-3
        d["elementwise_s"] = sum(d[f"time_stats.{op}.median"] for op in ew_ops) * 1e-3
        g = (d.groupby(["num_tensor_parallel_workers", "num_tokens"])[["gemm_s", "elementwise_s"]].min()
             .reset_index().rename(columns={"num_tensor_parallel_workers": "tp", "num_tokens": "tokens"}))
        g = g[g.tokens <= MAX_TOKENS].copy()
        params = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + (3 if gated else 2) * hidden * ffn
        g["model"] = path.parent.name
        g["weight_bytes"] = 2.0 * params / g.tp
        g["flops_per_token"] = 2.0 * params / g.tp
        g["elementwise_ops"] = len(ew_ops)
        # phi-2 has one norm (parallel block): drop the second norm's bytes with its operator
        norms_missing = 1 if "post_attention_layernorm" not in ew_ops else 0
        g["elementwise_bytes_per_token"] = [
            elementwise_bytes_per_token(hidden, heads, kv_heads, head_dim, ffn, int(tp), gated_mlp=gated)
            - norms_missing * 4 * hidden for tp in g.tp]
        frames.append(g)
    return pd.concat(frames, ignore_index=True)


def predict_gemm_s(card, table: pd.DataFrame) -> np.ndarray:
    """The card's linear-layer time per layer (s) for every row of :func:`load_profiles`."""
    peak = float(card.peak_flops_per_s["bf16"])
    return np.array([gemm_time_s(card, w, f * t, GEMMS_PER_LAYER, peak)
                     for w, f, t in zip(table.weight_bytes, table.flops_per_token, table.tokens)])


def predict_elementwise_s(card, table: pd.DataFrame) -> np.ndarray:
    """The card's non-GEMM time per layer (s) for every row of :func:`load_profiles`."""
    return np.array([elementwise_time_s(card, b * t, n)
                     for b, t, n in zip(table.elementwise_bytes_per_token, table.tokens, table.elementwise_ops)])


def _fit(card, table, fields, start, predict, measured):
    from scipy.optimize import minimize

    def loss(x):
        if any(v <= 0 for v in x):
            return 1e9
        values = dict(zip(fields, x))
        if values.get("bandwidth_efficiency", 0.5) > 1 or values.get("compute_efficiency", 0.5) > 1 \
                or values.get("elementwise_bandwidth_efficiency", 0.5) > 1 \
                or not 1 <= values.get("gemm_transition_exponent", 2) <= 16:
            return 1e9
        r = np.log(predict(card.model_copy(update=values), table) / measured)
        return float(np.sqrt(np.mean(r ** 2)))

    res = minimize(loss, start, method="Nelder-Mead", options={"maxiter": 3000, "xatol": 1e-5, "fatol": 1e-7})
    return dict(zip(fields, res.x))


def fit(gpu: str) -> tuple[dict, pd.DataFrame]:
    """Fit the six fields for GPU class ``gpu``; returns (fields, table with relative errors)."""
    card = load_hardware(CARDS[gpu])
    table = load_profiles(gpu)
    gemm_fields = ("bandwidth_efficiency", "compute_efficiency", "gemm_transition_exponent", "gemm_launch_s")
    values = _fit(card, table, gemm_fields, [0.85, 0.70, 1.6, 4e-6], predict_gemm_s, table.gemm_s.values)
    ew_fields = ("elementwise_bandwidth_efficiency", "elementwise_launch_s")
    values.update(_fit(card, table, ew_fields, [0.6, 3e-6], predict_elementwise_s, table.elementwise_s.values))
    fitted = card.model_copy(update=values)
    table["gemm_error"] = predict_gemm_s(fitted, table) / table.gemm_s - 1
    table["elementwise_error"] = predict_elementwise_s(fitted, table) / table.elementwise_s - 1
    return values, table


def main() -> None:
    for gpu in CARDS:
        values, table = fit(gpu)
        print(f"== {gpu}: " + ", ".join(f"{k}: {v:.4g}" for k, v in values.items()))
        summary = table.groupby(["model", "tp"]).agg(
            gemm_min=("gemm_error", "min"), gemm_max=("gemm_error", "max"),
            gemm_rms=("gemm_error", lambda e: float(np.sqrt(np.mean(e ** 2)))),
            elementwise_min=("elementwise_error", "min"), elementwise_max=("elementwise_error", "max"))
        print(summary.round(3).to_string())
        e = table.gemm_error
        print(f"GEMM: max |error| {e.abs().max():.3f}, rms {np.sqrt(np.mean(e ** 2)):.3f}, "
              f"{(e.abs() <= 0.08).mean():.0%} of {len(e)} points within 8%; non-GEMM max |error| "
              f"{table.elementwise_error.abs().max():.3f}")


if __name__ == "__main__":
    main()
