"""simulation.measure: throughput over a steady-state window, against a hand-worked closed loop."""

from __future__ import annotations

import pytest

from servesim import simulate
from servesim.errors import ConfigError

STEP_S = 16e9 / 3.35e12  # the lesson's memory-bound step: every step below ~295 tokens


def _config(measure):
    return {
        "hardware": "lesson-h100-sxm",
        "model": "lesson-8b-fp16",
        "roofline": {"mode": "ideal"},
        "workload": {"type": "closed_loop", "concurrency": 2, "num_requests": 12,
                     "prompt_tokens": {"type": "fixed", "value": 10},
                     "output_tokens": {"type": "fixed", "value": 11}},
        "simulation": {"measure": measure},
    }


def test_window_by_completed_requests_is_the_steady_state_rate():
    # Two clients in lockstep: one prefill step (first tokens) and 10 decode steps per pair of requests,
    # so pairs finish every 11 steps. From the 2nd to the 10th finish: 8 requests x 11 tokens in 44 steps.
    s = simulate(_config({"after_completed": 2, "until_completed": 10})).summary
    w = s["measurement_window"]
    assert w["completed"] == 8
    assert w["end_s"] - w["start_s"] == pytest.approx(44 * STEP_S, rel=1e-9)
    assert w["output_throughput"] == pytest.approx(2 / STEP_S, rel=1e-9)
    assert w["request_throughput"] == pytest.approx(8 / (44 * STEP_S), rel=1e-9)
    assert w["total_token_throughput"] == pytest.approx(8 * 21 / (44 * STEP_S), rel=1e-9)
    # the whole run's figure is unchanged beside it (the same here: no warm-up to exclude)
    assert s["output_throughput"] == pytest.approx(12 * 11 / (66 * STEP_S), rel=1e-9)


def test_window_by_time_counts_the_requests_finishing_inside():
    cycle = 11 * STEP_S
    s = simulate(_config({"after_s": 1.5 * cycle, "until_s": 4.5 * cycle})).summary
    w = s["measurement_window"]
    assert w["completed"] == 6  # the pairs finishing at 2, 3 and 4 cycles
    assert w["output_throughput"] == pytest.approx(66 / (3 * cycle), rel=1e-9)


def test_no_window_no_key_and_bad_window_is_one_line():
    assert "measurement_window" not in simulate(_config(None)).summary
    with pytest.raises(ConfigError, match="simulation.measure.after_s"):
        simulate(_config({"after_s": -1}))
