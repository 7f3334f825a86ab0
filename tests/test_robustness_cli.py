"""Regression tests of issue 11 (robustness of the command line, config loading and outputs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from servesim.cli import main
from servesim.errors import ConfigError

from test_cli import SMALL as CLI_SMALL
from test_cli import write_yaml

ROOT = Path(__file__).resolve().parents[1]
#: test_cli's small config with fewer and shorter requests (each run takes milliseconds)
SMALL = {**CLI_SMALL, "workload": {**CLI_SMALL["workload"], "num_requests": 40,
                                   "prompt_tokens": {"type": "uniform", "low": 10, "high": 500},
                                   "output_tokens": {"type": "uniform", "low": 1, "high": 50}}}


# --- item 11: --speculative-config first, then --set in order -----------------------------------------

def test_speculative_config_json_then_set_in_order(tmp_path):
    from servesim.cli.run import parse_overrides
    from servesim.config.models import load_config

    cfg_path = write_yaml(tmp_path / "c.yaml", SMALL)
    pairs = parse_overrides(["speculative_config.num_speculative_tokens=5"],
                            '{"method": "ngram", "num_speculative_tokens": 3}')
    cfg, _ = load_config(cfg_path, pairs)
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 5}
    # later --set of the same key wins, even after a --set of a key inside it
    pairs = parse_overrides(["speculative_config={method: ngram, num_speculative_tokens: 2}",
                             "speculative_config.prompt_lookup_max=4",
                             "speculative_config={method: ngram, num_speculative_tokens: 7}"], None)
    cfg, _ = load_config(cfg_path, pairs)
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 7}


# --- item 15: the console table's columns never run together ------------------------------------------

def test_console_table_columns_stay_apart_at_long_latencies():
    from servesim.metrics.table import format_summary_table

    def stats(mean, p50, p99):
        return {"mean": mean, "p50": p50, "p99": p99}

    summary = {"ttft_s": stats(1234.5678, 1000.0, 98765.4321), "tpot_s": stats(0.009, 0.009, 0.014),
               "itl_s": stats(0.01, 0.008, 0.03), "e2e_s": stats(12345.6, 9999.99, 123456.7)}
    lines = format_summary_table(summary).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Latency (ms)"))
    for line in lines[head + 1:head + 5]:
        numbers = line[28:].split()
        assert len(numbers) == 3, line
        assert "  " in line[28:].strip(), line  # two spaces at least between neighbours
    e2e = lines[head + 4][28:].split()
    assert [float(x) for x in e2e] == [12345600.0, 9999990.0, 123456700.0]
    # the header's column names end where the numbers end
    assert len(lines[head]) == len(lines[head + 4])


@pytest.mark.parametrize("share, text", [
    (1.0, "100.0"), (0.0, "0.0"), (0.5, "50.0"), (0.97254, "97.3"), (0.03, "3.0"),
    (119_997 / 120_000, "99.997"),  # 3 of 120,000 missed: not "100.0"
    (0.9996, "99.96"), (4e-5, "0.004"), (0.99999999, ">99.9999"), (1e-9, "<0.0001")])
def test_the_slo_attainment_never_reads_100_or_0_percent_unless_exact(share, text):
    from servesim.metrics.table import format_summary_table, percent_text

    assert percent_text(share) == text
    table = format_summary_table({"goodput": 1.0, "slo_attainment": share})
    assert f"SLO attainment              {text}%" in table.splitlines()


@pytest.mark.parametrize("share, text", [
    (1.0, "1.000"), (0.0, "0.000"), (0.5, "0.500"), (0.97254, "0.973"),
    (0.99975, "0.9998"), (0.00025, "0.0003"),  # the capacity table's 1.000 and 0.000 of 4,000 requests
    (1 - 1e-9, ">0.999999"), (1e-9, "<0.000001")])
def test_the_capacity_attainment_never_reads_1_or_0_unless_exact(share, text):
    from types import SimpleNamespace

    from servesim.analysis.capacity import parse_slo
    from servesim.cli.capacity import format_result
    from servesim.metrics.table import fraction_text

    assert fraction_text(share) == text
    ev = SimpleNamespace(rate=10.0, replicas=1, values={"ttft_p99": 0.1}, slo_attainment=share, passed=False)
    result = SimpleNamespace(slos=[parse_slo("ttft_p99=0.5")], evaluations=[ev], goodput_share=None, mode="replicas",
                             capacity=None, stopped=None, replications=1)
    assert f"      0.1 {text:>7} no" in format_result(result, None).splitlines()[1]


# --- item 12: `servesim acceptance ... > profile.yaml` is a valid profile -----------------------------

@pytest.mark.parametrize("argv", [
    ["ngram", "--input", "workloads/examples/ngram-pairs.jsonl", "--n", "3", "--k", "4"],
    ["from-vllm-log", "--input", "workloads/examples/vllm-specdecode-eagle3-k3.log", "--method", "eagle3"],
])
def test_acceptance_stdout_is_a_valid_profile(tmp_path, capsys, argv):
    from servesim.speculation.profile import load_profile

    argv = [ROOT / a if a.startswith("workloads/") else a for a in argv]
    assert main(["acceptance", *map(str, argv)]) == 0
    captured = capsys.readouterr()
    path = tmp_path / "profile.yaml"
    path.write_text(captured.out)
    profile = load_profile(str(path))
    assert profile.num_positions >= 3
    assert "mean acceptance length" in captured.err  # the statistics are still shown, on stderr


# --- item 14: duplicate keys and empty --set values refused; error paths are --set keys ----------------

def test_duplicate_yaml_key_is_refused_naming_the_line(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    text = yaml.safe_dump(SMALL, sort_keys=False)
    cfg.write_text(text + "engine:\n  max_num_seqs: 64\n  max_num_seqs: 128\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "duplicate key 'max_num_seqs'" in err
    assert f"line {text.count(chr(10)) + 3}" in err
    assert not (tmp_path / "out").exists()


def test_empty_set_value_is_refused(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--set", "engine.max_num_seqs="]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "engine.max_num_seqs: empty value" in err and "=null" in err


@pytest.mark.parametrize(("override", "path"), [
    ("workload.rate=-1", "workload.rate"),
    ("workload.bogus=1", "workload.bogus"),
    ("workload.prompt_tokens.low=-3", "workload.prompt_tokens.low"),
])
def test_error_paths_are_keys_a_user_can_type(tmp_path, capsys, override, path):
    from servesim.cli.run import parse_overrides
    from servesim.config.models import load_config

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    with pytest.raises(ConfigError) as err:
        load_config(cfg, parse_overrides([override], None))
    message = str(err.value)
    assert message.startswith(f"{cfg}: {path}: "), message
    # the path named in the message is a key that --set accepts and that fixes the value
    fixed = {"workload.rate": "5", "workload.bogus": None, "workload.prompt_tokens.low": "10"}[path]
    if fixed is not None:
        load_config(cfg, parse_overrides([override, f"{path}={fixed}"], None))


def test_trace_error_path_has_no_union_tag(tmp_path):
    from servesim.config.models import load_config

    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": {"type": "trace", "path": "t.csv", "rate_scale": 0}})
    with pytest.raises(ConfigError, match=r"c\.yaml: workload\.rate_scale: "):
        load_config(cfg)


# --- item 7: non-UTF-8 inputs give one line ------------------------------------------------------------

LATIN1 = "caf\u00e9".encode("latin-1")  # b"caf\xe9": not UTF-8


def _one_line_error(capsys, argv, name):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert name in err and "not UTF-8" in err and "line 2, column " in err and "(byte 0xe9)" in err, err
    return err


def test_non_utf8_run_config(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"name: x\n# " + LATIN1 + b"\n" + yaml.safe_dump(SMALL).encode())
    err = _one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")], "c.yaml")
    # the column within the line (the byte's offset in the file, 10, was given beside the line number)
    assert f"{cfg}: line 2, column 6: not UTF-8 text (byte 0xe9); save the file as UTF-8" in err, err


def test_non_utf8_trace_names_the_line_and_column(tmp_path, capsys):
    from servesim.errors import TraceError
    from servesim.workload import load_trace

    trace = tmp_path / "t.csv"
    trace.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\n"
                      b"2023-11-16 18:15:47.0000000," + LATIN1 + b",1\n")
    with pytest.raises(TraceError) as info:
        load_trace(trace)
    assert str(info.value) == f"{trace}: line 3, column 32: not UTF-8 text (byte 0xe9); save the file as UTF-8"


def test_non_utf8_sweep_file(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_bytes(b"base: c.yaml\n# " + LATIN1 + b"\n")
    _one_line_error(capsys, ["sweep", str(sweep), "--out", str(tmp_path / "o")], "s.yaml")


def test_non_utf8_card(tmp_path, capsys):
    card = tmp_path / "gpu.yaml"
    card.write_bytes(b"name: x\n# " + LATIN1 + b"\n")
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "hardware": "gpu.yaml"})
    _one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")], "gpu.yaml")


def test_non_utf8_ngram_input(tmp_path, capsys):
    pairs = tmp_path / "p.jsonl"
    pairs.write_bytes(b'{"prompt": "a b", "answer": "a b"}\n{"prompt": "' + LATIN1 + b'", "answer": "x"}\n')
    _one_line_error(capsys, ["acceptance", "ngram", "--input", str(pairs), "--k", "2"], "p.jsonl")


def test_non_utf8_calibrate_csv(tmp_path, capsys):
    csv_path = tmp_path / "steps.csv"
    csv_path.write_bytes(b"batch_size,scheduled_tokens\n# " + LATIN1 + b"\n")
    _one_line_error(capsys, ["calibrate", "--data", str(csv_path), "--hardware", "h100-sxm", "--model",
                             "llama-3.1-8b", "--out", str(tmp_path / "card.yaml")], "steps.csv")


# --- item 6: an unwritable --out is one line, before any simulation ------------------------------------

def _no_simulation(monkeypatch):
    import servesim
    import servesim.api

    def refuse(*args, **kwargs):
        raise AssertionError("a simulation ran before --out was checked")

    # the package's lazy re-export first: monkeypatch reads the old value through it, which must be the real
    # function (read after patching servesim.api, the lazy export would keep `refuse` after the test)
    monkeypatch.setattr(servesim, "simulate", refuse, raising=False)
    monkeypatch.setattr(servesim.api, "simulate", refuse)


@pytest.mark.parametrize("command", ["run", "sweep", "capacity", "tune-k", "validate", "plot"])
@pytest.mark.parametrize("kind", ["below a file", "a file"])
def test_unwritable_out_is_one_line_before_any_simulation(tmp_path, capsys, monkeypatch, command, kind):
    _no_simulation(monkeypatch)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    out = blocker / "sub" if kind == "below a file" else blocker
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    closed = write_yaml(tmp_path / "closed.yaml", {**SMALL, "workload": {
        "type": "closed_loop", "concurrency": 2, "requests_per_client": 2,
        "prompt_tokens": {"type": "fixed", "value": 10}, "output_tokens": {"type": "fixed", "value": 10}}})
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 16]}})
    sweep_dir = tmp_path / "sweepdir"
    sweep_dir.mkdir()
    (sweep_dir / "summary.csv").write_text("variant,replication,seed,point_id,rate,ttft_s.p99\n"
                                           "default,0,0,a,1,0.1\ndefault,0,0,b,2,0.2\n")
    (sweep_dir / "sweep.json").write_text(json.dumps({"columns": {"workload.rate": "rate"}}))
    argv = {
        "run": ["run", str(cfg), "--no-plot"],
        "sweep": ["sweep", str(sweep), "--no-progress"],
        "capacity": ["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--quiet"],
        "tune-k": ["tune-k", str(closed), "--batch-sizes", "1", "--k-max", "1", "--quiet"],
        "validate": ["validate", "--fast"],
        "plot": ["plot", str(sweep_dir)],
    }[command]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("servesim: error: --out: ") and str(blocker) in err, err
    assert blocker.read_text() == "not a folder\n"


# --- item 4: outputs respect the umask ------------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_respect_the_umask(tmp_path, mask):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    old = os.umask(mask)
    try:
        assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-plot", "--quiet"]) == 0
        from servesim.atomic import write_text_output

        write_text_output(tmp_path / "out" / "note.txt", "x\n")
    finally:
        os.umask(old)
    for name in ("summary.json", "requests.csv", "steps.csv", "note.txt"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


# --- item 3: output folders never mix runs --------------------------------------------------------------

def test_no_plot_rerun_removes_the_earlier_figure(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    out.mkdir()
    (out / "latency.png").write_bytes(b"\x89PNG an earlier run's figure")
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "steps.csv", "summary.json"]


def _sweep_dir(folder: Path, speedup: bool) -> Path:
    import pandas as pd

    folder.mkdir()
    rows = [{"variant": "default", "replication": 0, "seed": 0, "point_id": f"p{rate}", "rate": rate,
             "output_throughput": 100.0 * rate, "request_throughput": rate * 0.9, "ttft_s.p50": 0.01 * rate,
             "ttft_s.p99": 0.05 * rate, "tpot_s.p50": 0.001 * rate, "tpot_s.p99": 0.002 * rate}
            for rate in (5, 10, 20)]
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    (folder / "sweep.json").write_text(json.dumps({"columns": {"workload.rate": "rate"}}))
    if speedup:
        pd.DataFrame({"rate": [5, 10, 20], "speedup": [1.4, 1.1, 0.7]}).to_csv(folder / "speedup.csv", index=False)
    return folder


def test_plot_with_unknown_heatmap_metric_writes_nothing(tmp_path, capsys):
    sweep = _sweep_dir(tmp_path / "sweep", speedup=False)
    before = {p.name: p.read_bytes() for p in sweep.iterdir()}
    assert main(["plot", str(sweep), "--heatmap", "x=rate,y=variant,metric=ttft_s.p42"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metric='ttft_s.p42'" in err
    assert {p.name: p.read_bytes() for p in sweep.iterdir()} == before


def test_plot_with_a_text_column_as_heatmap_metric_writes_nothing(tmp_path, capsys):
    # metric=variant drew an empty heatmap and a CSV of blanks
    sweep = _sweep_dir(tmp_path / "sweep", speedup=False)
    before = {p.name: p.read_bytes() for p in sweep.iterdir()}
    for metric in ("variant", "seed"):
        assert main(["plot", str(sweep), "--heatmap", f"x=rate,y=variant,metric={metric}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"servesim: error: --heatmap: metric='{metric}' is not a metric of summary.csv "
                              "(expected a numeric column, e.g. ") and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in sweep.iterdir()} == before


def test_plot_removes_figures_the_sweep_no_longer_has(tmp_path, capsys):
    sweep = _sweep_dir(tmp_path / "sweep", speedup=True)
    assert main(["plot", str(sweep)]) == 0
    assert (sweep / "speedup.png").exists() and (sweep / "speedup_curve.csv").exists()
    (sweep / "speedup.csv").unlink()  # the sweep was rerun without a baseline
    assert main(["plot", str(sweep)]) == 0
    assert not any(p.name.startswith("speedup") for p in sweep.iterdir())
    assert (sweep / "latency_vs_throughput.png").exists()


def test_sweep_rerun_without_baseline_removes_speedup_csv(tmp_path):
    from servesim.sweep.runner import run_sweep

    write_yaml(tmp_path / "c.yaml", SMALL)
    variants = {"plain": {}, "other": {"engine.max_num_seqs": 8}}
    sweep = write_yaml(tmp_path / "a.yaml", {"base": "c.yaml", "variants": variants, "baseline": "plain"})
    run_sweep(sweep, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "speedup.csv").exists()
    write_yaml(tmp_path / "a.yaml", {"base": "c.yaml", "variants": variants})  # the same sweep, edited
    run_sweep(sweep, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "speedup.csv").exists()


# --- item 5: requests.csv and steps.csv at full precision ------------------------------------------------

def test_requests_and_steps_csv_read_back_bit_for_bit(tmp_path):
    import csv

    import numpy as np

    from servesim import simulate
    from servesim.metrics.outputs import request_columns, step_columns, write_outputs

    result = simulate({**SMALL, "workload": {**SMALL["workload"], "rate": 0.05}})  # arrivals up to ~800 s
    write_outputs(result.output, dict(result.summary), tmp_path)
    for name, columns in (("requests.csv", request_columns(result.output)), ("steps.csv", step_columns(result.output))):
        with open(tmp_path / name, newline="") as handle:
            rows = list(csv.DictReader(handle))
        for key, values in columns.items():
            back = np.array([float(row[key]) if row[key] else np.nan for row in rows])
            assert np.array_equal(back, values.astype(float), equal_nan=True), (name, key)
    # the engine's picosecond clock survives: each time is a whole number of picoseconds on disk
    with open(tmp_path / "requests.csv", newline="") as handle:
        finish = [row["finish_s"] for row in csv.DictReader(handle)]
    assert max(float(t) for t in finish) > 100.0
    assert all(len(t.partition(".")[2]) <= 12 for t in finish)
    assert any(len(t.partition(".")[2]) > 9 for t in finish)  # sub-nanosecond digits are kept


def test_full_precision_csv_formats():
    import numpy as np

    from servesim.metrics.csv_text import csv_bytes

    x = np.array([0.0, 1.5, np.nan, 1 / 3, -2.5e-13, 1e-12, 3504.340000123457, -7.000000000001, 1e300, np.inf])
    rows = csv_bytes({"x": x, "n": np.arange(x.size)}, full_precision=True).decode().splitlines()
    assert rows == ["x,n", "0,0", "1.5,1", ",2", "0.3333333333333333,3", "-2.5e-13,4", "0.000000000001,5",
                    "3504.340000123457,6", "-7.000000000001,7", "1e+300,8", "inf,9"]
    rng = np.random.default_rng(np.random.SeedSequence(5))
    y = np.concatenate([rng.integers(0, 2**53, 3000) / 1e12, rng.random(3000) * 10.0 ** rng.integers(-20, 20, 3000)])
    back = np.array([float(r) for r in csv_bytes({"y": y}, full_precision=True).decode().split()[1:]])
    assert np.array_equal(back, y)


def test_long_run_times_are_written_as_whole_picoseconds():
    """Beyond 2**53 ps (9,007 s) a time on the picosecond grid is still written as its whole picoseconds
    (at most 12 decimals, no exponent) and reads back as the same float64; up to 2**62 ps (4.6e6 s)."""
    import numpy as np

    from servesim.metrics.csv_text import csv_bytes

    rng = np.random.default_rng(np.random.SeedSequence(18))
    ps = rng.integers(2**53, 2**62 - 2**20, 4000)
    x = ps / 1e12  # engine times of a long run: whole picoseconds over 1e12, rounded
    assert (x > 9007.2).all()
    text = csv_bytes({"x": x}, full_precision=True).decode().split()[1:]
    assert np.array_equal(np.array([float(t) for t in text]), x)
    for value, written in zip(x, text):
        whole, _, fraction = written.partition(".")
        assert len(fraction) <= 12 and "e" not in written
        exact = int(np.rint(value * 1e12))  # the decimal written is exactly these picoseconds
        assert int(whole) * 10**12 + int(fraction.ljust(12, "0") or 0) == exact
    assert csv_bytes({"x": np.array([50_000.000_000_001])}, full_precision=True).decode() == \
        "x\n50000.000000001\n"
    # at and beyond 2**62 ps the shortest text that reads back is written instead
    far = np.array([2.0**62 / 1e12 * 1.5])
    assert csv_bytes({"x": far}, full_precision=True).decode().split()[1] == repr(float(far[0]))


# --- item 2: a resumed sweep reuses a run only when its resolved inputs are unchanged ---------------------

def _card_sweep(tmp_path, overhead_s: float, seed: int = 0) -> Path:
    card = yaml.safe_load((ROOT / "hardware" / "gpus" / "h100-sxm.yaml").read_text())
    card["step_overhead_s"] = overhead_s
    write_yaml(tmp_path / "gpu.yaml", card)
    write_yaml(tmp_path / "base.yaml", {**SMALL, "hardware": "gpu.yaml"})
    return write_yaml(tmp_path / "sweep.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]},
                                                "seed": seed})


def test_resume_reruns_points_whose_card_file_changed(tmp_path, capsys):
    import pandas as pd

    sweep = _card_sweep(tmp_path, 1.45e-3)
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    before = pd.read_csv(out / "summary.csv")["tpot_s.mean"]
    assert "reused 0 stored run(s)" in capsys.readouterr().out
    _card_sweep(tmp_path, 10e-3)  # edit the card the base config names by path
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "reused 0 stored run(s)" in printed and "ran 2 stored run(s) again" in printed
    assert "hardware/model card (2)" in printed and "gpu.yaml" in printed
    after = pd.read_csv(out / "summary.csv")["tpot_s.mean"]
    fresh = tmp_path / "fresh"
    assert main(["sweep", str(sweep), "--out", str(fresh), "--no-progress"]) == 0
    assert list(after) == list(pd.read_csv(fresh / "summary.csv")["tpot_s.mean"])
    assert all(a > b + 5e-3 for a, b in zip(after, before))
    # unchanged inputs: everything reused
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    assert "reused 2 stored run(s)" in capsys.readouterr().out


def _summary_simulate(config, *, seed=None, base_dir=None):
    return {"num_requests": 1, "completed": 1, "output_throughput": float(seed % 1000)}


@pytest.mark.parametrize("change", ["seed", "trace file", "profile file", "servesim version", "servesim source"])
def test_resume_keys_on_seed_files_and_version(tmp_path, monkeypatch, change):
    import servesim
    from servesim.sweep.runner import run_sweep

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text("name: p\nper_position_acceptance: [0.8, 0.6]\n")
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": {"type": "trace", "path": "trace.csv"},
            "speculative_config": {"method": "eagle", "num_speculative_tokens": 2, "acceptance": "profile.yaml"}}
    write_yaml(tmp_path / "base.yaml", base)
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]}, "seed": 1}
    write_yaml(tmp_path / "sweep.yaml", sweep)
    first = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate)
    assert first.num_run == 2
    if change == "seed":
        write_yaml(tmp_path / "sweep.yaml", {**sweep, "seed": 2})
        reason = "seed"
    elif change == "trace file":
        trace.write_text(trace.read_text() + "2023-11-16 18:15:47.0000000,100,10\n")
        reason = f"file {trace.resolve()}"
    elif change == "profile file":
        profile.write_text("name: p\nper_position_acceptance: [0.9, 0.6]\n")
        reason = f"file {profile.resolve()}"
    elif change == "servesim version":
        monkeypatch.setattr(servesim, "__version__", servesim.__version__ + ".post1")
        reason = "servesim version or source"
    else:  # an edit of the simulator's code that keeps the version number
        import servesim.sweep.inputs as inputs

        monkeypatch.setattr(inputs, "_SOURCE_DIGEST", ["0" * 64])
        reason = "servesim version or source"
    again = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate)
    assert (again.num_skipped, again.num_run, again.num_stale) == (0, 2, 2)
    assert again.stale == {reason: 2}
    same = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate)
    assert (same.num_skipped, same.num_run) == (2, 0)


def test_resume_reruns_points_whose_default_acceptance_profile_changed(tmp_path, monkeypatch):
    # a speculative config without `acceptance` reads its method's shipped profile: editing that file must
    # rerun the stored points as editing a profile the config names does
    import shutil

    import servesim.speculation.profile as profile_module
    from servesim.speculation.config import DEFAULT_PROFILES
    from servesim.sweep.runner import run_sweep

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    name = DEFAULT_PROFILES["eagle"]
    shutil.copy(profile_module.profiles_dir() / f"{name}.yaml", shipped / f"{name}.yaml")
    monkeypatch.setattr(profile_module, "profiles_dir", lambda: shipped)
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": SMALL["workload"],
            "speculative_config": {"method": "eagle", "num_speculative_tokens": 2}}
    write_yaml(tmp_path / "base.yaml", base)
    write_yaml(tmp_path / "sweep.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]}, "seed": 1})
    assert run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate).num_run == 2
    same = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate)
    assert (same.num_skipped, same.num_run) == (2, 0)
    edited = shipped / f"{name}.yaml"
    edited.write_text(edited.read_text() + "\n# edited\n")
    again = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", progress=False, simulate=_summary_simulate)
    assert (again.num_skipped, again.num_run, again.num_stale) == (0, 2, 2)
    assert again.stale == {f"file {edited.resolve()}": 2}


# --- item 10: huge grids are counted, refused without --yes, and expanded lazily ---------------------------

def test_huge_grid_is_counted_and_refused_without_yes(tmp_path, capsys):
    write_yaml(tmp_path / "base.yaml", SMALL)
    grid = {f"engine.k{i}": list(range(10)) for i in range(6)}  # 10^6 points
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "base.yaml", "grid": grid, "replications": 2})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "1,000,000 point(s) x 2 replication(s) = 2,000,000 run(s)" in captured.out
    assert captured.err.count("\n") == 1 and "pass --yes" in captured.err
    assert not (tmp_path / "out").exists()


def test_sweep_points_are_expanded_lazily():
    import itertools

    from servesim.sweep.points import count_points, iter_points
    from servesim.sweep.spec import SweepConfig, resolve_sweep

    grid = {f"engine.k{i}": list(range(10)) for i in range(9)}  # 10^9 points: a list would not fit
    loaded = resolve_sweep(SweepConfig(base=dict(SMALL), grid=grid, variants={"a": {}, "b": {}}), ROOT, "sweep")
    assert count_points(loaded) == 2 * 10**9
    first = list(itertools.islice(iter_points(loaded), 3))
    assert [p.variant for p in first] == ["a", "b", "a"] and first[2].axes["engine.k8"] == 1


# --- item 22: an experiment file's `Run:` line is the command its README reports ---------------------------

def _commands(lines: list[str], prefix: str) -> list[list[str]]:
    """``servesim ...`` commands in ``lines`` (after ``prefix``), with backslash continuations joined."""
    import shlex

    found, current = [], None
    for line in lines:
        text = line.removeprefix(prefix).strip() if line.startswith(prefix) else None
        if current is not None and text is not None:
            current += " " + text
        elif text is not None and text.startswith(("Run:", "servesim ")):
            current = text.removeprefix("Run:").strip()
        if current is not None and not current.endswith("\\"):
            if current.startswith("servesim "):
                found.append(shlex.split(current))
            current = None
        elif current is not None:
            current = current[:-1].rstrip()
    return found


def _experiment_files():
    return sorted(p for p in (ROOT / "experiments").rglob("*.yaml") if (p.parent / "README.md").exists())


@pytest.mark.parametrize("path", _experiment_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_run_line_matches_the_readme_command(path):
    rel = str(path.relative_to(ROOT))
    runs = [c for c in _commands(path.read_text().splitlines(), "#") if rel in c]
    readme = [c for c in _commands((path.parent / "README.md").read_text().splitlines(), "") if rel in c]
    for run in runs:
        same = [c for c in readme if c[:2] == run[:2]]
        assert not same or run in same, f"{rel}: Run: {' '.join(run)}; README: {[' '.join(c) for c in same]}"


def test_tune_k_run_line_is_the_readme_command():
    path = ROOT / "experiments" / "tune-k" / "llama8b-h100-eagle.yaml"
    run = _commands(path.read_text().splitlines(), "#")
    readme = _commands((path.parent / "README.md").read_text().splitlines(), "")
    assert run and run[0] in readme and "--requests-per-client" in run[0]


def test_speculative_config_error_path_is_a_set_key(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot",
            "--speculative-config", '{"method": "eagle", "num_speculative_tokens": -1}']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "speculative_config.num_speculative_tokens: " in err, err
    assert main([*argv, "--set", "speculative_config.num_speculative_tokens=2", "--quiet"]) == 0


def test_failed_rerun_leaves_no_earlier_results_looking_current(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 0
    (out / "latency.png").write_bytes(b"\x89PNG an earlier run's figure")
    (out / "notes.txt").write_text("mine\n")
    bad = ["--set", "workload={type: trace, path: missing.csv}"]
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", *bad]) == 2
    assert "missing.csv" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # only the user's own file is left


def test_a_rerun_removes_the_earlier_results_before_it_simulates(tmp_path, monkeypatch):
    # a run killed while it simulates (SIGKILL, out of memory: no handler runs) must not leave the earlier
    # run's files looking current: they are gone before the simulation starts
    from servesim import api

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    (out / "notes.txt").write_text("mine\n")
    (out / ".requests.csv.x1y2.tmp").write_text("a write killed half-way\n")  # atomic_file's temporary
    seen = []
    real = api._simulate

    def watching(*args, **kwargs):
        seen.append(sorted(p.name for p in out.iterdir()))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "_simulate", watching)
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert seen == [["notes.txt"]]
    assert sorted(p.name for p in out.iterdir()) == ["latency.png", "notes.txt", "requests.csv", "steps.csv",
                                                      "summary.json"]


@pytest.mark.parametrize("mistake", [["--set", "engine.max_num_seqs=abc"], ["--set", "engine.no_such_key=1"],
                                     ["--speculative-config", "{not json"]])
def test_rerun_with_a_config_mistake_leaves_no_earlier_results_looking_current(tmp_path, capsys, mistake):
    """The config fails before anything is simulated: the earlier run's outputs go all the same."""
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 0
    (out / "notes.txt").write_text("mine\n")
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", *mistake]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    missing = tmp_path / "never"  # nothing is created for a command that fails on its config
    assert main(["run", str(cfg), "--out", str(missing), "--no-plot", *mistake]) == 2
    assert not missing.exists()


