"""The engine against queueing theory: Lindley's recursion, M/D/1 and M/G/1 waits, Little's law.

The statistical checks replicate seeded runs and build a 99% Student-t interval for the steady-state mean
(the first WARMUP requests of each run, which start from an empty server, are left out). Each check
asserts that its interval contains the closed form AND excludes the closed form shifted by +-5%, so an
engine (or a formula) 5% off fails: the replications are sized for that, not only for passing.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from engine_helpers import flat_step_model, run_engine

STEP_S = 0.01  # every engine step lasts exactly 10 ms in these tests (no token-dependent terms)


def lindley(arrival_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """Waiting times of a FIFO single-server queue: W1 = 0, W(n+1) = max(0, W(n) + S(n) - A(n+1) + A(n))."""
    w = np.zeros(len(arrival_s))
    for i in range(1, len(arrival_s)):
        w[i] = max(0.0, w[i - 1] + service_s[i - 1] - (arrival_s[i] - arrival_s[i - 1]))
    return w


@pytest.mark.parametrize("mode", ["run", "step"])
def test_single_sequence_server_follows_lindley_recursion(mode):
    rng = np.random.default_rng(np.random.SeedSequence(11))
    n = 2000
    output = rng.integers(1, 40, n)
    prompt = rng.integers(1, 500, n)
    arrival = np.cumsum(rng.exponential(0.25, n))
    eng = run_engine(prompt, output, arrival, step_model=flat_step_model(STEP_S), max_num_seqs=1, mode=mode)
    out = eng.output().requests
    # With one sequence at a time, a request occupies the server for one prefill step (which emits its
    # first token) plus output-1 decode steps, each STEP_S long.
    service = output * STEP_S
    expected = lindley(out.arrival_s, service)
    queue = out.first_scheduled_s - out.arrival_s
    np.testing.assert_allclose(queue, expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(out.finish_s - out.first_scheduled_s, service, rtol=0, atol=1e-9)


WARMUP = 0.05  # share of each run's first requests left out of the steady-state means


def _replications(n_reps: int, n_req: int, rate: float, outputs, seed: int, mode: str = "run"):
    """Run ``n_reps`` seeded M/G/1 engines (one sequence at a time, 10 ms steps, Poisson arrivals at
    ``rate`` per s, output lengths from ``outputs(rng, n)``); yield each run's output."""
    for rep in range(n_reps):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(rep,)))
        arrival = np.cumsum(rng.exponential(1.0 / rate, n_req))
        output = outputs(rng, n_req)
        eng = run_engine(np.full(n_req, 16), output, arrival, step_model=flat_step_model(STEP_S), max_num_seqs=1,
                         mode=mode)
        yield eng.output()


def _mean_waits(outputs) -> np.ndarray:
    """Steady-state mean queueing delay (first scheduled - arrival, s) of each replication."""
    means = []
    for out in outputs:
        r = out.requests
        skip = int(WARMUP * len(r))
        means.append(float(np.mean((r.first_scheduled_s - r.arrival_s)[skip:])))
    return np.asarray(means)


def _check_interval(samples: np.ndarray, theory: float) -> None:
    """The 99% interval of the mean of ``samples`` contains ``theory`` and excludes ``theory`` x (1 +- 5%)."""
    n = len(samples)
    mean = float(samples.mean())
    half = float(stats.t.ppf(0.995, n - 1) * samples.std(ddof=1) / np.sqrt(n))
    assert abs(mean - theory) <= half, (mean, half, theory)
    for shifted in (0.95 * theory, 1.05 * theory):
        assert abs(mean - shifted) > half, ("a 5% error would pass", mean, half, shifted)


def test_md1_mean_wait_matches_pollaczek_khinchine():
    service = 20 * STEP_S  # deterministic: 20 tokens = 20 steps
    rate = 0.4 / service
    waits = _mean_waits(_replications(20, 8000, rate, lambda rng, n: np.full(n, 20), seed=2024))
    rho = rate * service
    _check_interval(waits, rho * service / (2 * (1 - rho)))


