"""servesim calibrate: fit recovery, input errors, the CLI, and the step-time script's torch-free parts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from servesim.analysis.calibrate import (
    StepPoint,
    fit_step_times,
    predict_step_times,
    read_step_data,
    read_step_times_csv,
    read_vllm_bench_json,
    step_counts,
    synthetic_step_points,
    write_step_times_csv,
)
from servesim.cards import load_hardware, load_model
from servesim.cli import main
from servesim.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = REPO / "workloads" / "examples" / "step-times-h100-llama8b-synthetic.csv"
# The factors the shipped synthetic file was generated with (stated in its header).
TRUE = dict(bandwidth_efficiency=0.75, compute_efficiency=0.62, gemm_transition_exponent=2.0,
            step_overhead_s=1.2e-3, per_request_s=5e-6)


@pytest.fixture(scope="module")
def cards():
    return load_hardware("h100-sxm"), load_model("llama-3.1-8b")


def test_step_counts_closed_form():
    # 5 tokens over 2 requests after 10 cached tokens: one request gets 2, the other 3.
    # pairs: 2*10 + 2*3/2 = 23 and 3*10 + 3*4/2 = 36.
    assert step_counts(StepPoint(2, 10, 5, 1.0)) == (5, 2, 2 * 10 + 5, 23 + 36, 2)
    # Decode: B requests, 1 token each over C: kv = B (C + 1), pairs = B (C + 1).
    assert step_counts(StepPoint(8, 100, 8, 1.0)) == (8, 8, 808, 808, 8)


def test_noise_free_fit_recovers_factors_exactly(cards):
    hw, model = cards
    truth = hw.model_copy(update=TRUE)
    pts = synthetic_step_points(truth, model, np.random.default_rng(0), noise_rel=0.0)
    fit = fit_step_times(hw, model, pts)
    # Only the engine's integer-picosecond rounding separates the data from the model.
    assert fit.bandwidth_efficiency == pytest.approx(0.75, rel=1e-3)
    assert fit.compute_efficiency == pytest.approx(0.62, rel=1e-3)
    assert fit.gemm_transition_exponent == pytest.approx(2.0, rel=1e-3)
    assert fit.step_overhead_s == pytest.approx(1.2e-3, rel=1e-3)
    assert fit.per_request_s == pytest.approx(5e-6, rel=2e-2)
    assert fit.max_abs_relative_error < 1e-4
    assert fit.r_squared > 1 - 1e-8
    assert fit.kept_from_base == ()


def test_shipped_synthetic_file_recovers_known_factors(cards):
    hw, model = cards
    assert "SYNTHETIC" in SYNTHETIC.read_text().splitlines()[0]
    pts = read_step_times_csv(SYNTHETIC)
    fit = fit_step_times(hw, model, pts)
    # The weight read and the per-step overhead are both constant over a model's decode steps: with 2%
    # noise only their sum is pinned (the batch-1 decode step), and the compute line
    assert fit.compute_efficiency == pytest.approx(0.62, rel=0.03)
    from servesim.roofline import build_step_time_model

    def batch1(card):
        return build_step_time_model(card, model, 1).step_s(1, 1, 1000, 1000, 1)

    fitted_card = hw.model_copy(update=dict(bandwidth_efficiency=fit.bandwidth_efficiency,
                                            compute_efficiency=fit.compute_efficiency,
                                            gemm_transition_exponent=fit.gemm_transition_exponent,
                                            step_overhead_s=fit.step_overhead_s, per_request_s=fit.per_request_s))
    assert batch1(fitted_card) == pytest.approx(batch1(hw.model_copy(update=TRUE)), rel=0.01)
    # 2% lognormal noise: RMS relative error of a good fit is about 2%, R^2 close to 1.
    assert 0.01 < fit.rms_relative_error < 0.03
    assert fit.r_squared > 0.99
    # The fitted card predicts the noise-free step times of the factors the file was generated with, not
    # only the noisy points it was fitted to: five fields fitted to 39 points with 2% noise average it out
    # to an RMS error of 0.8% against the truth (bound 1.2%, well below the noise) and 2.6% at the worst point.
    truth = predict_step_times(hw.model_copy(update=TRUE), model, pts)
    error = np.asarray(fit.predicted_s) / truth - 1
    assert np.sqrt(np.mean(error ** 2)) < 0.012 and np.max(np.abs(error)) < 0.03


def test_decode_only_small_batch_keeps_base_compute_efficiency(cards):
    hw, model = cards
    truth = hw.model_copy(update=TRUE)
    pts = synthetic_step_points(truth, model, np.random.default_rng(1), noise_rel=0.0,
                                batch_sizes=(1, 2, 4, 8), prefill_tokens=())
    fit = fit_step_times(hw, model, pts)
    # decode steps of at most 8 tokens never leave the memory floor: the compute line and the transition
    # exponent are not determined and keep the base card's values
    assert {"compute_efficiency", "gemm_transition_exponent"} <= set(fit.kept_from_base)
    assert fit.compute_efficiency == hw.compute_efficiency
    # weights and overhead are collinear over these steps; the fit still reproduces every one of them
    assert fit.max_abs_relative_error < 2e-3


def test_too_few_points(cards):
    hw, model = cards
    with pytest.raises(ConfigError, match="at least 3"):
        fit_step_times(hw, model, [StepPoint(1, 10, 1, 0.01, "x.csv:2")] * 2)


def test_steps_of_one_shape_are_refused_not_reported_as_a_fit(cards):
    # four measurements of the same step are one equation: bandwidth, overhead and the per-request term
    # all move it, so no fit can tell them apart (the report said "fitted" with R^2 = nan)
    hw, model = cards
    points = [StepPoint(8, 512, 8, 0.0081, f"x.csv:line {i + 2}") for i in range(4)]
    with pytest.raises(ConfigError, match=r"^x\.csv: all 4 measured steps have one shape \(batch 8, context 512, "
                                          r"8 scheduled tokens\): they cannot determine bandwidth_efficiency"):
        fit_step_times(hw, model, points)
    # one shape differing in its time only is refused the same way; two shapes are fitted
    varied = points[:2] + [StepPoint(8, 512, 8, 0.0083, "x.csv:line 9")]
    with pytest.raises(ConfigError, match="one shape"):
        fit_step_times(hw, model, varied)
    fit = fit_step_times(hw, model, points[:2] + [StepPoint(64, 512, 64, 0.0120, "x.csv:line 9")])
    assert np.isfinite(fit.r_squared)


@pytest.mark.parametrize(
    "body, match",
    [
        ("batch_size,context_tokens,step_time_s\n1,2,0.1\n", r"f\.csv: line 1: missing column\(s\) scheduled_tokens"),
        ("# c\nbatch_size,context_tokens,scheduled_tokens,step_time_s\n1,2,1,0.1\nx,2,1,0.1\n",
         r"f\.csv: line 4: batch_size: expected an integer >= 1 \(got 'x'\)"),
        ("batch_size,context_tokens,scheduled_tokens,step_time_s\n2,2,1,0.1\n",
         r"f\.csv: line 2: scheduled_tokens: expected >= batch_size = 2"),
        ("batch_size,context_tokens,scheduled_tokens,step_time_s\n1,2,1,-3\n",
         r"f\.csv: line 2: step_time_s: expected a positive number \(got '-3'\)"),
        ("batch_size,context_tokens,scheduled_tokens,step_time_s\n", r"f\.csv: no data rows"),
    ],
)
def test_csv_errors_are_one_line_naming_file_and_line(tmp_path, body, match):
    path = tmp_path / "f.csv"
    path.write_text(body)
    with pytest.raises(ConfigError, match=match) as info:
        read_step_times_csv(path)
    assert "\n" not in str(info.value)


def test_csv_round_trip(tmp_path):
    pts = [StepPoint(4, 100, 4, 0.0125), StepPoint(1, 0, 512, 0.05)]
    path = tmp_path / "s.csv"
    write_step_times_csv(pts, path, ["note"])
    back = read_step_data(path)
    assert [(p.batch_size, p.context_tokens, p.scheduled_tokens) for p in back] == [(4, 100, 4), (1, 0, 512)]
    assert [p.step_time_s for p in back] == pytest.approx([0.0125, 0.05], rel=1e-6)


BENCH = {"completed": 200, "max_concurrency": 16, "total_input_tokens": 200_000, "total_output_tokens": 40_000,
         "median_tpot_ms": 12.5, "mean_tpot_ms": 13.0, "duration": 100.0, "mean_e2el_ms": 4000.0}


def test_vllm_bench_result_mapping(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(BENCH))
    (pt,) = read_vllm_bench_json(path)
    # context = (input + output / 2) / completed = (1000 + 100) tokens; step = median TPOT.
    assert (pt.batch_size, pt.context_tokens, pt.scheduled_tokens) == (16, 1100, 16)
    assert pt.step_time_s == pytest.approx(0.0125)
    # Without --max-concurrency: Little's law, completed * mean E2E / duration = 200 * 4 / 100 = 8.
    lines = tmp_path / "b.jsonl"
    lines.write_text(json.dumps({**BENCH, "max_concurrency": None}) + "\n" + json.dumps(BENCH) + "\n")
    pts = read_step_data(lines)
    assert [p.batch_size for p in pts] == [8, 16]


def test_vllm_bench_errors_name_file_and_field(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({k: v for k, v in BENCH.items() if k not in ("median_tpot_ms", "mean_tpot_ms")}))
    with pytest.raises(ConfigError, match=r"b\.json: mean_tpot_ms: expected a positive number"):
        read_vllm_bench_json(path)
    path.write_text('{"completed": 3}\n{oops\n')
    with pytest.raises(ConfigError, match=r"b\.json: line 2: invalid JSON"):
        read_vllm_bench_json(path)
    with pytest.raises(ConfigError, match=r"expected a step-time \.csv"):
        read_step_data(tmp_path / "x.parquet")


def test_cli_writes_a_loadable_card(tmp_path, capsys):
    out = tmp_path / "card.yaml"
    rc = main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(SYNTHETIC),
               "--out", str(out), "--quiet"])
    assert rc == 0
    text = out.read_text()
    assert "# fit quality: R^2 = " in text and "rel_error" in text and SYNTHETIC.name in text
    card = load_hardware(str(out))
    assert card.name == "H100 SXM (calibrated)"
    assert card.compute_efficiency == pytest.approx(0.62, rel=0.03)
    assert card.memory_bandwidth_bytes_per_s == load_hardware("h100-sxm").memory_bandwidth_bytes_per_s
    assert "R^2" in capsys.readouterr().out


def test_cli_bad_data_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("batch_size,context_tokens,scheduled_tokens,step_time_s\n1,1,1,zero\n")
    rc = main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().count("\n") == 0 and "bad.csv: line 2: step_time_s" in err


# ------------------------------------------------------------------ benchmarks/measure_step_times.py
def _load_script():
    spec = importlib.util.spec_from_file_location("measure_step_times", REPO / "benchmarks" / "measure_step_times.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["measure_step_times"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_measure_script_grid_and_shapes():
    m = _load_script()
    grid = m.build_grid([1, 4], [256, 2048], [512], [0])
    assert sorted(grid) == sorted([("decode", 1, 256, 1), ("decode", 1, 2048, 1), ("decode", 4, 256, 4),
                                   ("decode", 4, 2048, 4), ("prefill", 1, 0, 512)])
    assert grid[:2] == [("decode", 1, 256, 1), ("prefill", 1, 0, 512)]  # both kinds early
    shape = m.resolve_shape("llama-3.1-8b")
    assert shape.kv_bytes_per_token() == load_model("llama-3.1-8b").kv_bytes_per_token == 131072
    assert m.resolve_shape("anything", tiny=True) == m.TINY_SHAPE


def test_measure_script_without_torch_says_so(capsys, tmp_path):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed; the missing-torch message cannot be exercised")
    m = _load_script()
    assert m.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "s.csv")]) == 1
    assert "PyTorch is not installed" in capsys.readouterr().err


def test_measure_script_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    m = _load_script()
    out = tmp_path / "s.csv"
    rc = m.main(["--tiny", "--device", "cpu", "--batch-sizes", "1,2", "--contexts", "8", "--prefill-tokens", "16",
                 "--prefill-contexts", "0,8", "--repeats", "2", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    pts = read_step_times_csv(out)
    assert sorted((p.batch_size, p.context_tokens, p.scheduled_tokens) for p in pts) == [
        (1, 0, 16), (1, 8, 1), (1, 8, 16), (2, 8, 2)]
    env = json.loads(out.with_suffix(".env.json").read_text())
    assert env["points_measured"] == 4 and env["model_shape"]["num_hidden_layers"] == 2


def test_cli_warns_of_a_poor_fit_and_refuses_an_unsplittable_tp(tmp_path, capsys):
    """One outlier row drove R^2 below 0 without a word; --tp 3 (32 heads) wrote a card `run` would refuse."""
    data = tmp_path / "d.csv"
    data.write_text(SYNTHETIC.read_text() + "1,256,1,0.3\n")  # R^2 0.57
    assert main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(data), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("servesim: warning: R^2 = 0.566 ") and "(below 0.9)" in err and err.count("\n") == 1
    assert main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(SYNTHETIC),
                 "--tp", "3", "--out", str(tmp_path / "c.yaml")]) == 2
    assert capsys.readouterr().err == ("servesim: error: --tp: total number of attention heads (32) must be "
                                       "divisible by tensor parallel size (3)\n")
    assert not (tmp_path / "c.yaml").exists()
    assert main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(SYNTHETIC),
                 "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_fit_worse_than_the_mean_writes_no_card_unless_allowed(tmp_path, capsys):
    """R^2 below 0 (one 100 s outlier) only warned, and the card was written."""
    data = tmp_path / "d.csv"
    data.write_text(SYNTHETIC.read_text() + "1,256,1,100\n")
    card = tmp_path / "c.yaml"
    argv = ["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(data), "--quiet",
            "--out", str(card)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"servesim: error: --data: R^2 = -0.0262: the fitted step-time model predicts the steps of {data} worse "
        "than their mean does; no card written (check the data for outliers, mixed setups or another model; "
        "--allow-poor-fit writes it anyway)\n")
    assert not card.exists()
    assert main([*argv, "--allow-poor-fit"]) == 0
    assert capsys.readouterr().err.startswith("servesim: warning: R^2 = -0.0262 (below 0.9)")
    assert card.exists()


def test_milliseconds_in_step_time_s_are_refused(tmp_path, capsys):
    # was fitted: 1,000 times the real step times gave a card with the efficiencies at their lower bounds and a
    # one-second step overhead, and only a warning about R^2
    points = read_step_times_csv(SYNTHETIC)
    scaled = tmp_path / "ms.csv"
    write_step_times_csv([StepPoint(p.batch_size, p.context_tokens, p.scheduled_tokens, p.step_time_s * 1000)
                          for p in points], scaled)
    argv = ["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(scaled), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {scaled}: step_time_s: every measured step is ") and err.endswith(
        " times the base card's roofline prediction (expected seconds, at most 100 times the prediction: are the "
        "times in milliseconds, or the hardware or model not the measured ones?)\n"), err
    assert err.count("\n") == 1
    # the bound is the least ratio over the data: a GPU 30 times slower than its card still fits
    hw, model = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    base = predict_step_times(hw, model, points)
    slow = [StepPoint(p.batch_size, p.context_tokens, p.scheduled_tokens, 30 * t) for p, t in zip(points, base)]
    assert fit_step_times(hw, model, slow).r_squared > 0.5
    at_bound = [StepPoint(p.batch_size, p.context_tokens, p.scheduled_tokens, 100 * t) for p, t in zip(points, base)]
    with pytest.raises(ConfigError, match="every measured step is 100 to 100 times"):
        fit_step_times(hw, model, at_bound)
    below = [StepPoint(p.batch_size, p.context_tokens, p.scheduled_tokens, (99 if i == 0 else 1000) * t)
             for i, (p, t) in enumerate(zip(points, base))]
    fit_step_times(hw, model, below)  # one step under the bound: fitted (its poor R^2 is warned of by the CLI)


@pytest.mark.parametrize("key", ["max_concurrency", "median_tpot_ms"])
def test_a_boolean_in_a_vllm_bench_result_is_not_a_number(tmp_path, key):
    # max_concurrency: true was read as batch 1, median_tpot_ms: true as a 1 ms step
    path = tmp_path / "b.json"
    path.write_text(json.dumps({**BENCH, key: True}))
    with pytest.raises(ConfigError) as exc:
        read_vllm_bench_json(path)
    assert str(exc.value) == f"{path}: {key}: expected a positive number (got True)"
