"""Run mode == step mode when the verify width varies inside a run of decode steps (issue 11, item 17).

n-gram rounds without a match verify one token instead of ``1 + k``, and llama.cpp's draft budget shortens
the last drafts of a request, so the token budget left for the waiting queue changes from step to step of a
run. A run must end where the head of the queue becomes admissible, and a partial prefill that a step's
decoders leave no budget for stays the partial prefill."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import simulate


#: n-gram acceptance with 30% of rounds finding no match (an empty draft: the request verifies 1 token)
NO_MATCH = {"source": "test", "per_position_acceptance": [0.5, 0.35, 0.25, 0.15], "no_match_probability": 0.3}


def config(seed: int, chunked: bool, budget: int, prompt_high: int, output_high: int, k: int, requests: int,
           **spec) -> dict:
    return {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        "seed": seed,
        "engine": {"num_gpu_blocks_override": 2000, "max_num_batched_tokens": budget, "max_num_seqs": min(64, budget),
                   "enable_chunked_prefill": chunked},
        "workload": {"type": "poisson", "rate": 200.0, "num_requests": requests,
                     "prompt_tokens": {"type": "uniform", "low": 1, "high": prompt_high},
                     "output_tokens": {"type": "uniform", "low": 1, "high": output_high}},
        "speculative_config": {"method": "ngram", "num_speculative_tokens": k, **spec},
    }


def assert_modes_agree(cfg: dict) -> None:
    run = simulate(cfg)
    step = simulate(dict(cfg, simulation={"mode": "step"}))
    r, s = run.output.requests, step.output.requests
    assert np.all(r.generated_tokens == r.output_tokens) and not np.isnan(r.finish_s).any()
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "preemptions", "generated_tokens"):
        np.testing.assert_array_equal(getattr(r, name), getattr(s, name), err_msg=name)
    assert run.output.spec_counters == step.output.spec_counters
    assert len(run.output.steps) < len(step.output.steps)  # runs of steps were really taken


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_head_admitted_where_empty_drafts_free_the_budget_without_chunked_prefill(seed):
    # whole prompts of up to 32 tokens wait behind decoders verifying 1 or 1 + 4 tokens of a 64-token budget
    assert_modes_agree(config(seed, False, 64, 32, 32, 4, 40, acceptance=NO_MATCH))


@pytest.mark.parametrize("seed", [0, 3, 6])
def test_head_admitted_where_the_draft_budget_shortens_drafts(seed):
    # llama.cpp's rule: a request's last drafts shrink to its remaining output - 1
    assert_modes_agree(config(seed, False, 64, 32, 32, 4, 40, draft_budget_limit=True))


def test_partial_prefill_survives_a_step_whose_drafts_fill_the_budget():
    # 8 decoders x (1 + 4) = 40 tokens = the whole budget at some step while a chunked prompt is mid-prefill
    assert_modes_agree(config(4, True, 40, 200, 100, 4, 40))


@pytest.mark.parametrize("spec", [{"acceptance": NO_MATCH}, {"draft_budget_limit": True}], ids=["no-match", "budget"])
@pytest.mark.parametrize("seed", [0, 1])
def test_head_admitted_after_a_run_whose_first_step_drafts_fill_the_budget(seed, spec):
    # chunked prefill, a 10-token budget: two decoders verifying 1 + 4 tokens leave nothing for the queue
    # at the run's first step, a shorter draft later does
    assert_modes_agree(config(seed, True, 10, 40, 60, 4, 30, **spec))
