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
    # was "run `servesim sweep` first": the sweep was run, and sweep.json names its file
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"servesim: error: {out}: the sweep did not finish (no summary.csv): rerun `servesim sweep {sweep} --out {out}` "
        "to resume")


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


@pytest.mark.parametrize("folder, named", [("/", "the root folder"), ("~", "the home folder")])
def test_root_or_home_as_out_is_refused(tmp_path, capsys, monkeypatch, folder, named):
    """--out / was accepted: run wrote summary.json into the filesystem's root."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--no-plot", "--out", folder]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {folder} is {named}; give a folder of its own "
                                       "for the results (e.g. out/run)\n")
    assert list((tmp_path / "home").iterdir()) == []


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
        # the option gave the whole speculative_config: its mistake names the option (the file has none)
        assert status == 2 and err == ("servesim: error: --speculative-config: speculative_config."
                                       f"draft_tensor_parallel_size: {draft_tp} cannot be other value than 1 or target "
                                       f"model tensor_parallel_size ({tp})\n")
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
    assert err.startswith(f"servesim: error: --set: {path}: ") and err.count("\n") == 1, err


def test_capacity_refuses_a_multi_turn_workload(tmp_path, capsys):
    # its rate is sessions/s and its turns come a think time apart: a search over it is not in requests/s
    workload = {"type": "multi_turn", "rate": 0.5, "num_sessions": 4, "turns": {"type": "fixed", "value": 2},
                "message_tokens": {"type": "fixed", "value": 20}, "output_tokens": {"type": "fixed", "value": 5},
                "think_time_s": 1.0}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--quiet"]) == 0  # a valid workload
    assert main(["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--out", str(tmp_path / "cap"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: workload.type: capacity search needs an open-loop "
                                       "workload (trace, poisson or gamma), not multi_turn\n")
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
    assert not out.exists()  # a table without its figure would look like a finished search; the folder the
    # command created is gone with it


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
    assert err == f"servesim: error: --set: {message}\n", err


def refused_run(tmp_path, capsys, *args: str, config: dict = SMALL) -> tuple:
    """``servesim run`` on ``config`` with ``args``, which must fail with status 2: (config path, stderr)."""
    cfg = write_yaml(tmp_path / "c.yaml", config)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", *args]) == 2
    return cfg, capsys.readouterr().err


BAD_SPEC = {"method": "eagle", "num_speculative_tokens": 0}
BAD_SPEC_ERROR = "speculative_config.num_speculative_tokens: Input should be greater than or equal to 1 (got 0)\n"


@pytest.mark.parametrize("command", [["run", "--no-plot"], ["tune-k"], ["capacity", "--slo", "ttft_p99=0.5"]])
def test_speculative_config_errors_name_the_config_file(tmp_path, capsys, command):
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": BAD_SPEC})
    assert main([command[0], str(cfg), *command[1:], "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"servesim: error: {cfg}: {BAD_SPEC_ERROR}"


@pytest.mark.parametrize("command", [["run", "--no-plot"], ["tune-k", "--batch-sizes", "1"],
                                     ["capacity", "--slo", "ttft_p99=0.5"],
                                     ["capacity", "--slo", "ttft_p99=0.5", "--replicas", "5"]])
def test_a_setting_set_gave_refused_when_the_run_is_set_up_names_set_in_every_command(tmp_path, capsys, command):
    # capacity and tune-k named the config file for a value only --set gave (refused when a run is wired)
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": {"method": "eagle",
                                                                          "num_speculative_tokens": 2}})
    argv = [command[0], str(cfg), *command[1:], "--out", str(tmp_path / "o"), "--set", "engine.block_size=7"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("servesim: error: --set: engine.block_size: expected one of "
                                       "[1, 8, 16, 32, 64, 128] as in vLLM (got 7)\n")


def test_speculative_config_option_errors_name_the_option(tmp_path, capsys):
    import json

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--speculative-config", json.dumps(BAD_SPEC)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"servesim: error: --speculative-config: {BAD_SPEC_ERROR}"
    # refined by --set, the speculative_config is the config's: named by its file
    assert main([*argv, "--set", "speculative_config.method=eagle"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {cfg}: {BAD_SPEC_ERROR}"


def test_sweep_checks_the_points_speculative_configs_up_front(tmp_path, capsys):
    write_yaml(tmp_path / "c.yaml", SMALL)
    variants = {"plain": {}, "eagle": {"speculative_config": BAD_SPEC}}
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "variants": variants})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    # the variant by its name (it was named by its overrides, the whole speculative_config)
    assert err == f"servesim: error: {sweep} (variant 'eagle'): {BAD_SPEC_ERROR}", err
    assert not (tmp_path / "o" / "summary.csv").exists()


@pytest.mark.parametrize("base, message", [
    # '' read the sweep file's folder: "cannot read file (Is a directory)"
    ("", "{sweep}: base: expected the path of a run config file (relative to the sweep file) or an inline mapping "
         "of run settings (got '')"),
    ("runs", "{sweep}: base: {tmp}/runs is a folder (expected a run config file)"),
    # another sweep file: its missing hardware, model and workload were listed as the mistake
    ("other.yaml", "{tmp}/other.yaml: a sweep file (base, grid/zip/variants), not a run config: the base of {sweep} "
                   "must be a run config (hardware, model, workload)"),
])
def test_sweep_base_that_is_no_run_config_file_says_what_it_is(tmp_path, capsys, base, message):
    write_yaml(tmp_path / "c.yaml", SMALL)
    (tmp_path / "runs").mkdir()
    write_yaml(tmp_path / "other.yaml", {"base": "c.yaml"})
    sweep = write_yaml(tmp_path / "s.yaml", {"base": base, "variants": {"a": {}}})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"servesim: error: {message.format(sweep=sweep, tmp=tmp_path)}\n"
    assert not (tmp_path / "o").exists()


def test_run_of_a_sweep_file_with_a_base_only_says_it_is_a_sweep_file(tmp_path, capsys):
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml"})
    assert main(["run", str(sweep), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"servesim: error: {sweep}: a sweep file (base, grid/zip/variants), "
                                              "not a run config")


@pytest.mark.parametrize("variants, where", [
    ({"plain": {}, "small-blocks": {"engine.block_size": 0}}, "variant 'small-blocks', point engine.max_num_seqs=8"),
    ({}, "point engine.max_num_seqs=8"),
])
def test_sweep_names_a_bad_point_by_its_variant_and_swept_values(tmp_path, capsys, variants, where):
    base = {**SMALL, "engine": {"block_size": 0}} if not variants else SMALL
    write_yaml(tmp_path / "c.yaml", base)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 16]},
                                             "variants": variants})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"servesim: error: {sweep} ({where}): engine.block_size: ")


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,"


@pytest.mark.parametrize("name, body, where, count", [
    ("t.csv", AZURE_HEADER + "99999999999999999999999,5\n", "line 2: ContextTokens", 10**23 - 1),  # a traceback
    # prompt + output tokens would overflow int64 (and slip past the max_model_len check)
    ("t.csv", AZURE_HEADER + "5,4611686018427387904\n", "line 2: GeneratedTokens", 2**62),
    ("t.jsonl", '{"timestamp": 0, "input_length": 99999999999999999999999, "output_length": 5}\n',
     "line 1: input_length", 10**23 - 1),
    ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2147483648}\n', "line 1: output_length", 2**31),
])
def test_trace_token_counts_beyond_int32_are_refused(tmp_path, name, body, where, count):
    from servesim.errors import TraceError
    from servesim.workload.trace import load_trace

    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: {where}: expected at most 2147483647 tokens (got {count})"


@pytest.mark.parametrize("body, line", [
    (AZURE_HEADER + "10,5\n2023-11-16 18:15:47.0000000,1\r0,5\n", 3),  # a stray \r in a field
    (AZURE_HEADER + "10,5\r2023-11-16 18:15:47.0000000,10,5\n", 2),  # an old Mac line end
    ("TIMESTAMP,Context\rTokens,GeneratedTokens\n2023-11-16 18:15:46.0000000,10,5\n", 1),
])
def test_azure_trace_with_a_stray_carriage_return_names_the_line(tmp_path, body, line):
    # was the csv module's "new-line character seen in unquoted field - do you need to open the file in
    # universal-newline mode?"
    from servesim.errors import TraceError
    from servesim.workload.trace import load_trace

    path = tmp_path / "t.csv"
    path.write_bytes(body.encode())
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == (f"{path}: line {line}: a carriage return (\\r) inside the line (expected each line "
                               "to end in \\n or \\r\\n, with no \\r elsewhere)")


MOONCAKE_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'


@pytest.mark.parametrize("body, hash_ids, message", [
    # named "row 2" (the data row, not the line: a blank line above it, and a window, shifted it)
    (MOONCAKE_ROW + "\n" + MOONCAKE_ROW.replace("[0, 1]", '[0, "x"]'), True,
     "line 3: hash_ids: expected integer ids in 0..2^56-1 (got 'x' as entry 2 of 2)"),
    (MOONCAKE_ROW + MOONCAKE_ROW.replace("[0, 1]", "[0, 1, -4]"), True,
     "line 2: hash_ids: expected integer ids in 0..2^56-1 (got -4 as entry 3 of 3)"),
    # a key twice in one line was read silently, the last value kept
    (MOONCAKE_ROW.replace('"output_length": 5', '"output_length": 5, "input_length": 700'), False,
     "line 1: key 'input_length' given twice (expected each key once)"),
    (MOONCAKE_ROW + MOONCAKE_ROW.replace("[0, 1]", "[0], \"hash_ids\": [1]"), True,
     "line 2: key 'hash_ids' given twice (expected each key once)"),
])
def test_mooncake_trace_mistakes_name_the_file_line(tmp_path, body, hash_ids, message):
    from servesim.errors import TraceError
    from servesim.workload.trace import load_trace

    path = tmp_path / "t.jsonl"
    path.write_text(body)
    with pytest.raises(TraceError) as info:
        load_trace(path, prefix_block_ids=hash_ids)
    assert str(info.value) == f"{path}: {message}"


FIXED5 = "prompt_tokens: {type: fixed, value: 5}, output_tokens: {type: fixed, value: 5}"
MULTI_TURN = ("workload={type: multi_turn, rate: 1, num_sessions: 3, turns: {type: fixed, value: 2}, think_time_s: 1, "
              "message_tokens: {type: fixed, value: 5}, output_tokens: {type: fixed, value: 5}")


@pytest.mark.parametrize("override, message", [
    # each of these was a traceback (ZeroDivisionError, ValueError: Maximum allowed dimension exceeded,
    # OverflowError, MemoryError), a float cast to garbage, or a run that could not end (given by --set, each
    # names --set)
    (f"workload={{type: gamma, rate: 5, cv: 1.0e-300, num_requests: 10, {FIXED5}}}",
     "--set: workload.cv: Input should be greater than or equal to 0.000001 (got 1e-300)"),
    (f"workload={{type: gamma, rate: 5, cv: 1.0e+100, duration_s: 10, {FIXED5}}}",
     "--set: workload.cv: Input should be less than or equal to 1000 (got 1e+100)"),
    (MULTI_TURN + ", cv: 1.0e-300}",
     "--set: workload.cv: Input should be greater than or equal to 0.000001 (got 1e-300)"),
    (MULTI_TURN + ", think_time_cv: 1.0e-300}",
     "--set: workload: think_time_cv: expected 0 (fixed) or at least 1e-06 (got 1e-300)"),
    (f"workload={{type: poisson, rate: 1.0e+300, duration_s: 10, {FIXED5}}}",
     "--set: workload: rate x duration_s = 1e+301 requests expected; servesim simulates at most 2147483647 "
     "(lower the rate or duration_s)"),
    ("workload.num_requests=1000000000000",
     "--set: workload.num_requests: Input should be less than or equal to 2147483647 (got 1000000000000)"),
    (f"workload={{type: closed_loop, concurrency: 2000000000, requests_per_client: 5, {FIXED5}}}",
     "--set: workload: concurrency x requests_per_client = 10000000000 requests; servesim simulates at most "
     "2147483647"),
    (f"workload={{type: closed_loop, concurrency: 2, think_time_s: 1.0e+300, num_requests: 5, {FIXED5}}}",
     "--set: workload.think_time_s: expected at most 2.31e+06 s (~26 days), the longest span of arrivals servesim "
     "simulates (got 1e+300)"),
    ("workload.prompt_tokens={type: fixed, value: 99999999999999999999999}",
     "--set: workload.prompt_tokens.value: Input should be less than or equal to 2147483647 "
     "(got 99999999999999999999999)"),
    ("workload.prompt_tokens={type: lognormal, mean: 1.0e+300, cv: 1}",
     "--set: workload.prompt_tokens.mean: Input should be less than or equal to 2147483647 (got 1e+300)"),
    ("workload.system_prompts={prompt_lengths: [99999999999999999999999]}",
     "--set: workload.system_prompts.prompt_lengths.0: Input should be less than or equal to 2147483647 "
     "(got 99999999999999999999999)"),
])
def test_extreme_workload_numbers_get_one_line(tmp_path, capsys, override, message):
    cfg, err = refused_run(tmp_path, capsys, "--set", override)
    assert err == "servesim: error: " + message.format(cfg=cfg) + "\n"


def test_infinite_lognormal_draws_are_cut_at_the_token_limit():
    import numpy as np

    from servesim.workload.lengths import LognormalLength

    # sigma 1000: draws overflow to inf, which the int64 cast turned into -2^63 (a ValueError traceback)
    draws = LognormalLength(mu=4.6, sigma=1000.0).sample(np.random.default_rng(0), 64)
    assert draws.min() == 1 and draws.max() == 2**31 - 1
    assert set(draws.tolist()) == {1, 2**31 - 1}


def test_huge_lognormal_cv_runs(tmp_path):
    from servesim.workload.lengths import LognormalLengthConfig

    # cv^2 overflowed a float (OverflowError); log1p(cv^2) is 2 ln(cv) to double precision there
    mu, sigma = LognormalLengthConfig(type="lognormal", mean=100, cv=1e300).mu_sigma()
    assert sigma == pytest.approx((2 * 300 * 2.302585092994046) ** 0.5, rel=1e-12)
    assert mu == pytest.approx(4.605170185988092 - 300 * 2.302585092994046, rel=1e-12)


def test_not_enough_memory_is_one_line(tmp_path, capsys, monkeypatch):
    import servesim.cli.run

    def too_big(args):
        raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (1000000000000,) and data type int64")

    monkeypatch.setattr(servesim.cli.run, "run", too_big)
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("servesim: error: not enough memory (Unable to allocate 7.28 TiB for an array "
                                       "with shape (1000000000000,) and data type int64): give a smaller workload, "
                                       "grid or trace\n")


@pytest.mark.parametrize("option, message", [
    (["--max-rate", "inf"], "--max-rate: expected a positive rate in requests/s (got inf)"),  # was an OverflowError
    (["--replicas", "inf"], "--replicas: expected a positive target rate in requests/s (got inf)"),  # named 'config'
])
def test_capacity_refuses_infinite_rates(tmp_path, capsys, option, message):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    argv = ["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--out", str(tmp_path / "o"), "--quiet", *option]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"servesim: error: {message}\n"


@pytest.mark.parametrize("option, message", [
    # was "config: speculative_config: num_speculative_tokens=129 exceeds 128 ..." after 129 runs
    (["--k-max", "1000"], "--k-max: expected at most 128 tokens, the most drafts vLLM's rejection sampler verifies "
                          "per request and step (got 1000)"),
    # were named 'config: workload: ...' (or ran out of memory)
    (["--batch-sizes", "99999999999"],
     "--batch-sizes x --requests-per-client: 99999999999 x 8 requests is more than the 2147483647 servesim simulates"),
    (["--batch-sizes", "4", "--requests-per-client", "100000000000"],
     "--batch-sizes x --requests-per-client: 4 x 100000000000 requests is more than the 2147483647 servesim "
     "simulates"),
])
def test_tune_k_refuses_impossible_grids_by_their_option(tmp_path, capsys, option, message):
    spec = {"method": "eagle", "num_speculative_tokens": 2}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": spec})
    assert main(["tune-k", str(cfg), "--out", str(tmp_path / "o"), "--quiet", *option]) == 2
    assert capsys.readouterr().err == f"servesim: error: {message}\n"


@pytest.mark.parametrize("override, message", [
    # settings refused while the run is wired named the key but not the file
    ("engine.block_size=3", "engine.block_size: expected one of [1, 8, 16, 32, 64, 128] as in vLLM (got 3)"),
    ("tensor_parallel_size=3",
     "tensor_parallel_size: total number of attention heads (32) must be divisible by tensor parallel size (3)"),
    ("engine.max_num_batched_tokens=8",
     "engine: max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (1024)"),
    # a bandwidth or peak FLOP/s near zero overflowed the integer coefficient (a traceback); the card refuses
    # those below its base units now, efficiencies near zero still reach the coefficient's check
    ("hardware={name: x, vendor: y, memory_bytes: 8.0e+10, memory_bandwidth_bytes_per_s: 3.0e+12, "
     "attention_bandwidth_efficiency: 1.0e-300, peak_flops_per_s: {bf16: 1.0e+15}}",
     "roofline: the KV-cache read time per context token is inf s with these step-time settings "
     "(memory_bandwidth_bytes_per_s, peak_flops_per_s and the efficiencies of the hardware card or roofline); "
     "servesim's steps take at most 70.4 s"),
    ("hardware={name: x, vendor: y, memory_bytes: 8.0e+10, memory_bandwidth_bytes_per_s: 3.0e+12, "
     "compute_efficiency: 1.0e-320, peak_flops_per_s: {bf16: 1.0e+15}}",
     "roofline: the attention time per (query, key) pair is inf s with these step-time settings "
     "(memory_bandwidth_bytes_per_s, peak_flops_per_s and the efficiencies of the hardware card or roofline); "
     "servesim's steps take at most 70.4 s"),
    # a card without a 16-bit peak under a bf16 model raised KeyError: 'fp16' (a traceback)
    ("hardware={name: x, vendor: y, memory_bytes: 8.0e+10, memory_bandwidth_bytes_per_s: 3.0e+12, "
     "peak_flops_per_s: {fp8: 2.0e+15, int8: 2.0e+15}}",
     "hardware: x lists no bf16 or fp16 peak in peak_flops_per_s (has fp8, int8), which the bf16 weights of model "
     "Llama-3.1-8B need: add one to the card, or give the model weights of a type it lists"),
])
def test_settings_refused_when_wired_name_the_config_file(tmp_path, capsys, override, message):
    cfg, err = refused_run(tmp_path, capsys, config=_with(override))
    assert err == f"servesim: error: {cfg}: {message}\n"
    # the same value given by --set names --set when the message is about its key (the mistake is not in
    # the file); a message about a whole section that holds the key (engine: ...) names the file with --set
    # and the key; one about another section (roofline: ...) names the file
    cfg, err = refused_run(tmp_path, capsys, "--set", override)
    key, field = override.split("=", 1)[0], message.split(": ", 1)[0]
    if field == key or field.startswith(key + "."):
        named = "--set"
    elif key.startswith(field + "."):
        named = f"{cfg} with --set {key}"
    else:
        named = str(cfg)
    assert err == f"servesim: error: {named}: {message}\n"


def test_a_max_model_len_beyond_the_models_is_refused_as_vllm_does(tmp_path, capsys):
    # --set engine.max_model_len=999999 on Llama-3.1-8B (131,072 tokens) ran 200,000-token prompts
    message = ("engine.max_model_len: 999999 tokens exceeds the model's context, 131072 tokens (the card's "
               "max_model_len); vLLM refuses a longer one unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: give at most "
               "131072, or a model card whose max_model_len the model really supports")
    cfg, err = refused_run(tmp_path, capsys, config=_with("engine.max_model_len=999999"))
    assert err == f"servesim: error: {cfg}: {message}\n"
    _, err = refused_run(tmp_path, capsys, "--set", "engine.max_model_len=999999")
    assert err == f"servesim: error: --set: {message}\n"
    cfg = write_yaml(tmp_path / "ok.yaml", _with("engine.max_model_len=131072"))  # the model's own: runs
    assert main(["run", str(cfg), "--out", str(tmp_path / "ok"), "--no-plot", "--quiet"]) == 0


def _with(assignment: str, config: dict = SMALL) -> dict:
    """``config`` with the ``--set``-style ``assignment`` written into it (a mistake in the file itself)."""
    from servesim.config.overrides import parse_assignment, set_dotted

    key, value = parse_assignment(assignment)
    return set_dotted(dict(config), key, value)


@pytest.mark.parametrize("override, message", [
    # an inline card's errors were named 'inline model card'; given by --set, they name --set
    ("model={name: x}", "model.max_model_len: required key is missing"),
    ("hardware={name: x, vendor: y, memory_bytes: .inf, memory_bandwidth_bytes_per_s: 3.0e+12, "
     "peak_flops_per_s: {bf16: 1.0e+15}}", "hardware.memory_bytes: Input should be a finite number (got inf)"),
])
def test_inline_cards_given_by_set_name_the_option_and_the_key(tmp_path, capsys, override, message):
    _, err = refused_run(tmp_path, capsys, "--set", override)
    assert err == f"servesim: error: --set: {message}\n"


@pytest.mark.parametrize("override, message", [
    ("engine.max_num_seqs=abc",
     "--set: engine.max_num_seqs: Input should be a valid integer, unable to parse string as an integer (got 'abc')"),
    ("engine.max_num_seq=5", "--set: engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
    ("engine.max_num_seqs.x=1", "--set: engine.max_num_seqs: Input should be a valid integer (got a mapping)"),
])
def test_a_bad_value_given_by_set_names_set_not_the_file(tmp_path, capsys, override, message):
    """A --set mistake was reported as the config file's ('c.yaml: engine.max_num_seqs: ...')."""
    _, err = refused_run(tmp_path, capsys, "--set", override)
    assert err == f"servesim: error: {message}\n"


