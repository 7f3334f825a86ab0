"""Regression tests for defects found by trying servesim as a new user: output folders of failed, interrupted
or mixed commands, interrupts while the command line is parsed, --help examples and defaults, a file of the
wrong kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.cli import main

from test_cli import write_yaml
from test_robustness_cli import SMALL


# the files of an earlier command in --out that a failed rerun of the same command must remove
EARLIER_OUTPUTS = {
    "capacity": ["capacity.csv", "slo_attainment.csv", "slo_attainment.png"],
    "tune-k": ["tune_k.json", "tune_k_grid.csv", "tune_k_check.csv", "tune_k.png", "tune_k.csv"],
    "sweep": ["summary.csv", "speedup.csv"],
    "run": ["summary.json", "requests.csv", "steps.csv", "latency.png"],
}


_MANIFEST = {"capacity": [], "tune-k": [], "run": [], "sweep": ["sweep.json"]}


def _earlier_outputs(out, command):
    """An --out holding an earlier ``command``'s outputs, a user's own file and (sweep) a stored run and the
    sweep's manifest (every sweep writes it first; tables without one are not a sweep's, and refused)."""
    out.mkdir()
    for name in EARLIER_OUTPUTS[command]:
        (out / name).write_text("an earlier run\n")
    (out / "notes.txt").write_text("mine\n")
    if command == "sweep":  # the head of a sweep's manifest
        (out / "sweep.json").write_text('{\n "source": "s.yaml",\n "columns": {},\n "points": [\n ]\n}\n')
    (out / "points").mkdir()
    (out / "points" / "abc-r0.json").write_text("{}\n")  # a sweep's stored run: kept, a rerun resumes


def _argv(tmp_path, command, *extra):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    if command == "sweep":
        cfg = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 16]}})
        return ["sweep", str(cfg), *extra]
    if command == "capacity":
        return ["capacity", str(cfg), "--slo", "ttft_p99=0.5", "--max-rate", "8", *extra]
    if command == "tune-k":
        return ["tune-k", str(cfg), "--batch-sizes", "1,2", *extra]
    return ["run", str(cfg), "--no-plot", *extra]


@pytest.mark.parametrize("command", ["capacity", "tune-k", "sweep", "run"])
def test_a_rerun_with_a_config_mistake_removes_the_earlier_outputs(tmp_path, capsys, command):
    out = tmp_path / "out"
    _earlier_outputs(out, command)
    if command == "sweep":  # a sweep has no --set: the typo is in its grid
        argv = _argv(tmp_path, command, "--out", str(out))
        write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seq": [8, 16]}})
    else:
        argv = _argv(tmp_path, command, "--set", "engine.max_num_seq=3", "--out", str(out))
    assert main(argv) == 2
    assert "engine.max_num_seq: unknown key" in capsys.readouterr().err
    # the earlier tables would look like the results of the command that just failed
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "points"] + _MANIFEST[command]
    assert [p.name for p in (out / "points").iterdir()] == ["abc-r0.json"]


@pytest.mark.parametrize("command", ["capacity", "tune-k", "sweep", "run"])
def test_ctrl_c_while_the_config_loads_removes_the_earlier_outputs(tmp_path, monkeypatch, capsys, command):
    import servesim.config.models
    import servesim.sweep.spec

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(servesim.config.models, "load_config", interrupted)
    monkeypatch.setattr(servesim.sweep.spec, "load_sweep", interrupted)
    out = tmp_path / "out"
    _earlier_outputs(out, command)
    assert main(_argv(tmp_path, command, "--out", str(out))) == 130
    assert capsys.readouterr().err == "servesim: interrupted\n"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "points"] + _MANIFEST[command]


def test_a_failure_leaves_a_missing_out_missing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_argv(tmp_path, "capacity", "--slo", "ttft_p77=0.5", "--out", str(out))) == 2
    assert capsys.readouterr().err.startswith("servesim: error: --slo: unknown statistic 'p77'")
    assert not out.exists()


def test_a_sweep_rerun_that_fails_its_check_removes_the_figures_drawn_from_its_tables(tmp_path, capsys):
    """A rerun whose grid fails the up-front check removed summary.csv and speedup.csv, and left the figures
    `servesim plot` had drawn from them."""
    from servesim.sweep.runner import PLOT_FIGURES

    out = tmp_path / "out"
    _earlier_outputs(out, "sweep")
    figures = [*PLOT_FIGURES, "heatmap_ttft_p99.png", "heatmap_ttft_p99.csv"]
    for name in figures:
        (out / name).write_text("drawn from the earlier table\n")
    write_yaml(tmp_path / "c.yaml", SMALL)
    write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 0]}})
    assert main(["sweep", str(tmp_path / "s.yaml"), "--out", str(out)]) == 2
    assert "engine.max_num_seqs=0" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "points", "sweep.json"]


def test_a_resumed_sweep_removes_the_temporary_files_of_a_killed_one(tmp_path):
    """A sweep killed while writing (SIGKILL: no handler runs) left atomic_file's .NAME.*.tmp files, which no
    later run removed."""
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 16]}})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    stored = sorted(p.name for p in (out / "points").iterdir())
    killed = [".summary.csv.k1x2z9.tmp", ".sweep.json.a8b7c6.tmp", ".failures.csv.zz.tmp", ".speedup.png.q.tmp",
              ".heatmap_ttft_p99.png.q.tmp", f"points/.{stored[0]}.u3v4w5.tmp"]
    mine = ["notes.txt", ".notes.txt.ab.tmp", ".cache.tmp", "points/.other.json.x.tmp"]  # the user's own
    for name in killed + mine:
        (out / name).write_text("")
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == sorted(mine + ["summary.csv", "sweep.json"] + [f"points/{name}" for name in stored])


@pytest.mark.parametrize("command", ["run", "capacity", "tune-k"])
def test_a_sweep_folder_without_its_tables_is_still_refused_to_other_commands(tmp_path, capsys, command):
    """An interrupted sweep's folder (its manifest and stored runs, no summary.csv yet) took a `servesim run`,
    after which the sweep could not resume there."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text("{}\n")
    (out / "points").mkdir()
    assert main(_argv(tmp_path, command, "--out", str(out))) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {out} holds the results of `servesim sweep` "
                                       f"(sweep.json); give `servesim {command}` another folder, or remove them "
                                       "first\n")
    assert sorted(p.name for p in out.iterdir()) == ["points", "sweep.json"]