def test_failed_capacity_rerun_removes_the_earlier_tables(tmp_path, monkeypatch, capsys):
    import servesim.api
    from servesim.errors import ServesimError

    out = tmp_path / "out"
    out.mkdir()
    for name in ("capacity.csv", "slo_attainment.csv", "slo_attainment.png"):
        (out / name).write_text("an earlier search\n")

    def fail(*args, **kwargs):
        raise ServesimError("engine stalled")

    monkeypatch.setattr(servesim.api, "simulate", fail)
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--out", str(out), "--quiet"]) == 2
    assert "engine stalled" in capsys.readouterr().err and list(out.iterdir()) == []


def test_sweep_with_a_bad_executor_writes_nothing(tmp_path, capsys):
    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]}})
    for bad in (["--executor", "ray"], ["--jobs", "0"]):
        assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), *bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_result_config_holds_the_seed_the_run_used():
    # simulate(cfg, seed=3) ran with seed 3 while result.config.seed said the config's 0
    import numpy as np

    from servesim.api import simulate

    cfg = dict(SMALL, workload=dict(SMALL["workload"], num_requests=20))
    given = simulate(cfg, seed=3)
    assert given.config.seed == 3 and simulate(cfg).config.seed == 0
    # the same run as the config that says seed 3 (what a user would rerun from result.config)
    again = simulate(given.config.model_dump(exclude_none=True))
    assert again.summary == given.summary
    assert simulate(cfg, seed=np.random.SeedSequence(3)).config.seed == 0  # a SeedSequence is no config seed


def test_sweep_names_the_variant_keys_its_swept_values_replace(tmp_path, capsys):
    import pandas as pd

    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "sweep.yaml", {
        "base": "base.yaml", "grid": {"engine.max_num_seqs": [8]}, "baseline": "plain",
        "variants": {"plain": {}, "small": {"engine": {"max_num_seqs": 2, "max_num_batched_tokens": 1024}}}})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert ("note: variant 'small': engine.max_num_seqs is replaced by the swept values of engine.max_num_seqs"
            in printed.splitlines())
    table = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(table["engine.max_num_seqs"]) == [8, 8]  # the swept value, in both variants
