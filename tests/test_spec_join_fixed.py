"""Run mode's fixed-width join (one global cumulative sum of the precomputed acceptance table,
``SpeculativeDecoding._join_fixed``) builds exactly the timeline of the general join, draw by draw: the same
rounds, computed tokens, KV blocks held and allocated, and per-step sums, with and without async scheduling,
also in the states the Azure runs never reach (a decoder holding more blocks than its first round needs, and
more rejected drafts in flight than its verify width)."""
from __future__ import annotations

import numpy as np
import pytest
import simpy

from engine_helpers import flat_step_model
from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.speculative_decoding import SpecSetup
from servesim.speculation.costs import DrafterCost
from servesim.speculation.profile import load_profile
from servesim.speculation.schedule import KSchedule

K = 3
BLOCK_SIZE = 4


def make_engine(table: np.ndarray, prompt: list[int], output: list[int], async_scheduling: bool,
                tree_nodes: int | None) -> Engine:
    setup = SpecSetup(schedule=KSchedule(K, None), lookahead=K, disable_by_batch_size=None, drafts_may_be_empty=False,
                      drafter=DrafterCost(kind="cpu", cpu_subps_per_request=0), profile=load_profile({"alpha": 0.7}),
                      uniforms=None, factors=None, accept_table=table, tree_nodes=tree_nodes)
    return Engine(speculation=setup, prompt_tokens=np.asarray(prompt), output_tokens=np.asarray(output),
                  arrivals=ArrivalSource(times=[0] * len(prompt), num_requests=len(prompt)),
                  step_time=flat_step_model(0.01), kv_blocks_total=100_000, block_size=BLOCK_SIZE, max_num_seqs=64,
                  max_num_batched_tokens=8192, mode="run", async_scheduling=async_scheduling,
                  enable_prefix_caching=True)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("tree_nodes", [None, 5])
