"""Tests of servesim.metrics and servesim.plots.latency against hand-computed closed forms."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine.output import EngineOutput, RequestLog, StepLog
from servesim.errors import ConfigError
from servesim.metrics import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    expand_step_durations,
    format_summary_table,
    itl_samples,
    detect_saturation,
    spec_decode_summary,
    summarize,
    to_dataframes,
    percentiles,
    weighted_percentiles,
    write_outputs,
)
from servesim.metrics.csv_text import csv_bytes
from servesim.metrics.percentiles import distribution_stats
from servesim.metrics.outputs import atomic_write
from servesim.metrics.summary import json_safe
from servesim.roofline import PS_PER_S

NAN = float("nan")
REL = 1e-12


def make_requests(rows: list[tuple]) -> RequestLog:
    """rows: (arrival, prompt, output, generated, first_scheduled, first_token, finish, preemptions)."""
    cols = list(zip(*rows))
    f = lambda i: np.array(cols[i], dtype=np.float64)  # noqa: E731
    i = lambda k: np.array(cols[k], dtype=np.int64)  # noqa: E731
    return RequestLog(
        request_id=np.arange(len(rows), dtype=np.int64), arrival_s=f(0), prompt_tokens=i(1),
        output_tokens=i(2), generated_tokens=i(3), first_scheduled_s=f(4), first_token_s=f(5),
        finish_s=f(6), preemptions=i(7),
    )


def make_steps(rows: list[dict]) -> StepLog:
    """Rows given as dicts of StepLog fields; missing ints default to 0, duration_s is derived."""
    data: dict[str, list] = {name: [] for name in STEP_COLUMNS}
    for row in rows:
        n, first, inc = row["num_steps"], row["first_step_s"], row.get("step_increment_s", 0.0)
        full = {"step_increment_s": inc, "duration_s": n * first + inc * n * (n - 1) / 2, **row}
        # exact integer forms: the start in ps, and blocks in use x duration (constant within the row)
        full.setdefault("start_ps", round(full["start_s"] * PS_PER_S))
        full.setdefault("kv_block_ps", full.get("kv_blocks_used", 0) * round(full["duration_s"] * PS_PER_S))
        for name in STEP_COLUMNS:
            data[name].append(full.get(name, 0))
    floats = {"start_s", "first_step_s", "step_increment_s", "duration_s"}
    return StepLog(**{k: np.array(v, dtype=np.float64 if k in floats else np.int64) for k, v in data.items()})


def small_output() -> EngineOutput:
    """Four requests (one single-token, one unfinished) and three step rows; all numbers dyadic."""
    requests = make_requests([
        (0.0, 10, 3, 3, 0.5, 1.0, 2.0, 0),    # TTFT 1, E2E 2, TPOT (2-1)/2 = 0.5, queue 0.5
        (1.0, 20, 1, 1, 1.25, 1.5, 1.5, 0),   # TTFT 0.5, E2E 0.5, no TPOT, queue 0.25
        (2.0, 30, 5, 5, 2.0, 2.25, 4.25, 1),  # TTFT 0.25, E2E 2.25, TPOT 2/4 = 0.5, queue 0
        (3.0, 40, 4, 2, 3.5, 4.0, NAN, 2),    # unfinished: left out of every distribution
    ])
    steps = make_steps([
        dict(start_s=0.5, num_steps=1, first_step_s=0.5, batch_size=1, num_tokens=10, num_prefill_tokens=10,
             itl_samples=0, kv_blocks_used=2, num_waiting=0),
        dict(start_s=1.0, num_steps=4, first_step_s=0.25, step_increment_s=0.125, batch_size=2, num_tokens=2,
             itl_samples=2, kv_blocks_used=4, num_waiting=1),
        dict(start_s=3.0, num_steps=2, first_step_s=0.5, step_increment_s=0.25, batch_size=3, num_tokens=3,
             itl_samples=1, kv_blocks_used=8, num_waiting=0, num_preempted=1),
    ])
    return EngineOutput(requests=requests, steps=steps, extra_itl_s=np.array([2.0]), kv_blocks_total=10,
                        block_size=16, end_s=4.25)


# ----------------------------------------------------------------------------- weighted percentiles


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 10.0, allow_nan=False, width=32), st.integers(0, 6)), min_size=1,
             max_size=40).filter(lambda rows: sum(w for _, w in rows) > 0),
    st.lists(st.floats(0.0, 100.0), min_size=1, max_size=8),
)
def test_weighted_percentiles_equal_expanded_numpy_percentile(rows, q):
    values = np.array([v for v, _ in rows])
    weights = np.array([w for _, w in rows])
    expected = np.percentile(np.repeat(values, weights), q)
    np.testing.assert_array_equal(weighted_percentiles(values, weights, q), expected)



def test_percentile_halfway_between_two_samples_uses_numpys_upper_form():
    # q = 25 of 3 samples: h = 2 * 0.25 = 0.5, halfway between 0.1 and 0.5. numpy's _lerp takes
    # b - (b - a) * (1 - g) for g >= 0.5: 0.5 - 0.4 * 0.5 = 0.3 exactly, where a + (b - a) * g gives
    # 0.30000000000000004 in floats
    assert percentiles(np.array([0.1, 0.5, 1.5]), [25])[0] == 0.3 == np.percentile([0.1, 0.5, 1.5], 25)
    assert weighted_percentiles(np.array([0.5, 0.1, 1.5]), np.array([1, 1, 1]), [25])[0] == 0.3


def test_weighted_percentiles_large_sample_bitwise():
    rng = np.random.default_rng(np.random.SeedSequence(7))
    values = np.round(rng.gamma(2.0, 0.01, 20_000), 5)  # many ties
    weights = rng.integers(0, 40, 20_000)
    q = [0, 1, 25, 50, 90, 95, 99, 99.9, 100]
    np.testing.assert_array_equal(weighted_percentiles(values, weights, q),
                                  np.percentile(np.repeat(values, weights), q))


def test_values_of_weight_zero_change_no_statistic_bit_for_bit():
    # itl_samples lists every step, those with no ITL sample at weight 0: the mean (a pairwise sum whose
    # rounding depends on the array's length) and the percentiles must be those of the positive weights
    rng = np.random.default_rng(np.random.SeedSequence(11))  # a seed where the two sums differ
    values = rng.lognormal(-4, 1, 50_001)
    weights = rng.integers(0, 6, 50_001)  # a sixth are 0
    positive = weights > 0
    with_zeros = distribution_stats(values, weights)
    assert with_zeros == distribution_stats(values[positive], weights[positive])
    assert with_zeros["mean"] != float(np.sum(values * weights) / weights.sum())  # the length matters here
    np.testing.assert_array_equal(
        [with_zeros[f"p{p}"] for p in (50, 90, 95, 99)],
        np.percentile(np.repeat(values, weights), [50, 90, 95, 99]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       st.lists(st.floats(0.0, 100.0), min_size=1, max_size=8))
def test_percentiles_equal_numpy_percentile(values, q):
    np.testing.assert_array_equal(percentiles(np.array(values), q), np.percentile(np.array(values), q))


def test_percentiles_large_sample_bitwise():
    rng = np.random.default_rng(np.random.SeedSequence(8))
    values = np.concatenate([rng.lognormal(-3, 1, 30_001), np.round(rng.gamma(2.0, 0.01, 9_999), 4)])
    q = [0, 1, 25, 50, 90, 95, 99, 99.9, 100]
    np.testing.assert_array_equal(percentiles(values, q), np.percentile(values, q))
    with pytest.raises(ValueError):
        percentiles(np.array([]), [50])


def test_weighted_percentiles_rejects_bad_input():
    with pytest.raises(ValueError):
        weighted_percentiles(np.array([1.0]), np.array([0]), [50])
    with pytest.raises(ValueError):
        weighted_percentiles(np.array([1.0, 2.0]), np.array([1, -1]), [50])
    with pytest.raises(ValueError):
        weighted_percentiles(np.array([1.0, 2.0]), np.array([1]), [50])


# ----------------------------------------------------------------------------- step expansion and ITL


def test_expand_step_durations_follows_first_plus_i_increment():
    durations, row = expand_step_durations(small_output().steps)
    np.testing.assert_array_equal(durations, [0.5, 0.25, 0.375, 0.5, 0.625, 0.5, 0.75])
    np.testing.assert_array_equal(row, [0, 1, 1, 1, 1, 2, 2])


def test_expanded_durations_sum_to_row_duration():
    rng = np.random.default_rng(np.random.SeedSequence(3))
    # durations on the engine's integer-picosecond grid, as the engine writes them
    rows = [dict(start_s=float(k), num_steps=int(n), first_step_s=float(f), step_increment_s=float(i))
            for k, (n, f, i) in enumerate(zip(rng.integers(1, 500, 50), rng.integers(1, 5 * 10**10, 50) / 1e12,
                                              rng.integers(0, 10**7, 50) / 1e12))]
    steps = make_steps(rows)
    durations, row = expand_step_durations(steps)
    np.testing.assert_allclose(np.bincount(row, weights=durations), steps.duration_s, rtol=1e-12)


def test_expanding_selected_rows_by_mask_or_index_gives_each_steps_own_duration():
    """With exact per-step durations (as the engine gives), the rows a bool mask selects expand to their
    own steps' durations, in order; the same as selecting them by index."""
    rng = np.random.default_rng(np.random.SeedSequence(4))
    counts = rng.integers(1, 6, 40)
    steps = make_steps([dict(start_s=float(k), num_steps=int(n), first_step_s=0.5, step_increment_s=0.0)
                        for k, n in enumerate(counts)])
    steps.durations_s = rng.integers(1, 10**9, int(counts.sum())) / 1e12
    mask = rng.random(40) < 0.5
    by_mask, row_mask = expand_step_durations(steps, mask)
    by_index, row_index = expand_step_durations(steps, np.flatnonzero(mask))
    owner = np.repeat(np.arange(40), counts)
    np.testing.assert_array_equal(by_mask, steps.durations_s[mask[owner]])
    np.testing.assert_array_equal(by_mask, by_index)
    np.testing.assert_array_equal(row_mask, owner[mask[owner]])
    np.testing.assert_array_equal(row_index, row_mask)


