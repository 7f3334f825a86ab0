"""The step-time model's GEMM and non-GEMM parts against Vidur's kernel profiles (the repository's copy in
docs/reference/kernel-profiles/), with the shipped H100 and A100 cards: every model, token count 1-4096 and
TP degree of the files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from servesim.cards import load_hardware

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fit_kernel_profiles",
                                               REPO / "experiments" / "calibration" / "fit_kernel_profiles.py")
fkp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fkp)

GPUS = tuple(fkp.CARDS)
GEMM_FIELDS = ("bandwidth_efficiency", "compute_efficiency", "gemm_transition_exponent", "gemm_launch_s")
ELEMENTWISE_FIELDS = ("elementwise_bandwidth_efficiency", "elementwise_launch_s")


@pytest.fixture(scope="module", params=GPUS)
def profiled(request):
    gpu = request.param
    table = fkp.load_profiles(gpu)
    card = load_hardware(fkp.CARDS[gpu])
    table["gemm_error"] = fkp.predict_gemm_s(card, table) / table.gemm_s - 1
    return gpu, card, table


def test_the_repository_copy_covers_every_profiled_model_and_tp_degree(profiled):
    gpu, _, table = profiled
    expected_models = {"h100": 6, "a100": 8}[gpu]
    assert table.model.nunique() == expected_models
    for model, g in table.groupby("model"):
        tps = sorted(g.tp.unique())
        assert tps == ([1] if model == "phi-2" else [1, 2, 4, 8]), model
        for _, per_tp in g.groupby("tp"):
            assert per_tp.tokens.min() == 1 and per_tp.tokens.max() == 4096 and len(per_tp) >= 250


def test_linear_layers_follow_the_profiles_for_every_model_and_tp(profiled):
    # per model and TP degree: no bias over all token counts (median within 4%), none in the verify range
    # (128-768 tokens, where the plain max() roofline was 15-66% too fast: median within 10%), and most
    # points within 8%. The literal "every point within 8%" cannot hold for any step time that grows
    # with the tokens: see test_no_monotone_model_is_within_8_percent_everywhere.
    gpu, _, table = profiled
    for (model, tp), g in table.groupby(["model", "tp"]):
        verify = g[(g.tokens >= 128) & (g.tokens <= 768)]
        assert abs(g.gemm_error.median()) <= 0.04, (gpu, model, tp, g.gemm_error.median())
        assert abs(verify.gemm_error.median()) <= 0.10, (gpu, model, tp, verify.gemm_error.median())
        assert (g.gemm_error.abs() <= 0.08).mean() >= {"h100": 0.60, "a100": 0.70}[gpu], (gpu, model, tp)


def test_smooth_transition_beats_the_plain_max_roofline_between_the_roofs(profiled):
    gpu, card, table = profiled
    plain = card.model_copy(update={"gemm_transition_exponent": 16.0})  # ~max(memory, compute)
    table = table[(table.tokens >= 128) & (table.tokens <= 768)]
    smooth_err = np.abs(fkp.predict_gemm_s(card, table) / table.gemm_s - 1)
    plain_err = np.abs(fkp.predict_gemm_s(plain, table) / table.gemm_s - 1)
    assert np.mean(smooth_err) < 0.6 * np.mean(plain_err)


def _rms_log(card, table, predict, measured) -> float:
    return float(np.sqrt(np.mean(np.log(predict(card, table) / measured) ** 2)))


@pytest.mark.parametrize("fields, kind", [(GEMM_FIELDS, "gemm"), (ELEMENTWISE_FIELDS, "elementwise")])
def test_shipped_cards_hold_the_fitted_optimum(profiled, fields, kind):
    # moving any fitted field by 5% either way (inside its bounds) makes the fit worse: the card holds what
    # experiments/calibration/fit_kernel_profiles.py fits, not a hand-set value
    gpu, card, table = profiled
    predict = fkp.predict_gemm_s if kind == "gemm" else fkp.predict_elementwise_s
    measured = table.gemm_s.values if kind == "gemm" else table.elementwise_s.values
    best = _rms_log(card, table, predict, measured)
    for name in fields:
        value = float(getattr(card, name))
        for factor in (0.95, 1.05):
            moved = value * factor
            if name.endswith("efficiency") and moved > 1.0:
                continue
            worse = _rms_log(card.model_copy(update={name: moved}), table, predict, measured)
            assert worse > best, (gpu, name, factor, worse, best)


def test_no_monotone_model_is_within_8_percent_everywhere(profiled):
    # The profiles are not monotone in the token count (kernel selection and tile quantisation): for most
    # H100 models and TP degrees (and some A100 ones) some token count T1 takes longer than a larger T2
    # by more than 1.08 / 0.92, so no step time that grows with the tokens can be within 8% of both.
    gpu, _, table = profiled
    infeasible = 0
    for _, g in table.groupby(["model", "tp"]):
        y = g.sort_values("tokens").gemm_s.values
        later_min = np.minimum.accumulate(y[::-1])[::-1]
        if np.max(y[:-1] / later_min[1:]) > 1.08 / 0.92:
            infeasible += 1
    assert infeasible >= {"h100": table.groupby(["model", "tp"]).ngroups // 2, "a100": 4}[gpu]