def test_a_mistake_in_the_file_still_names_the_file_beside_a_set(tmp_path, capsys):
    cfg, err = refused_run(tmp_path, capsys, "--set", "engine.max_num_seqs=8",
                            config={**SMALL, "engine": {"max_num_batched_tokenz": 64}})
    assert err == (f"servesim: error: {cfg}: engine.max_num_batched_tokenz: unknown key (did you mean "
                   "max_num_batched_tokens?)\n")


def test_a_setting_of_a_config_built_in_python_is_named_by_its_key():
    from servesim import simulate
    from servesim.errors import SettingError

    with pytest.raises(SettingError) as info:
        simulate({**SMALL, "engine": {"block_size": 3}})
    assert str(info.value) == "engine.block_size: expected one of [1, 8, 16, 32, 64, 128] as in vLLM (got 3)"


BLOCK_SIZE_ERROR = "engine.block_size: expected one of [1, 8, 16, 32, 64, 128] as in vLLM (got 3)"


@pytest.mark.parametrize("command", [["capacity", "--slo", "ttft_p99=0.5"], ["tune-k"]])
def test_capacity_and_tune_k_name_the_file_of_a_setting_refused_when_wired(tmp_path, capsys, command):
    spec = {"method": "eagle", "num_speculative_tokens": 2}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "engine": {"block_size": 3}, "speculative_config": spec})
    assert main([command[0], str(cfg), *command[1:], "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == f"servesim: error: {cfg}: {BLOCK_SIZE_ERROR}\n"


@pytest.mark.parametrize("change, message", [
    ({"engine": {"block_size": 3}}, BLOCK_SIZE_ERROR),
    ({"hardware": "H1000"}, "hardware: unknown hardware card 'H1000'"),
])
def test_validate_names_the_case_of_a_setting_refused_when_wired(tmp_path, capsys, change, message):
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", **change,
              "workload": {"type": "closed_loop", "concurrency": 1, "num_requests": 3,
                           "prompt_tokens": {"type": "fixed", "value": 10},
                           "output_tokens": {"type": "fixed", "value": 10}}}
    case = {"name": "a", "source": "s", "setup": "s", "role": "fit", "tolerance": 0.02, "tolerance_source": "s",
            "measured": {"metric": "output_throughput", "unit": "tok/s", "value": 100}, "config": config}
    path = write_yaml(tmp_path / "case.yaml", {"cases": [case]})
    assert main(["validate", str(path), "--out", str(tmp_path / "o")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the progress line
    assert last.startswith(f"servesim: error: {path}: cases[0].config: {message}"), last


@pytest.mark.parametrize("key, name, text, message", [
    # an empty card listed its missing fields; a JSON model config named only the file
    ("hardware", "gpu.yaml", "- h100\n", "expected a mapping of hardware card fields (name, vendor, memory_bytes, "
                                         "...) at the top level (got a list)"),
    ("hardware", "gpu.yaml", "", "expected a mapping of hardware card fields (name, vendor, memory_bytes, ...) at "
                                 "the top level (got an empty file)"),
    ("model", "m.yml", "llama\n", "expected a mapping of model card fields (name, max_model_len, ...) at the top "
                                  "level (got 'llama')"),
    ("model", "config.json", "[1, 2]", "expected a JSON object (a Hugging Face config.json; got a list)"),
])
def test_a_card_file_that_is_no_mapping_says_what_was_expected_and_found(tmp_path, capsys, key, name, text, message):
    (tmp_path / name).write_text(text)
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, key: name})
    assert err == f"servesim: error: {tmp_path / name}: {message}\n"


def test_a_run_config_that_is_no_mapping_says_what_was_found(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("- hardware: h100-sxm\n")
    assert main(["run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {tmp_path / 'c.yaml'}: expected a mapping of config keys "
                                       "at the top level (got a list)\n")


@pytest.mark.parametrize("change, field", [
    ({"measured": {"metric": "output_thruput", "unit": "tok/s", "value": 100}}, "measured.metric"),
    ({"measured": {"metric": "speedup", "unit": "x", "value": 1.5}, "baseline": {}, "speedup_of": "e2e.mean"},
     "speedup_of"),
])
def test_validate_checks_the_metric_names_before_running_a_case(tmp_path, capsys, change, field):
    # an unknown metric of the second case was found after the first case had run
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
              "workload": {"type": "closed_loop", "concurrency": 1, "num_requests": 3,
                           "prompt_tokens": {"type": "fixed", "value": 10},
                           "output_tokens": {"type": "fixed", "value": 10}}}
    case = {"name": "a", "source": "s", "setup": "s", "role": "fit", "tolerance": 0.02, "tolerance_source": "s",
            "measured": {"metric": "output_throughput", "unit": "tok/s", "value": 100}, "config": config}
    path = write_yaml(tmp_path / "case.yaml", {"cases": [case, {**case, "name": "b", **change}]})
    assert main(["validate", str(path), "--out", str(tmp_path / "o")]) == 2
    metric = change.get("speedup_of") or change["measured"]["metric"]
    assert capsys.readouterr().err == (f"servesim: error: {path}: cases[1].{field}: unknown summary metric "
                                       f"{metric!r} (e.g. output_throughput, e2e_s.mean, "
                                       "spec_decode.mean_acceptance_length)\n")  # no "running a" line before
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("override, message", [
    # OverflowError tracebacks (cannot convert float infinity to integer)
    ("roofline.step_overhead_s=1.0e+300", "roofline: a step of max_num_batched_tokens=8192 tokens takes 1e+300 s"),
    ("roofline.compute_efficiency=1.0e-300", "roofline: the attention time per (query, key) pair is 5.3e+290 s"),
    # finite, but beyond what a step's duration in int64 units of 2^-16 ps holds (an OverflowError in the
    # step log at the first compaction)
    ("roofline.step_overhead_s=1000", "roofline: a step of max_num_batched_tokens=8192 tokens takes 1e+03 s with "
                                      "these step-time settings (step_overhead_s and efficiencies of the hardware "
                                      "card or roofline); servesim's steps take at most 70.4 s"),
    ("simulation.max_time_s=1.0e+300", "simulation.max_time_s: expected at most 4.61e+06 s (~53 days), the engine's "
                                       "clock (got 1e+300)"),
])
def test_times_beyond_the_engine_clock_are_refused(tmp_path, capsys, override, message):
    cfg, err = refused_run(tmp_path, capsys, config=_with(override))
    assert err.startswith(f"servesim: error: {cfg}: {message}") and err.count("\n") == 1, err


def test_a_kv_cache_too_small_for_max_model_len_is_refused_as_vllm_does(tmp_path, capsys):
    # vLLM 0.32's check_enough_kv_cache_memory (v1/core/kv_cache_utils.py) refuses to start when one request at
    # max_model_len does not fit in the KV cache; servesim ran Llama-3.1-8B on an L4 at 131,072 tokens
    import re

    from servesim.cards import load_model

    l4 = {**SMALL, "hardware": "l4"}
    block_gib = load_model("llama-3.1-8b").kv_bytes_per_token_per_gpu(1) * 16 / 2**30
    cfg, err = refused_run(tmp_path, capsys, config=l4)
    found = re.search(r"estimated maximum model length is (\d+) ", err)
    assert found, err
    blocks = int(found.group(1)) // 16  # the KV cache's blocks (the estimate is a whole number of blocks)
    assert err == (f"servesim: error: {cfg}: engine.max_model_len: to serve at least one request with the model's "
                   f"max seq len (131072), {8192 * block_gib:.2f} GiB KV cache is needed, which is larger than the "
                   f"available KV cache memory ({blocks * block_gib:.2f} GiB); based on the available memory, the "
                   f"estimated maximum model length is {16 * blocks} (vLLM refuses to start): raise "
                   "engine.gpu_memory_utilization or lower engine.max_model_len\n")
    assert 8192 * block_gib == 16.0 and 2048 < blocks < 8192  # 128 KiB of KV per token; the L4 holds ~35k tokens
    # the boundary: a max_model_len of the whole cache runs, one token more is refused
    fits = write_yaml(tmp_path / "fits.yaml", {**l4, "engine": {"max_model_len": 16 * blocks}})
    assert main(["run", str(fits), "--out", str(tmp_path / "fits"), "--no-plot"]) == 0
    over = write_yaml(tmp_path / "over.yaml", {**l4, "engine": {"max_model_len": 16 * blocks + 1}})
    assert main(["run", str(over), "--out", str(tmp_path / "over"), "--no-plot"]) == 2
    # the check reads the memory, not num_gpu_blocks_override (applied after it, as in vLLM)
    few = write_yaml(tmp_path / "few.yaml", {**SMALL, "engine": {"num_gpu_blocks_override": 4000}})
    assert main(["run", str(few), "--out", str(tmp_path / "few"), "--no-plot"]) == 0
    capsys.readouterr()
    small_l4 = write_yaml(tmp_path / "l4few.yaml", {**l4, "engine": {"num_gpu_blocks_override": 100000}})
    assert main(["run", str(small_l4), "--out", str(tmp_path / "l4few"), "--no-plot"]) == 2
    assert "the estimated maximum model length is" in capsys.readouterr().err


def _h100_card(**changes) -> dict:
    """The shipped H100 SXM card as an inline mapping, with ``changes``."""
    from pathlib import Path

    import yaml

    card = Path(__file__).resolve().parents[1] / "hardware" / "gpus" / "h100-sxm.yaml"
    return {**yaml.safe_load(card.read_text(encoding="utf-8")), **changes}


def test_the_longest_step_attends_over_at_most_max_model_len_per_request(tmp_path, capsys):
    # a card with 10 TB of memory holds a KV cache of 7e7 tokens: the longest-step check had every scheduled
    # token attend over all of them (418 s, refused, blaming the step-time settings); no request attends over
    # more than max_model_len tokens, so the run goes on
    big = {**SMALL, "hardware": _h100_card(name="H100 10TB", memory_bytes=1.0e13)}
    cfg = write_yaml(tmp_path / "big.yaml", big)
    assert main(["run", str(cfg), "--out", str(tmp_path / "big"), "--no-plot"]) == 0
    capsys.readouterr()
    # a step whose context terms alone exceed the clock's limit names the KV cache and the card's memory
    slow = {**SMALL, "hardware": _h100_card(name="H100 slow KV", attention_bandwidth_efficiency=1e-6)}
    cfg, err = refused_run(tmp_path, capsys, config=slow)
    import re

    found = re.match(rf"servesim: error: {re.escape(str(cfg))}: roofline: a step of max_num_batched_tokens=8192 "
                     r"tokens over ([\d,]+) tokens of context \(the KV cache's ([\d,]+) blocks of 16 tokens, ", err)
    assert found and err.count("\n") == 1, err
    tokens, blocks = (int(text.replace(",", "")) for text in found.groups())
    assert tokens == 16 * blocks < 1024 * 131072  # the whole cache: below max_num_seqs x max_model_len here
    assert ("at most max_num_seqs x max_model_len) takes" in err and "the hardware card's memory_bytes and "
            "bandwidths" in err and "servesim's steps take at most 70.4 s" in err), err


@pytest.mark.parametrize("acceptance, message", [
    ({"alpha": 1.5}, "speculative_config.acceptance.alpha: conditional_acceptance.0: Input should be less than or "
                     "equal to 1 (got 1.5)"),
    ("nosuch", "speculative_config.acceptance: unknown acceptance profile 'nosuch' (expected one of: "),
])
def test_acceptance_errors_name_the_config_file(tmp_path, capsys, acceptance, message):
    spec = {"method": "eagle", "num_speculative_tokens": 2, "acceptance": acceptance}
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "speculative_config": spec})
    assert err.startswith(f"servesim: error: {cfg}: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("spec, message", [
    ({"method": "draft_model", "model": "nosuch"}, "speculative_config.model: unknown model card 'nosuch'"),
    ({"method": "draft_model", "model": {"name": "x"}}, "speculative_config.model: max_model_len: required key is "
                                                        "missing"),
    ({"method": "eagle", "draft_head": {"foo": 1}}, "speculative_config.draft_head: name: required key is missing"),
])
def test_draft_card_errors_name_the_config_file_and_key(tmp_path, capsys, spec, message):
    # were "unknown model card 'nosuch'" and "inline model card: ...", naming neither
    spec = {**spec, "num_speculative_tokens": 2, "acceptance": {"alpha": 0.5}}
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "speculative_config": spec})
    assert err.startswith(f"servesim: error: {cfg}: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("result, message", [
    # tracebacks (ValueError, TypeError, OverflowError) or silently truncated / raised to 1
    ({"input_lens": ["a", 5]}, "input_lens[0]: expected a token count, an integer in 0..2147483647 (got 'a')"),
    ({"input_lens": [None, 5]}, "input_lens[0]: expected a token count, an integer in 0..2147483647 (got None)"),
    ({"input_lens": [5.7, 5]}, "input_lens[0]: expected a token count, an integer in 0..2147483647 (got 5.7)"),
    ({"output_lens": [5, -3]}, "output_lens[1]: expected a token count, an integer in 0..2147483647 (got -3)"),
    ({"max_concurrency": 1.5}, "max_concurrency: expected a whole number (got 1.5)"),
    ({"completed": 2.5}, "completed: expected a whole number (got 2.5)"),
    ({"input_lens": None, "total_input_tokens": float("inf"), "total_output_tokens": 10},
     "total_input_tokens: expected a number >= 0 (got inf)"),
    ({"input_lens": None, "total_input_tokens": 1e15, "total_output_tokens": 10},
     "total_input_tokens: 1e+15 tokens over 2 requests is 500000000000000 per request (expected at most 2147483647)"),
])
def test_vllm_bench_results_with_bad_numbers_get_one_line(tmp_path, capsys, result, message):
    import json

    data = {"completed": 2, "input_lens": [5, 5], "output_lens": [5, 5], "max_concurrency": 1, "mean_ttft_ms": 10,
            **result}
    bench = tmp_path / "r.json"
    bench.write_text(json.dumps(data))
    server = write_yaml(tmp_path / "server.yaml", SMALL)
    assert main(["validate", "--vllm-bench", str(bench), "--server", str(server), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"servesim: error: {bench}: {message}"


def test_vllm_bench_nan_metric_is_skipped_not_compared(tmp_path, capsys):
    import json

    # vLLM writes NaN for a mean over no values; that metric has nothing to compare (the others still are)
    bench = tmp_path / "r.json"
    bench.write_text(json.dumps({"completed": 2, "input_lens": [5, 5], "output_lens": [5, 5], "max_concurrency": 1,
                                 "mean_ttft_ms": 10, "mean_tpot_ms": float("nan")}))
    server = write_yaml(tmp_path / "server.yaml", SMALL)
    assert main(["validate", "--vllm-bench", str(bench), "--server", str(server), "--out", str(tmp_path / "o")]) == 0
    import pandas as pd

    table = pd.read_csv(tmp_path / "o" / "validation.csv")
    assert table["metric"].tolist() == ["ttft_s.mean"]  # no TPOT row; the row's detail says why
    assert table["detail"].iloc[0].endswith("; not compared: mean_tpot_ms (NaN)")


@pytest.mark.parametrize("command", ["sweep", "tune-k"])
def test_more_jobs_than_the_cpus_can_run_are_refused_before_forking(tmp_path, capsys, monkeypatch, command):
    import os

    import servesim.sweep.executors as executors

    def no_pool(*args, **kwargs):  # a pool of 100,000 workers forks them all at once
        raise AssertionError("a process pool was started")

    monkeypatch.setattr(executors, "ProcessPoolExecutor", no_pool)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    base = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": {"method": "eagle",
                                                                            "num_speculative_tokens": 2}})
    target = base if command == "tune-k" else write_yaml(tmp_path / "s.yaml", {"base": "c.yaml"})
    assert main([command, str(target), "--out", str(tmp_path / "o"), "--jobs", "100000"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "servesim: error: --jobs: 100000 worker processes on 2 CPU(s); expected at most 8 (4 per CPU: more only "
        "slow the runs down and exhaust memory)")


def test_a_synthetic_workload_without_arrivals_is_refused(tmp_path, capsys):
    """A duration_s shorter than the first Poisson gap ran nothing and wrote empty results (exit 0)."""
    workload = {**SMALL["workload"], "type": "poisson", "rate": 1.0, "num_requests": None, "duration_s": 0.001}
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "workload": workload})
    assert err == (f"servesim: error: {cfg}: workload.duration_s: no request arrives in 0.001 s at 1 req/s (with "
                   "this seed): lengthen duration_s or raise the rate\n")
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("cv", [1.0, 2.0])
def test_a_multi_turn_workload_without_sessions_is_refused(tmp_path, capsys, cv):
    """A duration_s shorter than the first session's gap ran nothing and wrote empty results (exit 0), as a
    Poisson workload's had (the test above)."""
    workload = {"type": "multi_turn", "rate": 1.0, "cv": cv, "duration_s": 0.001, "think_time_s": 5.0,
                "turns": {"type": "fixed", "value": 3}, "message_tokens": {"type": "fixed", "value": 10},
                "output_tokens": {"type": "fixed", "value": 5}}
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "workload": workload})
    assert err == (f"servesim: error: {cfg}: workload.duration_s: no session starts in 0.001 s at 1 sessions/s "
                   "(with this seed): lengthen duration_s or raise the rate\n")
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("seed", [-1, "a", 1.5, True])
def test_simulate_refuses_a_seed_that_is_not_a_non_negative_integer(seed):
    """-1 and "a" raised numpy's and int()'s ValueError; 1.5 and True ran as 1."""
    from servesim import simulate
    from servesim.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        simulate(SMALL, seed=seed)
    assert str(info.value) == f"seed: expected a non-negative integer or a numpy SeedSequence (got {seed!r})"