def test_the_sweep_command_removes_the_runners_tables():
    from servesim.cli import COMMAND_OUTPUTS
    from servesim.sweep.runner import SWEEP_TABLES

    assert COMMAND_OUTPUTS["sweep"] == SWEEP_TABLES


def test_ctrl_c_while_the_command_line_is_parsed_is_one_line(tmp_path, monkeypatch, capsys):
    import servesim.cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(servesim.cli, "build_parser", interrupted)
    try:
        status = main(["run", "c.yaml", "--out", str(tmp_path / "o")])
    except KeyboardInterrupt:  # not let through to pytest, which would stop the whole session
        pytest.fail("Ctrl-C while parsing the command line came out of main() as a traceback")
    assert status == 130
    assert capsys.readouterr().err == "servesim: interrupted\n"


def test_sigterm_while_the_command_line_is_parsed_is_one_line(tmp_path):
    import subprocess
    import sys

    # in a child process: without servesim's handler SIGTERM would kill the test run itself
    code = ("import os, signal, sys\n"
            "import servesim.cli as cli\n"
            "def parsing(argv):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    raise AssertionError('SIGTERM was not delivered')\n"
            "cli.build_parser = parsing\n"
            "sys.exit(cli.main(['run', 'c.yaml', '--out', 'o']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (143, "servesim: terminated (SIGTERM)\n")


@pytest.mark.parametrize(("first", "second"), [("run", "sweep"), ("sweep", "run"), ("run", "capacity"),
                                               ("capacity", "tune-k")])
def test_one_out_for_two_commands_is_refused(tmp_path, capsys, first, second):
    out = tmp_path / "out"
    out.mkdir()
    for name in EARLIER_OUTPUTS[first]:
        (out / name).write_text(f"results of servesim {first}\n")
    assert main(_argv(tmp_path, second, "--out", str(out))) == 2
    err = capsys.readouterr().err
    found = ", ".join(EARLIER_OUTPUTS[first])
    assert err == (f"servesim: error: --out: {out} holds the results of `servesim {first}` ({found}); "
                   f"give `servesim {second}` another folder, or remove them first\n")
    # the first command's files are kept, and the second wrote nothing beside them
    assert sorted(p.name for p in out.iterdir()) == sorted(EARLIER_OUTPUTS[first])
    assert all(p.read_text() == f"results of servesim {first}\n" for p in out.iterdir())


def test_every_help_example_parses_and_names_files_that_exist(capsys):
    import shlex
    from pathlib import Path

    from servesim.cli import EXAMPLES, build_parser

    root = Path(__file__).resolve().parents[1]
    assert set(EXAMPLES) >= {None, "run", "sweep", "plot", "capacity", "tune-k"}
    for command, lines in EXAMPLES.items():
        for line in lines:
            for part in line.split(" && "):
                argv = shlex.split(part)
                assert argv[0] == "servesim"
                if argv[1] == "COMMAND":
                    continue
                assert command in (None, argv[1]), line  # a command's examples are of that command
                parser, _ = build_parser(argv[1:])
                args = parser.parse_args(argv[1:])  # an unknown option or a bad value would exit here
                for value in vars(args).values():
                    if isinstance(value, (str, Path)) and str(value).startswith(("experiments/", "tests/")):
                        assert (root / value).exists(), f"{line}: {value} does not exist"
    parser, _ = build_parser(None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "examples:\n  servesim run experiments/azure-conv-llama8b-h100.yaml" in capsys.readouterr().out


def test_help_states_the_defaults_that_are_not_obvious(capsys):
    from servesim.analysis.capacity import MAX_RATE_STEPS
    from servesim.cli import build_parser

    for argv, text in ((["run", "--help"], "default: the config's seed"),
                       (["capacity", "--help"], f"default: no limit, at most {MAX_RATE_STEPS} doublings"),
                       (["capacity", "--help"], "(default: not required)")):
        parser, _ = build_parser(argv)
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert text in " ".join(capsys.readouterr().out.split()), argv


def test_a_sweep_file_given_to_run_and_a_run_config_given_to_sweep_are_named(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, 16]}})
    assert main(["run", str(sweep), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {sweep}: a sweep file (base, grid/zip/variants), not a "
                                       "run config: give it to `servesim sweep`, or give this command its base "
                                       "run config\n")
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"servesim: error: {cfg}: a run config (hardware, model, workload), not a "
                                       "sweep file: give it to `servesim run`, or name it as a sweep file's base\n")
    assert not (tmp_path / "o").exists()


