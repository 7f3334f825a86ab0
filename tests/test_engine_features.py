"""Engine features checked end to end: ``simulation.max_time_s``, per-request acceptance heterogeneity,
context decay of acceptance, replicas with speculative decoding, and the requests an engine refuses."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from engine_helpers import flat_step_model, run_engine
from servesim import simulate
from test_spec_engine import closed_loop  # the closed-loop run config of the speculative engine tests

PROFILE = [0.622, 0.381, 0.252]  # EAGLE, Llama-3.1-8B, ShareGPT, K = 3 (docs/reference/acceptance-profiles.md)


def eagle(acceptance) -> dict:
    return {"method": "eagle", "num_speculative_tokens": 3, "acceptance": acceptance}


# ---------------------------------------------------------------------- simulation.max_time_s
@pytest.mark.parametrize("mode", ["run", "step"])
@pytest.mark.parametrize("max_time_s, steps", [(0.255, 26), (0.25, 25)])
def test_max_time_stops_at_the_first_step_boundary_at_or_after_it(mode, max_time_s, steps):
    # Hand-worked: one sequence at a time, 10 ms steps. Request 0 (100 output tokens) runs from t = 0 and
    # emits one token per step; request 1 arrives at 0.1 s and waits behind it; request 2 arrives after
    # the limit. The run stops at the end of the step that reaches max_time_s.
    eng = run_engine([16, 16, 16], [100, 5, 5], [0.0, 0.1, 0.3], step_model=flat_step_model(0.01),
                     max_num_seqs=1, mode=mode, max_time_s=max_time_s)
    out = eng.output()
    r = out.requests
    assert out.end_s == pytest.approx(steps * 0.01, abs=1e-12)
    assert r.generated_tokens.tolist() == [steps, 0, 0]
    assert np.isnan(r.finish_s).all()
    np.testing.assert_array_equal(r.arrival_s[:2], [0.0, 0.1])
    assert np.isnan(r.arrival_s[2])  # never arrived
    assert r.first_scheduled_s[0] == 0.0 and np.isnan(r.first_scheduled_s[1:]).all()
    assert int(out.steps.num_steps.sum()) == steps


def test_max_time_from_the_config_with_speculation_reports_unfinished_requests():
    cfg = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
           "workload": {"type": "poisson", "rate": 20.0, "num_requests": 400,
                        "prompt_tokens": {"type": "fixed", "value": 500},
                        "output_tokens": {"type": "fixed", "value": 300}},
           "speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
           "simulation": {"max_time_s": 5.0}}
    run = simulate(cfg)
    step = simulate({**cfg, "simulation": {"max_time_s": 5.0, "mode": "step"}})
    out, s = run.output, run.output.steps
    ends = s.start_s + s.duration_s
    # the last row is the step that crosses 5 s; no step starts at or after it (start + duration is a sum of
    # two rounded floats: equal to the engine's end within one picosecond, the clock's unit)
    assert s.start_s[-1] < 5.0 <= ends[-1] and abs(ends[-1] - out.end_s) <= 1e-12 and (s.start_s < 5.0).all()
    r = out.requests
    done = np.isfinite(r.finish_s)
    assert 0 < done.sum() < 400 and run.summary["completed"] == done.sum()
    assert (r.finish_s[done] <= out.end_s).all() and (r.generated_tokens[done] == 300).all()
    assert (r.generated_tokens[~done] < 300).all() and np.isnan(r.arrival_s).sum() > 0  # later ones never came
    # throughputs are over the completed requests' span (first arrival to last finish), not NaN
    span = float(r.finish_s[done].max() - np.nanmin(r.arrival_s))
    assert run.summary["duration_s"] == pytest.approx(span, rel=1e-12)
    assert run.summary["request_throughput"] == pytest.approx(done.sum() / span, rel=1e-12)
    for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "generated_tokens"):
        np.testing.assert_array_equal(getattr(r, name), getattr(step.output.requests, name), err_msg=name)
    assert run.output.spec_counters == step.output.spec_counters


def test_a_run_cut_by_max_time_counts_its_slo_attainment_over_the_requests_that_arrived():
    # 400 requests at 20 req/s, stopped at 5 s: about 100 arrived; the others were never offered, so they
    # are not SLO failures (attainment had read good / 400), and the table counts them apart
    from servesim.metrics import format_summary_table

    cfg = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
           "workload": {"type": "poisson", "rate": 20.0, "num_requests": 400,
                        "prompt_tokens": {"type": "fixed", "value": 500},
                        "output_tokens": {"type": "fixed", "value": 300}},
           "slo": {"ttft_s": 0.5, "tpot_s": 0.05}, "simulation": {"max_time_s": 5.0}}
    run = simulate(cfg)
    r, summary = run.output.requests, run.summary
    arrived = int(np.isfinite(r.arrival_s).sum())
    done = np.isfinite(r.finish_s)
    with np.errstate(invalid="ignore"):
        good = (done & (r.first_token_s - r.arrival_s <= 0.5)
                & ((r.finish_s - r.first_token_s) / 299 <= 0.05))  # 300 output tokens: 299 after the first
    assert 50 < arrived < 400 and summary["num_requests"] == 400 and summary["arrived"] == arrived
    assert 0 < done.sum() < arrived and summary["completed"] == done.sum()
    assert summary["slo_attainment"] == int(good.sum()) / arrived
    lines = format_summary_table(summary).splitlines()
    assert lines[0] == f"Requests completed          {done.sum()} / {arrived} arrived (400 in the workload)"
    assert f"Latencies cover the completed requests only ({arrived - done.sum()} did not finish)" in lines
    whole = simulate({**cfg, "simulation": {}}).summary  # not cut: every request arrives
    assert whole["arrived"] == whole["num_requests"] == 400
    assert format_summary_table(whole).splitlines()[0] == f"Requests completed          {whole['completed']} / 400"


# ---------------------------------------------------------------------- acceptance heterogeneity
def round_weighted_rates(profile, concentration: float) -> np.ndarray:
    """vLLM's per-position rates (accepted at position i / rounds) over a population of requests whose
    conditional rates are scaled by f = a / c*, a ~ Beta(kappa c*, kappa (1 - c*)), each request decoding
    a fixed number of tokens: a request with acceptance length L(f) = 1 + sum_i f^i p_i runs ~1/L(f) rounds
    per token, so rate_i = E[f^i p_i / L(f)] / E[1 / L(f)] (numerical integration over the beta law)."""
    p = np.asarray(profile)
    c_star = float((p / np.r_[1.0, p[:-1]]).max())
    law = stats.beta(concentration * c_star, concentration * (1 - c_star))

    def length(a):
        return 1 + sum((a / c_star) ** (i + 1) * p[i] for i in range(len(p)))

    norm = integrate.quad(lambda a: law.pdf(a) / length(a), 0, 1)[0]
    return np.array([integrate.quad(lambda a, i=i: law.pdf(a) * (a / c_star) ** (i + 1) * p[i] / length(a),
                                    0, 1)[0] / norm for i in range(len(p))])


def interval_99(samples: np.ndarray):
    """Mean and half-width of the 99% Student-t interval of each column of ``samples`` (replications x k)."""
    n = len(samples)
    return samples.mean(axis=0), stats.t.ppf(0.995, n - 1) * samples.std(axis=0, ddof=1) / np.sqrt(n)


def test_per_request_heterogeneity_matches_the_beta_law():
    kappa = 4.0
    profile = {"name": "het", "per_position_acceptance": PROFILE,
               "heterogeneity": {"type": "beta", "concentration": kappa}}
    cfg = closed_loop(eagle(profile), concurrency=16, num_requests=1000, output=200)
    rates = np.array([simulate(cfg, seed=seed).summary["spec_decode"]["per_position_acceptance_rate"]
                      for seed in range(10)])
    expected = round_weighted_rates(PROFILE, kappa)
    # heterogeneity shows: position 1 well below the profile's 0.622 (slow requests run more rounds),
    # position 3 above its 0.252 (E[f^3] > 1)
    assert expected[0] < 0.95 * PROFILE[0] and expected[2] > 1.02 * PROFILE[2]
    mean, half = interval_99(rates)
    assert (np.abs(mean - expected) <= half).all(), (mean, half, expected)
    assert (half < 0.03 * expected).all()  # narrow enough that a 5% error fails


# ---------------------------------------------------------------------- context decay
@pytest.mark.parametrize("shape, per_token", [("linear", 5e-5), ("exponential", 6e-5)])
def test_context_decay_scales_acceptance_by_the_context(shape, per_token):
    # Long prompts (6,000 tokens) and short outputs (64): every round sees a context of 6,000-6,064
    # tokens, so every p_i is scaled by s(ctx) within 0.3% of s(6,032).
    decay = {"shape": shape, "per_token": per_token, "reference_tokens": 1000}
    profile = {"name": "decay", "per_position_acceptance": PROFILE, "context_decay": decay}
    cfg = closed_loop(eagle(profile), concurrency=16, num_requests=1000, prompt=6000, output=64)
    sd = simulate(cfg).summary["spec_decode"]
    extra = 6032 - 1000
    scale = 1 - per_token * extra if shape == "linear" else np.exp(-per_token * extra)
    assert scale < 0.8
    n = sd["num_drafts"]
    for got, p in zip(sd["per_position_acceptance_rate"], scale * np.asarray(PROFILE)):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n) + 0.003 * p, (got, p)  # binomial 4 sigma + ctx spread
        assert 4 * np.sqrt(p * (1 - p) / n) + 0.003 * p < 0.05 * p



def test_context_decay_follows_the_context_as_the_output_grows():
    # The context a round sees grows with the output: round j of a request (after its 100-token prompt) is
    # predicted at ctx_j = 100 + j * L, L = 1 + c_1 = 1.8 the profile's mean acceptance length (K = 1), so
    # p(j) = c_1 * (1 - 1e-3 * 1.8 j) with reference_tokens 100. Expected counters, exactly, by dynamic
    # programming over the output tokens still to emit (399 after the prefill's token): a round of a request
    # with m >= 1 left accepts its draft with probability p(j) and emits min(1 + A, m) tokens; the rate is
    # E[sum_j A_j] / E[rounds]. (A prediction at 100 + j (L - 1), growing by the accepted drafts only,
    # gives 0.726 instead of 0.624.)
    c1, per_token, prompt, output = 0.8, 1e-3, 100, 400
    decay = {"shape": "linear", "per_token": per_token, "reference_tokens": prompt}
    spec = {"method": "eagle", "num_speculative_tokens": 1,
            "acceptance": {"name": "decay", "per_position_acceptance": [c1], "context_decay": decay}}
    sd = simulate(closed_loop(spec, concurrency=16, num_requests=300, prompt=prompt, output=output)).summary["spec_decode"]
    left = np.zeros(output)  # left[m]: probability that m tokens remain before round j
    left[output - 1] = 1.0
    accepted = rounds = 0.0
    for j in range(output):
        p = c1 * max(0.0, 1 - per_token * (1 + c1) * j)
        active = left[1:].sum()
        if active < 1e-15:
            break
        rounds += active
        accepted += p * active
        nxt = np.zeros(output)
        nxt[0] = left[0] + left[1]  # one token left: done whatever the draw
        nxt[1:-1] += (1 - p) * left[2:]  # rejected: one token
        nxt[:-2] += p * left[2:]  # accepted: two tokens
        left = nxt
    expected = accepted / rounds
    n = sd["num_drafts"]
    assert n > 300 * 200
    got = sd["per_position_acceptance_rate"][0]
    assert abs(got - expected) < 4 * np.sqrt(expected * (1 - expected) / n) + 0.005 * expected, (got, expected)
    assert n / 300 == pytest.approx(rounds, rel=0.01)  # about 246 rounds a request


# ---------------------------------------------------------------------- replicas with speculation
def test_replicas_with_speculation():
    spec = eagle("eagle-llama3.1-8b-sharegpt-k3")
    wl = {"type": "poisson", "rate": 30.0, "num_requests": 600, "prompt_tokens": {"type": "fixed", "value": 300},
          "output_tokens": {"type": "uniform", "low": 50, "high": 400}}
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": wl, "speculative_config": spec}
    one = simulate(base)
    two = simulate({**base, "deployment": {"replicas": 2, "router": "least_outstanding"}})
    two_step = simulate({**base, "deployment": {"replicas": 2, "router": "least_outstanding"},
                         "simulation": {"mode": "step"}})
    # Acceptance is drawn per request, whatever replica serves it: the counters and the tokens are those
    # of one server, exactly; only the times differ (half the load per replica: shorter TPOT).
    assert two.info["replicas"] == 2
    assert two.output.spec_counters == one.output.spec_counters
    np.testing.assert_array_equal(two.output.requests.generated_tokens, one.output.requests.generated_tokens)
    assert two.summary["completed"] == 600
    assert two.summary["tpot_s"]["mean"] < 0.95 * one.summary["tpot_s"]["mean"]
    sd = two.summary["spec_decode"]
    n = sd["num_drafts"]
    for got, p in zip(sd["per_position_acceptance_rate"], PROFILE):
        assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)
    # run mode == step mode with replicas and speculation
    for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "preemptions"):
        np.testing.assert_array_equal(getattr(two.output.requests, name), getattr(two_step.output.requests, name),
                                      err_msg=name)
    assert two.summary["tpot_s"] == two_step.summary["tpot_s"]


# ---------------------------------------------------------------------- requests an engine refuses
@pytest.mark.parametrize("prompt, output, words", [([10, 10], [5, 0], "request 1: output_tokens = 0"),
                                                   ([0, 10], [5, 5], "request 0: prompt_tokens = 0")])
def test_engine_refuses_requests_without_output_or_prompt_tokens(prompt, output, words):
    with pytest.raises(ValueError, match=words):
        run_engine(prompt, output, [0.0, 0.1])