def test_simulate_of_none_says_a_config_is_needed():
    from servesim import simulate
    from servesim.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^config: expected a run config \(a YAML path, a mapping or a SimConfig\)"):
        simulate(None)


@pytest.mark.parametrize("config, kwargs, message", [
    (42, {}, "config: expected a run config (a YAML path, a mapping or a SimConfig), got int"),
    (SMALL, {"base_dir": 5}, "base_dir: expected a folder path (got int)"),  # was a TypeError
    # YAML text was read as a path: "hardware: h100-sxm\nmodel: llama-3.1-8b: file not found", over two lines
    ("hardware: h100-sxm\nmodel: llama-3.1-8b\n", {},
     "config: a string is a YAML file's path, not YAML text (got 'hardware: h100-sxm' ...); pass a mapping, "
     "e.g. yaml.safe_load(text)"),
])
def test_simulate_of_a_wrong_type_names_the_argument(config, kwargs, message):
    from servesim import simulate
    from servesim.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        simulate(config, **kwargs)
    assert str(info.value) == message


def test_simulate_takes_load_configs_pair(tmp_path):
    """simulate(load_config(path)) was refused, quoting the (config, folder) tuple's repr."""
    from servesim import simulate
    from servesim.config.models import load_config

    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0000000,10,5\n")
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": {"type": "trace", "path": "t.csv"}})
    pair = load_config(cfg)
    assert simulate(pair).summary == simulate(cfg).summary  # the folder of the pair reads t.csv
    assert simulate(pair).summary["completed"] == 1