def test_run_writes_summary_json_last(tmp_path, monkeypatch):
    # a kill -9 while writing requests.csv left a complete, new summary.json: the folder read as a finished run
    import servesim.metrics.outputs as outputs
    from servesim.cli import main as cli_main

    written = []
    real = outputs.atomic_write

    def recording(path, chunks):
        real(path, chunks)
        written.append(Path(path).name)

    monkeypatch.setattr(outputs, "atomic_write", recording)
    import servesim.plots.latency as latency

    real_plot = latency.plot_latency

    def plot(*args, **kwargs):
        real_plot(*args, **kwargs)
        written.append("latency.png")

    monkeypatch.setattr(latency, "plot_latency", plot)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hardware: h100-sxm\nmodel: llama-3.1-8b\nworkload: {type: poisson, rate: 5, num_requests: 20, "
                   "prompt_tokens: {type: fixed, value: 50}, output_tokens: {type: fixed, value: 10}}\n")
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert written == ["latency.png", "requests.csv", "steps.csv", "summary.json"]


def test_a_sweep_rerun_says_which_stored_runs_were_unreadable(tmp_path, capsys):
    # a truncated or empty stored run was run again silently: "reused 1" without saying why the others ran
    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16, 32]}})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    first, second, _ = sorted((out / "points").iterdir())
    first.write_text("")
    second.write_text(second.read_text()[:40])
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    last = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("reused "))
    assert last.startswith("reused 1 stored run(s)")
    assert last.endswith(f"; 2 stored run(s) unreadable (points/{first.name}, points/{second.name}): ran them again")
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    assert "unreadable" not in capsys.readouterr().out


@pytest.mark.parametrize("damage", [
    lambda record: record.update(summary="oops"),  # the tables' flattening raised AttributeError
    lambda record: record["summary"].update(output_throughput="abc"),  # speedup.csv raised ValueError
    lambda record: record.update(summary={"num_requests": 1}),  # was reused: an empty row, a lost speedup
    lambda record: record.update(seed="7"),
])
def test_a_stored_run_edited_into_another_shape_is_unreadable_and_run_again(tmp_path, capsys, damage):
    import json

    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [8, 16]},
                                             "variants": {"a": {}, "b": {"engine.max_num_batched_tokens": 4096}},
                                             "baseline": "a"})
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    tables = {name: (out / name).read_bytes() for name in ("summary.csv", "speedup.csv")}
    first = sorted((out / "points").iterdir())[0]
    record = json.loads(first.read_text())
    damage(record)
    first.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"1 stored run(s) unreadable (points/{first.name})" in captured.out and "Traceback" not in captured.err
    assert {name: (out / name).read_bytes() for name in tables} == tables  # the run again, the same tables


