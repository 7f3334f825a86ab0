"""Speculative decoding in the engine: acceptance statistics, schedules, costs, the lesson's Example 12."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim import simulate
from servesim.errors import ConfigError
from servesim.speculation.schedule import KSchedule

ROOT = Path(__file__).resolve().parents[1]


def closed_loop(spec: dict, *, concurrency=8, num_requests=64, prompt=100, output=2000, engine=None, **extra) -> dict:
    cfg = {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "engine": engine or {},
        "workload": {
            "type": "closed_loop",
            "concurrency": concurrency,
            "num_requests": num_requests,
            "prompt_tokens": {"type": "fixed", "value": prompt},
            "output_tokens": {"type": "fixed", "value": output},
        },
        "speculative_config": spec,
    }
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize("alpha, k", [(0.5, 2), (0.7, 4), (0.8, 4), (0.9, 6)])
def test_mean_acceptance_length_matches_closed_form(alpha, k):
    spec = {"method": "draft_model", "num_speculative_tokens": k, "draft_cost": 0.05, "acceptance": {"alpha": alpha}}
    num_requests = int(100_000 * (1 + alpha * k) / 2000) + 8
    result = simulate(closed_loop(spec, num_requests=num_requests))
    sd = result.summary["spec_decode"]
    assert sd["num_drafts"] >= 100_000
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)  # Leviathan et al.: 1 + alpha + ... + alpha^k
    assert sd["mean_acceptance_length"] == pytest.approx(expected, rel=0.01)
    # The counters agree with each other and with the tokens the requests received: an accepted span of a
    # adds 1 to positions 1..a; every round emits 1 + a tokens except that a request's last round may
    # accept up to k tokens past its output length (vLLM counts them before the length stop).
    assert sd["num_accepted_tokens"] == sum(sd["num_accepted_tokens_per_pos"])
    assert sd["num_draft_tokens"] == k * sd["num_drafts"]
    decoded = int((result.output.requests.generated_tokens - 1).sum())  # the first token comes from prefill
    assert 0 <= sd["num_drafts"] + sd["num_accepted_tokens"] - decoded <= k * num_requests


def test_per_position_rates_reproduce_the_profile():
    profile = [0.622, 0.381, 0.252]  # EAGLE, Llama-3.1-8B, ShareGPT, K=3 (SpecDecode-Bench)
    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"}
    sd = simulate(closed_loop(spec, num_requests=120)).summary["spec_decode"]
    n = sd["num_drafts"]
    assert n > 100_000
    for got, p in zip(sd["per_position_acceptance_rate"], profile):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)  # binomial 4-sigma: ~0.006 at these counts
    assert sd["mean_acceptance_length"] == pytest.approx(1 + sum(profile), rel=0.01)


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "eagle", "num_speculative_tokens": 3},
        {"method": "ngram", "num_speculative_tokens": 5},
        {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4, "acceptance": {"alpha": 0.8}},
        {"method": "eagle", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 8, 1], [9, 4096, 0]]},
    ],
)
def test_speculation_changes_only_time(spec):
    cfg = {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "engine": {"num_gpu_blocks_override": 600},  # small enough to preempt
        "workload": {"type": "poisson", "rate": 30.0, "num_requests": 300,
                     "prompt_tokens": {"type": "uniform", "low": 10, "high": 3000},
                     "output_tokens": {"type": "uniform", "low": 1, "high": 500}},
    }
    plain = simulate(cfg)
    fast = simulate(dict(cfg, speculative_config=spec))
    for r in (plain, fast):
        assert np.all(r.output.requests.generated_tokens == r.output.requests.output_tokens)
    np.testing.assert_array_equal(plain.output.requests.output_tokens, fast.output.requests.output_tokens)
    np.testing.assert_array_equal(plain.output.requests.arrival_s, fast.output.requests.arrival_s)
    assert int(fast.output.requests.preemptions.sum()) > 0
    step = simulate(dict(cfg, speculative_config=spec, simulation={"mode": "step"}))
    for name in ("first_token_s", "finish_s", "preemptions"):
        np.testing.assert_array_equal(getattr(fast.output.requests, name), getattr(step.output.requests, name))
    assert fast.output.spec_counters == step.output.spec_counters


def test_vllm_schedule_example():
    s = KSchedule(3, [[1, 16, 3], [17, 128, 2], [129, 4096, 0]])
    assert [s.k_for(b) for b in (1, 16, 17, 128, 129, 4096, 5000)] == [3, 3, 2, 2, 0, 0, 0]
    gaps = KSchedule(4, [[1, 4, 6], [10, 20, 1]])  # gaps inherit the previous k; k capped at K
    assert [gaps.k_for(b) for b in (1, 4, 5, 9, 10, 20, 21)] == [4, 4, 4, 4, 1, 1, 1]
    # ... and [[1, 16, 3], [16, 20, 2]]: ranges are inclusive, so a range starting at the previous end overlaps
    for bad in ([[2, 16, 3]], [[1, 16, 3], [10, 20, 2]], [[1, 16, 3], [16, 20, 2]], [[1, 16, -1]], [[1, 16]], []):
        with pytest.raises(ValueError):
            KSchedule(3, bad)


def test_schedule_applies_the_k_of_the_previous_steps_batch():
    table = [[1, 4, 3], [5, 4096, 1]]
    spec = {"method": "eagle", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": table}
    schedule = KSchedule(3, table)
    res = simulate(closed_loop(spec, concurrency=8, num_requests=24, output=50, simulation={"mode": "step"}))
    steps = res.output.steps
    assert (steps.num_steps == 1).all()
    # the k verified in step i is the one chosen from the batch size of step i-1
    expected = [schedule.k_for(int(b)) for b in steps.batch_size[:-1]]
    assert steps.k[1:].tolist() == expected
    assert {1, 3} <= set(steps.k.tolist())  # 8 running, then the last few requests alone
    run = simulate(closed_loop(spec, concurrency=8, num_requests=24, output=50))
    np.testing.assert_array_equal(run.output.requests.finish_s, res.output.requests.finish_s)


def test_disable_by_batch_size_turns_speculation_off():
    spec = {"method": "eagle", "num_speculative_tokens": 3, "disable_by_batch_size": 4}
    busy = simulate(closed_loop(spec, concurrency=8, num_requests=8, output=40))
    assert busy.summary["spec_decode"]["num_drafts"] == 0
    idle = simulate(closed_loop(spec, concurrency=2, num_requests=2, output=40))
    assert idle.summary["spec_decode"]["num_drafts"] > 0


def test_drafts_truncated_when_the_token_budget_is_short():
    spec = {"method": "draft_model", "num_speculative_tokens": 4, "draft_cost": 0.05, "acceptance": {"alpha": 0.9}}
    for mode in ("run", "step"):
        res = simulate(closed_loop(spec, concurrency=1, num_requests=1, prompt=2, output=200,
                                   engine={"max_num_batched_tokens": 3, "max_num_seqs": 1}, simulation={"mode": mode}))
        sd = res.summary["spec_decode"]
        # 1 + 4 tokens cut to the budget of 3 less the draft model's drafting slot (vLLM's
        # max_num_new_slots_for_drafting = 1): 1 + 1
        assert sd["num_draft_tokens"] == sd["num_drafts"]
        assert int(res.output.steps.num_tokens.max()) <= 2
        assert res.summary["completed"] == 1


def first_preempting_concurrency(method: str) -> int:
    for conc in range(10, 60):
        cfg = closed_loop({"method": method, "num_speculative_tokens": 15, "acceptance": {"alpha": 0.6}},
                          concurrency=conc, num_requests=4 * conc, prompt=200, output=120,
                          engine={"num_gpu_blocks_override": 6400, "block_size": 1})
        if simulate(cfg).output.requests.preemptions.sum() > 0:
            return conc
    raise AssertionError("no preemption in range")


def test_lookahead_reservation_preempts_at_lower_load():
    # EAGLE reserves K = 15 lookahead slots per running request (vLLM's num_lookahead_tokens); n-gram none.
    # Same acceptance, same KV cache: EAGLE runs out of blocks with fewer concurrent requests.
    assert first_preempting_concurrency("eagle") < first_preempting_concurrency("ngram")


def test_example12_from_the_simulators_own_runs(tmp_path):
    from servesim.sweep import run_sweep

    run_sweep(ROOT / "experiments" / "seed" / "example12.yaml", tmp_path / "ex12")
    import csv

    with open(tmp_path / "ex12" / "speedup.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["batch_size", "plain_output_throughput", "spec_output_throughput", "speedup"]
    lesson = {1: 2.31, 8: 2.31, 32: 2.31, 64: 2.16, 128: 1.17, 256: 0.61}
    for row in rows:
        assert float(row["speedup"]) == pytest.approx(lesson[int(row["batch_size"])], rel=0.02)
    run_sweep(ROOT / "experiments" / "seed" / "example12-alpha.yaml", tmp_path / "alpha")
    with open(tmp_path / "alpha" / "speedup.csv") as f:
        got = {r["variant"]: float(r["speedup"]) for r in csv.DictReader(f)}
    assert got["alpha-0.3"] == pytest.approx(1.19, rel=0.02)
    assert got["alpha-0.1"] == pytest.approx(0.93, rel=0.02)


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
         "prompt_lookup_max"),
        ({"method": "eagle"}, "num_speculative_tokens must be provided"),
        ({"method": "draft_model", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "lookahead", "num_speculative_tokens": 3}, "method"),
        ({"method": "medusa", "num_speculative_tokens": 3}, "acceptance"),
        ({"method": "eagle", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]},
         "start at 1"),
    ],
)
def test_invalid_speculative_configs_fail_with_one_line(spec, words):
    with pytest.raises(ConfigError) as info:
        simulate(closed_loop(spec, num_requests=1, output=10))
    msg = str(info.value)
    assert "speculative_config" in msg and words in msg and "\n" not in msg


def test_cli_takes_vllms_json(tmp_path, capsys):
    import json

    import yaml

    from servesim.cli import main

    cfg = closed_loop(None, concurrency=1, num_requests=4, output=100)
    del cfg["speculative_config"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    spec = '{"method": "eagle3", "num_speculative_tokens": 2}'
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-plot", "--speculative-config", spec]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["spec_decode"]["num_drafts"] > 0
    assert summary["setup"]["speculative_method"] == "eagle3"
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--speculative-config", "{method: x"]) == 2
    assert "--speculative-config: invalid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["run", "step"])
def test_llamacpp_draft_budget_limit_reproduces_example10(mode):
    # llama.cpp, tiny model as its own draft, greedy: 40 tokens, 8 rounds, 7 x 4 + 3 = 31 drafted and all
    # accepted (a draft never exceeds the remaining budget minus one), mean len 1 + 31/8 = 4.875
    spec = {"method": "draft_model", "num_speculative_tokens": 4, "draft_cost": 0.05, "acceptance": {"alpha": 1.0},
            "draft_budget_limit": True, "verification_rule": "match"}
    res = simulate(closed_loop(spec, concurrency=1, num_requests=1, prompt=8, output=40, simulation={"mode": mode}))
    sd = res.summary["spec_decode"]
    assert (sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"]) == (8, 31, 31)
    assert sd["mean_acceptance_length"] == pytest.approx(4.875)
    assert res.summary["completed"] == 1