@pytest.mark.parametrize("block_requests", [4096, 7])  # one cumulative sum, or one per 7 requests
def test_fixed_join_matches_the_general_join(async_scheduling, tree_nodes, block_requests, monkeypatch):
    from servesim.engine import speculative_decoding

    monkeypatch.setattr(speculative_decoding, "EMITTED_BLOCK_REQUESTS", block_requests)
    rng = np.random.default_rng(20261201)
    num_requests = 40
    prompt = rng.integers(1, 60, num_requests).tolist()
    output = rng.integers(2, 90, num_requests).tolist()
    table = rng.integers(0, K + 1, sum(output)).astype(np.int32)
    fast, general = (make_engine(table, prompt, output, async_scheduling, tree_nodes) for _ in range(2))
    general.decoding.fixed_table = False  # the general path, for the same draws
    assert fast.decoding.fixed_table
    q = (tree_nodes if tree_nodes is not None else K) + 1
    states = set()
    for r in range(num_requests):
        # the decoder's state at its join: rounds and tokens so far (its first join: 0 rounds, 1 token),
        # blocks held (also more than its first round needs) and the rejected drafts of its last round
        first = r % 3 == 0
        rounds = 0 if first else int(rng.integers(0, output[r] - 1))
        generated = 1 if first else int(rng.integers(rounds + 1, output[r]))
        computed = prompt[r] + generated - 1
        need = -(-(computed + q + K) // BLOCK_SIZE)
        blocks = need + int(rng.integers(-2, 4))
        rejected = int(rng.integers(0, q + 3))
        g = int(rng.integers(1, 50))
        for engine in (fast, general):
            decoding = engine.decoding
            engine.num_computed[r], engine.num_generated[r], engine.num_blocks[r] = computed, generated, blocks
            decoding.rounds_done[r] = rounds
            engine.rejected_drafts[r], engine.rejected_at_step[r] = rejected, g - 1 - (r % 2)
            decoding.start_decode(r)
            decoding.join(r, g, K)
        a, b = fast.decoding.timelines[r], general.decoding.timelines[r]
        assert (a.start_step, a.num_rounds, a.generated_at_start, a.blocks_at_start, a.round_at_start, a.scheduled,
                a.k) == (b.start_step, b.num_rounds, b.generated_at_start, b.blocks_at_start, b.round_at_start,
                         b.scheduled, b.k), f"request {r}"
        for name in ("computed_before", "blocks_held", "accepted", "new_blocks"):
            assert getattr(a, name).tolist() == getattr(b, name).tolist(), f"request {r} {name}"
        assert fast.finish_step[r] == general.finish_step[r] == g + a.num_rounds - 1
        states.add((first, blocks > need, async_scheduling and r % 2 == 0 and rejected > q))
    for name in ("step_computed", "step_new_blocks"):
        assert getattr(fast.decoding, name).tolist() == getattr(general.decoding, name).tolist(), name
    assert len(fast.decoding.emitted_blocks) == -(-num_requests // block_requests)  # none finished: all kept
    assert {(True, True), (False, True), (True, False), (False, False)} <= {s[:2] for s in states}
    assert any(s[2] for s in states) == async_scheduling  # rejected drafts wider than the verify (async only)
    # leaving writes back the same state
    for r in range(num_requests):
        timeline = fast.decoding.timelines[r]
        g = timeline.start_step + min(r % 5, timeline.num_rounds)
        assert fast.decoding.leave(r, g) == general.decoding.leave(r, g)
        for field in ("num_computed", "num_generated", "num_blocks", "rejected_drafts", "kv_cached_tokens",
                      "emitted_tokens"):
            assert getattr(fast, field)[r] == getattr(general, field)[r], f"request {r} {field}"
    assert fast.decoding.counters() == general.decoding.counters()


def test_cumulative_sum_built_in_chunks_and_blocks(monkeypatch):
    """A block's ``C[j + 2]`` = tokens emitted by its requests' rounds before its round ``j`` (1 + accepted
    each), two leading zeros, the same for any chunking of the build; per request, C at its first draw and
    where its rounds from the first join end."""
    from servesim.engine import speculative_decoding

    rng = np.random.default_rng(7)
    output = rng.integers(2, 30, 25).tolist()
    table = rng.integers(0, K + 1, sum(output)).astype(np.int32)
    offsets = np.concatenate(([0], np.cumsum(output)[:-1])).tolist()
    for block_requests in (4096, 6):
        monkeypatch.setattr(speculative_decoding, "EMITTED_BLOCK_REQUESTS", block_requests)
        for chunk in (7, 1 << 20):
            monkeypatch.setattr(speculative_decoding, "EMITTED_CHUNK", chunk)
            engine = make_engine(table, [10] * len(output), output, True, None)
            decoding = engine.decoding  # (the strategy holds its engine weakly)
            for b in range(-(-len(output) // block_requests)):
                lo, hi = b * block_requests, min((b + 1) * block_requests, len(output))
                rounds = table[offsets[lo]: offsets[hi - 1] + output[hi - 1]]
                want = [0, 0] + np.concatenate(([0], np.cumsum(rounds + 1))).tolist()
                block = decoding._emitted_block(b)
                assert (block.first_request, block.end_request, block.first_round) == (lo, hi, offsets[lo])
                assert block.emitted_before.tolist() == want, f"chunk {chunk}, block {b}"
                local = [o - offsets[lo] for o in offsets[lo:hi]]
                assert list(block.first_before) == [want[o + 2] for o in local]
                # a first join's rounds end where the emitted tokens reach its output less the prefill's token
                assert list(block.first_stop) == [next(i for i in range(o + 2, len(want)) if want[i] >= want[o + 2] + n - 1)
                                                  for o, n in zip(local, output[lo:hi])]


def test_blocks_of_finished_requests_are_dropped_and_change_nothing(monkeypatch):
    """A block's cumulative sum is dropped, when the next block is built, once all its requests have
    finished; the run is the same as with one block for all."""
    from servesim.engine import speculative_decoding

    rng = np.random.default_rng(11)
    num_requests = 30
    output = rng.integers(2, 40, num_requests).tolist()
    table = rng.integers(0, K + 1, sum(output)).astype(np.int32)
    results = {}
    for block_requests in (4096, 2):
        monkeypatch.setattr(speculative_decoding, "EMITTED_BLOCK_REQUESTS", block_requests)
        engine = make_engine(table, [10] * num_requests, output, True, None)
        # one request every 10 s: each finishes (in well under 1 s of 10 ms steps) before the next arrives
        engine.arrivals = ArrivalSource(times=[r * 10 * 10**12 for r in range(num_requests)], num_requests=num_requests)
        env = simpy.Environment()
        env.process(engine.process(env))
        env.run()
        live = sorted(engine.decoding.emitted_blocks)
        out = engine.output()
        results[block_requests] = (out.requests.finish_s.tolist(), out.steps.durations_s.tolist(), out.spec_counters)
        if block_requests == 2:
            assert live == [num_requests // 2 - 1]  # only the last block, built after the others finished
    assert results[2] == results[4096]