def test_itl_multiset_is_steps_repeated_plus_extra():
    values, weights = itl_samples(small_output())
    expanded = np.sort(np.repeat(values, weights))
    np.testing.assert_array_equal(expanded, [0.25, 0.25, 0.375, 0.375, 0.5, 0.5, 0.5, 0.625, 0.625, 0.75, 2.0])


# ----------------------------------------------------------------------------- summary


def test_summary_counts_and_throughputs():
    s = summarize(small_output())
    assert s["num_requests"] == 4
    assert s["completed"] == 3
    assert s["duration_s"] == 4.25  # first arrival 0 to last finish 4.25
    assert s["request_throughput"] == pytest.approx(3 / 4.25, rel=REL)
    assert s["output_throughput"] == pytest.approx((3 + 1 + 5) / 4.25, rel=REL)
    assert s["total_token_throughput"] == pytest.approx((3 + 1 + 5 + 10 + 20 + 30) / 4.25, rel=REL)
    assert s["preemptions"] == 3


def test_summary_latency_definitions():
    s = summarize(small_output())
    ttft = s["ttft_s"]  # [1.0, 0.5, 0.25]
    assert ttft["mean"] == pytest.approx(1.75 / 3, rel=REL)
    assert ttft["p50"] == 0.5
    assert ttft["p90"] == pytest.approx(0.5 + 0.8 * 0.5, rel=REL)  # h = 2 * 0.9 = 1.8
    assert ttft["p99"] == pytest.approx(0.5 + 0.98 * 0.5, rel=REL)
    assert s["tpot_s"] == {"mean": 0.5, "p50": 0.5, "p90": 0.5, "p95": 0.5, "p99": 0.5}  # single-token left out
    e2e = s["e2e_s"]  # [2.0, 0.5, 2.25]
    assert e2e["mean"] == pytest.approx(4.75 / 3, rel=REL)
    assert e2e["p50"] == 2.0
    assert e2e["p95"] == pytest.approx(2.0 + 0.9 * 0.25, rel=REL)  # h = 1.9
    queue = s["queue_s"]  # [0.5, 0.25, 0.0]
    assert queue["mean"] == pytest.approx(0.25, rel=REL)
    assert queue["p50"] == 0.25


