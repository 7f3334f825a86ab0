"""Replay a golden scenario (a vLLM trace written by ``oracle/vllm_oracle.py``) in servesim and compare.

Shared by ``tests/test_golden_vllm.py`` (the committed traces) and ``oracle/fuzz.py`` (random scenarios):
the engine replays the scenario with a step time of exactly 1 ms, so that step ``s`` starts at ``s`` ms and a
request arriving at step ``s`` arrives at ``s`` ms, and reports its trace in the golden trace's format.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
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

STEP_PS = 10**9  # every step lasts 1 ms


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
        max_model_len=eng.get("max_model_len"),
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