def test_mtp_without_mtp_modules_names_where_the_method_came_from(tmp_path, capsys):
    """The MTP refusal named no source (a ConfigError outside the settings' naming)."""
    import json

    spec = {"method": "mtp", "num_speculative_tokens": 1}
    message = "speculative_config.method: mtp needs a target with MTP modules, and model Llama-3.1-8B has none"
    cfg, err = refused_run(tmp_path, capsys, config={**SMALL, "speculative_config": spec})
    assert err.startswith(f"servesim: error: {cfg}: {message}")
    _, err = refused_run(tmp_path, capsys, "--speculative-config", json.dumps(spec))
    assert err.startswith(f"servesim: error: --speculative-config: {message}")
    _, err = refused_run(tmp_path, capsys, "--set", "speculative_config.method=mtp",
                          config={**SMALL, "speculative_config": {**spec, "method": "eagle"}})
    assert err.startswith(f"servesim: error: --set: {message}")


def test_a_sections_check_of_a_key_set_by_set_names_set(tmp_path, capsys):
    """workload: bucket_policy: ... (a check of the whole workload about one key) named the file."""
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0000000,10,5\n")
    config = {**SMALL, "workload": {"type": "trace", "path": "t.csv"}}
    _, err = refused_run(tmp_path, capsys, "--set", "workload.bucket_policy=burst", config=config)
    assert err.startswith("servesim: error: --set: workload: bucket_policy: only Mooncake traces")