def test_summary_itl_weighted_percentiles():
    itl = summarize(small_output())["itl_s"]
    # expanded: [0.25, 0.25, 0.375, 0.375, 0.5, 0.5, 0.5, 0.625, 0.625, 0.75, 2.0], n = 11
    assert itl["mean"] == pytest.approx(6.75 / 11, rel=REL)
    assert itl["p50"] == 0.5           # h = 5
    assert itl["p90"] == 0.75          # h = 9
    assert itl["p95"] == 1.375         # h = 9.5: 0.75 + 0.5 * 1.25
    assert itl["p99"] == pytest.approx(0.75 + 0.9 * 1.25, rel=REL)  # h = 9.9


def test_summary_kv_cache_and_batch_size_time_weighted():
    s = summarize(small_output())
    # row durations 0.5, 1.75, 1.25; utilisation 0.2, 0.4, 0.8; batch 1, 2, 3
    assert s["kv_cache_utilization"]["mean"] == pytest.approx((0.1 + 0.7 + 1.0) / 3.5, rel=REL)
    assert s["kv_cache_utilization"]["max"] == 0.8
    assert s["batch_size"]["mean"] == pytest.approx((0.5 + 3.5 + 3.75) / 3.5, rel=REL)
    assert s["batch_size"]["max"] == 3


