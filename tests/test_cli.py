"""The command line: outputs of `servesim run`, and one-line errors without tracebacks."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "hardware": "h100-sxm",
    "model": "llama-3.1-8b",
    "workload": {
        "type": "poisson",
        "rate": 5.0,
        "num_requests": 200,
        "prompt_tokens": {"type": "uniform", "low": 10, "high": 2000},
        "output_tokens": {"type": "uniform", "low": 1, "high": 300},
    },
    "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
}


def write_yaml(path: Path, data) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def test_run_writes_all_outputs(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == summary["completed"] == 200
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p95", "p99"}
    assert summary["request_throughput"] > 0 and summary["output_throughput"] > 0
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200
    assert {"request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s",
            "preemptions"} <= set(rows[0])
    with open(out / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert steps and {"start_s", "duration_s", "batch_size", "num_tokens", "kv_blocks_used"} <= set(steps[0])
    assert (out / "latency.png").stat().st_size > 10_000
    assert "TTFT" in capsys.readouterr().out


def test_seed_and_set_override(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-plot", "--quiet", "--seed", "3"])
    main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-plot", "--quiet", "--seed", "3"])
    main(["run", str(cfg), "--out", str(tmp_path / "c"), "--no-plot", "--quiet", "--seed", "4",
          "--set", "engine.max_num_seqs=8"])
    a, b, c = ((tmp_path / d / "requests.csv").read_text() for d in "abc")
    assert a == b and a != c
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["setup"]["max_num_seqs"] == 8
    assert not (tmp_path / "a" / "latency.png").exists()


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("servesim: error: ")
    return err


def test_unknown_key_names_file_and_field(tmp_path, capsys):
    bad = dict(SMALL, engine={"max_num_seq": 8})
    cfg = write_yaml(tmp_path / "bad.yaml", bad)
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "bad.yaml" in err and "engine.max_num_seq" in err and "unknown key" in err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_wrong_type_and_value(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "bad.yaml", dict(SMALL, engine={"max_num_seqs": "many"}))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "engine.max_num_seqs" in err and "'many'" in err
    cfg = write_yaml(tmp_path / "bad2.yaml", dict(SMALL, engine={"gpu_memory_utilization": 1.5}))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "engine.gpu_memory_utilization" in err and "1.5" in err


def test_invalid_yaml_names_the_line(tmp_path, capsys):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("hardware: h100-sxm\nmodel: [llama\n")
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "broken.yaml" in err and "line" in err


def test_malformed_trace_row_names_file_and_line(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,abc,109\n")
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, workload={"type": "trace", "path": "t.csv"}))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "t.csv" in err and "line 3" in err


def test_unknown_card_and_model_that_does_not_fit(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, hardware="h900"))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "h900" in err
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, hardware="l4", model="llama-3.1-70b"))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "does not fit" in err and err.startswith(f"servesim: error: {cfg}: tensor_parallel_size: ")


def test_a_draft_model_that_does_not_fit_is_named_and_huge_sizes_stay_short(tmp_path, capsys):
    """The 70B draft model's 141 GB were counted as the 8B target's own weights, and a huge token budget
    printed its reserve with 21 digits."""
    spec = {"method": "draft_model", "model": "llama-3.1-70b", "num_speculative_tokens": 2,
            "acceptance": {"alpha": 0.5}}
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, speculative_config=spec))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert ("Llama-3.1-8B does not fit on 1 x H100 SXM: per GPU, its weights 16.1 GB + the draft model "
            "llama-3.1-70b's weights 141.1 GB + the activation reserve ") in err
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, engine={"max_num_batched_tokens": 10**14}))
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert "the activation reserve 9.01e+09 GB (at max_num_batched_tokens=100000000000000)" in err
    # the weights fit and the token budget's activations take the rest: named as that setting, --set's
    # when --set gave it (it was named tensor_parallel_size, in the file)
    assert err.startswith(f"servesim: error: {cfg}: engine.max_num_batched_tokens: Llama-3.1-8B does not fit ")
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o"),
                                  "--set", "engine.max_num_batched_tokens=100000000000000"])
    assert err.startswith("servesim: error: --set: engine.max_num_batched_tokens: Llama-3.1-8B does not fit ")


def test_bad_set_assignment(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o"), "--set", "engine.max_num_seqs"])
    assert "engine.max_num_seqs" in err


def test_console_script_exit_status(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, seed=-1))
    proc = subprocess.run([sys.executable, "-c", "import sys; from servesim.cli import main; sys.exit(main())",
                           "run", str(cfg), "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "seed" in proc.stderr


def _console(args: list[str], before: str = "", **kwargs) -> subprocess.CompletedProcess:
    """Run ``servesim ARGS`` through the console script's entry point, ``before`` run first in the process."""
    code = f"{before}\nfrom servesim.cli import console_main\nconsole_main()"
    return subprocess.run([sys.executable, "-c", code, *args], text=True, **kwargs)