def test_set_and_sweeps_take_a_workload_file(tmp_path):
    """--set workload=FILE and a grid over workload files were refused ('expected a mapping')."""
    import yaml

    from servesim.config.models import load_config
    from servesim.sweep.points import expand_points, point_config
    from servesim.sweep.spec import load_sweep

    (tmp_path / "w.yaml").write_text(yaml.safe_dump(SMALL["workload"]))
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({**SMALL, "workload": {"type": "poisson", "rate": 1.0, "num_requests": 3,
                                                             "prompt_tokens": {"type": "fixed", "value": 5},
                                                             "output_tokens": {"type": "fixed", "value": 5}}}))
    cfg, _ = load_config(cfg_path, [("workload", "w.yaml"), ("workload.num_requests", 7)])
    assert cfg.workload.num_requests == 7 and cfg.workload.type == SMALL["workload"]["type"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"base": "c.yaml", "grid": {"workload": ["w.yaml"]}}))
    sweep = load_sweep(tmp_path / "s.yaml")
    (point,) = expand_points(sweep)
    assert point_config(sweep, point)["workload"] == SMALL["workload"]


def test_simulate_takes_a_whole_float_seed_as_a_config_does():
    from servesim import simulate

    assert simulate(SMALL, seed=4.0).summary == simulate(SMALL, seed=4).summary