def test_goodput_requires_every_slo():
    out = small_output()
    s = summarize(out, slo={"ttft_s": 0.5, "tpot_s": 0.5})
    # r0 misses TTFT (1.0); r1 meets both (TPOT of a one-token request counts as 0); r2 meets both (<=)
    assert s["goodput"] == pytest.approx(2 / 4.25, rel=REL)
    assert s["slo_attainment"] == 0.5  # 2 good of 4 requests (the unfinished one is not good)
    s = summarize(out, slo={"ttft_s": 0.5, "tpot_s": 0.4})
    assert s["goodput"] == pytest.approx(1 / 4.25, rel=REL)
    assert s["slo_attainment"] == 0.25
    s = summarize(out, slo={"e2e_s": 2.0})
    assert s["goodput"] == pytest.approx(2 / 4.25, rel=REL)
    assert "goodput" not in summarize(out) and "slo_attainment" not in summarize(out)


def test_bad_slo_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="slo: unknown key 'ttft_ms'"):
        summarize(small_output(), slo={"ttft_ms": 200})
    with pytest.raises(ConfigError, match="slo.tpot_s"):
        summarize(small_output(), slo={"tpot_s": -1})


def test_summary_without_completed_requests_is_json_clean():
    out = small_output()
    out.requests.finish_s[:] = np.nan
    s = summarize(out)
    assert s["completed"] == 0 and s["duration_s"] == 0.0 and s["request_throughput"] == 0.0
    assert s["ttft_s"] == dict.fromkeys(["mean", "p50", "p90", "p95", "p99"])
    json.dumps(s, allow_nan=False)


def test_summary_is_plain_json():
    s = summarize(small_output(), slo={"ttft_s": 1.0})
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    assert isinstance(s["saturated"], bool)


def test_spec_decode_counters_to_rates():
    # the example log line of docs/reference/vllm-semantics.md: 1650 accepted of 3000 drafted over 1000 drafts, k = 3
    rates = spec_decode_summary({"num_drafts": 1000, "num_draft_tokens": 3000, "num_accepted_tokens": 1650,
                                 "num_accepted_tokens_per_pos": [750, 530, 370]})
    assert rates["mean_acceptance_length"] == pytest.approx(2.65, rel=REL)
    assert rates["draft_acceptance_rate"] == pytest.approx(0.55, rel=REL)
    assert rates["per_position_acceptance_rate"] == pytest.approx([0.75, 0.53, 0.37], rel=REL)
    out = small_output()
    out.spec_counters = {"num_drafts": 4, "num_draft_tokens": 8, "num_accepted_tokens": 6,
                         "num_accepted_tokens_per_pos": [4, 2]}
    assert summarize(out)["spec_decode"]["mean_acceptance_length"] == 2.5
    assert "spec_decode" not in summarize(small_output())


# ----------------------------------------------------------------------------- saturation


def queue_output(n_requests: int, span_s: float, waiting) -> EngineOutput:
    """Arrivals evenly over [0, span_s]; one 0.5 s step row every 0.5 s with num_waiting = waiting(t)."""
    arrival = np.linspace(0.0, span_s, n_requests)
    nan = np.full(n_requests, np.nan)
    zeros = np.zeros(n_requests, dtype=np.int64)
    requests = RequestLog(np.arange(n_requests), arrival, zeros + 8, zeros + 8, zeros, nan, nan, nan, zeros)
    start = np.arange(0.0, span_s + 10.0, 0.5)
    rows = [dict(start_s=t, num_steps=1, first_step_s=0.5, batch_size=4, num_waiting=int(waiting(t)))
            for t in start]
    return EngineOutput(requests, make_steps(rows), np.zeros(0), 100, 16, float(start[-1] + 0.5))


