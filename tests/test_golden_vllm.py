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

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import simpy

from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.speculative_decoding import SpecSetup
from servesim.engine.step_trace import StepTracer
from servesim.workload.content import SequenceContent
from servesim.speculation.config import SpeculativeConfig
from servesim.speculation.profile import load_profile
from servesim.speculation.schedule import KSchedule
from servesim.roofline import SUBPS_PER_PS

GOLDEN = Path(__file__).parent / "data" / "golden"
STEP_PS = 10**9  # every step lasts 1 ms

GOLDEN_FILES = sorted(GOLDEN.glob("*.json.gz"))


class ConstantStepTime:
    """A step-time model in which every step lasts ``STEP_PS`` (the engine's step-time interface, 2^-16 ps)."""

    kv_subps_per_token = 0
    attn_subps_per_pair = 0
    decode_subps_per_token = 0
    request_subps_per_request = 0

    def tokens_subps(self, num_tokens: int, num_logits: int) -> int:
        return STEP_PS * SUBPS_PER_PS

    def base_subps(self, num_tokens: int, num_logits: int, num_requests: int = 0) -> int:
        return STEP_PS * SUBPS_PER_PS

    def step_subps(self, num_tokens: int, num_logits: int, kv_tokens: int, attn_pairs: int,
                   num_requests: int = 0) -> int:
        return STEP_PS * SUBPS_PER_PS


class FreeDrafter:
    """A drafter that takes no time (the drafter cost interface)."""

    kv_subps_per_draft_token = 0

    def const_subps(self, num_tokens: int, num_requests: int, k: int) -> int:
        return 0

    def step_subps(self, num_tokens: int, num_requests: int, k: int, ctx_tokens: int) -> int:
        return 0


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def spec_setup(scen: dict) -> SpecSetup | None:
    """The engine's speculative setup for a scenario, through servesim's own config."""
    sc = scen["speculative_config"]
    if sc is None:
        return None
    cfg = SpeculativeConfig.model_validate({
        "method": sc["method"],
        "num_speculative_tokens": sc["num_speculative_tokens"],
        "num_speculative_tokens_per_batch_size": sc.get("num_speculative_tokens_per_batch_size"),
        "acceptance": {"alpha": 0.7},
        **({"draft_cost": 0.1} if sc["method"] == "draft_model" else {}),
    })
    table = np.concatenate([
        np.asarray(r["accept"] + [0] * (r["output_tokens"] - len(r["accept"])), dtype=np.int32)
        for r in scen["requests"]
    ])
    return SpecSetup(
        schedule=KSchedule(cfg.num_speculative_tokens, cfg.num_speculative_tokens_per_batch_size),
        lookahead=cfg.lookahead_slots,
        disable_by_batch_size=None,
        drafts_may_be_empty=cfg.drafts_may_be_empty,
        drafter=FreeDrafter(),
        profile=load_profile({"alpha": 0.7}),
        uniforms=None,
        factors=None,
        accept_table=table,
        draft_slots=cfg.max_num_new_slots_for_drafting,
        prefill_lookahead=cfg.num_prefill_lookahead_tokens(sc.get("num_nextn_predict_layers", 1)),
    )


def replay(golden: dict, mode: str) -> list[dict]:
    """servesim's trace of a golden scenario, in the golden trace's format."""
    scen = golden["scenario"]
    eng, reqs = scen["engine"], scen["requests"]
    spec = spec_setup(scen)
    engine = Engine(
        speculation=spec,
        prompt_tokens=[r["prompt_tokens"] for r in reqs],
        output_tokens=[r["output_tokens"] for r in reqs],
        arrivals=ArrivalSource(times=[r["arrival_step"] * STEP_PS for r in reqs], num_requests=len(reqs)),
        step_time=ConstantStepTime(),
        kv_blocks_total=eng["num_gpu_blocks"],
        block_size=eng["block_size"],
        max_num_seqs=eng["max_num_seqs"],
        max_num_batched_tokens=eng["max_num_batched_tokens"],
        enable_chunked_prefill=eng["enable_chunked_prefill"],
        async_scheduling=eng["async_scheduling"],
        mode=mode,
        enable_prefix_caching=eng.get("enable_prefix_caching", False),
        content=content_of(reqs) if eng.get("enable_prefix_caching") else None,
    )
    engine.tracer = StepTracer()
    env = simpy.Environment()
    env.process(engine.process(env))
    env.run()
    steps = [
        {"step": s.start_ps // STEP_PS, "scheduled": [list(e) for e in s.scheduled], "preempted": s.preempted,
         "kv_blocks_used": s.kv_blocks_used, "num_waiting": s.num_waiting, "k": s.k}
        for s in engine.tracer.steps
    ]
    if eng.get("enable_prefix_caching"):
        for row, s in zip(steps, engine.tracer.steps):
            row["new_computed"] = [list(e) for e in s.new_computed]
            row["prefix_cache"] = {key: s.prefix_cache.get(key, 0) for key in PREFIX_CACHE_FIELDS}
    return steps


PREFIX_CACHE_FIELDS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")


def content_of(requests: list[dict]) -> SequenceContent:
    """The scenario's sequence content: each request's ``segments`` ``[[content id, tokens], ...]``."""
    owner = [i for i, r in enumerate(requests) for _ in r["segments"]]
    order = [j for r in requests for j in range(len(r["segments"]))]
    ids = [c for r in requests for c, _ in r["segments"]]
    tokens = [n for r in requests for _, n in r["segments"]]
    return SequenceContent.from_parts(len(requests), np.asarray(owner, dtype=np.int64), np.asarray(order, dtype=np.int64),
                                      np.asarray(ids, dtype=np.uint64), np.asarray(tokens, dtype=np.int64))


def first_difference(got: list[dict], want: list[dict]) -> str | None:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"step #{i}:\n  servesim {g}\n  vLLM     {w}"
    if len(got) != len(want):
        return f"servesim ran {len(got)} steps, vLLM {len(want)}"
    return None


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
