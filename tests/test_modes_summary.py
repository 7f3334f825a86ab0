"""Run mode == step mode for EVERY summary key, bit for bit (issue 11, item 16).

The run-mode engine advances runs of decode steps at once; its step log must still give the summary that
stepping one step at a time gives: the KV-cache utilisation integrates the blocks in use step by step
(``kv_block_ps``), every arrival ends a run (so each row's waiting count is each of its steps', and the
saturation slope is fitted over the same steps), and the prefill-token count classifies a request's
last recompute token the same way in both modes."""

from __future__ import annotations

import numpy as np
import pytest

from engine_helpers import flat_step_model, run_engine
from servesim import simulate
from servesim.metrics import summarize


def flatten(summary: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def step_totals(out) -> dict:
    """Step-log totals that must not depend on how steps are grouped into rows."""
    st = out.steps
    n = st.num_steps
    return {
        "steps": int(n.sum()),
        "num_tokens": int((st.num_tokens * n).sum()),
        "num_prefill_tokens": int((st.num_prefill_tokens * n).sum()),
        "itl_samples": int((st.itl_samples * n).sum()),
        "num_preempted": int(st.num_preempted.sum()),
        "kv_block_ps": sum(st.kv_block_ps.tolist()),
        "busy_ps": int(np.rint(np.asarray(st.duration_s) * 1e12).sum()),
    }


def config(spec=None, blocks=None, budget=None, rate=20.0, chunked=True, prompt_high=3000, output_high=400,
           requests=120, seed=1) -> dict:
    engine = {"max_num_seqs": 64, "enable_chunked_prefill": chunked}
    if blocks is not None:
        engine["num_gpu_blocks_override"] = blocks
    if budget is not None:
        engine["max_num_batched_tokens"] = budget
    return {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "seed": seed,
        "engine": engine,
        "workload": {"type": "poisson", "rate": rate, "num_requests": requests,
                     "prompt_tokens": {"type": "uniform", "low": 1, "high": prompt_high},
                     "output_tokens": {"type": "uniform", "low": 1, "high": output_high}},
        "speculative_config": spec,
        "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
    }


EAGLE = {"method": "eagle", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4,
         "acceptance": {"source": "test", "per_position_acceptance": [0.5, 0.35, 0.25, 0.15],
                        "no_match_probability": 0.3}}

CASES = {
    "plain": config(),
    "preemption": config(blocks=600, rate=40.0),
    "saturated": config(blocks=400, rate=200.0, requests=200),
    "no-chunked-prefill": config(chunked=False, budget=8192, prompt_high=2000, output_high=300),
    "eagle": config(EAGLE),
    "eagle-preemption": config(EAGLE, blocks=600, rate=40.0),
    "ngram-preemption": config(NGRAM, blocks=800, rate=30.0),
    "llamacpp-budget": config(dict(NGRAM, draft_budget_limit=True), blocks=800, rate=30.0),
    "closed-loop": dict(config(blocks=700), workload={
        "type": "closed_loop", "concurrency": 12, "num_requests": 80, "think_time_s": 0.05,
        "prompt_tokens": {"type": "uniform", "low": 1, "high": 2000},
        "output_tokens": {"type": "uniform", "low": 1, "high": 300}}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_summary_key_is_identical_in_both_modes(name):
    cfg = CASES[name]
    run = simulate(cfg)
    step = simulate(dict(cfg, simulation={"mode": "step"}))
    assert len(run.output.steps) < len(step.output.steps)  # the fast path really grouped steps
    a, b = flatten(run.summary), flatten(step.summary)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], key  # exact: the claim is bit for bit
    totals_run, totals_step = step_totals(run.output), step_totals(step.output)
    if name in ("ngram-preemption", "llamacpp-budget"):
        # a run row logs its first step's num_tokens; with a varying verify width the others differ
        del totals_run["num_tokens"], totals_step["num_tokens"]
    assert totals_run == totals_step
    if name in ("preemption", "saturated", "eagle-preemption", "ngram-preemption"):
        assert run.summary["preemptions"] > 0
    if name == "saturated":
        assert run.summary["saturated"] is True and run.summary["waiting_queue_slope_per_s"] > 0


@pytest.mark.parametrize("seed", [7, 28, 29])
def test_recompute_prefill_tokens_agree(seed):
    # preemption with small token budgets: recomputes are cut anywhere, also one token before their end
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    n, block_size = int(rng.integers(5, 80)), int(rng.choice([1, 2, 4, 16]))
    budget, seqs = int(rng.integers(8, 600)), int(rng.integers(1, 32))
    prompt, output = rng.integers(1, 800, n), rng.integers(1, 200, n)
    arrival = np.cumsum(rng.exponential(0.01, n))
    blocks = -(-int((prompt + output).max()) // block_size) + int(rng.integers(0, 100))
    kw = dict(kv_blocks=blocks, block_size=block_size, max_num_seqs=seqs, max_num_batched_tokens=budget)
    run = run_engine(prompt, output, arrival, mode="run", **kw).output()
    step = run_engine(prompt, output, arrival, mode="step", **kw).output()
    assert run.requests.preemptions.sum() > 0
    assert step_totals(run) == step_totals(step)
    assert flatten(summarize(run)) == flatten(summarize(step))


def test_kv_integral_of_a_long_run_is_exact_and_fits_int64():
    # one request holding 62,501 blocks decodes 199 steps of 1 s: 1.2e19 block-ps, past int64; the engine
    # splits the run so that each row's integral fits, and the total is the exact step-by-step sum
    prompt, output = [1_000_000], [200]
    kw = dict(step_model=flat_step_model(decode_s=1.0), kv_blocks=70_000, block_size=16, max_num_batched_tokens=8192)
    run = run_engine(prompt, output, [0.0], mode="run", **kw).output()
    step = run_engine(prompt, output, [0.0], mode="step", **kw).output()
    assert (run.steps.kv_block_ps < 2**62).all()
    expected = sum(u * d for u, d in zip(step.steps.kv_blocks_used.tolist(),
                                         np.rint(step.steps.duration_s * 1e12).astype(np.int64).tolist()))
    assert sum(run.steps.kv_block_ps.tolist()) == sum(step.steps.kv_block_ps.tolist()) == expected > 2**63
    assert summarize(run)["kv_cache_utilization"] == summarize(step)["kv_cache_utilization"]


def test_a_speculative_run_ends_before_its_kv_integral_reaches_the_bound(monkeypatch):
    # a run's row holds its KV integral (blocks x ps) in int64: runs of speculative steps, short or long,
    # end before the step that would take it to KV_BLOCK_PS_MAX. Lowered here below what most runs of this
    # case hold (up to 4.7e14), every row of more than one step stays below it, and the summary is still
    # step mode's bit for bit
    from servesim.engine import speculative_decoding

    cfg = CASES["eagle"]
    rows_before = len(simulate(cfg).output.steps)
    bound = 10**14
    monkeypatch.setattr(speculative_decoding, "KV_BLOCK_PS_MAX", bound)
    run = simulate(cfg)
    steps = run.output.steps
    assert len(steps) > rows_before
    multi = steps.num_steps > 1
    assert multi.sum() >= 20 and (steps.kv_block_ps[multi] < bound).all()
    step = simulate(dict(cfg, simulation={"mode": "step"}))
    assert flatten(run.summary) == flatten(step.summary)
    assert step_totals(run.output) == step_totals(step.output)
