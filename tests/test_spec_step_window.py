"""Run mode's per-step sums of the aggregated speculative decoders hold a window of steps from the next one to
be taken (``SpeculativeDecoding._ensure``), not the whole run: moving it, in place or into a larger array,
changes no result, and its size follows the decoders' horizon."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from servesim.config.models import load_config
from servesim.engine import speculative_decoding
from servesim.wiring import build_engine

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "azure-conv-llama8b-h100.yaml"
SPECS = {
    "eagle": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"},
    # empty n-gram drafts: the verify width varies, and the window also holds the token sums
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"},
}


def _run(spec: dict, requests: int):
    cfg, folder = load_config(CONFIG, [("speculative_config", spec), ("workload.rate_scale", 4),
                                       ("workload.max_requests", requests)])
    engine, env, _ = build_engine(cfg, folder, np.random.SeedSequence(cfg.seed))
    env.run()
    decoding = engine.decoding
    window = {"capacity": decoding.capacity, "step_base": decoding.step_base,
              "arrays": len(decoding.step_computed), "steps": engine.step_index}
    return engine.output(), window


def _assert_same_output(first, second):
    for part in ("requests", "steps"):
        for field in dataclasses.fields(getattr(first, part)):
            a, b = getattr(getattr(first, part), field.name), getattr(getattr(second, part), field.name)
            if a is None or b is None:
                assert a is b, field.name
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"{part}.{field.name}")
    assert first.spec_counters == second.spec_counters
    assert first.end_s == second.end_s


@pytest.mark.parametrize("method", sorted(SPECS))
def test_moving_the_window_changes_no_result(method, monkeypatch):
    default, window = _run(SPECS[method], 600)
    assert window["step_base"] > 0  # the default window moved during the run
    monkeypatch.setattr(speculative_decoding, "STEP_WINDOW_MIN", 2)  # moves and grows from 2 steps
    small, small_window = _run(SPECS[method], 600)
    assert small_window["step_base"] > window["step_base"] // 2
    _assert_same_output(default, small)


def test_the_window_holds_the_horizon_not_the_run(monkeypatch):
    monkeypatch.setattr(speculative_decoding, "STEP_WINDOW_MIN", 16)  # the size the horizon asks for
    out, window = _run(SPECS["eagle"], 5000)
    longest = int(out.requests.output_tokens.max())  # a decoder's horizon is at most its remaining rounds
    assert window["arrays"] == window["capacity"]
    assert window["capacity"] <= 2 * longest
    assert window["steps"] > 3 * window["capacity"]  # the run took more steps than the window holds
