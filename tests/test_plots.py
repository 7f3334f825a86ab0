"""``servesim plot``: bands, crossover, heatmap tables, and the files written for a sweep directory."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from servesim.errors import ConfigError
from servesim.plots.curves import crossover, curve_table, mean_ci, t975
from servesim.plots.heatmap import heatmap_table, parse_heatmap


def test_t_quantiles_and_band():
    # printed tables (NIST/SEMATECH e-Handbook 1.3.6.7.2), to their 3 decimals
    for df, printed in ((1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (40, 2.021), (100, 1.984)):
        assert abs(t975(df) - printed) < 5e-4, df
    m, half, n = mean_ci([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and half == pytest.approx(4.3027 * 1.0 / math.sqrt(3), rel=1e-4)
    assert mean_ci([5.0, np.nan]) == (5.0, pytest.approx(float("nan"), nan_ok=True), 1)
    with pytest.raises(ValueError):
        t975(0)


def test_crossover_by_linear_interpolation():
    assert crossover([5, 10, 20, 40], [1.5, 1.2, 0.9, 0.8]) == pytest.approx(10 + 0.2 / 0.3 * 10)
    assert crossover([1, 2, 3], [1.3, 1.0, 0.5]) == pytest.approx(2.0)  # exactly 1 at x = 2, then below
    assert crossover([1, 2, 3], [1.5, 1.2, 1.01]) is None
    assert crossover([1, 2, 3], [0.9, 0.8, 0.7]) is None  # never >= 1: it does not "fall below" in the range


def summary_frame():
    rows = []
    for seqs in (32, 256):
        for rate in (5, 10, 20):
            for rep in range(3):
                base = rate * (1 if seqs == 32 else 2)
                rows.append({"rate": rate, "max_num_seqs": seqs, "variant": "default", "replication": rep,
                             "seed": rep, "point_id": f"{seqs}-{rate}", "output_throughput": 100.0 * rate + rep,
                             "request_throughput": rate * 0.9,
                             "ttft_s.p50": 0.01 * base + 0.001 * rep, "ttft_s.p99": 0.05 * base + 0.001 * rep,
                             "tpot_s.p50": 0.001 * base, "tpot_s.p99": 0.002 * base})
    return pd.DataFrame(rows)


def test_curve_table_means_and_bands():
    table = curve_table(summary_frame(), "rate", "output_throughput", ["max_num_seqs"], ["ttft_s.p99", "tpot_s.p50"])
    row = table[(table["max_num_seqs"] == 256) & (table["rate"] == 10) & (table["metric"] == "ttft_s.p99")].iloc[0]
    assert row["mean"] == pytest.approx(0.05 * 20 + 0.001) and row["n"] == 3
    assert row["ci_high"] - row["mean"] == pytest.approx(4.3027 * 0.001 / math.sqrt(3), rel=1e-4)
    assert row["x"] == pytest.approx(1001.0) and row["group"] == "max_num_seqs=256"
    flat = table[table["metric"] == "tpot_s.p50"]
    assert (flat["ci_low"] == flat["mean"]).all()  # identical replications: zero-width band
    assert len(table) == 2 * 3 * 2


def test_curves_of_a_large_sweep_keep_distinct_styles_and_single_runs_claim_no_bands(tmp_path):
    from servesim.plots.curves import CURVE_MARKERS, curve_styles, plot_latency_curves

    colors = [f"C{i}" for i in range(10)]
    groups = [f"g{i}" for i in range(10 * len(CURVE_MARKERS))]
    styles = curve_styles(groups, colors)
    assert len(set(styles.values())) == len(groups)  # colours repeat after 10 groups, markers tell them apart
    assert styles["g0"] == ("C0", "o") and styles["g10"] == ("C0", "s")
    one_run = summary_frame()[summary_frame()["replication"] == 0]
    plot_latency_curves(one_run, "rate", "output_throughput", ["max_num_seqs"], tmp_path / "c.png")
    svg = (tmp_path / "c.svg").read_text()
    assert "p50 (solid) and p99 (dashed)" in svg and "bands" not in svg  # one run per point: no band drawn
    plot_latency_curves(summary_frame(), "rate", "output_throughput", ["max_num_seqs"], tmp_path / "d.png")
    assert "bands: 95% CI over replications" in (tmp_path / "d.svg").read_text()


def test_where_a_speedup_curve_lies_below_one_in_words():
    from servesim.plots.curves import where_below_one

    assert where_below_one([5, 10, 20, 40], [1.5, 1.2, 0.9, 0.8], "b") == ("above b = 16.7", pytest.approx(50 / 3))
    assert where_below_one([1, 2, 3], [1.5, 1.2, 1.0], "b") == ("", None)  # 1 is not below 1
    # below 1 from the start: it hurts everywhere (it had read "never hurts"), or below where it reaches 1
    assert where_below_one([1, 32, 128, 256], [0.31, 0.30, 0.23, 0.16], "b") == ("everywhere in the range", None)
    assert where_below_one([1, 32, 128, 256], [0.42, 0.5, 0.9, 1.72], "b") == ("below b = 144", pytest.approx(
        128 + 0.1 / 0.82 * 128))
    assert where_below_one([1, 2, 3, 4], [0.5, 1.5, 1.5, 0.5], "b", digits=4) == ("below b = 1.5 and above b = 3.5",
                                                                                   1.5)


def test_a_speedup_curve_reads_the_same_in_the_legend_and_the_output(tmp_path):
    from servesim.plots.curves import plot_speedup, speedup_verdict

    assert speedup_verdict("above rate = 12.5", True) == "speculation hurts above rate = 12.5"
    assert speedup_verdict("", True) == "speculation never hurts in the range"
    assert speedup_verdict("below rate = 4", False, "fcfs") == "throughput below fcfs's below rate = 4"
    assert speedup_verdict("", False, "fcfs") == "throughput never below fcfs's in the range"
    table = pd.DataFrame({"rate": [5.0, 10.0, 20.0], "speedup": [1.5, 1.1, 0.9]})
    plot_speedup(table, "rate", tmp_path / "s.png", speculative=True)
    assert "speculation hurts above rate = 15" in (tmp_path / "s.svg").read_text()


def test_heatmap_panel_titles_wrap_at_their_separators():
    from servesim.plots.heatmap import wrap_at_commas

    title = "hardware=h100-sxm, engine.max_num_batched_tokens=8192, variant=plain"
    assert wrap_at_commas(title, 45) == "hardware=h100-sxm,\nengine.max_num_batched_tokens=8192,\nvariant=plain"
    assert wrap_at_commas(title, 80) == title
    assert wrap_at_commas("a=1, b=2, c=3", 8) == "a=1, b=2,\nc=3"  # 8 characters fit exactly
    assert wrap_at_commas("x" * 50 + ", y=1", 45) == "x" * 50 + ",\ny=1"  # a long part keeps its own line


def test_a_heatmap_says_what_its_cells_hold_also_over_several_panels(tmp_path):
    # one panel per max_num_seqs: the figure's heading names the metric and the mean over replications
    # (the panels' titles name their panels); single runs claim no mean
    from servesim.plots.heatmap import plot_heatmap

    summary = summary_frame().assign(max_num_seqs=lambda d: d["max_num_seqs"].astype(str))
    plot_heatmap(summary, "rate", "replication", "ttft_s.p99", ["max_num_seqs"], tmp_path)
    svg = (tmp_path / "heatmap_ttft_s.p99.svg").read_text()
    assert "ttft_s.p99 (mean over replications)" not in svg  # one run per (rate, replication) cell
    assert "max_num_seqs=32" in svg and "max_num_seqs=256" in svg
    replicated = summary.assign(load=summary["rate"] * 2)  # 3 replications in each (rate, load) cell
    for panels in (["max_num_seqs"], []):
        plot_heatmap(replicated, "rate", "load", "ttft_s.p99", panels, tmp_path)
        assert "ttft_s.p99 (mean over replications)" in (tmp_path / "heatmap_ttft_s.p99.svg").read_text()


def test_heatmap_table_and_parse():
    assert parse_heatmap("x=rate,y=max_num_seqs,metric=ttft_s.p99") == {"x": "rate", "y": "max_num_seqs",
                                                                        "metric": "ttft_s.p99"}
    for bad in ("x=rate,y=seqs", "x=rate,y=a,metric=", "rate,seqs"):
        with pytest.raises(ConfigError):
            parse_heatmap(bad)
    with pytest.raises(ConfigError, match="x and y are the same column 'rate'"):  # was drawn against itself
        parse_heatmap("x=rate,y=rate,metric=ttft_s.p99")
    for axes in ("x=rate,y=seed", "x=replication,y=rate", "x=point_id,y=rate"):  # bookkeeping, not swept
        with pytest.raises(ConfigError, match=r"^--heatmap: [xy]='\w+' is a bookkeeping column of summary.csv, "
                                              r"not a swept one \(expected a swept column or variant\)$"):
            parse_heatmap(f"{axes},metric=ttft_s.p99")
    assert parse_heatmap("x=rate,y=variant,metric=ttft_s.p99")["y"] == "variant"
    table = heatmap_table(summary_frame(), "rate", "max_num_seqs", "ttft_s.p50", [])
    cell = table[(table["rate"] == 20) & (table["max_num_seqs"] == 32)].iloc[0]
    assert cell["mean"] == pytest.approx(0.01 * 20 + 0.001) and cell["n"] == 3
    with pytest.raises(ConfigError, match="nope"):
        heatmap_table(summary_frame(), "rate", "nope", "ttft_s.p50", [])


def write_sweep_dir(folder, speedup=True):
    folder.mkdir()
    summary_frame().to_csv(folder / "summary.csv", index=False)
    (folder / "sweep.json").write_text(json.dumps(
        {"columns": {"workload.rate": "rate", "engine.max_num_seqs": "max_num_seqs"}}))
    if speedup:
        pd.DataFrame({"rate": [5, 10, 20, 5, 10, 20], "max_num_seqs": [32, 32, 32, 256, 256, 256],
                      "plain_output_throughput": [1.0] * 6, "spec_output_throughput": [1.4, 1.1, 0.7, 1.5, 1.3, 1.2],
                      "speedup": [1.4, 1.1, 0.7, 1.5, 1.3, 1.2]}).to_csv(folder / "speedup.csv", index=False)


def test_plot_of_a_comparison_without_speculation_says_below_the_baseline(tmp_path, capsys):
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    summary = pd.concat([summary_frame().assign(variant=name) for name in ("rr", "jsq")])
    summary.to_csv(sweep / "summary.csv", index=False)
    (sweep / "sweep.json").write_text(json.dumps({"columns": {"workload.rate": "rate", "engine.max_num_seqs":
                                                              "max_num_seqs"}, "baseline": "rr",
                                                  "units": {"rate": "sessions/s"}}))
    pd.DataFrame({"rate": [5, 10, 20], "max_num_seqs": [32] * 3, "variant": ["jsq"] * 3,
                  "baseline_output_throughput": [1.0] * 3, "variant_output_throughput": [1.4, 1.1, 0.7],
                  "speedup": [1.4, 1.1, 0.7]}).to_csv(sweep / "speedup.csv", index=False)
    assert main(["plot", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "throughput below rr's above rate = 12.5" in out and "speculation" not in out
    assert "agree within" not in out  # the ratios differ by up to 40%
    svg = (sweep / "speedup.svg").read_text()
    assert "relative to rr" in svg and "Speculative" not in svg
    assert "rate (sessions/s)" in svg and "requests/s" not in svg  # the manifest's unit, not the key's


def test_plot_says_when_every_throughput_ratio_is_within_one_percent(tmp_path, capsys):
    # open-loop arrivals below saturation: the throughput is the offered load, whatever the variant
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep, speedup=False)
    pd.DataFrame({"rate": [5, 10, 20], "max_num_seqs": [32] * 3, "plain_output_throughput": [1.0] * 3,
                  "spec_output_throughput": [1.0003, 0.9991, 1.0099],
                  "speedup": [1.0003, 0.9991, 1.0099]}).to_csv(sweep / "speedup.csv", index=False)
    assert main(["plot", str(sweep)]) == 0
    assert "note: the output throughputs agree within 1% everywhere" in capsys.readouterr().out
    pd.DataFrame({"rate": [5, 10], "max_num_seqs": [32] * 2, "plain_output_throughput": [1.0] * 2,
                  "spec_output_throughput": [1.0, 1.0101], "speedup": [1.0, 1.0101]}).to_csv(sweep / "speedup.csv",
                                                                                          index=False)
    assert main(["plot", str(sweep)]) == 0
    assert "agree within" not in capsys.readouterr().out


@pytest.mark.parametrize("types, open_loop", [(["poisson"], True), (["multi_turn", "trace"], True),
                                             (["closed_loop"], False), (["closed_loop", "poisson"], False),
                                             (["None"], False), (None, False)])
def test_the_equal_throughput_note_explains_it_by_open_loop_arrivals_only_for_them(types, open_loop):
    # a closed loop's clients send again after each response: the offered load is not set by a rate
    from servesim.cli.plot import same_throughput_note

    note = same_throughput_note(types)
    assert note.startswith("note: the output throughputs agree within 1% everywhere")
    assert note.endswith("compare their latencies (latency_vs_throughput.png: TTFT, TPOT)")
    assert ("with open-loop arrivals (a rate, a trace) below saturation the throughput is the offered load "
            "whatever the variant" in note) == open_loop


def test_the_sweep_manifest_records_its_workload_types(tmp_path):
    from servesim.sweep.runner import run_sweep
    from test_sweep import fake_simulate, write_sweep, FULL_SWEEP

    path = write_sweep(tmp_path, dict(FULL_SWEEP, grid={"workload.type": ["poisson", "closed_loop"]}, zip=[]))
    run_sweep(path, tmp_path / "out", progress=False, simulate=fake_simulate)
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["workload_types"] == ["closed_loop", "poisson"]


def test_plot_says_speculation_hurts_everywhere_when_every_speedup_is_below_one(tmp_path, capsys):
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep, speedup=False)
    pd.DataFrame({"rate": [5, 10, 20], "max_num_seqs": [32] * 3, "plain_output_throughput": [1.0] * 3,
                  "spec_output_throughput": [0.31, 0.3, 0.23], "speedup": [0.31, 0.3, 0.23]}).to_csv(
        sweep / "speedup.csv", index=False)
    assert main(["plot", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "speculation hurts everywhere in the range" in out and "never" not in out
    assert "speculation hurts everywhere in the range" in (sweep / "speedup.svg").read_text()


def test_plot_against_a_swept_column_of_text_is_refused_before_any_figure_is_touched(tmp_path, capsys):
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep)
    summary = pd.read_csv(sweep / "summary.csv")
    summary["max_num_seqs"] = summary["max_num_seqs"].map({32: "small", 256: "large"})  # as a router's names
    summary.to_csv(sweep / "summary.csv", index=False)
    assert main(["plot", str(sweep)]) == 0
    drawn = {p.name: p.read_bytes() for p in sweep.iterdir() if p.suffix in (".png", ".svg")}
    assert main(["plot", str(sweep), "--x", "max_num_seqs"]) == 2
    err = capsys.readouterr().err
    assert "--x: the swept column 'max_num_seqs' holds text ('small', ...)" in err and "Traceback" not in err
    assert "numeric swept column (rate)" in err
    assert {p.name: p.read_bytes() for p in sweep.iterdir() if p.suffix in (".png", ".svg")} == drawn


def test_plot_command_writes_figures_with_their_data(tmp_path, capsys):
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep)
    status = main(["plot", str(sweep), "--slo", "ttft_p99=0.5",
                   "--heatmap", "x=rate,y=max_num_seqs,metric=ttft_s.p99"])
    assert status == 0
    for stem in ("latency_vs_throughput", "speedup", "heatmap_ttft_s.p99"):
        png = sweep / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (sweep / f"{stem}.svg").read_text().lstrip().startswith("<?xml")
    # each figure's data, beside it, against values worked out from summary_frame() by hand:
    # ttft_s.p99 at (seqs, rate) is 0.05 rate (x2 at 256 seqs) + 0.001 rep over reps 0, 1, 2
    curves = pd.read_csv(sweep / "latency_vs_throughput.csv")
    assert set(curves["metric"]) == {"ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99"}
    assert len(curves) == 4 * 2 * 3 and (curves["n"] == 3).all()
    row = curves[(curves["max_num_seqs"] == 256) & (curves["rate"] == 10) & (curves["metric"] == "ttft_s.p99")]
    assert row["mean"].item() == pytest.approx(1.001) and row["x"].item() == pytest.approx(1001.0)
    band = 4.3027 * 0.001 / math.sqrt(3)  # t(0.975, 2) sd / sqrt(n), sd = 0.001
    assert row["ci_high"].item() - 1.001 == pytest.approx(band, rel=1e-4)
    assert 1.001 - row["ci_low"].item() == pytest.approx(band, rel=1e-4)
    assert row["x_ci"].item() == pytest.approx(4.3027 * 1.0 / math.sqrt(3), rel=1e-4)  # throughput sd = 1
    heat = pd.read_csv(sweep / "heatmap_ttft_s.p99.csv").set_index(["rate", "max_num_seqs"])
    assert len(heat) == 6
    for (rate, seqs), cell in heat.iterrows():
        assert cell["mean"] == pytest.approx(0.05 * rate * (1 if seqs == 32 else 2) + 0.001) and cell["n"] == 3
    curve = pd.read_csv(sweep / "speedup_curve.csv")
    cross = curve.groupby("max_num_seqs")["crossover"].first()
    assert cross[32] == pytest.approx(10 + 0.1 / 0.4 * 10) and np.isnan(cross[256])
    out = capsys.readouterr().out
    assert "speculation hurts above rate = 12.5" in out and "never hurts" in out
    # each line names the figure's data file: the speedup curve's is speedup_curve.csv (the line said
    # "(+ .svg, .csv)", i.e. speedup.csv, which is the sweep's own table, not the figure's data)
    assert f"wrote {sweep / 'speedup.png'} (+ .svg, speedup_curve.csv)\n" in out
    assert f"wrote {sweep / 'latency_vs_throughput.png'} (+ .svg, .csv)\n" in out


def test_plot_command_errors_are_one_line(tmp_path, capsys):
    from servesim.cli import main

    assert main(["plot", str(tmp_path / "missing")]) == 2
    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep, speedup=False)
    assert main(["plot", str(sweep), "--along", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing: does not exist" in err[0] and "--along" in err[1]


def test_per_position_acceptance_bars(tmp_path):
    import pandas as pd

    from servesim.plots.acceptance import acceptance_table, plot_acceptance
    from servesim.sweep.tables import flatten_metrics

    flat = flatten_metrics({"spec_decode": {"per_position_acceptance_rate": [0.6, 0.4], "num_drafts": 10}})
    assert flat == {"spec_decode.per_position_acceptance_rate.1": 0.6,
                    "spec_decode.per_position_acceptance_rate.2": 0.4, "spec_decode.num_drafts": 10}
    summary = pd.DataFrame([
        {"variant": "eagle", "spec_decode.per_position_acceptance_rate.1": 0.6, "spec_decode.per_position_acceptance_rate.2": 0.4},
        {"variant": "eagle", "spec_decode.per_position_acceptance_rate.1": 0.8, "spec_decode.per_position_acceptance_rate.2": 0.2},
        {"variant": "plain", "spec_decode.per_position_acceptance_rate.1": None, "spec_decode.per_position_acceptance_rate.2": None},
    ])
    table = acceptance_table(summary, ["variant"])
    assert table["group"].tolist() == ["variant=eagle"] * 2 and table["position"].tolist() == [1, 2]
    assert table["acceptance_rate"].tolist() == pytest.approx([0.7, 0.3]) and table["runs"].tolist() == [2, 2]
    plot_acceptance(table, tmp_path / "acceptance.png")
    drawn = pd.read_csv(tmp_path / "acceptance.csv")
    assert drawn["group"].tolist() == ["variant=eagle"] * 2 and drawn["position"].tolist() == [1, 2]
    assert drawn["acceptance_rate"].tolist() == pytest.approx([0.7, 0.3]) and drawn["runs"].tolist() == [2, 2]


def test_acceptance_bars_are_drawn_per_swept_speculative_setting(tmp_path):
    """A sweep of two profiles x two k merged all runs into one set of bars: position 1 averaged over every
    run, positions 2-4 over the k = 4 runs only, bars of no configuration that ran."""
    from servesim.cli import main

    p1, p2 = "spec_decode.per_position_acceptance_rate.1", "spec_decode.per_position_acceptance_rate.2"
    rows = []
    for profile, rates in (("[0.9, 0.5]", (0.9, 0.45)), ("[0.6, 0.3]", (0.6, 0.18))):
        for k in (1, 2):
            for rate in (5, 10):  # a swept load: averaged within each setting
                rows.append({"acceptance": profile, "k": k, "rate": rate, "variant": "default", "replication": 0,
                             "seed": 0, "point_id": f"{profile}-{k}-{rate}", "output_throughput": 1.0 * rate,
                             "request_throughput": 1.0, "ttft_s.p99": 0.1, "tpot_s.p50": 0.01,
                             p1: rates[0] + rate / 1000, p2: rates[1] if k == 2 else None})
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    pd.DataFrame(rows).to_csv(sweep / "summary.csv", index=False)
    (sweep / "sweep.json").write_text(json.dumps({"columns": {
        "speculative_config.acceptance": "acceptance", "speculative_config.num_speculative_tokens": "k",
        "workload.rate": "rate"}}))
    assert main(["plot", str(sweep)]) == 0
    drawn = pd.read_csv(sweep / "acceptance.csv")
    assert drawn["group"].tolist() == ["acceptance=[0.9, 0.5], k=1", "acceptance=[0.9, 0.5], k=2",
                                       "acceptance=[0.9, 0.5], k=2", "acceptance=[0.6, 0.3], k=1",
                                       "acceptance=[0.6, 0.3], k=2", "acceptance=[0.6, 0.3], k=2"]
    assert drawn["position"].tolist() == [1, 1, 2, 1, 1, 2]
    assert drawn["acceptance_rate"].tolist() == pytest.approx([0.9075, 0.9075, 0.45, 0.6075, 0.6075, 0.18])
    assert drawn["runs"].tolist() == [2] * 6


@pytest.mark.parametrize("inside", ["points", "points/figures"])
def test_plot_out_refuses_the_sweeps_stored_runs(tmp_path, capsys, inside):
    """--out SWEEP/points wrote the PNGs and CSVs among the stored runs."""
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep)
    (sweep / "points").mkdir()
    assert main(["plot", str(sweep), "--out", str(sweep / inside)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {sweep / inside} is inside the sweep's stored runs "
                                       f"({sweep / 'points'}); give another folder, or leave --out out to draw "
                                       "into the sweep's folder\n")
    assert [p.name for p in (sweep / "points").iterdir()] == []


def test_plot_out_refuses_a_folder_of_other_results(tmp_path, capsys):
    """--out naming a run's (or another sweep's) folder wrote the figures among its files."""
    from servesim.cli import main

    sweep = tmp_path / "sweep"
    write_sweep_dir(sweep)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    assert main(["plot", str(sweep), "--out", str(run_dir)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {run_dir} holds the results of `servesim run` "
                                       "(summary.json); give `servesim plot` another folder, or remove them first\n")
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]
    assert main(["plot", str(sweep), "--out", str(sweep)]) == 0  # the sweep's own folder, named
    assert main(["plot", str(sweep), "--out", str(tmp_path / "figures")]) == 0


def test_a_plot_removes_the_heatmaps_an_earlier_plot_of_its_folder_drew(tmp_path, capsys):
    """Plotting sweep B into the --out folder of sweep A's plot left A's heatmap beside B's figures, looking
    like one of them (an earlier plot's speedup and acceptance figures were removed, its heatmaps were not)."""
    from servesim.cli import main

    first, second, figures = tmp_path / "a", tmp_path / "b", tmp_path / "figures"
    write_sweep_dir(first)
    write_sweep_dir(second, speedup=False)
    heatmap = ["--heatmap", "x=rate,y=max_num_seqs,metric=ttft_s.p99"]
    assert main(["plot", str(first), "--out", str(figures), *heatmap,
                 "--heatmap", "x=rate,y=max_num_seqs,metric=tpot_s.p50"]) == 0
    assert {"heatmap_ttft_s.p99.png", "heatmap_tpot_s.p50.csv"} <= {p.name for p in figures.iterdir()}
    assert main(["plot", str(second), "--out", str(figures), *heatmap]) == 0
    assert sorted(p.name for p in figures.iterdir()) == [
        "heatmap_ttft_s.p99.csv", "heatmap_ttft_s.p99.png", "heatmap_ttft_s.p99.svg",
        "latency_vs_throughput.csv", "latency_vs_throughput.png", "latency_vs_throughput.svg"]
    assert main(["plot", str(second), "--out", str(figures)]) == 0
    assert sorted(p.name for p in figures.iterdir()) == [
        "latency_vs_throughput.csv", "latency_vs_throughput.png", "latency_vs_throughput.svg"]
