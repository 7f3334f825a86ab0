"""The cyclic garbage collector is paused during the simulation (servesim/collector.py), which is safe only
because the engine's run makes no reference cycles: these tests pin both."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import simpy

from servesim import simulate
from servesim.collector import cycle_collector_paused
from servesim.api import _as_config
from servesim.deployment import build_deployment
from servesim.wiring import build_engine

POISSON = {"type": "poisson", "rate": 40, "num_requests": 300,
           "prompt_tokens": {"type": "uniform", "low": 5, "high": 900},
           "output_tokens": {"type": "uniform", "low": 1, "high": 300}}
PREFIX = {**POISSON, "system_prompts": {"num_prompts": 3, "prompt_tokens": {"type": "fixed", "value": 400}}}
CONFIGS = {
    "plain": {},
    "plain tight KV (preemptions)": {"engine": {"num_gpu_blocks_override": 400}},
    "plain step mode": {"simulation": {"mode": "step"}},
    "EAGLE k=3": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3}},
    "EAGLE async tight KV": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
                             "engine": {"async_scheduling": True, "num_gpu_blocks_override": 400}},
    "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    "prefix caching": {"workload": PREFIX},
    "prefix caching, EAGLE, tight KV": {"workload": PREFIX, "engine": {"num_gpu_blocks_override": 400},
                                        "speculative_config": {"method": "eagle", "num_speculative_tokens": 3}},
    "2 replicas, least outstanding": {"deployment": {"replicas": 2, "router": "least_outstanding"}},
}


def _config(extra: dict):
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": POISSON, "seed": 5}
    return _as_config({**base, **extra}, None)


def _run_and_count_unreachable(cfg, folder) -> tuple[int, object]:
    """Run ``cfg`` with automatic collections off from before it; the objects a collection then finds
    unreachable, and the run's output."""
    build = build_deployment if cfg.deployment.replicas > 1 else build_engine
    runner, env, _ = build(cfg, folder, np.random.SeedSequence(cfg.seed))
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        env.run()
        unreachable = gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    return unreachable, runner.output()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_whole_run_leaves_no_reference_cycle(name):
    """A collection after the run finds no unreachable object: reference counting frees all the run's
    garbage, so pausing the collector during it costs no memory. (The first run in a process may leave a
    few hundred objects of a one-time lazy import, e.g. ``inspect``'s signature parsing under n-gram
    speculation: measured on a second run, which must leave none.)"""
    cfg, folder = _config(CONFIGS[name])
    _run_and_count_unreachable(cfg, folder)  # lazy imports and caches
    unreachable, out = _run_and_count_unreachable(cfg, folder)
    assert unreachable == 0
    assert len(out.requests.finish_s) == 300 and not np.isnan(out.requests.finish_s).any()  # a whole run


def test_simulate_pauses_the_collector_only_during_the_run(monkeypatch):
    seen = []
    original = simpy.Environment.run

    def recording_run(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(simpy.Environment, "run", recording_run)
    assert gc.isenabled()
    simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": {**POISSON, "num_requests": 20}})
    assert seen == [False]
    assert gc.isenabled()  # restored
    gc.disable()  # a caller that disabled it keeps it disabled
    try:
        simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": {**POISSON, "num_requests": 20}})
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_the_pause_restores_the_collector_when_the_block_raises():
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        with cycle_collector_paused():
            assert not gc.isenabled()
            1 / 0
    assert gc.isenabled()