@pytest.mark.parametrize("workload", [{"type": "trace", "path": "requests.csv"}, "wl.yaml"])
def test_a_run_whose_trace_is_one_of_its_outputs_is_refused_and_the_trace_kept(tmp_path, capsys, workload):
    # `servesim run c.yaml --out .` in the folder of a trace named requests.csv removed the trace as an
    # earlier run's output before reading it, then said "requests.csv: trace file not found"
    trace = tmp_path / "requests.csv"
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,10\n"
    trace.write_text(text)
    (tmp_path / "wl.yaml").write_text("type: trace\npath: requests.csv\n")
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "workload": workload})
    assert main(["run", str(cfg), "--out", str(tmp_path), "--no-plot"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {trace} is an input of this run, and the run "
                                       "writes its requests.csv there: give another --out folder\n")
    assert trace.read_text() == text
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"]) == 0


@pytest.mark.parametrize("command", ["capacity", "tune-k", "sweep", "run"])
def test_an_out_folder_in_use_by_another_command_is_refused_untouched(tmp_path, capsys, command):
    # another servesim command still writing into --out holds the folder's lock: this one is refused at
    # once, before it removes or writes anything (two commands' files would otherwise interleave)
    from servesim.atomic import output_folder_lock

    out = tmp_path / "out"
    _earlier_outputs(out, command)
    with output_folder_lock(out):
        assert main(_argv(tmp_path, command, "--out", str(out))) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {out} is in use by another servesim command, "
                                       "still running; wait for it to finish or give another folder\n")
    assert sorted(p.name for p in out.iterdir()) == sorted(EARLIER_OUTPUTS[command] + ["notes.txt", "points"]
                                                           + _MANIFEST[command])
    assert all((out / name).read_text() == "an earlier run\n" for name in EARLIER_OUTPUTS[command])
    # the refused command took no lock of its own: the folder is free once the holder lets go
    with output_folder_lock(out):
        pass


def test_a_run_into_a_folder_whose_lock_was_released_writes_its_results(tmp_path, capsys):
    from servesim.atomic import output_folder_lock

    out = tmp_path / "out"
    with output_folder_lock(out):
        pass
    assert main(_argv(tmp_path, "run", "--out", str(out), "--quiet")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "steps.csv", "summary.json"]


