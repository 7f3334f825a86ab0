"""Regression tests for defects found by trying every command as a new user: mistakes in options and in
the files they read get one line naming the option or the file, the field or line, and what was expected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesim.cli import main

from test_cli import write_yaml
from test_robustness_cli import SMALL
from test_user_mistakes import refused_run


@pytest.mark.parametrize("spec, message", [
    # refused when the run is set up (not by the option's own validation): named the config file, where the
    # user would look in vain
    ({"method": "eagle", "num_speculative_tokens": 2, "acceptance": [0.8, 1.2]},
     "speculative_config.acceptance: per_position_acceptance.1: Input should be less than or equal to 1 (got 1.2)"),
    ({"method": "eagle", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "speculative_config.draft_tensor_parallel_size: 2 cannot be other value than 1 or target model "
     "tensor_parallel_size (1)"),
])
def test_speculative_config_option_settings_refused_when_wired_name_the_option(tmp_path, capsys, spec, message):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--speculative-config", json.dumps(spec)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"servesim: error: --speculative-config: {message}\n"
    # refined by --set, the speculative_config is the config's: named by its file
    assert main([*argv, "--set", "speculative_config.method=eagle"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {cfg}: {message}\n"


def test_vllm_bench_result_without_a_metric_is_refused(tmp_path, capsys):
    # was "0 of 0 cases within tolerance", a matplotlib warning on stderr and exit status 0
    bench = tmp_path / "r.json"
    bench.write_text(json.dumps({"completed": 2, "input_lens": [5, 5], "output_lens": [5, 5], "max_concurrency": 1,
                                 "mean_ttft_ms": 0, "mean_tpot_ms": float("nan")}))
    server = write_yaml(tmp_path / "server.yaml", SMALL)
    assert main(["validate", "--vllm-bench", str(bench), "--server", str(server), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"servesim: error: {bench}: no measured metric to compare (expected one of mean_ttft_ms, mean_tpot_ms, "
        "output_throughput > 0)")


def test_validate_server_without_vllm_bench_is_refused(tmp_path, capsys):
    # was ignored: the published cases ran as if the server had been replayed
    server = write_yaml(tmp_path / "server.yaml", SMALL)
    assert main(["validate", "--server", str(server), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("servesim: error: validate: --server is the server of --vllm-bench "
                                       "RESULT.json: give both, or neither\n")
    assert not (tmp_path / "o").exists()


STEP_CSV = "batch_size,context_tokens,scheduled_tokens,step_time_s\n1,256,1,{}\n2,1,2,0.009\n4,256,4,0.008\n8,100,8,0.01\n"


@pytest.mark.parametrize("step_time", ["1e-300", "1e-9"])
def test_calibrate_refuses_step_times_below_a_microsecond(tmp_path, capsys, step_time):
    # 1e-300 s was a traceback (the fit's relative errors overflowed: "array must not contain infs or NaNs")
    data = tmp_path / "steps.csv"
    data.write_text(STEP_CSV.format(step_time))
    assert main(["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", str(data)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {data}: line 2: step_time_s: expected a step time of at "
                                       f"least 1e-06 s (got '{step_time}'; is it in another unit?)\n")


FILE_OUT_COMMANDS = [
    ["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--data", "STEPS"],
    ["acceptance", "ngram", "--input", "PAIRS", "--k", "3"],
]


def _file_out_command(tmp_path, command):
    """``command`` of FILE_OUT_COMMANDS with its input written in ``tmp_path`` (steps.csv, pairs.jsonl)."""
    (tmp_path / "steps.csv").write_text(STEP_CSV.format("0.008"))
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "a b c a b", "answer": "a b c"}\n')
    return [str(tmp_path / "steps.csv") if a == "STEPS" else str(tmp_path / "pairs.jsonl") if a == "PAIRS" else a
            for a in command]


@pytest.mark.parametrize("command", FILE_OUT_COMMANDS)
def test_an_out_file_under_a_file_or_at_a_folder_is_refused_before_the_work(tmp_path, capsys, command):
    # were "afile/x.yaml: cannot write file (File exists)" and "DIR: cannot write file (Is a directory)",
    # after the whole fit
    command = _file_out_command(tmp_path, command)
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "sub" / "card.yaml"
    assert main([*command, "--out", str(target)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: cannot write {target}: {tmp_path / 'afile'} is a "
                                       "file, not a folder\n")
    assert main([*command, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"servesim: error: --out: {tmp_path} is a folder (expected a file path)\n"
    # a missing folder is created when the file is written
    assert main([*command, "--out", str(tmp_path / "new" / "card.yaml")]) == 0
    assert (tmp_path / "new" / "card.yaml").is_file()


@pytest.mark.parametrize("command", FILE_OUT_COMMANDS)
def test_an_out_file_that_is_a_pipe_or_device_is_refused_not_replaced(tmp_path, capsys, command):
    # --out /dev/full wrote a temporary file beside it and renamed it over the device: as root /dev/full (or
    # /dev/null) became a regular file holding the card, and the command said "wrote /dev/full"
    import os
    import stat

    command = _file_out_command(tmp_path, command)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main([*command, "--out", str(fifo)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {fifo} is not a regular file (a device, pipe or "
                                       "socket, which the output would replace); give a file path, or no --out to "
                                       "print it\n")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl", "pipe", "steps.csv"]


@pytest.mark.parametrize("command, option", list(zip(FILE_OUT_COMMANDS, ["--data", "--input"])))
def test_an_out_file_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys, command, option):
    # --out naming the --data (--input) file replaced the measurements with the card (profile), silently
    command = _file_out_command(tmp_path, command)
    data = Path(command[command.index(option) + 1])
    before = data.read_text()
    assert main([*command, "--out", str(data)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {data} is the {option} file (an input of this "
                                       "command); give another file path\n")
    assert data.read_text() == before


@pytest.mark.parametrize("command", [["capacity", "CFG"], ["tune-k", "CFG"]])
def test_one_slo_statistic_given_twice_is_refused(tmp_path, capsys, command):
    # was accepted: both targets were checked, so the stricter one silently won
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": {"method": "eagle", "num_speculative_tokens": 1}})
    args = [str(cfg) if a == "CFG" else a for a in command]
    assert main([*args, "--slo", "ttft_p99=0.5", "--slo", "tpot_p99=0.05", "--slo", "ttft_p99=0.4", "--out",
                 str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("servesim: error: --slo: ttft_p99 given twice (0.5 s and 0.4 s; expected each "
                                       "statistic once)\n")


def test_tune_k_without_speculation_names_the_config_file(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["tune-k", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: speculative_config: tune-k needs a config with a "
                                       "speculative_config (method, acceptance)\n")


def test_tune_k_says_where_no_k_meets_the_slos(tmp_path, capsys):
    # the table's k is then the one closest to meeting them, which the output did not say; and it exited 0
    import json

    spec = {"method": "eagle", "num_speculative_tokens": 1, "acceptance": {"alpha": 0.6}}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": spec})
    base = ["tune-k", str(cfg), "--batch-sizes", "1,2", "--requests-per-client", "2", "--quiet"]
    assert main([*base, "--slo", "tpot_p99=1e-9", "--out", str(tmp_path / "o")]) == 1
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert len(rows) == 2 and all(row.endswith("  no k meets the SLOs") for row in rows)  # the table's rows say so
    assert captured.err.splitlines()[-1] == (
        "servesim: no k meets the SLOs (tpot_p99=1e-09) at batch size(s) 1, 2: the table's k there is only the "
        "one closest to meeting them (smallest statistic / target)")
    # what was found is written all the same
    assert json.loads((tmp_path / "o" / "tune_k.json").read_text())["slo_unmet_batch_sizes"] == [1, 2]
    assert (tmp_path / "o" / "tune_k_grid.csv").exists() and (tmp_path / "o" / "tune_k.png").exists()
    assert main([*base, "--slo", "tpot_p99=10", "--out", str(tmp_path / "o2")]) == 0
    captured = capsys.readouterr()
    assert "no k meets" not in captured.err and "no k meets" not in captured.out
    assert json.loads((tmp_path / "o2" / "tune_k.json").read_text())["slo_unmet_batch_sizes"] == []


@pytest.mark.parametrize("change, message", [
    # a misspelt required key was reported as the required key missing, naming neither the typo nor the file's line
    ({"hardwar": "h100-sxm", "hardware": None}, "hardwar: unknown key (did you mean hardware?) [and 1 more error: hardware]"),
    ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
    ({"slo": {"ttfts": 1}}, "slo.ttfts: unknown key (did you mean ttft_s?)"),
    # inside a union member (the workload's type) and a mapping checked against its own model
    ({"workload": {**SMALL["workload"], "num_request": 5}}, "workload.num_request: unknown key (did you mean "
                                                            "num_requests?)"),
    ({"speculative_config": {"method": "eagle", "num_speculative_token": 2}},
     "speculative_config.num_speculative_token: unknown key (did you mean num_speculative_tokens?)"),
    ({"xyz": 1}, "xyz: unknown key"),  # nothing close: no guess
])
def test_a_misspelt_key_is_named_with_the_key_meant(tmp_path, capsys, change, message):
    config = {key: value for key, value in {**SMALL, **change}.items() if value is not None}
    cfg = write_yaml(tmp_path / "c.yaml", config)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {cfg}: {message}\n"


@pytest.mark.parametrize("change, message", [
    # a workload file (its whole content one workload) gave no hint where a run config's workload did
    ({"num_request": 5}, "num_request: unknown key (did you mean num_requests?)"),
    ({"type": "closed_loop", "rate": None, "num_requests": None, "concurrency": 2, "num_request": 5},
     "num_request: unknown key (did you mean num_requests?)"),
])
def test_a_misspelt_key_in_a_workload_file_is_named_with_the_key_meant(tmp_path, capsys, change, message):
    workload = write_yaml(tmp_path / "w.yaml", {key: value for key, value in {**SMALL["workload"], **change}.items()
                                                if value is not None})
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": "w.yaml"})
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {workload}: {message}\n"


def test_a_misspelt_sweep_key_is_named_with_the_key_meant(tmp_path, capsys):
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"seed": [1]}, "replication": 2})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"servesim: error: {sweep}: replication: unknown key (did you mean replications?)\n"


def test_a_run_config_given_to_validate_is_named_as_one(tmp_path, capsys):
    # was "c.yaml: hardware: unknown key [and 4 more errors]"
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["validate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: a run config (hardware, model, workload), not a "
                                       "validation case file: give it to `servesim run`, or to `servesim validate "
                                       "--server` with --vllm-bench RESULT.json\n")


def test_a_set_key_below_a_value_names_the_option(tmp_path, capsys):
    # was "override: cannot set ...", naming no option or file
    _, err = refused_run(tmp_path, capsys, "--set", "workload.num_requests.x=3")
    assert err == ("servesim: error: --set: cannot set 'workload.num_requests.x': 'workload.num_requests' holds 40 "
                   "(int), not a mapping\n")


def test_a_sweep_that_changes_its_table_removes_the_earlier_plots(tmp_path, capsys, monkeypatch):
    # the figures `servesim plot` drew from the earlier summary.csv stayed beside the new one, looking current
    import servesim.sweep.runner

    write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"

    def sweep(rates: list) -> int:
        spec = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"workload.rate": rates}})
        return main(["sweep", str(spec), "--out", str(out), "--no-progress"])

    assert sweep([4, 8]) == 0 and main(["plot", str(out)]) == 0
    drawn = {"latency_vs_throughput.png", "latency_vs_throughput.svg", "latency_vs_throughput.csv"}
    (out / "heatmap_ttft_s.p99.png").write_bytes(b"an earlier heatmap")
    assert drawn <= {p.name for p in out.iterdir()}
    assert sweep([4, 8]) == 0  # every run reused: the same table, its figures still hold
    assert drawn | {"heatmap_ttft_s.p99.png"} <= {p.name for p in out.iterdir()}
    assert sweep([4, 8, 16]) == 0
    assert not {p.name for p in out.iterdir()} & (drawn | {"heatmap_ttft_s.p99.png"})
    # interrupted, a sweep removes them with its tables
    assert main(["plot", str(out)]) == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(servesim.sweep.runner, "execute_task", interrupted)
    assert sweep([2, 4, 8, 16]) == 130
    assert {p.name for p in out.iterdir()} == {"points", "sweep.json"}
    capsys.readouterr()


def test_the_alpha_shorthand_with_another_key_names_the_extra_key(tmp_path, capsys):
    # was "speculative_config.acceptance: alpha: unknown key [and 1 more error]": alpha is the known key
    spec = {"method": "eagle", "num_speculative_tokens": 2, "acceptance": {"alpha": 0.5, "decay": 3}}
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "speculative_config": spec})
    assert err == (f"servesim: error: {cfg}: speculative_config.acceptance: the shorthand {{alpha: RATE}} takes no "
                   "other key (got decay); give a profile mapping (conditional_acceptance: [RATE], ...) for more\n")


def test_capacity_names_the_replica_limit_it_reached(tmp_path, capsys):
    # was "no replica count up to the limit serves ...", naming neither the limit nor the option that sets it
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=1e-6", "--replicas", "10", "--replications", "1",
                 "--max-replicas", "3", "--out", str(tmp_path / "o"), "--quiet"]) == 1  # no answer: status 1
    out = capsys.readouterr().out.splitlines()
    assert "no replica count up to 3 (the most tried; raise --max-replicas to look further) serves 10 requests/s" in out
    assert "        10        1      0.02493   0.000 no" not in out  # attainment 0 reads 0.000 only when exact
    assert (tmp_path / "o" / "capacity.csv").exists()


def test_capacity_refuses_more_replicas_than_it_simulates_before_any_run(tmp_path, capsys):
    # --max-replicas 5000 ran 1 to 4096 replicas, then stopped on the deployment's limit naming the config's
    # deployment.replicas, and wrote nothing
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=1e-6", "--replicas", "10", "--max-replicas", "5000",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ("servesim: error: --max-replicas: expected at most 4,096, the "
                                                   "most replicas servesim simulates (got 5,000)\n")
    assert not (tmp_path / "o").exists()


def test_capacity_stops_at_the_replicas_x_requests_limit_and_keeps_its_work(tmp_path, capsys, monkeypatch):
    # the 2 x 10^7 replicas x requests limit: the search stops at the most replicas it can simulate and says so
    import servesim.deployment as deployment

    monkeypatch.setattr(deployment, "MAX_REPLICA_REQUESTS", 5 * SMALL["workload"]["num_requests"])
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=1e-6", "--replicas", "10", "--replications", "1",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 1
    out = capsys.readouterr().out.splitlines()
    n = SMALL["workload"]["num_requests"]
    assert out[-2] == (f"no replica count up to 5 serves 10 requests/s; the search stopped at 5 replicas, the most "
                       f"servesim simulates for {n} requests ({5 * n} replicas x requests)")
    import pandas as pd

    assert pd.read_csv(tmp_path / "o" / "capacity.csv")["replicas"].tolist() == [1, 2, 4, 5]


def test_capacity_refuses_a_multi_turn_workload_first_with_max_requests(tmp_path, capsys):
    # said to give --set workload.num_sessions=N instead, which the search then refused as not open-loop
    config = {**SMALL, "workload": {"type": "multi_turn", "num_sessions": 4, "rate": 1.0,
                                    "turns": {"type": "fixed", "value": 2},
                                    "message_tokens": {"type": "fixed", "value": 50},
                                    "output_tokens": {"type": "fixed", "value": 20}, "think_time_s": 5}}
    cfg = write_yaml(tmp_path / "c.yaml", config)
    for extra in (["--max-requests", "40"], []):
        assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", *extra, "--out", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err == (f"servesim: error: {cfg}: workload.type: capacity search needs an "
                                           "open-loop workload (trace, poisson or gamma), not multi_turn\n")


def test_capacity_shows_small_rates_in_significant_digits():
    # rates below 0.0005 req/s all read "0.000" in the table and the answer ("capacity: 0.000 requests/s")
    from pathlib import Path

    from servesim.analysis.capacity import CapacitySearch, parse_slo
    from servesim.cli.capacity import format_result

    from test_capacity import FakeSimulate, poisson_cfg

    search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=0.000003")], replications=1,
                            simulate=FakeSimulate())  # itl p99 = 0.01 s x rate: capacity 0.0003 req/s
    lines = format_result(search.max_rate(), search).splitlines()
    assert lines[1].split()[:2] == ["0.0002441", "1"] and lines[-3].split()[:2] == ["2", "1"]
    assert lines[-1] == "capacity: 0.0002975 requests/s (within 5%)"
    # the replica search's answer gives its target rate as the table does (it read 1234.57 beside 1235)
    search = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=0.1")], replications=1,
                            simulate=FakeSimulate())
    lines = format_result(search.min_replicas(1234.5678, max_replicas=256), search).splitlines()
    assert lines[1].split()[0] == "1235" and lines[-1] == "fewest replicas for 1235 requests/s: 124"


def test_check_draft_names_both_vocabularies_values(tmp_path, capsys):
    # was "BOS id differs: None" (the lesson's wording names the draft's value only, None for no BOS token)
    card = 'name: {name}\nvocab_type: BPE\n{bos}eos_id: 1\ntokens: ["<s>", "</s>", "a", "b", "c", "d"]\n'
    (tmp_path / "t.yaml").write_text(card.format(name="with-bos", bos="bos_id: 0\n"))
    (tmp_path / "d.yaml").write_text(card.format(name="no-bos", bos=""))
    assert main(["check-draft", str(tmp_path / "t.yaml"), str(tmp_path / "d.yaml")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "BOS id differs: None (target 0, draft none)",
        "  target (with-bos): type BPE, BOS id 0, EOS id 1, add BOS unknown, add EOS unknown, 6 tokens",
        "  draft (no-bos): type BPE, BOS id none, EOS id 1, add BOS unknown, add EOS unknown, 6 tokens"]


def test_plot_of_a_run_folder_says_it_holds_a_run(tmp_path, capsys):
    # was "DIR/summary.csv: cannot read the sweep summary (FileNotFoundError); run `servesim sweep` first"
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 0
    assert main(["plot", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {tmp_path / 'o'}: holds the results of `servesim run` "
                                       "(summary.json, requests.csv, steps.csv), not of a sweep: plot draws a "
                                       "`servesim sweep` folder (`servesim run` draws its own figures)\n")


def test_plot_of_a_capacity_folder_says_whose_it_is(tmp_path, capsys):
    # was "DIR/summary.csv: cannot read the sweep summary (FileNotFoundError); run `servesim sweep` first"
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "capacity.csv").write_text("rate\n1\n")
    assert main(["plot", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {tmp_path / 'o'}: holds the results of `servesim capacity` "
                                       "(capacity.csv), not of a sweep: plot draws a `servesim sweep` folder "
                                       "(`servesim capacity` draws its own figures)\n")


@pytest.mark.parametrize("slo", ["tpot_p99=0.05", "itl_p50=0.01"])
def test_capacity_with_an_slo_no_request_defines_is_refused(tmp_path, capsys, slo):
    # every request has one output token, so no TPOT or ITL: the search halved the rate 17 times and answered
    # "meets the SLOs at no rate down to 3.052e-05 requests/s"
    workload = {**SMALL["workload"], "output_tokens": {"type": "fixed", "value": 1}}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=1", "--slo", slo, "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    rate = f"{SMALL['workload']['rate']:.4g}"
    assert capsys.readouterr().err == (
        f"servesim: error: --slo: {slo.split('=')[0]} is undefined at {rate} requests/s, where every request "
        "completed (TPOT and ITL need requests of two or more output tokens); give an objective the workload "
        "defines\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key, value", [("workload.num_requests", "100"), ("workload.duration_s", "30")])
def test_capacity_max_requests_and_a_set_of_the_key_it_replaces_are_refused(tmp_path, capsys, key, value):
    # --max-requests replaced the --set value silently (the search ran on --max-requests' count, without the
    # duration the --set gave)
    count = {"num_requests": None, "duration_s": 10.0} if key == "workload.duration_s" else {}
    workload = {k: v for k, v in {**SMALL["workload"], **count}.items() if v is not None}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--set", f"{key}={value}", "--max-requests", "20",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --max-requests: replaces {key}, which --set gives too "
                                       "(give one of them)\n")
    assert not (tmp_path / "o").exists()


def test_sweep_into_a_file_is_refused_before_its_size_is_printed(tmp_path, capsys):
    # printed "sweep: 1 point(s) x 1 replication(s) = 1 run(s)" first, as if the sweep had started
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml"})
    (tmp_path / "o").write_text("mine\n")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"servesim: error: --out: {tmp_path / 'o'} is a file, not a folder\n"
    assert (tmp_path / "o").read_text() == "mine\n"


def test_tune_k_with_an_slo_no_request_defines_is_refused(tmp_path, capsys):
    # was "no k meets the SLOs (tpot_p99=0.05) at batch size(s) 1, 2", exit 1, of a TPOT no run has
    workload = {**SMALL["workload"], "output_tokens": {"type": "fixed", "value": 1}}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload,
                                           "speculative_config": {"method": "eagle", "num_speculative_tokens": 1}})
    assert main(["tune-k", str(cfg), "--slo", "tpot_p99=0.05", "--batch-sizes", "1,2", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: --slo: tpot_p99 is undefined at batch size 1 (k=0), where every request completed (TPOT "
        "and ITL need requests of two or more output tokens); give an objective the workload defines\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", [["--max-rate", "1e-06"], ["--replicas", "1e-06"]])
def test_capacity_at_a_rate_too_low_to_simulate_names_the_option(tmp_path, capsys, option):
    # was "c.yaml: workload: the last request arrives at ... s; ...: raise the rate or rate_scale", blaming the
    # config's file for the rate the option gave
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", *option, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {option[0]}: 1e-06 requests/s cannot be simulated (workload: the last "
                          "request arrives at "), err
    assert err.endswith(" of arrivals: raise the rate or rate_scale)\n") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("make, message", [
    (None, "does not exist (expected the output folder of `servesim sweep`)"),
    ("file", "is a file (expected the output folder of `servesim sweep`)"),
    ("folder", "no summary.csv (expected the output folder of `servesim sweep`; run one first)"),
])
def test_plot_of_no_sweep_folder_says_what_the_path_is(tmp_path, capsys, make, message):
    # was "DIR/summary.csv: cannot read the sweep summary (FileNotFoundError|NotADirectoryError); run `servesim
    # sweep` first", naming a file under a path that does not exist or is a file
    path = tmp_path / "o"
    if make == "file":
        path.write_text("x\n")
    elif make == "folder":
        path.mkdir()
    assert main(["plot", str(path)]) == 2
    assert capsys.readouterr().err == f"servesim: error: {path}: {message}\n"


@pytest.mark.parametrize("measure", [{"after_completed": 60}, {"after_s": 1e6}, {"until_s": 1e-3}])
def test_a_measurement_window_that_holds_no_request_is_refused(tmp_path, capsys, measure):
    # was accepted: summary.json's measurement_window read 0.0 req/s and 0.0 tok/s (start_s 1e6 > end_s)
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "simulation": {"measure": measure}})
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # an earlier run's: must not stay looking like this one's
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {cfg}: simulation.measure: the window from ") and err.endswith(
        "holds none of the run's 40 completed requests (expected bounds that leave some inside: after_completed "
        "below the requests, after_s before the last finish)\n"), err
    assert list(out.iterdir()) == []


def test_a_measurement_window_from_set_names_set(tmp_path, capsys):
    # was "c.yaml: simulation.measure: ...": the file held no such window, the command line gave it
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet",
                 "--set", "simulation.measure.after_completed=60"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: --set: simulation.measure: the window from "), err


def test_the_other_errors_name_their_fields(tmp_path, capsys):
    # "[and 2 more errors]" named none of them: one field fixed per run
    bad = {**SMALL, "engine": {"max_num_seqs": -1, "block_size": "x"}, "workload": {**SMALL["workload"], "rate": -1}}
    cfg, err = refused_run(tmp_path, capsys, config=bad)
    assert err == (f"servesim: error: {cfg}: engine.max_num_seqs: Input should be greater than or equal to 1 (got -1) "
                   "[and 2 more errors: engine.block_size, workload.rate]\n")
    cfg, err = refused_run(tmp_path, capsys, config={"hardware": "h100-sxm"})
    assert err == f"servesim: error: {cfg}: model: required key is missing [and 1 more error: workload]\n"
    many = {**SMALL, "engine": {key: -1 for key in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                                                    "gpu_memory_utilization", "max_model_len", "num_gpu_blocks_override")}}
    _, err = refused_run(tmp_path, capsys, config=many)
    assert err.endswith("[and 5 more errors: engine.max_num_batched_tokens, engine.block_size, "
                        "engine.gpu_memory_utilization, engine.num_gpu_blocks_override, ...]\n"), err  # (model order)


def test_a_sweep_refused_for_another_sweeps_folder_touches_nothing(tmp_path, capsys):
    # the refusal ("holds the runs of another sweep") removed the other sweep's summary.csv and speedup.csv
    write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    first = write_yaml(tmp_path / "first.yaml", {"base": "c.yaml", "grid": {"workload.rate": [4, 8]}})
    assert main(["sweep", str(first), "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert "summary.csv" in before
    other = write_yaml(tmp_path / "other.yaml", {"base": "c.yaml", "grid": {"workload.rate": [2]}})
    assert main(["sweep", str(other), "--out", str(out), "--no-progress"]) == 2
    assert "holds the runs of another sweep" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_changed_sweep_removes_the_earlier_tables_before_its_runs(tmp_path, monkeypatch, capsys):
    # killed (SIGKILL: no handler) after writing its new sweep.json, a rerun with another seed left the
    # earlier seed's summary.csv looking current; an unchanged sweep keeps its tables and figures while it runs
    import servesim.sweep.runner

    write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"

    def sweep(seed: int) -> int:
        spec = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"workload.rate": [4, 8]}, "seed": seed})
        return main(["sweep", str(spec), "--out", str(out), "--no-progress"])

    assert sweep(40) == 0 and main(["plot", str(out)]) == 0
    seen = []
    real = servesim.sweep.runner.execute_task

    def watching(*args, **kwargs):
        seen.append(sorted(p.name for p in out.iterdir()))
        return real(*args, **kwargs)

    monkeypatch.setattr(servesim.sweep.runner, "execute_task", watching)
    assert sweep(41) == 0
    assert seen and all("summary.csv" not in names and "latency_vs_throughput.png" not in names for names in seen)
    seen.clear()
    assert main(["plot", str(out)]) == 0
    assert sweep(41) == 0 and not seen  # every run reused: nothing ran, the table and its figures stay
    assert {"summary.csv", "latency_vs_throughput.png"} <= {p.name for p in out.iterdir()}
    capsys.readouterr()


def test_a_plot_that_fails_while_drawing_leaves_no_figure(tmp_path, monkeypatch, capsys):
    # a full disk after the first figure left it beside an earlier plot's others, mixed
    import errno

    import servesim.plots.curves as curves

    write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    spec = {"base": "c.yaml", "grid": {"workload.rate": [4, 8]},
            "variants": {"plain": {}, "eagle": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 2,
                                                                       "acceptance": {"alpha": 0.7}}}},
            "baseline": "plain"}
    assert main(["sweep", str(write_yaml(tmp_path / "s.yaml", spec)), "--out", str(out), "--no-progress"]) == 0
    assert main(["plot", str(out)]) == 0
    assert {"latency_vs_throughput.png", "speedup.png", "acceptance.png"} <= {p.name for p in out.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "speedup.png"))

    monkeypatch.setattr(curves, "plot_speedup", full_disk)  # (the plot command imports it when it runs)
    capsys.readouterr()
    assert main(["plot", str(out)]) == 2
    assert capsys.readouterr().err == f"servesim: error: {out / 'speedup.png'}: No space left on device\n"
    names = {p.name for p in out.iterdir()}
    assert not names & {"latency_vs_throughput.png", "latency_vs_throughput.csv", "acceptance.png", "speedup.png"}
    assert {"summary.csv", "speedup.csv", "sweep.json", "points"} <= names  # the sweep's own results stay


@pytest.mark.parametrize("argv, option", [
    (["run", "c.yaml", "--out", "o", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
      "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'], "--speculative-config"),
    (["run", "c.yaml", "--out", "o", "--llama-cpp-spec", "--draft-max 4", "--llama-cpp-spec=--draft-max 8"],
     "--llama-cpp-spec"),
    (["validate", "--vllm-bench", "b.json", "--server", "a.yaml", "--server", "b.yaml", "--out", "o"], "--server"),
    (["sweep", "s.yaml", "--out", "o", "--out", "p"], "--out"),
    # a subcommand's subcommand (argparse builds it of its parent's parser class)
    (["acceptance", "ngram", "--input", "p.jsonl", "--k", "3", "--k", "2", "--out", "o"], "--k"),
])
def test_a_single_valued_option_given_twice_is_refused(tmp_path, capsys, monkeypatch, argv, option):
    # the last --speculative-config won silently
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and not (tmp_path / "o").exists()
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument {option}: given twice (expected it once; the last would win silently)")


def test_repeatable_options_may_be_repeated(tmp_path):
    from servesim.cli import build_parser

    argv = ["run", "c.yaml", "--out", "o", "--set", "seed=1", "--set", "seed=2"]
    assert build_parser(argv)[0].parse_args(argv).overrides == ["seed=1", "seed=2"]


@pytest.mark.parametrize("argv, expected", [
    (["run", "c.yaml", "--out", "o", "--seed", "3"],
     {"command": "run", "config": "c.yaml", "out": "o", "seed": 3, "overrides": [], "speculative_config": None,
      "llama_cpp_spec": None, "no_plot": False, "quiet": False}),
    (["acceptance", "ngram", "--input", "p.jsonl", "--k", "3", "--out", "o"], None),
])
def test_the_parsed_options_are_the_commands_own(argv, expected):
    # the record of which single-valued options were given (StoreOnce's) is not left among the command's
    # options, also for a subcommand's subcommand
    from servesim.cli import build_parser

    parsed = vars(build_parser(argv)[0].parse_args(argv))
    assert not [name for name in parsed if name.startswith("_")]
    if expected is not None:
        assert parsed == expected
    else:
        assert parsed["k"] == 3 and str(parsed["input"]) == "p.jsonl"


REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "workloads" / "examples"
VOCAB = REPO / "tests" / "data" / "vocab"


@pytest.mark.parametrize("source, argv", [
    # a byte-order mark (Excel's "CSV UTF-8", Notepad) was read as part of the first field or refused as JSON:
    # "line 1: missing column(s) batch_size", "invalid JSON (Unexpected UTF-8 BOM ...)", "no llama.cpp
    # speculative statistics found"; trace files already dropped it
    (EXAMPLES / "step-times-h100-llama8b-synthetic.csv",
     ["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--quiet", "--data", "{file}"]),
    (EXAMPLES / "ngram-pairs.jsonl", ["acceptance", "ngram", "--k", "3", "--input", "{file}"]),
    (EXAMPLES / "llamacpp-responses.jsonl", ["acceptance", "from-llamacpp", "--k", "4", "--input", "{file}"]),
    (EXAMPLES / "vllm-specdecode-eagle3-k3.log", ["acceptance", "from-vllm-log", "--input", "{file}"]),
    (VOCAB / "draft-padded" / "tokenizer.json", ["check-draft", str(VOCAB / "target"), "{folder}"]),
])
def test_a_byte_order_mark_changes_nothing(tmp_path, capsys, source, argv):
    folder = tmp_path / "in"
    shutil.copytree(source.parent, folder)
    file = folder / source.name
    args = [a.replace("{file}", str(file)).replace("{folder}", str(folder)) for a in argv]
    assert main(args) == 0
    plain = capsys.readouterr()
    file.write_bytes(b"\xef\xbb\xbf" + file.read_bytes())
    assert main(args) == 0
    assert capsys.readouterr() == plain


def test_a_vllm_bench_result_with_a_byte_order_mark_is_read(tmp_path):
    from servesim.analysis.calibrate import read_vllm_bench_json

    path = tmp_path / "b.json"
    path.write_text(json.dumps({"completed": 8, "max_concurrency": 4, "total_input_tokens": 800,
                                "total_output_tokens": 80, "median_tpot_ms": 9.0}))
    plain = read_vllm_bench_json(path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # was: invalid JSON (Unexpected UTF-8 BOM ...)
    assert read_vllm_bench_json(path) == plain


def test_a_draft_model_of_the_option_that_does_not_fit_names_the_option_with_the_file(tmp_path, capsys):
    # named the file alone ("c.yaml: tensor_parallel_size: ... + the draft model llama-3.1-70b's weights"),
    # where the user would look in vain; README: --speculative-config names itself
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    spec = {"method": "draft_model", "model": "llama-3.1-70b", "num_speculative_tokens": 2,
            "acceptance": {"alpha": 0.7}}
    argv = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--speculative-config", json.dumps(spec)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {cfg} with --speculative-config: tensor_parallel_size: Llama-3.1-8B does "
                          "not fit on 1 x H100 SXM: per GPU, its weights 16.1 GB + the draft model llama-3.1-70b's "
                          "weights 141.1 GB"), err
    # a target that does not fit without its drafter is the file's mistake, with or without the option
    config = write_yaml(tmp_path / "big.yaml", {**SMALL, "model": "llama-3.1-405b"})
    assert main(["run", str(config), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err.startswith(f"servesim: error: {config}: tensor_parallel_size: Llama-3.1-405B does "
                                              "not fit")


TRACE = str(Path(__file__).resolve().parents[1] / "workloads" / "traces" / "conversation_trace.jsonl")


@pytest.mark.parametrize("grid, message", [
    ({"hardware": ["h100-sxm", "h999"]},
     "(point hardware='h999'): hardware: unknown hardware card 'h999' (available in "),
    ({"model": ["llama-3.1-8b", "no-such-model"]},
     "(point model='no-such-model'): model: unknown model card 'no-such-model'"),
    ({"workload": [{"type": "trace", "path": TRACE, "max_requests": 5},
                   {"type": "trace", "path": "missing.jsonl", "max_requests": 5}]},
     "workload.path: file not found: {folder}/missing.jsonl"),
    ({"workload": [{"type": "poisson", "rate": 5, "num_requests": 10,
                    "lengths": {"type": "empirical", "path": "lengths.jsonl"}}]},
     "workload.lengths.path: file not found: {folder}/lengths.jsonl"),
    ({"speculative_config": [{"method": "eagle", "num_speculative_tokens": 2, "acceptance": "no-such-profile"}]},
     "speculative_config.acceptance: unknown acceptance profile 'no-such-profile' (expected one of: "),
])
def test_a_sweep_refuses_a_grid_value_naming_a_missing_input_before_any_run(tmp_path, capsys, grid, message):
    # each had failed in every run of its points, after the sweep had run the others (failures.csv, exit 1)
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": grid})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: {sweep} (point ") and err.count("\n") == 1
    assert message.format(folder=tmp_path) in err
    assert not (tmp_path / "o").exists()  # nothing run, nothing written


@pytest.mark.parametrize("key, named", [("deployment.replicas=5", "deployment.replicas"),
                                        ("workload.rate_scale=7", "workload.rate_scale"),
                                        ("workload.rate=3", "workload.rate")])
def test_capacity_replicas_refuses_a_set_of_what_it_searches(tmp_path, capsys, key, named):
    # with --replicas, --set deployment.replicas=5 and --set workload.rate_scale=7 had no effect, silently
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--replicas", "10", "--set", key,
                 "--out", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "servesim: error: --replicas: searches deployment.replicas at the target rate (the workload's rate, or a "
        f"trace's rate_scale), which --set gives too ({named}): give one of them\n")
    assert not (tmp_path / "o").exists()


def test_capacity_goodput_share_without_a_per_request_objective_is_refused(tmp_path, capsys):
    # --slo queue_p99=100 --goodput-share 0.99: the attainment was the completed share (1.0), so the option
    # never bound, silently
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["capacity", str(cfg), "--slo", "queue_p99=100", "--slo", "itl_p99=1", "--goodput-share", "0.99",
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: --goodput-share: the SLO attainment is the share of requests meeting the per-request "
        "objectives (ttft, tpot, e2e), and no --slo gives one: add one, or leave --goodput-share out\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("assignment, replaced", [
    ("deployment={replicas: 3}", "deployment.replicas"),
    ("workload={type: poisson, rate: 9, num_requests: 40, prompt_tokens: {type: fixed, value: 100}, "
     "output_tokens: {type: fixed, value: 20}}", "workload.rate")])
def test_capacity_replicas_runs_a_mapping_set_with_a_note_of_what_it_replaces(tmp_path, capsys, assignment, replaced):
    # a whole mapping may need the keys the search replaces to be valid (a poisson workload's rate): refusing
    # them left no way to give one; it runs, and says which of its keys the search replaces
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    status = main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--replicas", "10", "--max-replicas", "2",
                   "--replications", "1", "--quiet", "--set", assignment, "--out", str(tmp_path / "o")])
    assert status in (0, 1)
    assert capsys.readouterr().err == (f"servesim: note: --replicas replaces {replaced} of the mapping --set gives\n")
    assert (tmp_path / "o" / "capacity.csv").exists()
