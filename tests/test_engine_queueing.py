"""The engine against queueing theory: Lindley's recursion, M/D/1 and M/G/1 waits, Little's law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy_free_stats import t_quantile_99

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


def _replicated_mean_wait(n_reps: int, n_req: int, rate: float, outputs, seed: int):
    means = []
    for rep in range(n_reps):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(rep,)))
        arrival = np.cumsum(rng.exponential(1.0 / rate, n_req))
        output = outputs(rng, n_req)
        eng = run_engine(np.full(n_req, 16), output, arrival, step_model=flat_step_model(STEP_S), max_num_seqs=1)
        r = eng.output().requests
        means.append(float(np.mean(r.first_scheduled_s - r.arrival_s)))
    means = np.asarray(means)
    half = t_quantile_99(n_reps - 1) * means.std(ddof=1) / np.sqrt(n_reps)
    return means.mean(), half


def _check_interval(mean, half, theory):
    # The 99% interval must contain the closed form and be narrow enough to expose a 10% error.
    assert abs(mean - theory) <= half, (mean, half, theory)
    assert half < 0.1 * theory, (half, theory)


def test_md1_mean_wait_matches_pollaczek_khinchine():
    service = 20 * STEP_S  # deterministic: 20 tokens = 20 steps
    rate = 0.7 / service
    mean, half = _replicated_mean_wait(12, 4000, rate, lambda rng, n: np.full(n, 20), seed=2024)
    rho = rate * service
    _check_interval(mean, half, rho * service / (2 * (1 - rho)))


def test_mg1_geometric_service_matches_pollaczek_khinchine_and_mm1():
    # Output lengths geometric with mean m: service = m * STEP_S on average, E[S^2] = STEP_S^2 (2 - p) / p^2,
    # within 0.25% of an exponential service's 2 E[S]^2, so the M/M/1 wait rho / (mu - lambda) applies too.
    m = 200
    p = 1.0 / m
    es = m * STEP_S
    es2 = STEP_S**2 * (2 - p) / p**2
    rate = 0.6 / es
    mean, half = _replicated_mean_wait(12, 4000, rate, lambda rng, n: rng.geometric(p, n), seed=7)
    rho = rate * es
    pk = rate * es2 / (2 * (1 - rho))
    _check_interval(mean, half, pk)
    mm1 = rho / (1 / es - rate)
    assert abs(pk - mm1) / mm1 < 0.003
    _check_interval(mean, half, mm1)


@pytest.mark.slow
def test_md1_high_load_long_runs():
    service = 20 * STEP_S
    rate = 0.85 / service
    mean, half = _replicated_mean_wait(30, 20000, rate, lambda rng, n: np.full(n, 20), seed=99)
    rho = rate * service
    _check_interval(mean, half, rho * service / (2 * (1 - rho)))


def test_littles_law_from_the_step_log():
    rng = np.random.default_rng(np.random.SeedSequence(5))
    n = 3000
    prompt = rng.integers(50, 2000, n)
    output = rng.integers(10, 300, n)
    arrival = np.cumsum(rng.exponential(1 / 8.0, n))
    eng = run_engine(prompt, output, arrival)
    out = eng.output()
    s, r = out.steps, out.requests
    # L: time-average number of requests in the system, from the engine's own step log.
    in_system = (s.batch_size + s.num_waiting) * s.duration_s
    span = float(np.nanmax(r.finish_s) - r.arrival_s.min())
    L = in_system.sum() / span
    lam = n / span
    W = float(np.mean(r.finish_s - r.arrival_s))
    assert abs(L - lam * W) / (lam * W) < 0.02