def test_the_lock_of_a_killed_command_is_released(tmp_path):
    # flock: the kernel drops a process's locks when it ends, SIGKILL included (nothing stale to clean up)
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    code = ("import sys, time; from servesim.atomic import output_folder_lock\n"
            "with output_folder_lock(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        from servesim.atomic import output_folder_lock
        from servesim.errors import OutputFolderRefused

        with pytest.raises(OutputFolderRefused, match="is in use by another servesim command"):
            with output_folder_lock(out):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with output_folder_lock(out):  # taken at once
        pass
    assert list(out.iterdir()) == []  # the lock wrote nothing into the folder


def test_a_refused_command_leaves_the_folder_the_other_one_created(tmp_path, monkeypatch, capsys):
    # a race: --out was missing when this command started (it would remove the folders it created on
    # failure) and another command created and locked it since; the folder is the other's and stays
    import servesim.cli as cli
    from servesim.atomic import output_folder_lock

    out = tmp_path / "new" / "out"
    monkeypatch.setattr(cli, "_missing_folders", lambda _: [out, out.parent])  # as seen at this one's start
    with output_folder_lock(out):
        assert main(_argv(tmp_path, "run", "--out", str(out))) == 2
        assert out.is_dir()
    assert "is in use by another servesim command" in capsys.readouterr().err


def test_plot_is_refused_while_a_command_holds_the_sweep_folder(tmp_path, capsys):
    # a sweep still running into DIR: its tables are not final, and figures drawn from them now would stay
    # beside the new table (a sweep removes only the figures it found at its start)
    from servesim.atomic import output_folder_lock

    out = tmp_path / "out"
    assert main(_argv(tmp_path, "sweep", "--out", str(out), "--no-progress")) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    with output_folder_lock(out):
        assert main(["plot", str(out)]) == 2
        assert capsys.readouterr().err == (f"servesim: error: DIR: {out} is in use by another servesim command, "
                                           "still running; wait for it to finish or give another folder\n")
        assert main(["plot", str(out), "--out", str(tmp_path / "figures")]) == 2
    assert sorted(p.name for p in out.iterdir()) == before
    assert main(["plot", str(out)]) == 0  # the lock released: drawn, into DIR also when --out names it
    assert main(["plot", str(out), "--out", str(out)]) == 0


@pytest.mark.parametrize("command", ["calibrate", "acceptance"])
def test_a_failed_rerun_removes_the_earlier_output_file(tmp_path, capsys, command):
    # calibrate --out CARD.yaml and acceptance ... --out PROFILE.yaml left the previous file in place when a new
    # run failed, looking like its result
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "out" / "result.yaml"
    if command == "calibrate":
        good = str(repo / "workloads" / "examples" / "step-times-h100-llama8b-synthetic.csv")
        bad = tmp_path / "header-only.csv"
        bad.write_text("batch_size,context_tokens,scheduled_tokens,step_time_s\n")
        argv = ["calibrate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--quiet", "--out", str(out),
                "--data"]
    else:
        good = str(repo / "workloads" / "examples" / "vllm-specdecode-eagle3-k3.log")
        bad = tmp_path / "no-spec-lines.log"
        bad.write_text("INFO 01-01 00:00:00 engine started\n")
        argv = ["acceptance", "from-vllm-log", "--method", "eagle3", "--out", str(out), "--input"]
    assert main([*argv, good]) == 0 and out.is_file()
    assert main([*argv, str(bad)]) == 2
    assert "servesim: error: " in capsys.readouterr().err
    assert not out.exists() and list(out.parent.iterdir()) == []
    # a file the command did not write is left as it is when a run fails, also one that names the command,
    # and so is a neighbour named like a temporary file of it
    for mine in ("my notes\n", "# notes: run servesim acceptance and calibrated by servesim calibrate later\n",
                 "name: mine\nsource: measured by me\n# calibrated by servesim calibrate? servesim acceptance? no\n"):
        out.write_text(mine)
        (out.parent / f".{out.name}.backup.tmp").write_text("mine too\n")
        assert main([*argv, str(bad)]) == 2
        assert out.read_text() == mine and (out.parent / f".{out.name}.backup.tmp").exists()
    capsys.readouterr()


def test_calibrate_refuses_an_out_that_is_its_input_card(tmp_path, capsys):
    # --out naming the --hardware card given by path deleted it, then said it did not exist
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    card = tmp_path / "gpu.yaml"
    shutil.copy(repo / "hardware" / "gpus" / "h100-sxm.yaml", card)
    before = card.read_bytes()
    data = str(repo / "workloads" / "examples" / "step-times-h100-llama8b-synthetic.csv")
    assert main(["calibrate", "--hardware", str(card), "--model", "llama-3.1-8b", "--data", data,
                 "--out", str(card)]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out: {card} is the --hardware file (an input of this "
                                       "command); give another file path\n")
    assert card.read_bytes() == before


def test_a_long_or_quoted_earlier_output_is_still_recognised_as_the_commands(tmp_path, capsys):
    # the mark was looked for in the first 64 KB (a card with ~950 measured steps has it further down) and as
    # written (a quoted, escaped YAML string splits it): the earlier file stayed, looking current
    from servesim.atomic import remove_earlier_output_file

    card = tmp_path / "card.yaml"
    card.write_text("# " + "x" * 100_000 + "\nname: c\nsource: calibrated by servesim calibrate on 2026-12-07\n")
    remove_earlier_output_file(card, "calibrated by servesim calibrate")
    assert not card.exists()
    profile = tmp_path / "p.yaml"
    profile.write_text('name: p\nsource: "vllm-log donn\\xE9es.log via servesim\\\n  \\ acceptance"\n')
    remove_earlier_output_file(profile, "servesim acceptance")
    assert not profile.exists()


def test_a_user_file_named_sweep_json_does_not_make_a_sweeps_folder(tmp_path, capsys):
    # a failed sweep into a folder with the user's sweep.json deleted the user's summary.csv
    out = tmp_path / "o"
    out.mkdir()
    (out / "sweep.json").write_text('{"mine": 1}\n')
    (out / "summary.csv").write_text("my,data\n")
    assert main(["sweep", str(tmp_path / "nosuch.yaml"), "--out", str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["summary.csv", "sweep.json"]
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8]}})
    assert main(["sweep", str(sweep), "--out", str(out)]) == 2
    assert capsys.readouterr().err.endswith(f"--out: {out} holds sweep.json, summary.csv but a sweep.json that is "
                                            f"not a sweep's (not a sweep's folder); give {sweep} another folder, or "
                                            "remove them first\n")
    assert (out / "summary.csv").read_text() == "my,data\n"