def test_mg1_geometric_service_matches_pollaczek_khinchine_and_mm1():
    # Output lengths geometric with mean m: service = m * STEP_S on average, E[S^2] = STEP_S^2 (2 - p) / p^2,
    # within 0.25% of an exponential service's 2 E[S]^2, so the M/M/1 wait rho / (mu - lambda) applies too.
    m = 200
    p = 1.0 / m
    es = m * STEP_S
    es2 = STEP_S**2 * (2 - p) / p**2
    rate = 0.3 / es
    waits = _mean_waits(_replications(48, 8000, rate, lambda rng, n: rng.geometric(p, n), seed=7))
    rho = rate * es
    pk = rate * es2 / (2 * (1 - rho))
    _check_interval(waits, pk)
    mm1 = rho / (1 / es - rate)
    assert abs(pk - mm1) / mm1 < 0.003
    _check_interval(waits, mm1)


@pytest.mark.slow
def test_md1_high_load_long_runs():
    service = 20 * STEP_S
    rate = 0.85 / service
    waits = _mean_waits(_replications(30, 20000, rate, lambda rng, n: np.full(n, 20), seed=99))
    rho = rate * service
    _check_interval(waits, rho * service / (2 * (1 - rho)))


def test_littles_law_from_the_step_log_against_the_closed_form():
    """L = lambda W with L the time-average number of requests in the system read from the engine's step
    log (step mode: one row per step) and W the M/D/1 closed form, not the run's own sojourn times.

    The step log counts a request from the start of the first step at or after its arrival (the requests
    waiting at the row's start, ``num_waiting``, include the one admitted in that step) until the end of
    its last step: against its sojourn time that adds one step (its admission step is counted as waiting
    and as running) and removes the wait until the next step boundary of an arrival to a busy server
    (probability rho by PASTA, STEP_S / 2 on average). So E[L] = lambda (Wq + S + STEP_S (1 - rho / 2)).
    """
    service = 20 * STEP_S
    rate = 0.5 / service
    rho = rate * service
    averages = []
    for out in _replications(10, 8000, rate, lambda rng, n: np.full(n, 20), seed=5, mode="step"):
        s = out.steps
        assert (s.num_steps == 1).all()
        averages.append(float(((s.batch_size + s.num_waiting) * s.duration_s).sum() / out.end_s))
    wq = rho * service / (2 * (1 - rho))
    _check_interval(np.asarray(averages), rate * (wq + service + STEP_S * (1 - rho / 2)))


@pytest.mark.parametrize("mode", ["run", "step"])
def test_an_arrival_exactly_at_a_step_end_is_admitted_by_the_next_step(mode):
    # Steps of 10 ms + 1,000 ps per attended token (integer ps: every end is exact). Request 0 (16 + 40 tokens):
    # its prefill ends at 10,000,016,000 ps, its decode step j (17 + j tokens attended) lasts
    # 10,000,017,000 + 1,000 j ps, so decode step 3 ends at 50,000,090,000 ps. Request 1 arrives exactly then:
    # the next step admits it at once (a run of decode steps stops at that boundary, not one step later)
    arrival_ps = 10_000_016_000 + sum(10_000_017_000 + 1_000 * j for j in range(4))
    assert arrival_ps == 50_000_090_000
    eng = run_engine([16, 16], [40, 5], [0.0, arrival_ps / 1e12], step_model=flat_step_model(0.01, kv_ps=1000),
                     mode=mode)
    out = eng.output()
    assert out.requests.first_scheduled_s.tolist() == [0.0, 0.05000009]
    if mode == "run":
        assert out.steps.num_steps.tolist()[:3] == [1, 4, 1]


def test_a_decode_run_reaches_the_first_step_end_after_an_arrival_in_one_row():
    # flat 10 ms steps; request 1 arrives at 55 ms, inside decode step 4 (50-60 ms): the run of decode steps
    # after request 0's prefill takes ceil(45 / 10) = 5 steps in one row, and request 1 is admitted at 60 ms
    out = run_engine([16, 16], [40, 5], [0.0, 0.055], step_model=flat_step_model(0.01), mode="run").output()
    assert out.steps.num_steps.tolist()[:3] == [1, 5, 1]
    assert out.requests.first_scheduled_s.tolist() == [0.0, 0.06]
