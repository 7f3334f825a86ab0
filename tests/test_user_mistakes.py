"""Regression tests for defects found by trying servesim as a new user (bad input, interrupted commands)."""

from __future__ import annotations

import pytest

from servesim.cli import main

from test_cli import write_yaml
from test_robustness_cli import SMALL


def test_run_interrupted_while_writing_leaves_no_partial_results(tmp_path, monkeypatch, capsys):
    import servesim.plots.latency

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(servesim.plots.latency, "plot_latency", interrupted)
    assert main(["run", str(cfg), "--out", str(out)]) == 130
    assert capsys.readouterr().err == "servesim: interrupted\n"
    # summary.json, requests.csv and steps.csv without their figure would look like a finished run
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_interrupted_sweep_of_a_changed_grid_removes_the_old_tables(tmp_path, monkeypatch, capsys):
    import servesim.sweep.runner as runner

    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]},
                                             "variants": {"a": {}, "b": {"engine": {"block_size": 32}}},
                                             "baseline": "a"})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out)]) == 0
    assert (out / "summary.csv").exists() and (out / "speedup.csv").exists()
    write_yaml(sweep, {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16, 32]},
                       "variants": {"a": {}, "b": {"engine": {"block_size": 32}}}, "baseline": "a"})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute_task", interrupted)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--out", str(out)]) == 130
    # the earlier grid's tables would be read by `servesim plot` as this grid's results
    assert not (out / "summary.csv").exists() and not (out / "speedup.csv").exists()
    assert main(["plot", str(out)]) == 2
    assert "run `servesim sweep` first" in capsys.readouterr().err


@pytest.mark.parametrize("measure, field", [
    ({"after_s": 5.0, "until_s": 1.0}, "simulation.measure"),
    ({"after_s": 2.0, "until_s": 2.0}, "simulation.measure"),
    ({"after_completed": 30, "until_completed": 10}, "simulation.measure"),
])
def test_empty_measurement_window_is_refused(tmp_path, capsys, measure, field):
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "simulation": {"measure": measure}})
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"servesim: error: {cfg}: {field}: "), err
    assert "must be" in err and "after" in err, err
    assert not (tmp_path / "o").exists()


def test_window_with_after_before_until_still_runs(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "simulation": {"measure": {"after_completed": 5,
                                                                              "until_completed": 30}}})
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 0


def test_speculative_config_json_with_a_key_twice_is_refused(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet", "--speculative-config",
            '{"method": "eagle", "num_speculative_tokens": 3, "num_speculative_tokens": 4}']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == ("servesim: error: --speculative-config: key 'num_speculative_tokens' given twice "
                   "(expected each key once)\n"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "capacity", "sweep"])
def test_empty_out_is_refused(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8]}})
    argv = {"run": ["run", str(cfg), "--no-plot"],
            "capacity": ["capacity", str(cfg), "--slo", "ttft_p99=0.5"],
            "sweep": ["sweep", str(sweep)]}[command]
    for empty in (["--out", ""], ["--out="]):
        assert main([*argv, *empty]) == 2
        assert capsys.readouterr().err == "servesim: error: --out: empty folder name (expected a folder path)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "s.yaml"]  # nothing written here


def test_empty_out_is_refused_by_the_output_folder_check(tmp_path):
    from servesim.atomic import prepare_output_dir
    from servesim.errors import ConfigError

    with pytest.raises(ConfigError, match="^--out: empty folder name"):
        prepare_output_dir("")


@pytest.mark.parametrize("draft_tp, tp, ok", [(2, 1, False), (3, 4, False), (1, 4, True), (4, 4, True)])
def test_draft_tensor_parallel_size_must_be_one_or_the_targets(tmp_path, capsys, draft_tp, tp, ok):
    # vLLM's SpeculativeConfig._verify_and_get_draft_tp refuses any other value
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "tensor_parallel_size": tp})
    spec = f'{{"method": "eagle", "num_speculative_tokens": 2, "draft_tensor_parallel_size": {draft_tp}}}'
    status = main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet", "--speculative-config", spec])
    err = capsys.readouterr().err
    if ok:
        assert status == 0, err
    else:
        assert status == 2 and err == (f"servesim: error: speculative_config.draft_tensor_parallel_size: {draft_tp} "
                                       f"cannot be other value than 1 or target model tensor_parallel_size ({tp})\n")
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("override, path", [
    ("workload.prompt_tokens={type: uniform, low: 10, high: 5}", "workload.prompt_tokens"),
    ("workload.prompt_tokens={type: lognormal, mean: 10}", "workload.prompt_tokens"),
    ("workload={type: closed_loop, concurrency: 4, num_requests: 2}", "workload"),
])
def test_model_validator_error_names_a_key_not_a_union_tag(tmp_path, capsys, override, path):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--set", override]) == 2
    err = capsys.readouterr().err
    # not workload.prompt_tokens.uniform or workload.closed_loop: keys --set does not accept
    assert err.startswith(f"servesim: error: {cfg}: {path}: ") and err.count("\n") == 1, err


