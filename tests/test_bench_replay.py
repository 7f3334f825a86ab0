"""servesim validate with a user's `vllm bench serve --save-result` JSON: replay, report, --strict."""

from __future__ import annotations

import json

import pytest

from servesim.analysis.bench_replay import replay_workload
from servesim.cli import main
from servesim.errors import ConfigError

SERVER = "hardware: lesson-h100-sxm\nmodel: lesson-8b-fp16\nroofline: {mode: ideal}\n"
STEP_S = 16e9 / 3.35e12  # every step of this server below ~295 tokens


def _result(**extra):
    # one client, 4 requests of 10 + 11 tokens, all steps 4.776 ms: TTFT = 1 step, TPOT = 1 step,
    # output throughput = 44 tokens / 44 steps
    base = {"completed": 4, "total_input_tokens": 40, "total_output_tokens": 44, "max_concurrency": 1,
            "request_rate": "inf", "burstiness": 1.0, "mean_ttft_ms": STEP_S * 1e3,
            "mean_tpot_ms": STEP_S * 1e3, "output_throughput": 1 / STEP_S, "duration": 44 * STEP_S}
    base.update(extra)
    return base


def _write(tmp_path, result):
    (tmp_path / "server.yaml").write_text(SERVER)
    (tmp_path / "r.json").write_text(json.dumps(result))
    return ["validate", "--vllm-bench", str(tmp_path / "r.json"), "--server", str(tmp_path / "server.yaml"),
            "--out", str(tmp_path / "out")]


