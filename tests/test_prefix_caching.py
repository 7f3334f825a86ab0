"""Prefix caching (vLLM 0.32's KV cache manager, ``servesim/engine/block_manager.py``): each rule pinned by
a hand-worked trace, in step mode and in run mode, plus step = run on prefix-sharing workloads.

Hand-worked traces use block_size 4 and a flat 10 ms step; ``trace`` gives per step (scheduled
``(request, tokens)``, preempted, KV blocks used after scheduling, new computed ``(request, hit tokens)``).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import simpy

from engine_helpers import flat_step_model, run_engine
from servesim import simulate
from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.block_manager import BlockManager
from servesim.engine.core import Engine
from servesim.engine.speculative_decoding import SpecSetup
from servesim.engine.step_trace import StepTracer
from servesim.roofline import PS_PER_S
from servesim.speculation.config import SpeculativeConfig
from servesim.speculation.costs import DrafterCost
from servesim.speculation.profile import load_profile
from servesim.speculation.schedule import KSchedule
from servesim.workload.content import (
    NAMESPACE_MESSAGE,
    NAMESPACE_OUTPUT,
    NAMESPACE_SYSTEM_PROMPT,
    SequenceContent,
    content_id,
)

MODES = ("step", "run")
SYSTEM = int(content_id(NAMESPACE_SYSTEM_PROMPT, 0))


def msg(i: int) -> int:
    return int(content_id(NAMESPACE_MESSAGE, i))


def out(i: int) -> int:
    return int(content_id(NAMESPACE_OUTPUT, i))


def content_of(rows: list[list[tuple[int, int]]]) -> SequenceContent:
    """Content from per-request segment lists ``[(content id, tokens), ...]`` (prompt then output)."""
    req = np.array([i for i, r in enumerate(rows) for _ in r], dtype=np.int64)
    order = np.array([j for r in rows for j in range(len(r))], dtype=np.int64)
    ids = np.array([c for r in rows for c, _ in r], dtype=np.uint64)
    tok = np.array([n for r in rows for _, n in r], dtype=np.int64)
    return SequenceContent.from_parts(len(rows), req, order, ids, tok)


def run(prompt, output, arrival_s, mode, kv_blocks=100, content=None, **kw):
    return run_engine(prompt, output, arrival_s, kv_blocks=kv_blocks, block_size=4, mode=mode,
                      step_model=flat_step_model(0.01), enable_prefix_caching=True, content=content,
                      tracer=StepTracer(), **kw)


def trace(engine) -> list[tuple]:
    return [([(r, n) for r, n, _ in s.scheduled], s.preempted, s.kv_blocks_used, s.new_computed)
            for s in engine.tracer.steps]


@pytest.mark.parametrize("mode", MODES)
def test_preempted_request_rehits_its_own_blocks_not_evicted_yet(mode):
    """5 usable blocks (6 with the null block). A and B (8 + 8 tokens) prefill together (2 blocks each).
    Step 1: A's 9th token takes the last free block, B is preempted; its 2 full blocks are cached and go
    to the free queue (B's block 1 at the head, block 0 behind it). Steps 2-4: B's hit is 2 blocks (cap
    (9 - 1) // 4 = 2), both in the free queue, so it needs 3 - 2 + 2 = 3 blocks > 2 free: it waits (the
    hit blocks count against the free blocks). Step 5: A's 13th token pops the head, B's block 1 (the
    chain's end is evicted first). A finishes after step 7 (its 3 cached blocks to the tail, its partial
    block to the front); step 8 re-admits B with its surviving block 0: 4 tokens hit, 5 computed."""
    e = run([8, 8], [8, 8], [0, 0], mode, kv_blocks=6)
    want = ([([(0, 8), (1, 8)], [], 4, [(0, 0), (1, 0)]), ([(0, 1)], [1], 3, [])]
            + [([(0, 1)], [], 3, [])] * 3 + [([(0, 1)], [], 4, [])] * 3
            + [([(1, 5)], [], 3, [(1, 4)])] + [([(1, 1)], [], 3, [])] * 3 + [([(1, 1)], [], 4, [])] * 3)
    assert trace(e) == want
    stats = e.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 16, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 4)
    assert list(e.num_cached_tokens) == [0, 0]  # set at the first scheduling only


@pytest.mark.parametrize("mode", MODES)
def test_preempted_request_rehits_the_blocks_its_decode_tokens_filled(mode):
    """5 usable blocks. A: 8 + 4 tokens (3 blocks from step 1, finishes after step 3); B: 6 + 8. Step 3:
    B's 9th token needs a third block, none is free: B is preempted with 8 computed tokens, so its block 1
    (prompt tokens 4-5 and its first two output tokens) is cached too. A's blocks return after step 3;
    step 4 re-admits B (9 known tokens): hit (9 - 1) // 4 = 2 blocks = 8 tokens, 1 token computed."""
    e = run([8, 6], [4, 8], [0, 0], mode, kv_blocks=6)
    assert trace(e)[:5] == [([(0, 8), (1, 6)], [], 4, [(0, 0), (1, 0)]), ([(0, 1), (1, 1)], [], 5, []),
                            ([(0, 1), (1, 1)], [], 5, []), ([(0, 1)], [1], 3, []), ([(1, 1)], [], 3, [(1, 8)])]


@pytest.mark.parametrize("mode", MODES)
def test_running_request_caches_decode_blocks_as_they_fill(mode):
    """Turn 1: message m0 (3 tokens), output o0 (10). At step 4 it schedules its 5th output token (8
    known tokens): blocks 0 and 1 are cached, while it still decodes. Turn 2 arrives during step 4 (open
    loop) with m0, o0's first 5 tokens and m1 (2): 10 tokens, hit (10 - 1) // 4 = 2 blocks, held by turn 1
    (so they cost no free block), admitted in step 5."""
    rows = [[(msg(0), 3), (out(0), 10)], [(msg(0), 3), (out(0), 5), (msg(1), 2), (out(1), 1)]]
    e = run([3, 10], [10, 1], [0, 0.045], mode, content=content_of(rows))
    assert e.tracer.steps[5].new_computed == [(1, 8)]
    assert e.tracer.steps[5].scheduled == [(0, 1, 0), (1, 2, 0)]
    assert e.tracer.steps[5].kv_blocks_used == 2 + 1  # turn 1's 2 blocks, shared, and turn 2's third


@pytest.mark.parametrize("mode", MODES)
def test_hit_is_capped_at_num_tokens_minus_one_and_block_aligned(mode):
    """A: system prompt of 8 tokens + 1 output. B (after A finished) has exactly that 8-token prompt:
    both its blocks are cached, but the hit stops at (8 - 1) // 4 = 1 block (4 tokens, not 7 nor 8).
    C: the system prompt + 3 tokens of its own (11): (11 - 1) // 4 = 2 blocks, 8 tokens."""
    rows = [[(SYSTEM, 8), (out(0), 1)], [(SYSTEM, 8), (out(1), 1)], [(SYSTEM, 8), (msg(2), 3), (out(2), 1)]]
    e = run([8, 8, 11], [1, 1, 1], [0, 0.05, 0.1], mode, content=content_of(rows))
    assert [s.new_computed for s in e.tracer.steps if s.new_computed] == [[(0, 0)], [(1, 4)], [(2, 8)]]
    assert [s.scheduled for s in e.tracer.steps] == [[(0, 8, 0)], [(1, 4, 0)], [(2, 3, 0)]]
    assert list(e.num_cached_tokens) == [0, 4, 8]
    assert (e.prefix_cache_stats.queries, e.prefix_cache_stats.hits) == (27, 12)


@pytest.mark.parametrize("mode", MODES)
def test_requests_admitted_in_one_step_share_blocks(mode):
    """A and B arrive together with the same 8-token system prompt and 2 tokens of their own: A's first
    chunk caches the system prompt's 2 blocks when it is allocated, so B, looked up next in the same step,
    hits them (8 tokens) and holds only its own third block: 3 + 1 blocks used, not 6."""
    rows = [[(SYSTEM, 8), (msg(0), 2), (out(0), 2)], [(SYSTEM, 8), (msg(1), 2), (out(1), 2)]]
    e = run([10, 10], [2, 2], [0, 0], mode, content=content_of(rows))
    first = e.tracer.steps[0]
    assert first.scheduled == [(0, 10, 0), (1, 2, 0)]
    assert first.new_computed == [(0, 0), (1, 8)]
    assert first.kv_blocks_used == 4


@pytest.mark.parametrize("mode", MODES)
def test_decode_blocks_are_cached_as_they_fill_so_the_next_turn_hits_its_history(mode):
    """Turn 1: message m0 (3 tokens), output o0 (6). Its block 0 (m0 + o0's first token) and block 1
    (o0's tokens 2-5) fill while it decodes. Turn 2 (after turn 1 finished) resends m0 + o0 and adds m1
    (2): 11 tokens, hit (11 - 1) // 4 = 2 blocks = 8 tokens, of which 5 are turn 1's output."""
    rows = [[(msg(0), 3), (out(0), 6)], [(msg(0), 3), (out(0), 6), (msg(1), 2), (out(1), 1)]]
    e = run([3, 11], [6, 1], [0, 0.5], mode, content=content_of(rows))
    assert [s.new_computed for s in e.tracer.steps if s.new_computed] == [[(0, 0)], [(1, 8)]]
    assert e.tracer.steps[-1].scheduled == [(1, 3, 0)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finished_request_caches_the_block_its_last_computed_token_fills(mode, async_scheduling):
    """Turn 1: m0 (3 tokens), 6 outputs: its last step computes token 8 (P + O - 1 = 8, two blocks). Sync:
    that step knows 8 tokens and caches both blocks. Async: it knows only 7 (the token in flight), caching
    block 0; its last output is then processed before its blocks are freed (vLLM 0.32
    ``AsyncScheduler._update_request_with_output``: ``num_computed_tokens - num_output_placeholders`` = 8,
    no further step scheduled), caching block 1. Turn 2 (after turn 1 finished) resends m0 + o0 and adds m1
    (2): 11 tokens, cap 2 blocks: hit 8 either way."""
    rows = [[(msg(0), 3), (out(0), 6)], [(msg(0), 3), (out(0), 6), (msg(1), 2), (out(1), 1)]]
    e = run([3, 11], [6, 1], [0, 0.5], mode, content=content_of(rows), async_scheduling=async_scheduling)
    assert [s.new_computed for s in e.tracer.steps if s.new_computed] == [[(0, 0)], [(1, 8)]]
    assert e.tracer.steps[-1].scheduled == [(1, 3, 0)]


@pytest.mark.parametrize("mode", MODES)
def test_hits_on_free_queue_blocks_cost_free_blocks_hits_on_held_ones_do_not(mode):
    """H: 12 own prompt tokens, 4 output (3 blocks, 4 from step 1, finishes after step 3). A: the 8-token
    system prompt (2 blocks), 1 output; B (arrives during step 0): the system prompt + 4 own tokens, 1
    output, so its hit is 2 blocks (8 tokens) and it needs 3 blocks in all.

    Free-queue case, 6 usable blocks: A finishes after step 0, its 2 cached blocks go to the free queue;
    step 1: H takes the last uncached block, 2 free blocks are left, both A's. B needs 3 - 2 + 2 = 3 > 2
    (its hit blocks leave the free queue): it waits until H finishes, and is admitted in step 4.
    Held case, 8 usable blocks, A decodes on: after H's and A's step-1 blocks 1 block is free and B needs
    3 - 2 = 1 (hits on blocks a running request holds cost nothing): admitted in step 1."""
    def admitted(engine):
        return {r: (i, hit) for i, s in enumerate(engine.tracer.steps) for r, hit in s.new_computed}

    def rows(a_output):
        return [[(msg(9), 12), (out(9), 4)], [(SYSTEM, 8), (out(1), a_output)], [(SYSTEM, 8), (msg(2), 4), (out(2), 1)]]
    e = run([12, 8, 12], [4, 1, 1], [0, 0, 0.005], mode, kv_blocks=7, content=content_of(rows(1)))
    assert admitted(e)[2] == (4, 8)
    e = run([12, 8, 12], [4, 10, 1], [0, 0, 0.005], mode, kv_blocks=9, content=content_of(rows(10)))
    assert admitted(e)[2] == (1, 8)


def test_free_queue_lru_order_uncached_to_the_front_and_the_null_block():
    """The manager on its own: 1 null + 6 usable blocks. Request 0 frees 3 blocks of which 2 are cached
    (own chain), request 1 then frees 2 cached ones: queue = [uncached x (free)] [0's block 1, 0's block 0]
    [1's block 1, 1's block 0]. Popping past the uncached blocks evicts request 0's block 1 first (its
    chain's end, the least recently freed), then its block 0, then request 1's."""
    manager = BlockManager(7, 4, True)
    assert manager.num_free == 6  # block 0 is the null block
    manager.sync(1)  # requests 0 and 1 allocate 3 + 2 blocks
    assert manager.free(0, 3, 9, 1) == 3  # 9 cached tokens: blocks 0, 1 cached, block 2 uncached
    assert manager.free(1, 2, 8, 4) == 2
    assert (manager.num_free, manager.num_uncached) == (6, 2)
    assert manager.lookup(0, 13, 6).num_blocks == 2 and manager.lookup(1, 9, 6).num_blocks == 2
    manager.sync(4)  # two pops take the uncached blocks (the partial block was put at the front)
    assert manager.lookup(0, 13, 4).num_blocks == 2
    manager.sync(3)  # the next pop evicts request 0's block 1
    assert manager.lookup(0, 13, 3).num_blocks == 1 and manager.lookup(1, 9, 3).num_blocks == 2
    manager.sync(2)
    assert manager.lookup(0, 13, 2).num_blocks == 0 and manager.lookup(1, 9, 2).num_blocks == 2
    manager.sync(1)
    assert manager.lookup(1, 9, 1).num_blocks == 1


def test_shared_blocks_are_freed_in_reverse_order():
    """Explicit (shareable) blocks: request 0's two system-prompt blocks go to the free queue last block
    first, so one pop past the uncached blocks evicts its block 1 and request 1 (same system prompt) still
    hits block 0."""
    rows = [[(SYSTEM, 8), (out(0), 1)], [(SYSTEM, 8), (msg(1), 4), (out(1), 1)]]
    manager = BlockManager(4, 4, True, content_of(rows))  # 3 usable blocks
    manager.sync(1)  # request 0 allocates 2 blocks
    manager.cache(0, 8)
    assert manager.free(0, 2, 8, 1) == 2
    assert manager.lookup(1, 12, 3).num_blocks == 2
    manager.sync(1)  # the uncached block, then request 0's block 1
    hit = manager.lookup(1, 12, 1)
    assert (hit.num_blocks, hit.num_evictable) == (1, 1)


def test_eagle_drops_the_last_matched_block():
    """With an EAGLE-family drafter the hit is one block shorter (vLLM ``drop_eagle_block``)."""
    for use_eagle, want in ((False, 2), (True, 1)):
        manager = BlockManager(10, 4, True, use_eagle=use_eagle)
        manager.sync(6)
        manager.free(0, 3, 8, 6)
        hit = manager.lookup(0, 9, 9)
        assert (hit.num_blocks, hit.num_evictable) == (want, want)


@pytest.mark.parametrize("mode", MODES)
def test_prefix_caching_off_changes_nothing_and_reports_nothing(mode):
    rows = [[(SYSTEM, 8), (out(0), 2)], [(SYSTEM, 8), (out(1), 2)]]
    kw = dict(kv_blocks=100, block_size=4, mode=mode, step_model=flat_step_model(0.01))
    on = run_engine([8, 8], [2, 2], [0, 0], enable_prefix_caching=True, content=content_of(rows), **kw)
    off = run_engine([8, 8], [2, 2], [0, 0], enable_prefix_caching=False, content=content_of(rows), **kw)
    assert on.output().prefix_cache["hits"] == 4
    assert off.output().prefix_cache == {} and off.output().requests.num_cached_tokens.tolist() == [0, 0]
    assert on.output().requests.num_cached_tokens.tolist() == [0, 4]


# ------------------------------------------------------------------------------ with speculative decoding

def run_spec(prompt, output, arrival_s, mode, method, k, accept, kv_blocks=100, content=None, block_size=4,
             max_num_batched_tokens=8192, async_scheduling=False, mtp_layers=1, tracer=True) -> Engine:
    """A speculative engine (free drafter, flat 10 ms step) whose request ``r`` accepts ``accept[r][j]``
    drafts in its ``j``-th verification round (0 past the list), as the oracle's fake model runner."""
    cfg = SpeculativeConfig.model_validate({"method": method, "num_speculative_tokens": k, "acceptance": {"alpha": 0.7},
                                            **({"draft_cost": 0.1} if method == "draft_model" else {})})
    table = np.concatenate([np.asarray(list(a)[:o] + [0] * (o - len(a[:o])), dtype=np.int32)
                            for a, o in zip(accept, output)])
    setup = SpecSetup(schedule=KSchedule(k, None), lookahead=cfg.lookahead_slots, disable_by_batch_size=None,
                      drafts_may_be_empty=cfg.drafts_may_be_empty,
                      drafter=DrafterCost(kind="cpu", cpu_subps_per_request=0), profile=load_profile({"alpha": 0.7}),
                      uniforms=None, factors=None, accept_table=table, draft_slots=cfg.max_num_new_slots_for_drafting,
                      prefill_lookahead=cfg.num_prefill_lookahead_tokens(mtp_layers))
    times = np.rint(np.asarray(arrival_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tolist()
    engine = Engine(speculation=setup, prompt_tokens=np.asarray(prompt), output_tokens=np.asarray(output),
                        arrivals=ArrivalSource(times=times, num_requests=len(times)), step_time=flat_step_model(0.01),
                        kv_blocks_total=kv_blocks, block_size=block_size, max_num_seqs=16,
                        max_num_batched_tokens=max_num_batched_tokens, mode=mode, async_scheduling=async_scheduling,
                        enable_prefix_caching=True, content=content)
    engine.tracer = StepTracer() if tracer else None
    env = simpy.Environment()
    env.process(engine.process(env))
    env.run()
    return engine


def hits(engine) -> list[list[tuple[int, int]]]:
    return [s.new_computed for s in engine.tracer.steps if s.new_computed]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method, drop", [("eagle", True), ("eagle3", True), ("mtp", True), ("ngram", False),
                                          ("draft_model", False), ("medusa", False)])
def test_eagle_family_hits_drop_their_last_block_other_methods_do_not(mode, method, drop):
    """A: a 12-token system prompt, 2 outputs (its 3 prompt blocks cached). B (after A finished): the
    system prompt + 3 tokens of its own (15): cap (15 - 1) // 4 = 3 blocks = 12 tokens; EAGLE, EAGLE-3
    and MTP then drop the last one (vLLM ``use_eagle``): 8."""
    rows = [[(SYSTEM, 12), (out(0), 2)], [(SYSTEM, 12), (msg(1), 3), (out(1), 1)]]
    e = run_spec([12, 15], [2, 1], [0, 0.1], mode, method, 2, [[0], []], content=content_of(rows))
    assert hits(e) == [[(0, 0)], [(1, 8 if drop else 12)]]


@pytest.mark.parametrize("mode", MODES)
def test_verify_step_caches_verified_tokens_not_drafts(mode):
    """n-gram k = 3, block size 4. A: message m0 (3 tokens), 12 outputs, accepting 0, 0, 3 drafts. Step 0:
    prefill, 1 token sampled (4 known). Step 1 schedules 1 + 3 tokens: cached min(3 + 4, 4) = 4 tokens
    (block 0), not the drafts; 0 accepted. Step 2: 5 known: still block 0 only (with the drafts it would
    be 4 + 4 = 8, two blocks). B arrives during step 1 with m0 + o0's first 5 tokens + 2 of its own (10):
    hit 1 block (4 tokens) in step 2, 6 computed."""
    rows = [[(msg(0), 3), (out(0), 12)], [(msg(0), 3), (out(0), 5), (msg(1), 2), (out(1), 1)]]
    e = run_spec([3, 10], [12, 1], [0, 0.015], mode, "ngram", 3, [[0, 0, 3, 3], []], content=content_of(rows))
    assert [s.scheduled for s in e.tracer.steps[:3]] == [[(0, 3, 0)], [(0, 4, 3)], [(0, 4, 3), (1, 6, 0)]]
    assert hits(e) == [[(0, 0)], [(1, 4)]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("method, drop", [("ngram", False), ("eagle", True)])
def test_next_turn_hits_the_verified_output_of_the_previous_turn(mode, async_scheduling, method, drop):
    """k = 3, turn 1: m0 (5 tokens), 7 outputs, accepting 3 and 3. Sync: step 0 samples token 6; step 1
    caches 6 known tokens (block 0), accepts 3 (10 known); step 2 caches 10 (block 1) and finishes (7
    outputs of 8 emitted): 13 computed tokens, but 8 cached (its last scheduling). Async: the last
    output is processed before the blocks are freed (vLLM's ``AsyncScheduler`` caches again then,
    ``num_computed_tokens - num_output_placeholders`` = 13 - 2: the placeholders of the 2 accepted drafts
    cut at max_tokens stay, as ``tests/data/golden/prefix_async_trimmed_verify`` shows): 11 cached, still
    2 blocks. Turn 2 (after turn 1) resends m0 + o0 + 2 tokens (14): cap 3 blocks; hits 8, a block less
    with EAGLE."""
    rows = [[(msg(0), 5), (out(0), 7)], [(msg(0), 5), (out(0), 7), (msg(1), 2), (out(1), 1)]]
    e = run_spec([5, 14], [7, 1], [0, 0.5], mode, method, 3, [[3, 3], []], content=content_of(rows),
                 async_scheduling=async_scheduling)
    want = 8 - (4 if drop else 0)
    assert hits(e) == [[(0, 0)], [(1, want)]]
    assert e.output().requests.num_cached_tokens.tolist() == [0, want]


@pytest.mark.parametrize("mode", MODES)
def test_preempted_spec_request_rehits_the_blocks_cached_when_last_scheduled(mode):
    """n-gram k = 1, every draft accepted, 5 usable blocks. Step 0: A (8 tokens) and B (6) prefill (2
    blocks each), 1 token each. Step 1: both verify 2 tokens; A takes a third block; B caches min(6 + 2,
    7) = 7 tokens (block 0 only), then computes 8 (the accepted draft fills block 1, not cached yet).
    Step 2: B needs a third block, none is free: B is preempted; A finishes (5 outputs). Step 3: B (9
    known tokens) re-hits its block 0: 4 tokens (its block 1 has no hash), 5 computed."""
    e = run_spec([8, 6], [5, 8], [0, 0], mode, "ngram", 1, [[1] * 8, [1] * 8], kv_blocks=6)
    assert [([(r, n) for r, n, _ in s.scheduled], s.preempted, s.kv_blocks_used, s.new_computed)
            for s in e.tracer.steps[:4]] == [
        ([(0, 8), (1, 6)], [], 4, [(0, 0), (1, 0)]), ([(0, 2), (1, 2)], [], 5, []), ([(0, 2)], [1], 3, []),
        ([(1, 5)], [], 3, [(1, 4)])]
    stats = e.prefix_cache_stats
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 4)


def test_mtp_with_several_layers_caches_all_but_its_last_k_minus_one_tokens():
    """MTP, k = 3; with 3 layers vLLM's ``num_reprefillable_tokens`` = 2 tokens are held back. A: a
    p-token system prompt, 2 outputs (accepting 0: it finishes in its first verify step, which caches
    min(p + 4, p + 1) - 2 = p - 1 tokens). B (after A): the system prompt + 3 tokens, cap (p + 2) // 4
    blocks, less the MTP block drop. p = 13: 12 cached tokens, 3 blocks, hit 2 blocks = 8 (one layer: 14
    cached, the same). p = 12: 11 cached, 2 blocks, hit 4 (one layer: 13 cached, 3 blocks, hit 8)."""
    for prompt, layers, want in ((13, 3, 8), (13, 1, 8), (12, 3, 4), (12, 1, 8)):
        rows = [[(SYSTEM, prompt), (out(0), 2)], [(SYSTEM, prompt), (msg(1), 3), (out(1), 1)]]
        for mode in MODES:
            e = run_spec([prompt, prompt + 3], [2, 1], [0, 0.1], mode, "mtp", 3, [[0], []],
                         content=content_of(rows), mtp_layers=layers)
            assert hits(e)[1] == [(1, want)], (prompt, layers, mode)


# ------------------------------------------------------------------------------ step = run

def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    prompt, output = rng.integers(1, 120, n), rng.integers(1, 60, n)
    arrival = np.sort(rng.uniform(0, 0.5, n))
    content = None
    if seed % 2:
        shared = rng.integers(0, 80, n)
        content = SequenceContent.unique(prompt, output).prepend(
            content_id(NAMESPACE_SYSTEM_PROMPT, rng.integers(0, 3, n)), shared)
        prompt = prompt + shared
    kv = int(rng.integers(-(-int((prompt + output).max()) // 16) + 2, 60))  # tight: preemptions
    kw = dict(kv_blocks=kv, block_size=16, max_num_batched_tokens=int(rng.integers(64, 512)),
              enable_prefix_caching=True, content=content, async_scheduling=bool(seed % 3 == 0))
    return prompt, output, arrival, kw


@pytest.mark.parametrize("seed", range(24))
def test_run_mode_equals_step_mode_with_shared_prefixes_and_preemptions(seed):
    prompt, output, arrival, kw = _random_case(seed)
    got = {}
    for mode in MODES:
        e = run_engine(prompt, output, arrival, mode=mode, tracer=StepTracer(), **kw)
        o = e.output()
        got[mode] = ([(s.start_ps, s.scheduled, s.preempted, s.kv_blocks_used, s.num_waiting, s.new_computed,
                       s.prefix_cache) for s in e.tracer.steps],
                     o.requests.finish_s.tolist(), o.requests.num_cached_tokens.tolist(), o.prefix_cache)
    assert got["step"] == got["run"]


SPEC_METHODS = [("eagle", 1), ("ngram", 1), ("draft_model", 1), ("mtp", 3), ("eagle3", 1), ("medusa", 1)]


@pytest.mark.parametrize("seed", range(18))
def test_spec_run_mode_equals_step_mode_with_shared_prefixes_and_preemptions(seed):
    """Speculative decoding with prefix caching (every method, sync and async, tight pools, shared system
    prompts on odd seeds, random acceptance with empty n-gram rounds): identical steps, hits, statistics,
    finish times and speculative counters in both modes."""
    prompt, output, arrival, kw = _random_case(seed)
    method, layers = SPEC_METHODS[seed % len(SPEC_METHODS)]
    rng = np.random.default_rng(1000 + seed)
    k = 3
    accept = [rng.integers(-1 if method == "ngram" else 0, k + 1, int(o)).tolist() for o in output]
    lookahead = k if method in ("eagle", "eagle3", "mtp", "draft_model") else 0
    kv = max(kw["kv_blocks"], -(-int((prompt + output).max() + k + lookahead) // 16) + 1)
    got = {}
    for mode in MODES:
        e = run_spec(prompt, output, arrival, mode, method, k, accept, kv_blocks=kv, content=kw["content"],
                     block_size=16, max_num_batched_tokens=kw["max_num_batched_tokens"],
                     async_scheduling=kw["async_scheduling"], mtp_layers=layers)
        o = e.output()
        got[mode] = ([(s.start_ps, s.scheduled, s.preempted, s.kv_blocks_used, s.num_waiting, s.new_computed,
                       s.prefix_cache) for s in e.tracer.steps],
                     o.requests.finish_s.tolist(), o.requests.num_cached_tokens.tolist(), o.prefix_cache,
                     o.spec_counters)
    assert got["step"] == got["run"]
    if seed % 2:
        assert got["run"][3]["hits"] > 0


WORKLOADS = {
    "multi_turn": {"type": "multi_turn", "rate": 5, "num_sessions": 30, "turns": {"type": "uniform", "low": 1, "high": 5},
                   "message_tokens": {"type": "fixed", "value": 150}, "output_tokens": {"type": "uniform", "low": 10, "high": 200},
                   "think_time_s": 2},
    "system_prompts": {"type": "poisson", "rate": 20, "num_requests": 150,
                       "prompt_tokens": {"type": "uniform", "low": 5, "high": 300},
                       "output_tokens": {"type": "uniform", "low": 5, "high": 200},
                       "system_prompts": {"num_prompts": 4, "prompt_tokens": {"type": "uniform", "low": 100, "high": 900}}},
    "mooncake_hash_ids": {"type": "trace", "path": "workloads/traces/conversation_trace.jsonl", "hash_ids": True,
                          "max_requests": 150},
}


TIGHT_BLOCKS = {"multi_turn": 150, "system_prompts": 300, "mooncake_hash_ids": 9000}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("tight", [False, True])
def test_summary_run_equals_step_on_prefix_workloads(name, tight):
    """Whole runs through the config (the workload's content wired to the engine): the same summary and
    requests in both modes, with prefix-cache hits, and with preemptions in a tight KV pool."""
    results = {}
    for mode in MODES:
        config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOADS[name],
                  "simulation": {"mode": mode}, "seed": 3,
                  "engine": {"num_gpu_blocks_override": TIGHT_BLOCKS[name]} if tight else {}}
        results[mode] = simulate(config)
    step, fast = results["step"], results["run"]
    assert json.dumps(step.summary, sort_keys=True) == json.dumps(fast.summary, sort_keys=True)
    pd.testing.assert_frame_equal(step.requests, fast.requests, check_exact=True)
    assert fast.summary["prefix_cache"]["hits"] > 0
    if tight:
        assert fast.summary["preemptions"] > 0


@pytest.mark.parametrize("name", ["multi_turn", "system_prompts"])
@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("method", ["eagle", "ngram"])
def test_spec_summary_run_equals_step_on_prefix_workloads(name, tight, method):
    """As above with speculative decoding (prefix caching stays on, as in vLLM): the same summary,
    requests and speculative counters in both modes, with hits, and preemptions in a tight pool."""
    results = {}
    for mode in MODES:
        config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOADS[name],
                  "simulation": {"mode": mode}, "seed": 5,
                  "speculative_config": {"method": method, "num_speculative_tokens": 3},
                  "engine": {"num_gpu_blocks_override": TIGHT_BLOCKS[name]} if tight else {}}
        results[mode] = simulate(config)
    step, fast = results["step"], results["run"]
    assert json.dumps(step.summary, sort_keys=True) == json.dumps(fast.summary, sort_keys=True)
    pd.testing.assert_frame_equal(step.requests, fast.requests, check_exact=True)
    assert step.output.spec_counters == fast.output.spec_counters
    assert fast.summary["prefix_cache"]["hits"] > 0 and fast.info["enable_prefix_caching"]
    if tight:
        assert fast.summary["preemptions"] > 0


def test_metrics_per_replica_and_merged_and_off():
    """Two replicas: each replica's summary has its own prefix-cache counters and the merged summary
    their sums; hit_rate = hits / queries; requests.csv's num_cached_tokens sums to the first-admission
    hits. With prefix caching off: no prefix_cache entry, num_cached_tokens all 0."""
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOADS["system_prompts"], "seed": 1,
              "deployment": {"replicas": 2}}
    res = simulate(config)
    merged, replicas = res.summary["prefix_cache"], [r["prefix_cache"] for r in res.summary["replicas"]]
    for key in ("requests", "queries", "hits", "preempted_queries", "preempted_hits"):
        assert merged[key] == sum(r[key] for r in replicas)
    assert all(r["hits"] > 0 for r in replicas)
    assert merged["requests"] == 150 and merged["hit_rate"] == merged["hits"] / merged["queries"]
    assert int(res.requests["num_cached_tokens"].sum()) == merged["hits"]
    off = simulate({**config, "engine": {"enable_prefix_caching": False}})
    assert "prefix_cache" not in off.summary and not off.requests["num_cached_tokens"].any()
    assert off.summary["ttft_s"]["mean"] > res.summary["ttft_s"]["mean"]  # the cached prefixes are not recomputed


@pytest.mark.parametrize("spec", [None, {"method": "eagle", "num_speculative_tokens": 3}])
def test_the_multi_turn_workload_file_hits_the_prefix_cache_as_its_docs_say(spec):
    # multi-turn-chat.yaml said its shared prefixes were for "prefix caching, which the engine does not model
    # yet", and EngineConfig's docstring that speculative runs go without it: both false
    from pathlib import Path

    from servesim.config.models import EngineConfig

    workloads = Path(__file__).resolve().parents[1] / "workloads"
    assert "does not model" not in (workloads / "multi-turn-chat.yaml").read_text(encoding="utf-8")
    assert "Not modelled with speculative decoding" not in " ".join(EngineConfig.__doc__.split())
    import yaml

    workload = {**yaml.safe_load((workloads / "multi-turn-chat.yaml").read_text(encoding="utf-8")), "num_sessions": 30}
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": workload,
              **({"speculative_config": spec} if spec else {})}
    summary = simulate(config).summary
    assert summary["prefix_cache"]["hits"] > 0


class _Content:
    """The fields of SequenceContent that shareable_blocks reads."""

    def __init__(self, content_ids, segment_request, segment_starts, sequence_tokens):
        self.content_ids, self.segment_request = content_ids, segment_request
        self.segment_starts, self.sequence_tokens = segment_starts, sequence_tokens

    def __len__(self) -> int:
        return len(self.sequence_tokens)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shareable_blocks_counts_the_requests_of_each_content_id_once(seed):
    # per request: its leading blocks before its first segment whose content id no other request has, by a
    # Python dict of id -> requests and by numpy's unique over the stacked (id, request) pairs (the former code)
    from servesim.engine.block_manager import shareable_blocks

    rng = np.random.default_rng(seed)
    n, block_size = 60, 16
    requests, ids, starts = [], [], []
    for r in rng.permutation(n):  # segments in no particular request order
        at = 0
        for _ in range(int(rng.integers(1, 6))):
            requests.append(r)
            ids.append(int(rng.integers(0, 40)) | (int(rng.integers(2, 5)) << 56))  # repeats within and across
            starts.append(at)
            at += int(rng.integers(1, 80))
    ids_array = np.array(ids, dtype=np.uint64)
    req_array = np.array(requests, dtype=np.int64)
    start_array = np.array(starts, dtype=np.int64)
    tokens = np.array([1 + max([s + 50 for s, q in zip(starts, requests) if q == r] or [50]) for r in range(n)])
    content = _Content(ids_array, req_array, start_array, tokens.astype(np.int64))
    got = shareable_blocks(content, block_size)
    owners: dict[int, set[int]] = {}
    for q, i in zip(requests, ids):
        owners.setdefault(i, set()).add(q)
    expected = []
    for r in range(n):
        solo_starts = [s for s, q, i in zip(starts, requests, ids) if q == r and len(owners[i]) == 1]
        expected.append(min(solo_starts + [int(tokens[r])]) // block_size)
    assert got.tolist() == expected
    pairs = np.unique(np.stack([ids_array, req_array.astype(np.uint64)], axis=1), axis=0)
    uniq, counts = np.unique(pairs[:, 0], return_counts=True)
    solo = counts[np.searchsorted(uniq, ids_array)] == 1
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, req_array[solo], start_array[solo])
    assert got.tolist() == (np.minimum(first, tokens) // block_size).tolist()
    assert 0 < sum(got) < sum(tokens // block_size)  # some blocks shared, some not