def test_capacity_refuses_a_multi_turn_workload(tmp_path, capsys):
    # its rate is sessions/s and its turns come a think time apart: a search over it is not in requests/s
    workload = {"type": "multi_turn", "rate": 0.5, "num_sessions": 4, "turns": {"type": "fixed", "value": 2},
                "message_tokens": {"type": "fixed", "value": 20}, "output_tokens": {"type": "fixed", "value": 5},
                "think_time_s": 1.0}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 0  # a valid workload
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--out", str(tmp_path / "cap"), "--quiet"]) == 2
    assert capsys.readouterr().err == ("servesim: error: workload.type: capacity search needs an open-loop workload "
                                       "(trace, poisson or gamma), not multi_turn\n")
    assert not (tmp_path / "cap").exists() or not any((tmp_path / "cap").iterdir())


def test_increasing_profile_is_refused_with_plain_numbers(tmp_path, capsys):
    (tmp_path / "acc.yaml").write_text("source: me\nper_position_acceptance: [0.5, 0.9]\n")
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    spec = '{"method": "eagle", "num_speculative_tokens": 2, "acceptance": "acc.yaml"}'
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--speculative-config", spec]) == 2
    err = capsys.readouterr().err
    assert err.endswith("acc.yaml: per_position_acceptance must be non-increasing, got [0.5, 0.9]\n"), err


def test_failed_validate_rerun_removes_the_earlier_tables(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("validation.csv", "validation.png"):
        (out / name).write_text("an earlier validation\n")
    (tmp_path / "bench.json").write_text('{"completed": 0}')
    server = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["validate", "--vllm-bench", str(tmp_path / "bench.json"), "--server", str(server), "--out", str(out)]
    assert main(argv) == 2
    assert "bench.json: completed: " in capsys.readouterr().err
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("command", ["capacity", "tune-k"])
def test_interrupted_while_writing_leaves_no_partial_tables(tmp_path, monkeypatch, capsys, command):
    import servesim.cli.capacity as capacity_command
    import servesim.cli.tune_k as tune_k_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(capacity_command, "plot_slo_attainment", interrupted)
    monkeypatch.setattr(tune_k_command, "plot_check", interrupted)
    out = tmp_path / "out"
    if command == "capacity":
        cfg = write_yaml(tmp_path / "c.yaml", SMALL)
        argv = ["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--max-rate", "8", "--replications", "1"]
    else:
        spec = {"method": "eagle", "num_speculative_tokens": 2, "acceptance": {"alpha": 0.6}}
        workload = {"type": "closed_loop", "concurrency": 1, "requests_per_client": 2,
                    "prompt_tokens": {"type": "fixed", "value": 50}, "output_tokens": {"type": "fixed", "value": 20}}
        cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload, "speculative_config": spec})
        argv = ["tune-k", str(cfg), "--batch-sizes", "1,2", "--requests-per-client", "2"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 130
    assert capsys.readouterr().err.endswith("servesim: interrupted\n")
    assert list(out.iterdir()) == []  # a table without its figure would look like a finished search


@pytest.mark.parametrize(("override", "message"), [
    ("workload={}", "workload.type: required key is missing"),
    ("workload=[1, 2]", "workload: expected a mapping (key: value pairs) (got a list)"),
    ("workload={type: nope}", "workload.type: unknown type 'nope' (expected one of 'trace', 'poisson', 'gamma', "
                              "'closed_loop', 'multi_turn')"),
])
def test_a_workload_that_is_not_one_gets_a_plain_message(tmp_path, capsys, override, message):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--set", override]) == 2
    err = capsys.readouterr().err
    assert err == f"servesim: error: {cfg}: {message}\n", err
