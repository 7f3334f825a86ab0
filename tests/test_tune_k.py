"""servesim tune-k: the vLLM table builder (exact), and a small real tuning on the lesson's Example 12 setup."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from servesim.analysis.tune_k import (
    build_schedule,
    choose_best_fixed_k,
    choose_best_k,
    closed_loop_config,
    default_batch_sizes,
    fixed_k_spec,
    tune_k,
    tuned_spec,
    vllm_speculative_config,
)
from servesim.input_files import validate
from servesim.config.models import SimConfig
from servesim.speculation.config import SpeculativeConfig
from servesim.speculation.schedule import KSchedule, validate_schedule

# ---------------------------------------------------------------------------------------------- table


def test_default_grid():
    assert default_batch_sizes(None) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert default_batch_sizes(100) == [1, 2, 4, 8, 16, 32, 64]
    assert default_batch_sizes(1) == [1]


BEST = {1: 4, 2: 4, 4: 3, 8: 3, 16: 0}


def test_midpoint_ranges_and_merging():
    # starts: 1, (1+2)//2+1 = 2, (2+4)//2+1 = 4, (4+8)//2+1 = 7, (8+16)//2+1 = 13; equal neighbours merge
    assert build_schedule(BEST, 64) == [[1, 3, 4], [4, 12, 3], [13, 64, 0]]


def test_next_point_ranges():
    assert build_schedule(BEST, 64, boundary="next") == [[1, 3, 4], [4, 15, 3], [16, 64, 0]]


def test_cap_then_merge():
    # k capped at num_speculative_tokens = 3: 4 -> 3, and the first two ranges merge with the next
    assert build_schedule(BEST, 64, num_speculative_tokens=3) == [[1, 12, 3], [13, 64, 0]]
    assert build_schedule({1: 5, 8: 5}, 8, num_speculative_tokens=2) == [[1, 8, 2]]


def test_grid_with_gaps_covers_every_batch_size():
    best = {4: 2, 32: 1, 100: 0}
    table = build_schedule(best, 200)
    assert table == [[1, 18, 2], [19, 66, 1], [67, 200, 0]]
    sched = KSchedule(2, table)
    for b in range(1, 301):  # beyond 200: vLLM's tail rule keeps the last k
        nearest = min(best, key=lambda g: (abs(g - b), g))  # nearest grid point, the lower one on a tie
        assert sched.k_for(b) == best[nearest], b
    table_next = build_schedule(best, 200, boundary="next")
    assert table_next == [[1, 31, 2], [32, 99, 1], [100, 200, 0]]
    sched = KSchedule(2, table_next)
    for b in range(1, 201):
        below = [g for g in best if g <= b]
        assert sched.k_for(b) == best[max(below) if below else min(best)], b


def test_tables_are_valid_vllm_schedules():
    for boundary in ("midpoint", "next"):
        table = build_schedule({1: 3, 2: 2, 3: 2, 5: 1, 1000: 0}, 4096, 3, boundary)
        validate_schedule(table, 3)
        assert table[0][0] == 1 and table[-1][1] == 4096
        assert all(a[1] + 1 == b[0] for a, b in zip(table, table[1:]))  # contiguous
        assert all(a[2] != b[2] for a, b in zip(table, table[1:]))  # merged


def test_single_point():
    assert build_schedule({8: 2}, 8) == [[1, 8, 2]]


@pytest.mark.parametrize("best, end, boundary", [({}, 8, "midpoint"), ({4: 1, 16: 0}, 8, "midpoint"),
                                                 ({4: -1}, 8, "midpoint"), ({0: 1}, 8, "midpoint"),
                                                 ({4: 1}, 8, "nearest")])
def test_builder_rejects(best, end, boundary):
    with pytest.raises(ValueError):
        build_schedule(best, end, boundary=boundary)


def test_vllm_json():
    spec = {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 5,
            "acceptance": "eagle-llama3.1-8b-sharegpt-k5", "draft_cost": 0.1}
    table = [[1, 6, 3], [7, 64, 2], [65, 256, 0]]
    out = vllm_speculative_config(spec, table)
    assert out == {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3,
                   "num_speculative_tokens_per_batch_size": table}
    validate(SpeculativeConfig, out, "printed JSON")
    assert vllm_speculative_config(spec, [[1, 256, 0]]) is None
    # a servesim model card mapping is not a vLLM value: left out
    card = {"method": "draft_model", "model": {"name": "x", "num_params": 1e9}, "num_speculative_tokens": 2}
    assert "model" not in vllm_speculative_config(card, [[1, 8, 2]])


def test_point_specs():
    spec = {"method": "eagle", "num_speculative_tokens": 5, "disable_by_batch_size": 8,
            "num_speculative_tokens_per_batch_size": [[1, 8, 5]], "draft_cost": 0.05}
    assert fixed_k_spec(spec, 0) is None
    assert fixed_k_spec(spec, 3) == {"method": "eagle", "num_speculative_tokens": 3, "draft_cost": 0.05}
    t = tuned_spec(spec, [[1, 4, 2], [5, 9, 0]])
    assert t["num_speculative_tokens"] == 2 and t["num_speculative_tokens_per_batch_size"] == [[1, 4, 2], [5, 9, 0]]
    assert "disable_by_batch_size" not in t
    assert tuned_spec(spec, [[1, 9, 0]]) is None


def test_closed_loop_from_open_loop_and_trace():
    base = {"hardware": "lesson-h100-sxm", "model": "lesson-8b-fp16", "slo": {"tpot_s": 0.05},
            "workload": {"type": "poisson", "rate": 2.0, "num_requests": 10,
                         "prompt_tokens": {"type": "fixed", "value": 7}, "output_tokens": {"type": "fixed", "value": 9}}}
    data = closed_loop_config(validate(SimConfig, base, "t"), 16, 3, {"method": "ngram", "num_speculative_tokens": 2})
    cfg = validate(SimConfig, data, "point")
    assert cfg.workload.type == "closed_loop" and cfg.workload.concurrency == 16 and cfg.workload.num_requests == 48
    assert cfg.workload.prompt_tokens.value == 7 and cfg.workload.output_tokens.value == 9
    assert cfg.slo is None and cfg.speculative_config["num_speculative_tokens"] == 2
    base["workload"] = {"type": "trace", "path": "x.csv"}
    cfg = validate(SimConfig, closed_loop_config(validate(SimConfig, base, "t"), 4, 2, None), "point")
    assert cfg.workload.lengths.type == "empirical" and cfg.workload.lengths.path == "x.csv"
    assert cfg.speculative_config is None


# ---------------------------------------------------------------------------------------------- real tuning

STEP_S = 16e9 / 3.35e12  # the lesson's memory-bound step of the 8B FP16 model on the H100 (s)
OUTPUT = 256


def lesson_config(k: int = 4) -> dict:
    """Example 12: ideal roofline, lesson cards, draft cost c = 0.05, alpha = 0.7."""
    return {
        "hardware": "lesson-h100-sxm",
        "model": "lesson-8b-fp16",
        "roofline": {"mode": "ideal"},
        "workload": {"type": "closed_loop", "concurrency": 1, "requests_per_client": 1,
                     "prompt_tokens": {"type": "fixed", "value": 16},
                     "output_tokens": {"type": "fixed", "value": OUTPUT}},
        "speculative_config": {"method": "eagle", "num_speculative_tokens": k, "draft_cost": 0.05,
                               "acceptance": {"alpha": 0.7}},
        "seed": 0,
    }


@pytest.fixture(scope="module")
def lesson_tuning():
    cfg = validate(SimConfig, lesson_config(), "lesson")
    return tune_k(cfg, ".", batch_sizes=[1, 256], requests_per_client=4)


def test_lesson_best_k(lesson_tuning):
    r = lesson_tuning
    # Example 12: at batch 1 every k pays (round = 1 + 0.05 k steps, memory-bound; speedup grows up to k = 6),
    # at 256 clients 256 x (k + 1) >> 295 tokens per step: any k > 0 is compute-bound and loses to k = 0
    assert r.best_k == {1: 4, 256: 0}
    assert r.table == [[1, 128, 4], [129, 4096, 0]]
    # best fixed k: largest mean share of the best throughput over the two batch sizes. Closed forms (lesson):
    # batch 1: AL(k) / (1 + 0.05 k); batch 256: AL(k) x 4.78 ms / (256 (k + 1) x 16e9 / 989e12 s + 0.05 k x 4.78 ms)
    al = [(1 - 0.7 ** (k + 1)) / 0.3 for k in range(5)]
    b1 = [al[k] / (1 + 0.05 * k) for k in range(5)]
    b256 = [1.0] + [al[k] * STEP_S / (256 * (k + 1) * 16e9 / 989e12 + 0.05 * k * STEP_S) for k in range(1, 5)]
    shares = [(b1[k] / max(b1) + b256[k] / max(b256)) / 2 for k in range(5)]
    assert max(range(5), key=shares.__getitem__) == 2  # 0.836 vs 0.826 (k = 1 and 3) and 0.806 (k = 4)
    assert r.best_fixed_k == 2


def test_lesson_throughput_closed_forms(lesson_tuning):
    grid = lesson_tuning.grid.set_index(["batch_size", "variant"])["output_throughput"]
    # plain, 256 clients in lockstep: one prefill step of 256 x 16 tokens (compute-bound, 4096 x 16e9 / 989e12 s)
    # that emits the first token, then OUTPUT - 1 memory-bound steps
    round_s = 4096 * 16e9 / 989e12 + (OUTPUT - 1) * STEP_S
    assert grid[(256, "k=0")] == pytest.approx(256 * OUTPUT / round_s, rel=1e-3)
    # batch 1, k = 4: AL = (1 - 0.7^5) / 0.3 tokens per round of (1 + 4 x 0.05) steps after the prefill step;
    # 4 requests x 255 tokens ~ 370 rounds: the simulated rate is within 5% of the closed form
    al = (1 - 0.7**5) / 0.3
    expected = OUTPUT / (STEP_S + (OUTPUT - 1) / al * STEP_S * 1.2)
    assert grid[(1, "k=4")] == pytest.approx(expected, rel=0.05)


def test_lesson_check(lesson_tuning):
    check = lesson_tuning.check.set_index("batch_size")
    assert list(check["tuned_k"]) == [4, 0]
    # tuned matches or beats the best fixed k (common random numbers: equal k gives the same run)
    assert (check["tuned_output_throughput"] >= 0.98 * check["fixed_output_throughput"]).all()
    # at 256 the tuned schedule sets k = 0 and beats the fixed k = 2 (closed form: 1 / 0.811 = 1.23)
    assert check.loc[256, "tuned_vs_fixed"] > 1.15
    assert check.loc[1, "tuned_vs_none"] > 2.0


def test_cli_prints_valid_json(tmp_path, capsys):
    from servesim.cli import main

    path = tmp_path / "lesson.yaml"
    path.write_text(yaml.safe_dump(lesson_config(k=3)))
    out = tmp_path / "out"
    status = main(["tune-k", str(path), "--batch-sizes", "1,256", "--requests-per-client", "2", "--quiet",
                   "--out", str(out)])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    printed = json.loads(lines[lines.index("vLLM --speculative-config:") + 1])
    spec = validate(SpeculativeConfig, printed, "printed JSON")
    assert spec.num_speculative_tokens == 3
    assert spec.num_speculative_tokens_per_batch_size == [[1, 128, 3], [129, 4096, 0]]
    saved = json.loads((out / "tune_k.json").read_text())
    assert saved["speculative_config"] == printed
    for name in ("tune_k_grid.csv", "tune_k_check.csv", "tune_k.png"):
        assert (out / name).stat().st_size > 0
    # the figure's data, beside it: three lines per batch size, each the check table's throughput
    check = pd.read_csv(out / "tune_k_check.csv").set_index("batch_size")
    drawn = pd.read_csv(out / "tune_k.csv")
    assert sorted(drawn["batch_size"].unique()) == [1, 256] and len(drawn) == 6
    fixed_k = int(check["best_fixed_k"].iloc[0])
    names = {"no speculation": "none", f"best fixed k = {fixed_k}": "fixed", "tuned per batch size": "tuned"}
    assert set(drawn["line"]) == set(names)
    for _, row in drawn.iterrows():
        expected = check.loc[row["batch_size"], f"{names[row['line']]}_output_throughput"]
        assert row["output_throughput"] == pytest.approx(expected, rel=1e-12)
        assert row["ratio_to_none"] == pytest.approx(
            expected / check.loc[row["batch_size"], "none_output_throughput"], rel=1e-12)


def test_slo_objective(tmp_path):
    # an unreachable target (1 ms: plain decoding needs 4.78 ms per token) makes every goodput 0; a loose one
    # (0.1 s) is met everywhere, so the goodput choice equals the throughput choice
    cfg = validate(SimConfig, lesson_config(k=1), "lesson")
    from servesim.analysis.capacity import parse_slo

    r = tune_k(cfg, ".", batch_sizes=[1, 256], requests_per_client=1, slos=[parse_slo("tpot_p50=0.001")])
    grid = r.grid.set_index(["batch_size", "variant"])
    assert not grid["slo_met"].any() and (grid["goodput"] == 0).all()
    # nothing meets 1 ms: the best k is the one closest to it (k = 1 at batch 1: fewer seconds per token)
    assert r.best_k[1] == 1
    r = tune_k(cfg, ".", batch_sizes=[1, 256], requests_per_client=1, slos=[parse_slo("tpot_p50=0.1")])
    assert r.grid["slo_met"].all()
    assert r.best_k == {1: 1, 256: 0}


def test_cli_errors(tmp_path, capsys):
    from servesim.cli import main

    data = lesson_config()
    del data["speculative_config"]
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["tune-k", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"servesim: error: {path}: speculative_config:") and "\n" not in err
    path.write_text(yaml.safe_dump(lesson_config()))
    assert main(["tune-k", str(path), "--batch-sizes", "1,x", "--out", str(tmp_path / "o")]) == 2
    assert "--batch-sizes" in capsys.readouterr().err
    data = lesson_config()
    data["engine"] = {"max_num_seqs": 8}
    path.write_text(yaml.safe_dump(data))
    assert main(["tune-k", str(path), "--batch-sizes", "4,16", "--out", str(tmp_path / "o")]) == 2
    assert "max_num_seqs" in capsys.readouterr().err


def test_batch_sizes_above_the_default_max_num_seqs_are_refused(tmp_path, capsys):
    # without engine.max_num_seqs, --batch-sizes 2048 ran 2048 clients on a server that runs at most 1024
    # requests (vLLM's default on the card) and reported the best k "at batch 2048"
    from servesim.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(lesson_config()))
    assert main(["tune-k", str(path), "--batch-sizes", "1,2048", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: --batch-sizes: 2048 exceeds max_num_seqs = 1024, vLLM's default on this GPU "
        "(engine.max_num_seqs is not set): the server never runs more requests at once; set "
        "engine.max_num_seqs to tune beyond it\n")
    assert not (tmp_path / "o").exists()


def _slo_grid(ratios: dict[int, list[float]]) -> pd.DataFrame:
    """A tune-k grid where no point meets its SLO: batch size -> the SLO ratio of k = 0, 1, 2."""
    rows = [{"batch_size": b, "variant": f"k={k}", "objective": 0.0, "slo_met": False, "slo_ratio": r}
            for b, rs in ratios.items() for k, r in enumerate(rs)]
    return pd.DataFrame(rows)


def test_best_fixed_k_under_an_slo_met_nowhere_is_the_k_closest_to_meeting_it():
    """The tuned schedule took the k closest to meeting an unmeetable SLO, the best fixed k was always 0."""
    grid = _slo_grid({1: [3.0, 2.0, 2.5], 8: [4.0, 3.5, 3.0]})  # mean ratios 3.5, 2.75, 2.75
    assert choose_best_k(grid, with_slo=True) == {1: 1, 8: 2}
    assert choose_best_fixed_k(grid) == 1  # tie 2.75 with k = 2: the smaller k
    assert choose_best_fixed_k(_slo_grid({1: [3.0, 2.0, 1.5], 8: [4.0, 3.5, 3.0]})) == 2


# ---------------------------------------------------------------------------------------------- scoring rules
def test_a_point_meets_its_slos_only_when_every_request_completed_and_each_ratio_is_at_most_1():
    from servesim.analysis.capacity import parse_slo
    from servesim.analysis.tune_k import point_frame

    slo = parse_slo("tpot_p50=0.5")
    base = {"replication": 0, "output_throughput": 100.0, "mean_acceptance_length": 2.0}
    rows = [{**base, "batch_size": 1, "variant": "k=0", "completed_share": 1.0, "tpot_p50": 0.5},  # ratio 1: met
            {**base, "batch_size": 1, "variant": "k=1", "completed_share": 0.9, "tpot_p50": 0.25},  # 10% unfinished
            {**base, "batch_size": 1, "variant": "k=2", "completed_share": 1.0, "tpot_p50": 0.75}]  # ratio 1.5
    frame = point_frame(rows, [slo]).set_index("variant")
    assert frame["slo_ratio"].tolist() == [1.0, 0.5, 1.5]
    assert frame["slo_met"].tolist() == [True, False, False]
    assert frame["goodput"].tolist() == [100.0, 0.0, 0.0]


def test_best_k_and_best_fixed_k_ties_keep_the_smaller_k():
    # objectives (tokens/s) at batch 1 for k = 2, 0, 1 (listed out of order): 7, 5, 7 -> k = 1 and k = 2 tie
    grid = pd.DataFrame([{"batch_size": 1, "variant": f"k={k}", "objective": obj}
                         for k, obj in ((2, 7.0), (0, 5.0), (1, 7.0))])
    assert choose_best_k(grid, with_slo=False) == {1: 1}
    # shares of the best: k = 0 5/7, k = 1 and k = 2 1.0 each: the smaller k
    assert choose_best_fixed_k(grid) == 1


@pytest.mark.parametrize("key", ["workload.rate", "workload.num_requests", "workload.concurrency",
                                 "workload.max_requests", "workload.think_time_s"])
def test_cli_refuses_a_set_workload_key_its_closed_loops_ignore(tmp_path, capsys, key):
    # the closed loops keep only the workload's lengths: --set workload.rate had run silently, unapplied
    from servesim.cli import main

    path = tmp_path / "lesson.yaml"
    path.write_text(yaml.safe_dump(lesson_config()))
    assert main(["tune-k", str(path), "--set", f"{key}=3", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"servesim: error: --set {key}: tune-k replaces the workload with closed loops")
    assert "keeps only its prompt_tokens, output_tokens, lengths, path, format" in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_cli_keeps_a_set_workload_length_key():
    from servesim.cli.tune_k import refuse_ignored_workload_keys
    from servesim.errors import ConfigError

    used = ["workload.output_tokens.value=5", "workload.prompt_tokens={type: fixed, value: 10}",
            "workload.lengths.path=x.csv", "workload.path=t.csv", "workload={type: trace, path: t.csv}",
            "engine.max_num_seqs=8", "seed=1"]
    # the used keys pass; the one ignored key among them is the one the error names
    with pytest.raises(ConfigError, match=r"^--set workload\.rate: "):
        refuse_ignored_workload_keys(used + ["workload.rate=3"] + used)
    assert refuse_ignored_workload_keys(used) is None


def test_a_whole_workload_set_runs_with_a_note_of_the_keys_tune_k_ignores(capsys):
    # --set workload={type: closed_loop, concurrency: 64, ...} must hold concurrency to be a valid workload:
    # refusing it left no way to set one; it runs, and the note says what tune-k ignores
    from servesim.cli.tune_k import refuse_ignored_workload_keys

    mapping = ("workload={type: closed_loop, concurrency: 64, requests_per_client: 2, "
               "prompt_tokens: {type: fixed, value: 100}, output_tokens: {type: fixed, value: 50}}")
    assert refuse_ignored_workload_keys([mapping]) is None
    assert capsys.readouterr().err == ("servesim: note: --set workload: tune-k replaces the workload with closed "
                                       "loops and ignores its concurrency, requests_per_client\n")