def test_the_console_script_ends_the_process_with_main_s_status_and_its_output_complete(tmp_path):
    # console_main skips the interpreter's teardown (os._exit) after flushing: the status is main()'s, the
    # printed summary is all there, the files are written, and atexit handlers still run
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    before = "import atexit; atexit.register(lambda: print('atexit ran'))"
    proc = _console(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], before, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("atexit ran\n") and "TTFT" in proc.stdout
    assert "completed" in json.loads((tmp_path / "o" / "summary.json").read_text())
    proc = _console(["run", str(cfg), "--out", str(tmp_path / "o"), "--set", "seed=-1"], capture_output=True)
    assert proc.returncode == 2 and proc.stderr.startswith("servesim: error: ") and "Traceback" not in proc.stderr
    out = subprocess.run([sys.executable, "-m", "servesim", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "capacity" in out.stdout  # python -m servesim: the same entry point


@pytest.mark.parametrize("signum, status, line", [("SIGINT", 130, "servesim: interrupted\n"),
                                                   ("SIGTERM", 143, "servesim: terminated (SIGTERM)\n")])
def test_a_second_interrupt_while_the_console_script_ends_is_ignored(tmp_path, signum, status, line):
    # the command stops at a Ctrl-C (or SIGTERM); the same signal, sent three more times while the process
    # ends (from an atexit handler, as a key pressed again would land), must not print a traceback
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    before = ("import atexit, os, signal, time\n"
              "import servesim.cli.run as command\n"
              "# Ctrl-C as in a terminal: a background job (a CI runner's) starts with SIGINT ignored\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "def interrupted(args):\n"
              f"    os.kill(os.getpid(), signal.{signum})\n"
              "    for _ in range(1000):  # the handler raises at the next check (within 10 s, else status 99)\n"
              "        time.sleep(0.01)\n"
              "    os._exit(99)\n"
              "command.run = interrupted\n"
              "atexit.register(lambda: print('exit went on', flush=True))  # runs last\n"
              f"atexit.register(lambda: [os.kill(os.getpid(), signal.{signum}) for _ in range(3)])")
    proc = _console(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], before, capture_output=True)
    assert proc.returncode == status and proc.stderr == line, proc.stderr
    assert proc.stdout == "exit went on\n"  # the exit went on after the signals: the last handler ran


def test_the_console_script_pauses_the_cyclic_collector_for_run_only(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    before = "import atexit, gc; atexit.register(lambda: print('collector enabled:', gc.isenabled()))"
    proc = _console(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"], before,
                    capture_output=True)
    assert proc.returncode == 0 and proc.stdout.endswith("collector enabled: False\n"), proc.stderr
    proc = _console(["--help"], before, capture_output=True)  # any other command: as Python starts
    assert proc.returncode == 0 and proc.stdout.endswith("collector enabled: True\n")


def test_the_console_script_runs_numpy_s_blas_on_one_thread_unless_told_otherwise():
    import os

    code = "import atexit, os; atexit.register(lambda: print('threads', os.environ.get('OPENBLAS_NUM_THREADS')))"
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    assert _console(["--help"], code, capture_output=True, env=env).stdout.endswith("threads 1\n")
    env["OPENBLAS_NUM_THREADS"] = "4"  # the user's setting is kept
    assert _console(["--help"], code, capture_output=True, env=env).stdout.endswith("threads 4\n")


def test_a_console_run_has_no_thread_but_its_own(tmp_path):
    # numpy imported, the run done: no BLAS pool (the progress bar's thread only runs on a terminal)
    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts threads in /proc (Linux)")
    import os

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    code = "import atexit, os; atexit.register(lambda: print('threads', len(os.listdir('/proc/self/task'))))"
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_NUM_THREADS"}
    proc = _console(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--quiet"], code,
                    capture_output=True, env=env)
    assert proc.returncode == 0 and proc.stdout == "threads 1\n", proc.stderr


def test_the_console_script_waits_for_a_live_thread_and_reports_a_failed_flush(tmp_path):
    # a non-daemon thread still running: the normal exit, which waits for it (its file gets written)
    marker = tmp_path / "written"
    before = ("import threading, time\n"
              f"threading.Thread(target=lambda: (time.sleep(0.3), open({str(marker)!r}, 'w').close())).start()")
    proc = _console(["--help"], before, capture_output=True)
    assert proc.returncode == 0 and marker.exists()
    # stdout whose flush fails (a full disk, a closed pipe): the normal exit, which reports it (status 120)
    # where os._exit would end with 0 and the output lost
    before = ("import io, sys\nclass Full(io.StringIO):\n    def flush(self):\n        raise OSError(28, 'No space left')\n"
              "sys.stdout = Full()")
    proc = _console(["--help"], before, capture_output=True)
    assert proc.returncode == 120 and "No space left" in proc.stderr


def test_the_cli_starts_where_nothing_imported_importlib_util_before_it():
    # an editable install's path hook imports importlib.util at start-up; a plain `pip install .` into a
    # clean venv does not, and `importlib.util` is then no attribute of `importlib` until imported by name
    # (the CLI once failed there on every command with AttributeError)
    code = ("import sys, importlib; sys.modules.pop('importlib.util', None); importlib.__dict__.pop('util', None); "
            "from servesim.cli import main; sys.exit(main(['--help']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "run" in proc.stdout


def test_out_is_a_file_and_negative_seed(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    (tmp_path / "afile").write_text("x")
    one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "afile")])
    with pytest.raises(SystemExit) as info:  # argparse: usage line + one error line, status 2
        main(["run", str(cfg), "--out", str(tmp_path / "o"), "--seed", "-1"])
    assert info.value.code == 2
    assert "expected an integer >= 0" in capsys.readouterr().err


def test_an_out_folder_removed_during_the_run_is_one_line(tmp_path, capsys, monkeypatch):
    # the folder goes while the command runs (another shell's rm -rf, a cleaned /tmp): the atomic write's
    # rename then fails; the user gets the file it was writing, not a traceback
    import os
    import shutil

    from servesim import atomic

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    real_replace = os.replace

    def replace_after_removal(source, target):  # the folder goes between the temporary file and its rename
        shutil.rmtree(out, ignore_errors=True)
        return real_replace(source, target)

    monkeypatch.setattr(atomic.os, "replace", replace_after_removal)
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"servesim: error: {out}") and "No such file or directory" in err


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    # a write that fails for want of space (ENOSPC carries no file name): the file it was writing is named,
    # no traceback, status 2, and no file of the failed run is left
    import errno

    from servesim.metrics import outputs

    def full_disk(path, chunks):
        with outputs.atomic_file(path, "wb") as handle:
            handle.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "out"
    monkeypatch.setattr(outputs, "atomic_write", full_disk)
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err == f"servesim: error: {out / 'requests.csv'}: No space left on device\n"  # the first file written (summary.json is last)
    assert not out.exists()  # no temporary file, no partial output: the folder the run created is gone