@pytest.mark.parametrize("workload, key", [
    ({"type": "poisson", "rate": 1.0}, "workload.rate"),
    ({"type": "gamma", "rate": 1.0, "cv": 2.0}, "workload.rate"),
    ({"type": "closed_loop", "concurrency": 4}, "workload.concurrency"),
])
def test_too_many_replicas_advice_names_the_traffic_key_of_the_workload_type(tmp_path, capsys, workload, key):
    # the advice said workload.rate_scale, a key of trace workloads only
    base = {k: v for k, v in SMALL["workload"].items() if k not in ("type", "rate")}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": {**base, **workload}})
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--set", "deployment.replicas=5000"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"share of the traffic ({key})") and "rate_scale" not in err


def test_validate_checks_every_bench_result_before_announcing_a_run(tmp_path, capsys):
    # "running empty" was printed before the error of its empty result file; and a second result's mistake
    # came after the first one's simulation
    import json

    good = tmp_path / "good.json"
    good.write_text(json.dumps({"completed": 2, "input_lens": [5, 5], "output_lens": [5, 5], "max_concurrency": 1,
                                "mean_ttft_ms": 10}))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    server = write_yaml(tmp_path / "min.yaml", {"hardware": "h100-sxm", "model": "llama-3.1-8b"})
    argv = ["validate", "--vllm-bench", str(good), "--vllm-bench", str(empty), "--server", str(server),
            "--out", str(tmp_path / "vb")]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"servesim: error: {empty}: invalid JSON (Expecting value)\n"
    assert not (tmp_path / "vb").exists()