def test_saturated_when_queue_grows_linearly():
    result = detect_saturation(queue_output(200, 100.0, lambda t: t))  # +1 request/s
    assert result.saturated
    assert result.slope_per_s == pytest.approx(1.0, rel=1e-3)
    assert result.growth == pytest.approx(25.0, rel=1e-3)  # over the last 25 s of arrivals


def test_not_saturated_when_queue_fluctuates():
    result = detect_saturation(queue_output(200, 100.0, lambda t: [0, 3, 1, 4, 0, 2][int(2 * t) % 6]))
    assert not result.saturated
    assert abs(result.growth) < result.threshold


def test_slow_growth_below_absolute_threshold_is_not_saturated():
    result = detect_saturation(queue_output(200, 100.0, lambda t: 0.15 * t))  # 3.75 requests over the tail
    assert not result.saturated and result.threshold == 5.0



def test_growth_exactly_at_the_threshold_is_not_saturated():
    # arrivals at 0 and 20 s: tail [15, 20], one arrival in it, threshold max(5, 5% x 1) = 5. One-second steps
    # from 0 with num_waiting = max(0, t - 15): over the tail starts 15..20 the fitted slope is exactly 1/s
    # (x and y are small dyadic numbers), so the growth is exactly 5 = the threshold: not "more than" it
    n = 2
    nan = np.full(n, np.nan)
    zeros = np.zeros(n, dtype=np.int64)
    requests = RequestLog(np.arange(n), np.array([0.0, 20.0]), zeros + 8, zeros + 8, zeros, nan, nan, nan, zeros)
    rows = [dict(start_s=float(t), num_steps=1, first_step_s=1.0, batch_size=4, num_waiting=max(0, t - 15))
            for t in range(0, 26)]
    result = detect_saturation(EngineOutput(requests, make_steps(rows), np.zeros(0), 100, 16, 26.0))
    assert result.slope_per_s == 1.0 and result.growth == 5.0 and result.threshold == 5.0
    assert not result.saturated


def test_queue_trend_weights_each_step_by_its_duration():
    # tail [15, 20] (arrivals at 0 and 20 s); steps starting at 15 (2 s, 0 waiting), 17 (2 s, 8 waiting),
    # 19 (1 s, 8) and 20 (0.25 s, 0): the least-squares slope with weights 2, 2, 1, 0.25 (numpy's polyfit
    # weighs residuals by sqrt(w)) is 1.56/s; unweighted, the short last step would pull it down to 0.27/s
    n = 2
    nan = np.full(n, np.nan)
    zeros = np.zeros(n, dtype=np.int64)
    requests = RequestLog(np.arange(n), np.array([0.0, 20.0]), zeros + 8, zeros + 8, zeros, nan, nan, nan, zeros)
    x, w, y = [15.0, 17.0, 19.0, 20.0], [2.0, 2.0, 1.0, 0.25], [0, 8, 8, 0]
    rows = [dict(start_s=a, num_steps=1, first_step_s=d, batch_size=4, num_waiting=q) for a, d, q in zip(x, w, y)]
    result = detect_saturation(EngineOutput(requests, make_steps(rows), np.zeros(0), 100, 16, 21.0))
    weighted = np.polyfit(x, y, 1, w=np.sqrt(w))[0]
    assert result.slope_per_s == pytest.approx(weighted, rel=1e-9)
    assert weighted > 1.5 > 0.3 > np.polyfit(x, y, 1)[0]


def test_threshold_scales_with_arrivals_in_the_tail():
    # 2001 arrivals, 501 of them in the last 25 s: threshold = 5% of 501 = 25.05 requests
    below = detect_saturation(queue_output(2001, 100.0, lambda t: 0.9 * t))   # growth 22.5
    above = detect_saturation(queue_output(2001, 100.0, lambda t: 1.1 * t))   # growth 27.5
    assert below.threshold == pytest.approx(25.05) and not below.saturated
    assert above.saturated
    assert summarize(queue_output(2001, 100.0, lambda t: 1.1 * t))["saturated"] is True


