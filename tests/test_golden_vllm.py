"""servesim's scheduler against vLLM 0.32's own scheduler, step by step, in step mode and in run mode.

The golden traces in ``tests/data/golden/`` were written by vLLM's real v1 ``Scheduler`` driven by
``oracle/vllm_oracle.py`` (see ``oracle/README.md``: how to install vLLM and regenerate them). Each holds
the scenario (engine settings, KV blocks, speculative config, requests with their arrival step and the
drafts each verification round accepts) and vLLM's trace: per step, the tokens and drafts scheduled per
request in vLLM's order, the preemption victims, the KV blocks in use, the waiting requests and k. The
engine replays the scenario with a step time of exactly 1 ms, so that step ``s`` starts at ``s`` ms and a
request arriving at step ``s`` arrives at ``s`` ms, and must reproduce every step exactly. Times are not
compared: the step-time model does not affect scheduling decisions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from golden_replay import PREFIX_CACHE_FIELDS, first_difference, load, replay

GOLDEN = Path(__file__).parent / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN.glob("*.json.gz"))


def test_enough_golden_scenarios_covering_the_rules():
    assert len(GOLDEN_FILES) >= 30
    methods, asyncs, preemptions, tables_with_k0, block_sizes = set(), set(), 0, 0, set()
    for path in GOLDEN_FILES:
        golden = load(path)
        assert golden["vllm_version"] == "0.32.0"
        assert golden["steps"], path.name
        scen = golden["scenario"]
        spec = scen["speculative_config"] or {}
        methods.add((spec.get("method"), spec.get("num_nextn_predict_layers")))
        asyncs.add((scen["engine"]["async_scheduling"], spec.get("method")))
        block_sizes.add(scen["engine"]["block_size"])
        preemptions += sum(len(s["preempted"]) for s in golden["steps"])
        tables_with_k0 += any(e[2] == 0 for e in spec.get("num_speculative_tokens_per_batch_size") or [])
    assert {m for m, _ in methods} >= {None, "ngram", "eagle", "eagle3", "mtp", "draft_model", "medusa"}
    assert ("mtp", 1) in methods and ("mtp", 3) in methods
    assert {(True, None), (True, "eagle"), (False, None)} <= asyncs
    assert block_sizes == {16, 32} and preemptions > 50 and tables_with_k0 >= 2


@pytest.mark.parametrize("mode", ["step", "run"])
@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.name.removesuffix(".json.gz") for p in GOLDEN_FILES])
def test_reproduces_vllm_trace(path: Path, mode: str):
    golden = load(path)
    diff = first_difference(replay(golden, mode), golden["steps"])
    assert diff is None, f"{path.name} ({mode} mode) differs from vLLM at {diff}"


def test_prefix_caching_golden_scenarios_cover_hits_and_rehits_after_preemption():
    """The prefix-caching traces (vLLM 0.32 with ``enable_prefix_caching``): shared prefixes hit, and
    preempted requests re-hit their own blocks, with and without async scheduling."""
    prefix = [load(p) for p in GOLDEN_FILES if p.name.startswith("prefix_")]
    assert len(prefix) >= 10
    assert all(g["scenario"]["engine"]["enable_prefix_caching"] for g in prefix)
    totals = {key: sum(s["prefix_cache"][key] for g in prefix for s in g["steps"]) for key in PREFIX_CACHE_FIELDS}
    assert totals["hits"] > 0 and totals["preempted_hits"] > 0
    assert {g["scenario"]["engine"]["async_scheduling"] for g in prefix} == {False, True}
    # with speculation too: the EAGLE-family block drop (EAGLE, MTP with 3 layers, async EAGLE) and the
    # methods without it (draft model, n-gram)
    methods = {((g["scenario"]["speculative_config"] or {}).get("method"), g["scenario"]["engine"]["async_scheduling"])
               for g in prefix}
    assert methods >= {(None, False), (None, True), ("eagle", False), ("eagle", True), ("mtp", False),
                       ("draft_model", False), ("ngram", False)}
    assert {g["vllm_config"]["use_eagle_block_drop"] for g in prefix} == {False, True}


@pytest.mark.parametrize("name", ["eagle_max_model_len", "async_eagle_max_model_len",
                                  "async_draft_model_max_model_len_empty_step",
                                  "ngram_max_model_len_no_chunked_prefill"])
def test_max_model_len_scenarios_pin_the_context_bound(name: str):
    """Replayed without ``max_model_len`` (drafts and KV slots uncapped) these traces no longer match: they pin
    vLLM's bound on a step's positions and on the KV slots (found by ``oracle/fuzz.py``)."""
    golden = load(GOLDEN / f"{name}.json.gz")
    unbounded = dict(golden, scenario=dict(golden["scenario"], engine=dict(golden["scenario"]["engine"],
                                                                            max_model_len=None)))
    assert first_difference(replay(unbounded, "step"), golden["steps"]) is not None