@pytest.mark.parametrize("section", ["engine", "deployment", "workload"])
def test_a_section_written_without_a_value_says_so_not_empty_file(tmp_path, capsys, section):
    # ``engine:`` with nothing after it is a key without a value; the message said "(got an empty file)" of a
    # file that is not empty
    cfg = tmp_path / "c.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump({k: v for k, v in SMALL.items() if k != section}) + f"{section}:\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: {section}: expected a mapping (key: value pairs) "
                                       "(got no value)\n")


@pytest.mark.parametrize("command, sized_by", [
    (["capacity", "--slo", "ttft_p99=0.5", "--replications", "1"], "--max-requests or the workload's own count"),
    (["tune-k", "--batch-sizes", "1,2", "--requests-per-client", "2"], "--requests-per-client"),
])
@pytest.mark.parametrize("given_by", ["file", "--set"])
def test_capacity_and_tune_k_refuse_a_time_limit(tmp_path, capsys, command, sized_by, given_by):
    # a run stopped at max_time_s leaves requests unfinished or not yet arrived: the capacity search had
    # halved the rate 17 times and answered "meets the SLOs at no rate down to 0.0002361 requests/s"
    config = {**SMALL, "speculative_config": {"method": "eagle", "num_speculative_tokens": 2}}
    if given_by == "file":
        config["simulation"] = {"max_time_s": 30}
    cfg = write_yaml(tmp_path / "c.yaml", config)
    extra = ["--set", "simulation.max_time_s=30"] if given_by == "--set" else []
    assert main([command[0], str(cfg), *command[1:], "--out", str(tmp_path / "o"), *extra]) == 2
    what = "a capacity search" if command[0] == "capacity" else "tune-k"
    where = f"{cfg}" if given_by == "file" else "--set"
    assert capsys.readouterr().err == (
        f"servesim: error: {where}: simulation.max_time_s: {what} runs every request to completion (a run stopped "
        f"at 30 s leaves requests unfinished or not yet arrived, which no setting would pass); leave it out "
        f"({sized_by} sizes the runs)\n")
    assert not (tmp_path / "o").exists()