def test_run_cut_off_before_the_arrivals_end_measures_the_arrivals_that_happened():
    # simulation.max_time_s stopped the run at 100 s; the 200 requests planned for (100, 200] never
    # arrived (arrival_s NaN). The window is [0, 100] and its tail [75, 100], where the queue grows 1/s.
    out = queue_output(400, 200.0, lambda t: t)
    cut = out.requests.arrival_s > 100.0 + 1e-9
    out.requests.arrival_s[cut] = np.nan
    result = detect_saturation(out)
    assert result.saturated
    assert result.slope_per_s == pytest.approx(1.0, rel=2e-3)  # the last arrival is at 99.75 s
    assert result.growth == pytest.approx(25.0, rel=2e-2)


def test_table_says_latencies_cover_completed_requests_when_some_did_not_finish():
    summary = {"completed": 3, "num_requests": 5}
    assert "Latencies cover the completed requests only (2 did not finish)" in format_summary_table(summary)
    assert "cover" not in format_summary_table({"completed": 5, "num_requests": 5})


# ----------------------------------------------------------------------------- CSV text


def test_csv_number_formats():
    text = csv_bytes({
        "x": np.array([0.0, 1.0, 100.0, 0.125, -0.5, 2.7123456789012e-8, 1234.5678901234, 999999999999.9,
                       np.nan, -0.0]),
        "n": np.array([0, 7, -42, 10, 123456789012, 1, 9999, 10000, -1, 5], dtype=np.int64),
    }).decode()
    assert text.splitlines() == [
        "x,n", "0,0", "1,7", "100,-42", "0.125,10", "-0.5,123456789012", "0.000000027123456789,1",
        "1234.56789012,9999", "1000000000000,10000", ",-1", "0,5",
    ]


def test_csv_floats_keep_twelve_significant_digits():
    rng = np.random.default_rng(np.random.SeedSequence(11))
    x = (0.1 + rng.random(5000)) * 10.0 ** rng.integers(-14, 14, 5000) * rng.choice([-1, 1], 5000)
    rows = csv_bytes({"x": x}).decode().splitlines()[1:]
    back = np.array([float(r) for r in rows])
    assert all("e" not in r for r in rows)
    assert np.max(np.abs(back - x) / np.abs(x)) <= 5e-12
    assert np.array_equal(np.array([float(r) for r in csv_bytes({"x": back}).decode().split()[1:]]), back)


def test_csv_falls_back_to_repr_for_extreme_floats():
    text = csv_bytes({"x": np.array([1e-20, np.inf, 2.5, np.nan])}).decode()
    assert text.splitlines() == ["x", "1e-20", "inf", "2.5", ""]


def test_csv_rejects_ragged_columns():
    with pytest.raises(ValueError):
        csv_bytes({"a": np.zeros(2), "b": np.zeros(3)})


# ----------------------------------------------------------------------------- output files


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_write_outputs_round_trip(tmp_path):
    out = small_output()
    summary = summarize(out, slo={"ttft_s": 0.5, "tpot_s": 0.5})
    write_outputs(out, summary, tmp_path / "run")
    folder = tmp_path / "run"
    assert sorted(p.name for p in folder.iterdir()) == ["requests.csv", "steps.csv", "summary.json"]
    assert json.loads((folder / "summary.json").read_text(), parse_constant=lambda c: 1 / 0) == summary

    rows = read_csv(folder / "requests.csv")
    assert tuple(rows[0]) == REQUEST_COLUMNS
    expected = {
        "ttft_s": [1.0, 0.5, 0.25, 1.0], "tpot_s": [0.5, NAN, 0.5, NAN], "e2e_s": [2.0, 0.5, 2.25, NAN],
        "queue_s": [0.5, 0.25, 0.0, 0.5], "finish_s": [2.0, 1.5, 4.25, NAN],
        "first_token_s": [1.0, 1.5, 2.25, 4.0], "arrival_s": [0.0, 1.0, 2.0, 3.0],
    }
    for name, values in expected.items():
        got = [float(r[name]) if r[name] != "" else NAN for r in rows]
        np.testing.assert_array_equal(got, values, err_msg=name)
    assert [int(r["preemptions"]) for r in rows] == [0, 0, 1, 2]
    assert [int(r["output_tokens"]) for r in rows] == [3, 1, 5, 4]

    steps = read_csv(folder / "steps.csv")
    assert tuple(steps[0]) == STEP_COLUMNS
    for name in STEP_COLUMNS:
        column = np.asarray(getattr(out.steps, name))
        got = np.array([float(r[name]) for r in steps]) if column.dtype.kind == "f" else \
            np.array([int(r[name]) for r in steps])
        np.testing.assert_array_equal(got, column, err_msg=name)