def test_a_failed_command_leaves_no_empty_out_folder_it_created(tmp_path, capsys):
    # refused while the run is set up, after --out was created (an unwritable --out must fail at once): the
    # folder the command created goes; a folder that was there before stays, as do its parents
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, tensor_parallel_size=3))
    out = tmp_path / "parent" / "a" / "out"
    (tmp_path / "parent").mkdir()
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 2
    assert "divisible by tensor parallel size (3)" in capsys.readouterr().err
    assert not (tmp_path / "parent" / "a").exists() and (tmp_path / "parent").is_dir()  # what it created goes
    out.mkdir(parents=True)
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 2
    assert out.is_dir()


def test_a_full_stdout_is_one_line(tmp_path):
    # stdout on a full device (/dev/full here): one line, status 2
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system to write to")
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "servesim", "run", str(cfg), "--out", str(tmp_path / "o"),
                               "--no-plot"], stdout=full, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "servesim: error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["acceptance", "--help"], ["--version"]])
def test_help_to_a_full_stdout_is_one_line(argv):
    # argparse ignores a failed write of its help (status 0, nothing said); servesim's parser does not
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system to write to")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "servesim", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True)
    assert (proc.returncode, proc.stderr) == (2, "servesim: error: cannot write the output: No space left on device\n")
    proc = subprocess.run([sys.executable, "-m", "servesim", *argv], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("servesim" if argv == ["--version"] else "usage: servesim")
    assert proc.stderr == ""


def test_help_into_a_closed_pipe_ends_quietly_as_sigpipe_would():
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "servesim", "run", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # before the help is written
    err = proc.stderr.read().decode()
    assert proc.wait() == 128 + signal.SIGPIPE
    assert err == ""


def test_a_closed_pipe_ends_quietly_as_sigpipe_would(tmp_path):
    # ``servesim ... | head -1``: the reader goes away; no traceback, the status of a command SIGPIPE ended
    import signal

    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    proc = subprocess.Popen([sys.executable, "-m", "servesim", "run", str(cfg), "--out", str(tmp_path / "o"),
                             "--no-plot"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command prints its table
    err = proc.stderr.read().decode()
    assert proc.wait() == 128 + signal.SIGPIPE
    assert err == ""


def test_a_closed_stdout_is_no_traceback(tmp_path):
    # ``servesim run ... >&-``: Python starts with sys.stdout None (print() writes nothing); flushing it was an
    # AttributeError traceback, status 1. The run writes its files and succeeds
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "servesim", "run", str(cfg), "--out", str(out), "--no-plot"],
                          preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert (out / "summary.json").is_file()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"engine": {"block_size": 7}}, "engine.block_size"),
        ({"tensor_parallel_size": 3}, "divisible by tensor parallel size (3)"),
        ({"engine": {"max_num_batched_tokens": 8}}, "max_num_seqs (1024)"),
        ({"workload": dict(SMALL["workload"], rate=1e-9)}, "simulates at most"),
    ],
)
def test_settings_vllm_or_the_clock_would_reject(tmp_path, capsys, change, words):
    cfg = write_yaml(tmp_path / "c.yaml", dict(SMALL, **change))
    assert words in one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "o")])


def test_sweep_with_a_typo_fails_before_running(tmp_path, capsys):
    write_yaml(tmp_path / "base.yaml", SMALL)
    sweep = write_yaml(tmp_path / "sweep.yaml", {"base": "base.yaml", "grid": {"engine.max_num_seq": [1, 2]}})
    err = one_line_error(capsys, ["sweep", str(sweep), "--out", str(tmp_path / "s")])
    assert "sweep.yaml" in err and "engine.max_num_seq" in err and "unknown key" in err
    assert not (tmp_path / "s").exists()