def test_a_metric_the_run_lacks_is_not_called_unknown():
    # validate said "unknown summary metric 'spec_decode.mean_acceptance_length' (e.g. ...,
    # spec_decode.mean_acceptance_length)" of a run without speculation, and "unknown" of ttft_s.p100
    from servesim.analysis.validation import summary_value
    from servesim.errors import ConfigError

    summary = {"ttft_s": {"mean": 0.5, "p50": 0.4, "p99": 0.9}, "output_throughput": 100.0}
    where = "c.yaml: cases[0].measured.metric"
    expected = {
        "spec_decode.mean_acceptance_length": f"{where}: summary metric 'spec_decode.mean_acceptance_length': this "
        "run's summary has no 'spec_decode' (e.g. spec_decode needs a speculative_config, replicas a deployment of "
        "several)",
        "ttft_s.p100": f"{where}: summary metric 'ttft_s.p100': this run's ttft_s has no 'p100' (it holds mean, p50, "
        "p99)",
        "nosuch": f"{where}: unknown summary metric 'nosuch' (e.g. output_throughput, e2e_s.mean, "
        "spec_decode.mean_acceptance_length)",
    }
    for key, message in expected.items():
        with pytest.raises(ConfigError) as info:
            summary_value(summary, key, where)
        assert str(info.value) == message
    assert summary_value(summary, "ttft_s.p99", where) == 0.9


def test_a_profile_measured_with_another_method_is_noted(tmp_path, capsys):
    # an n-gram profile under EAGLE ran without a word (mean acceptance length 1.39)
    import json

    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": "ngram-llama3.1-8b-sharegpt-k3"}
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": spec})
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 0
    note = ("speculative_config.acceptance: the profile 'ngram-llama3.1-8b-sharegpt-k3' was measured with method "
            "'ngram'; this run's method is 'eagle'")
    assert capsys.readouterr().err == f"servesim: note: {note}\n"
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["setup"]["notes"] == [note]
    same = write_yaml(tmp_path / "same.yaml", {**SMALL, "speculative_config": {**spec, "method": "ngram"}})
    assert main(["run", str(same), "--out", str(tmp_path / "same"), "--no-plot", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert "notes" not in json.loads((tmp_path / "same" / "summary.json").read_text())["setup"]
