"""Run mode's aggregate under async scheduling, against step mode on a hand-checked case: a request that
finished in the previous step without vLLM knowing it would (its accepted drafts reached its output
length) is scheduled once more, and when the KV cache cannot hold that repeat it is the preemption victim,
as the last running request (``Engine._preempt_aggregated``), while the decoder before it keeps its step."""

from __future__ import annotations

import pytest

from servesim.engine.core import Engine
import test_prefix_caching
from test_prefix_caching import run_spec

# Requests 0 and 1: prompts 3 and 2, 12 output tokens each, accepting no draft. Request 2: prompt 1, 3
# output tokens, accepting both of its 2 drafts in its first verify, so it emits 3 tokens and finishes in
# step 1 unknown to vLLM. Blocks of 4 tokens, 6 usable (7 with the null block), EAGLE k = 2 (2 lookahead
# slots).
CASE = dict(prompt=[3, 2, 1], output=[12, 12, 3], arrival_s=[0.0, 0.0, 0.0], method="eagle", k=2,
            accept=[[0] * 30, [0] * 30, [2] * 5], kv_blocks=7, block_size=4, async_scheduling=True)


def _run(mode: str, monkeypatch) -> tuple[Engine, list[int]]:
    removed: list[int] = []

    class RecordingEngine(Engine):
        """Notes the repeated finished requests each aggregated preemption removes (a subclass: the compiled
        Engine's type cannot be patched)."""

        def _preempt_aggregated(self, g, new_blocks, need_partial, partial_scheduled, zombies=None):
            before = set(zombies or ())
            out = super()._preempt_aggregated(g, new_blocks, need_partial, partial_scheduled, zombies)
            removed.extend(sorted(before - set(zombies or ())))
            return out

    monkeypatch.setattr(test_prefix_caching, "Engine", RecordingEngine)
    engine = run_spec(CASE["prompt"], CASE["output"], CASE["arrival_s"], mode, CASE["method"], CASE["k"],
                      CASE["accept"], kv_blocks=CASE["kv_blocks"], block_size=CASE["block_size"],
                      async_scheduling=CASE["async_scheduling"])
    assert type(engine) is RecordingEngine
    return engine, removed


def test_a_repeated_finished_request_is_the_victim_when_its_blocks_do_not_fit(monkeypatch):
    step, removed_step = _run("step", monkeypatch)
    run, removed_run = _run("run", monkeypatch)
    # by hand: step 0 prefills the three (2 + 1 + 1 blocks for prompt + 2 lookahead slots); step 1 verifies
    # 1 + 2 tokens each (blocks 2, 2, 2: all 6 in use) and request 2 accepts both drafts and finishes.
    # Step 2 allocates for computed + rejected + scheduled + lookahead tokens: request 0 needs a third
    # block (4 + 2 + 3 + 2 = 11 slots), request 1 too (3 + 2 + 3 + 2), and request 2, scheduled once more,
    # a third one (4 + 0 + 3 + 2). None is free: request 0's allocation preempts the last running request,
    # request 2 (freeing 2 blocks), and then requests 0 and 1 both fit; request 1 is not preempted
    trace = step.tracer.steps
    assert [s.scheduled for s in trace[:3]] == [[(0, 3, 0), (1, 2, 0), (2, 1, 0)], [(0, 3, 2), (1, 3, 2), (2, 3, 2)],
                                                [(0, 3, 2), (1, 3, 2)]]
    assert [s.preempted for s in trace[:3]] == [[], [], [2]]
    assert [s.kv_blocks_used for s in trace[:3]] == [4, 6, 6]
    # run mode takes that step on the aggregate (no exact step) and agrees step by step
    assert removed_run == [2] and removed_step == []
    assert run.tracer.steps == trace
    for name in ("first_token_s", "finish_s", "preemptions", "generated_tokens"):
        assert getattr(run.output().requests, name).tolist() == getattr(step.output().requests, name).tolist()


@pytest.mark.parametrize("mode", ["run", "step"])
def test_the_finished_request_is_not_requeued(mode, monkeypatch):
    engine, _ = _run(mode, monkeypatch)
    out = engine.output()
    assert out.requests.generated_tokens.tolist() == [12, 12, 3]
    assert out.requests.finish_s.tolist()[2] == pytest.approx(0.02)  # finished in step 1 (10 ms steps)
