"""SimPy events: a single engine takes every step up to the next arrival in one SimPy timeout
(Engine.process), with exactly the results of one timeout per step or run; a replica behind a router
keeps one timeout per step or run (the router observes it between steps)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import simpy

from servesim.engine import core
from servesim.engine.arrival_source import ArrivalSource
from servesim.config.models import SimConfig
from servesim.wiring import build_engine
from test_modes_azure import ROOT, config


@dataclasses.dataclass
class _ObservedSource(ArrivalSource):
    """An ArrivalSource of another type: the engine then yields once per step or run (as behind a router)."""


class _CountingEnv(simpy.Environment):
    def __init__(self) -> None:
        super().__init__()
        self.timeouts = 0

    def timeout(self, delay, value=None):
        self.timeouts += 1
        return super().timeout(delay, value)


def _engine(cfg: dict, observed: bool, arrivals_per_timeout: int | None = None, monkeypatch=None):
    if arrivals_per_timeout is not None:
        monkeypatch.setattr(core, "ARRIVALS_PER_TIMEOUT", arrivals_per_timeout)
    engine, _, _ = build_engine(SimConfig.model_validate(cfg), ROOT, np.random.SeedSequence(0))
    if observed:
        source = engine.arrivals
        engine.arrivals = _ObservedSource(times=source.times, num_requests=source.num_requests)
    env = _CountingEnv()
    env.process(engine.process(env))
    env.run()
    return engine, env


def _same_results(out_b, out_s) -> None:
    for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "generated_tokens"):
        np.testing.assert_array_equal(getattr(out_b.requests, name), getattr(out_s.requests, name), err_msg=name)
    for name in ("start_ps", "num_steps", "duration_s", "kv_block_ps", "num_waiting", "itl_samples"):
        np.testing.assert_array_equal(getattr(out_b.steps, name), getattr(out_s.steps, name), err_msg=name)
    assert out_b.spec_counters == out_s.spec_counters


@pytest.mark.parametrize("spec", [None, {"method": "eagle", "num_speculative_tokens": 3}])
def test_steps_batched_over_arrivals_give_the_same_results(spec, monkeypatch):
    cfg = config(4.0, "run", 60.0, 2500, spec)
    single, env_single = _engine(cfg, observed=True)
    per_arrival, env_per_arrival = _engine(cfg, observed=False, arrivals_per_timeout=1, monkeypatch=monkeypatch)
    batched, env_batched = _engine(cfg, observed=False, arrivals_per_timeout=64, monkeypatch=monkeypatch)
    out_s = single.output()
    _same_results(per_arrival.output(), out_s)
    out_b = batched.output()
    _same_results(out_b, out_s)
    # one timeout per step or run when observed; one per arrival interval (plus an idle engine's waits)
    # with one arrival per timeout: about a third as many; with 64, one per 63 arrivals pulled between
    # steps (this busy 4x run never idles)
    num_requests = len(out_b.requests)
    assert env_per_arrival.timeouts <= 2 * num_requests + 1 < env_single.timeouts
    assert env_batched.timeouts <= num_requests // 63 + 2 < env_per_arrival.timeouts // 20


@pytest.mark.parametrize("concurrency", [None, 2])
def test_arrival_source_next_time_follows_every_release_and_finish(concurrency):
    """``ArrivalSource.next_ps`` (read by the engine's hot loop) is the next unreleased arrival after every
    change: open loop, its schedule; closed loop, the clients' next sends (a finish issues one)."""
    times = [0, 5, 5, 9, 20]
    source = ArrivalSource(times=times if concurrency is None else None, num_requests=len(times),
                           concurrency=concurrency, think_ps=3)
    released: list = []
    expected_next = 0
    assert source.next_time() == source.next_ps == expected_next
    now = 0
    while source.next_ps is not None:
        got: list = []
        source.pop_until(now, got)
        released += got
        if concurrency is None:
            pending = [t for t in times[len(released):]]
            assert source.next_ps == (pending[0] if pending else None)
        else:
            for _ in got:
                source.on_finish(now + 1)  # each released request finishes 1 ps later
            pending = sorted(t for t, _ in source._heap)
            assert source.next_ps == (pending[0] if pending else None)
        assert source.next_time() == source.next_ps
        now = source.next_ps if source.next_ps is not None else now
    assert sorted(r for r, _ in released) == list(range(len(times)))