def test_replay_reproduces_a_hand_worked_benchmark(tmp_path, capsys):
    # exact to the engine's picosecond clock: a 1e-6 tolerance
    assert main(_write(tmp_path, _result()) + ["--strict", "--tolerance", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 cases within tolerance" in out
    rows = (tmp_path / "out" / "validation.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[1].startswith("r-ttft_s,")


def test_strict_exits_1_when_a_case_is_outside_default_reports_only(tmp_path, capsys):
    args = _write(tmp_path, _result(mean_tpot_ms=STEP_S * 1e3 * 1.2))  # measured 20% slower than simulated
    assert main(args) == 0
    assert main(args + ["--strict"]) == 1
    assert "Outside tolerance" in capsys.readouterr().out


def test_replay_workload_follows_how_the_benchmark_sent_requests(tmp_path):
    closed, _ = replay_workload(_result(), "r.json", tmp_path)
    assert closed["type"] == "closed_loop" and closed["concurrency"] == 1 and closed["num_requests"] == 4
    poisson, _ = replay_workload(_result(max_concurrency=None, request_rate=2.5), "r.json", tmp_path)
    assert poisson["type"] == "poisson" and poisson["rate"] == 2.5
    gamma, _ = replay_workload(_result(max_concurrency=None, request_rate=2.5, burstiness=0.25), "r.json", tmp_path)
    assert gamma["type"] == "gamma" and gamma["cv"] == pytest.approx(2.0)
    burst, how = replay_workload(_result(completed=2, max_concurrency=None, input_lens=[5, 7], output_lens=[3, 4]),
                                 "r.json", tmp_path)
    assert burst["type"] == "trace" and "2 (input, output) pairs" in how
    assert (tmp_path / "bench-requests.csv").read_text().splitlines()[1:] == [
        "2024-01-01 00:00:00.0000000,5,3", "2024-01-01 00:00:00.0000000,7,4"]


def test_bad_result_and_missing_server_are_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="total_input_tokens"):
        replay_workload({"completed": 3}, "r.json", tmp_path)
    # vLLM lists every request it sent (failed ones too): more completed than listed is not one run's result
    with pytest.raises(ConfigError, match=r"^r\.json: completed: 4 requests, but input_lens and output_lens list 2 "):
        replay_workload(_result(input_lens=[5, 7], output_lens=[3, 4]), "r.json", tmp_path)
    # lists of different lengths were replayed at the mean lengths, described as "no input_lens in the result"
    with pytest.raises(ConfigError, match=r"^r\.json: input_lens lists 2 requests and output_lens 3 "):
        replay_workload(_result(completed=2, input_lens=[5, 7], output_lens=[3, 4, 5]), "r.json", tmp_path)
    # null is vllm bench serve's "no limit"; 0 clients would send nothing
    with pytest.raises(ConfigError, match=r"^r\.json: max_concurrency: expected a positive number of clients"):
        replay_workload(_result(max_concurrency=0), "r.json", tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(_result()))
    assert main(["validate", "--vllm-bench", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--server" in err


def test_a_rate_or_burstiness_vllm_cannot_send_is_refused_not_reinterpreted(tmp_path):
    # burstiness 0 ran as Poisson (0 read as "absent"), request_rate 0 as all at once, burstiness 1e-300
    # failed on the internal workload.cv
    with pytest.raises(ConfigError, match=r"^r\.json: request_rate: expected a positive rate in req/s, or \"inf\" "
                                          r"for all at once \(got 0\)$"):
        replay_workload(_result(request_rate=0), "r.json", tmp_path)
    for burst in (0, 1e-300):
        with pytest.raises(ConfigError, match=r"^r\.json: burstiness: expected a positive gamma shape \(1 = Poisson, "
                                              r"smaller = burstier; at least 1e-06\), got "):
            replay_workload(_result(request_rate=4.0, burstiness=burst), "r.json", tmp_path)
    open_loop = dict(max_concurrency=None, request_rate=4.0)
    workload, _ = replay_workload(_result(**open_loop, burstiness=0.25), "r.json", tmp_path)
    assert workload["type"] == "gamma" and workload["cv"] == 2.0
    workload, _ = replay_workload(_result(**open_loop, burstiness=None), "r.json", tmp_path)  # vLLM's default
    assert workload["type"] == "poisson"


def test_a_result_too_large_to_replay_is_refused_before_anything_is_drawn(tmp_path):
    # completed 3e9 was killed for lack of memory, 1e8 at 4 req/s (290 days) ran on for minutes
    with pytest.raises(ConfigError, match=r"^r\.json: completed: 3000000000 requests; servesim simulates at most "
                                          r"2147483647$"):
        replay_workload(_result(completed=3e9), "r.json", tmp_path)
    with pytest.raises(ConfigError, match=r"^r\.json: completed / request_rate: 100000000 requests at 4 req/s arrive "
                                          r"over 2.5e\+07 s; servesim simulates at most 2.31e\+06 s"):
        replay_workload(_result(completed=1e8, max_concurrency=None, request_rate=4.0), "r.json", tmp_path)
    assert list(tmp_path.iterdir()) == []  # no lengths file written for a refused result


def test_a_mistake_in_the_server_file_names_that_file(tmp_path, capsys):
    # was "<cwd>/--vllm-bench: vllm_bench[0].config: engine.max_num_seq: ...", a path that does not exist
    import yaml

    (tmp_path / "r.json").write_text(json.dumps(_result()))
    server = tmp_path / "server.yaml"
    server.write_text(yaml.safe_dump({"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": {"max_num_seq": 8}}))
    argv = ["validate", "--vllm-bench", str(tmp_path / "r.json"), "--server", str(server), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err  # before any "running r" progress line
    assert err == f"servesim: error: {server}: engine.max_num_seq: unknown key (did you mean max_num_seqs?)\n"


def test_a_measured_tpot_that_the_replay_cannot_define_is_refused_before_the_run(tmp_path, capsys):
    # 14 output tokens over 10 requests replay as 10 one-token outputs (mean 1.4, rounded), which define no
    # TPOT: after "running r" the command said "<cwd>/--vllm-bench: vllm_bench[0]: summary metric
    # 'tpot_s.mean' holds no number (got None)", naming a file that does not exist
    args = _write(tmp_path, _result(completed=10, total_input_tokens=100, total_output_tokens=14))
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"servesim: error: {tmp_path / 'r.json'}: mean_tpot_ms: measured, but every replayed "
                            "request has one output token (10 requests of the mean lengths 10 / 1 tokens (no "
                            "input_lens in the result)), so the simulation defines no TPOT to compare; save the "
                            "result with --save-detailed (input_lens, output_lens)\n")
    assert not (tmp_path / "out").exists()
    # the same lengths listed one per request replay as they are
    assert main(_write(tmp_path, _result(completed=2, total_input_tokens=20, total_output_tokens=3,
                                         max_concurrency=None, input_lens=[10, 10], output_lens=[1, 2]))) == 0


def test_two_results_of_one_name_are_told_apart_and_one_file_twice_is_refused(tmp_path, capsys):
    # both were named "r": six rows r-ttft_s, ..., r-ttft_s, ... with no way to tell which file each compared
    args = _write(tmp_path, _result())
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "r.json").write_text(json.dumps(_result(mean_tpot_ms=STEP_S * 1e3 * 1.3)))
    first = str(tmp_path / "r.json")
    second = str(tmp_path / "b" / "r.json")
    assert main(args + ["--vllm-bench", second]) == 0
    out = capsys.readouterr().out
    names = [row.split(",")[0] for row in (tmp_path / "out" / "validation.csv").read_text().splitlines()[1:]]
    stem = first.removesuffix(".json")
    assert names == [f"{stem}-ttft_s", f"{stem}-tpot_s", f"{stem}-output_throughput",
                     f"{second.removesuffix('.json')}-ttft_s", f"{second.removesuffix('.json')}-tpot_s",
                     f"{second.removesuffix('.json')}-output_throughput"]
    # the one case outside: its file, how it was replayed, and no "no note"
    assert (f"Outside tolerance:\n  {second.removesuffix('.json')}-tpot_s: [4 requests of the mean lengths 10 / 11 "
            "tokens (no input_lens in the result), resampled by 1 closed-loop client]\n") in out
    # the same file twice (another spelling of its path): refused, nothing run or written
    (tmp_path / "out2").mkdir()
    twice = ["validate", "--vllm-bench", first, "--vllm-bench", str(tmp_path / "b" / ".." / "r.json"),
             "--server", str(tmp_path / "server.yaml"), "--out", str(tmp_path / "out2")]
    assert main(twice) == 2
    assert capsys.readouterr().err == (f"servesim: error: validate: --vllm-bench: {tmp_path / 'b' / '..' / 'r.json'} "
                                       f"given twice (as {first}; expected each result file once)\n")
    assert list((tmp_path / "out2").iterdir()) == []


def test_tolerance_without_vllm_bench_is_refused(tmp_path, capsys):
    """--tolerance without --vllm-bench was accepted and ignored (the published cases carry their own)."""
    assert main(["validate", "--fast", "--tolerance", "0.2", "--out", str(tmp_path / "v")]) == 2
    assert capsys.readouterr().err == ("servesim: error: validate: --tolerance applies to --vllm-bench cases only "
                                       "(the published cases carry their own): give it with --vllm-bench, or "
                                       "leave it out\n")
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (0, "0")])
def test_a_measured_metric_left_out_says_so_in_the_detail(tmp_path, capsys, value, shown):
    # a NaN (vLLM's mean over no values) or 0 mean TTFT removed that row with no word
    import pandas as pd

    assert main(_write(tmp_path, _result(mean_ttft_ms=value))) == 0
    capsys.readouterr()
    table = pd.read_csv(tmp_path / "out" / "validation.csv")
    assert table["case"].tolist() == ["r-tpot_s", "r-output_throughput"]
    assert all(detail.endswith(f"; not compared: mean_ttft_ms ({shown})") for detail in table["detail"]), table