def test_csv_read_back_with_pandas(tmp_path):
    import pandas as pd  # a dependency of servesim: no skip

    out = small_output()
    write_outputs(out, summarize(out), tmp_path)
    frame = pd.read_csv(tmp_path / "requests.csv")
    requests, steps = to_dataframes(out)
    pd.testing.assert_frame_equal(frame, requests, check_dtype=False)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "steps.csv"), steps, check_dtype=False)
    assert list(steps.columns) == list(STEP_COLUMNS) and len(steps) == 3
    assert math.isnan(requests["tpot_s"][1])


def test_atomic_write_leaves_old_file_and_no_temporary_on_failure(tmp_path):
    target = tmp_path / "steps.csv"
    atomic_write(target, [b"old,content\n"])

    def failing():
        yield b"partial"
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        atomic_write(target, failing())
    assert target.read_bytes() == b"old,content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["steps.csv"]


def test_a_write_that_names_no_file_is_given_the_file_being_written(tmp_path):
    import errno

    from servesim.atomic import atomic_file

    target = tmp_path / "requests.csv"
    with pytest.raises(OSError) as raised:
        with atomic_file(target, "wb") as handle:
            handle.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")  # as a write to a full disk raises it
    assert raised.value.filename == str(target) and raised.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as named:  # an error that names its own file keeps it
        with atomic_file(target, "wb"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/elsewhere")
    assert named.value.filename == "/elsewhere"


def test_write_outputs_replaces_previous_files(tmp_path):
    out = small_output()
    write_outputs(out, {"first": 1}, tmp_path)
    write_outputs(out, {"second": np.float64(2.5), "nan": float("nan")}, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == {"second": 2.5, "nan": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.csv", "steps.csv", "summary.json"]


def test_json_safe_converts_numpy_and_non_finite():
    assert json_safe({"a": np.int64(3), "b": [np.float32(0.5), float("inf")], "c": np.array([1, 2])}) == \
        {"a": 3, "b": [0.5, None], "c": [1, 2]}


def test_importing_metrics_does_not_import_pandas_or_matplotlib():
    code = ("import sys, servesim.metrics, servesim.plots.latency; "
            "sys.exit(('pandas' in sys.modules) * 1 + ('matplotlib' in sys.modules) * 2)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ----------------------------------------------------------------------------- table and plot


def test_summary_table_lists_the_headline_numbers():
    s = summarize(small_output(), slo={"ttft_s": 0.5, "tpot_s": 0.5})
    table = format_summary_table(s)
    lines = table.splitlines()
    assert lines[0].split()[-3:] == ["3", "/", "4"]
    ttft = next(line for line in lines if line.strip().startswith("TTFT")).split()
    assert ttft[1:] == ["583.33", "500.00", "990.00"]  # mean 1.75/3 s, p50 0.5 s, p99 0.99 s, in ms
    assert "Preemptions" in table and "Goodput" in table and "50.0%" in table
    assert lines[-1] == "Saturated (queue growing)   no"


def test_plot_latency_writes_a_png(tmp_path):
    from servesim.plots.latency import plot_latency

    out = small_output()
    written = plot_latency(out, summarize(out), tmp_path)
    assert written == tmp_path / "latency.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other = plot_latency(out, summarize(out), tmp_path / "sub" / "custom.png")
    assert other.exists() and [p.name for p in (tmp_path / "sub").iterdir()] == ["custom.png"]


def test_latency_figure_draws_the_runs_numbers():
    import matplotlib.pyplot as plt

    from servesim.plots.latency import latency_figure

    out = small_output()
    fig = latency_figure(out, summarize(out))
    (ttft, tpot), (batch, kv) = fig.axes[0:2], fig.axes[2:4]
    # CDFs of the completed requests, in ms: TTFT 1, 0.5, 0.25 s; TPOT 0.5, 0.5 s (the 1-token request has none)
    cdf = ttft.lines[0]
    assert cdf.get_xdata().tolist() == [250.0, 500.0, 1000.0]
    assert cdf.get_ydata().tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert tpot.lines[0].get_xdata().tolist() == [500.0, 500.0]
    # p50 and p99 markers at the summary's values (p50 0.5 s, p99 0.99 s)
    assert [line.get_xdata()[0] for line in ttft.lines[1:]] == pytest.approx([500.0, 990.0])
    # the step rows as segments [start, end) with gaps: ends 1.0, 2.75 (0.25 + 0.375 + 0.5 + 0.625), 4.25
    x = batch.lines[0].get_xdata()
    np.testing.assert_allclose(x[~np.isnan(x)], [0.5, 1.0, 1.0, 2.75, 3.0, 4.25])
    y = batch.lines[0].get_ydata()
    assert y[~np.isnan(y)].tolist() == [1, 1, 2, 2, 3, 3]
    y = kv.lines[0].get_ydata()
    assert y[~np.isnan(y)].tolist() == pytest.approx([20, 20, 40, 40, 80, 80])  # % of the 10 blocks
    assert "3/4 requests" in fig._suptitle.get_text()
    plt.close(fig)


def test_plot_latency_bins_long_step_logs(tmp_path):
    import matplotlib.pyplot as plt

    from servesim.plots.latency import TIME_BINS, latency_figure, plot_latency

    # 821 rows of 0.5 s (more than 2 x TIME_BINS): the batch panel shows per-bin duration-weighted means
    out = queue_output(200, 400.0, lambda t: t % 7)
    starts = np.asarray(out.steps.start_s)
    out.steps.batch_size = (np.arange(len(starts)) % 5).astype(np.int64)
    assert len(out.steps) > 2 * TIME_BINS
    fig = latency_figure(out, summarize(out))
    mean_line = fig.axes[2].lines[0]
    edges = np.linspace(starts.min(), starts.max() + 0.5, TIME_BINS + 1)
    expected = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (starts >= lo) & (starts < hi) if hi < edges[-1] else (starts >= lo)
        expected.append(out.steps.batch_size[inside].mean() if inside.any() else np.nan)  # equal durations
    np.testing.assert_allclose(mean_line.get_xdata(), (edges[:-1] + edges[1:]) / 2)
    np.testing.assert_allclose(mean_line.get_ydata(), expected, equal_nan=True)
    plt.close(fig)
    assert plot_latency(out, summarize(out), tmp_path / "latency.png").stat().st_size > 0


def test_run_without_steps_summarises_and_plots(tmp_path):
    from servesim.plots.latency import plot_latency

    out = small_output()
    out.steps = make_steps([])
    out.extra_itl_s = np.zeros(0)
    s = summarize(out)
    assert s["itl_s"]["p50"] is None and s["batch_size"] == {"mean": None, "max": None}
    assert s["kv_cache_utilization"] == {"mean": None, "max": None} and s["saturated"] is False
    json.dumps(s, allow_nan=False)
    write_outputs(out, s, tmp_path)
    assert (tmp_path / "steps.csv").read_text() == ",".join(STEP_COLUMNS) + "\n"
    assert plot_latency(out, s, tmp_path).exists()


def test_exact_sum_of_int64_values_beyond_int64_sums_is_exact():
    """KV block-picosecond integrals overflow an int64 sum at 10^6 requests: the sum by 32-bit halves
    equals Python's exact sum, negative values included."""
    from servesim.metrics.steps import _exact_sum

    rng = np.random.default_rng(np.random.SeedSequence(7))
    values = rng.integers(-(2**62), 2**62, 100_000, dtype=np.int64)
    values[:10] = [2**63 - 1, -(2**63), 0, 1, -1, 2**32, -(2**32), 2**32 - 1, 2**62, 3]
    assert _exact_sum(values) == sum(int(v) for v in values.tolist())
    small = rng.integers(0, 1000, 1000, dtype=np.int64)
    assert _exact_sum(small) == int(small.sum()) and _exact_sum([2**70, 1]) == 2**70 + 1


def test_table_shows_the_first_eight_per_position_rates_of_a_long_draft():
    """An n-gram draft of 48 tokens printed 48 rates on one line."""
    rates = [round(0.9 - 0.01 * i, 3) for i in range(48)]
    spec = {"num_drafts": 10, "mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.1,
            "per_position_acceptance_rate": rates}
    line = [x for x in format_summary_table({"spec_decode": spec}).splitlines() if x.startswith("Per-position")][0]
    assert line.split(None, 2)[2] == ("0.900, 0.890, 0.880, 0.870, 0.860, 0.850, 0.840, 0.830, "
                                     "... (48 positions in summary.json)")
    short = {**spec, "per_position_acceptance_rate": rates[:8]}
    assert format_summary_table({"spec_decode": short}).endswith("0.860, 0.850, 0.840, 0.830")
