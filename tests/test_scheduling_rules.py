"""vLLM 0.32's scheduling rules, pinned by hand-worked traces (issue 10, item 6).

Each scenario below is a handful of requests on a tiny KV-block pool, worked out step by step by hand in
its comment, with vLLM 0.32's ``v1/core/sched/scheduler.py`` and ``v1/core/kv_cache_manager.py`` as the
rule book. Every trace was then checked once against vLLM 0.32's own ``Scheduler`` (the CPU build, driven
with a fake model output that samples ``1 + min(drafts, accepted)`` tokens): it produced the same
scheduled tokens per request, the same victims, the same KV blocks in use and the same waiting counts,
step for step. The tests do not need vLLM.

The rules, and the tests that fail when one is broken:

===  ==========================================================================  ===========================
R1   running requests are walked in admission order, each given                  chunks, budget_truncates,
     ``min(known tokens - computed, budget left)``                               prefill_chunks_beside
R2   when the pool is empty, the LAST running request is preempted               victim_front, no_admit
R3   the victim goes to the FRONT of the waiting queue                           victim_front, no_admit
R4   preemption is by recompute: blocks freed, computed tokens reset to 0        victim_front, no_admit
R5   a request that preempts itself stops the running pass (it is the last      victim_front (step 11)
     running request, so nothing after it is scheduled)
R6   nothing is admitted in a step that preempted                                no_admit (speculative),
                                                                                 victim_front (tried at all)
R7   waiting requests are admitted FCFS; the first that does not fit stops       head_of_line, chunked_off
     admission (no skipping)
R8   a waiting request is admitted only if its WHOLE prompt fits in the free     whole_prompt,
     blocks (``scheduler_reserve_full_isl``); it is allocated its first chunk    whole_prompt_check_leaves_out
                                                                                 _the_lookahead
R9   admission stops at ``max_num_seqs`` running requests                        max_num_seqs
R10  admission needs token budget; with chunked prefill a prompt takes what is   chunks, chunked_off,
     left, without it the prompt must fit whole                                  prefill_chunks_beside
R11  a request samples when its computed tokens reach its known tokens;         all
     finished requests free their blocks at the END of the step (usable from
     the next step on)
R12  speculation: a decoding request schedules ``1 + k`` (its drafts), fewer     budget_truncates, no_admit,
     when the budget is short; KV slots for ``computed + scheduled + K``         prefill_chunks_beside,
     (lookahead: EAGLE family and draft models; none for n-gram, suffix,         lookahead_slots_per_method
     Medusa); it emits ``1 + accepted``                                          
R13  block 0 is vLLM's null block: a pool of N blocks has N - 1 usable           null_block
===  ==========================================================================  ===========================

Pool sizes are given as vLLM's ``num_gpu_blocks`` (null block included). In plain decoding rule R6 cannot
change any outcome (after a preemption the head of the waiting queue is the victim, which needs at least
the blocks it held; see ``test_no_admission_in_a_step_that_preempted``), so it is pinned there by the
engine not even trying to admit in such a step, and by its outcome with speculation, where rejected drafts
leave a victim holding more blocks than it needs to resume.

Every step takes exactly 10 ms (a flat step-time model), so a request's times give its step numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import simpy

from engine_helpers import flat_step_model
from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.speculative_decoding import SpecSetup
from servesim.roofline import PS_PER_S
from servesim.speculation.costs import DrafterCost
from servesim.speculation.profile import load_profile
from servesim.speculation.schedule import KSchedule

STEP_S = 0.01
"""Every engine step lasts exactly this long (s)."""


MODES = ["step", "run"]


def engine_blocks(num_gpu_blocks: int) -> int:
    """``kv_blocks_total`` for the engine that matches vLLM's pool of ``num_gpu_blocks``: the engine counts
    vLLM's null block itself, so the two are the same number."""
    return num_gpu_blocks


@dataclass
class Req:
    """One request of a scenario: arrival step, prompt and output tokens (and accepted drafts per round)."""

    arrival_step: int
    prompt: int
    output: int
    accept: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One hand-worked step: ``scheduled`` = [(request, tokens, drafts)] in vLLM's order, the victims of its
    preemptions, KV blocks in use after scheduling (null block excluded), requests waiting before it."""

    scheduled: list[tuple[int, int, int]]
    preempted: list[int]
    kv_blocks_used: int
    num_waiting: int


@dataclass
class Outcome:
    """A request's step numbers: first scheduled, first token, finish; and its preemption count."""

    first_scheduled: int
    first_token: int
    finish: int
    preemptions: int = 0


def _tracing(cls):
    class Traced(cls):
        """The engine, recording each preemption (step, victim, waiting queue right after) and the steps in
        which it tries to admit waiting requests."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            self.preemption_log: list[tuple[int, int, list[int]]] = []
            self.admission_steps: list[int] = []  # steps in which admission of waiting requests was tried

        def _admit(self, *args, **kwargs):
            self.admission_steps.append(self.step_index)
            return super()._admit(*args, **kwargs)

        def _preempt(self, victim: int) -> int:
            freed = super()._preempt(victim)
            self.preemption_log.append((self.step_index, victim, list(self.waiting)))
            return freed

    return Traced


TracedEngine = _tracing(Engine)


def run(requests: list[Req], *, num_gpu_blocks: int, mode: str, max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 8, block_size: int = 16, chunked: bool = True, spec_k: int | None = None) -> Engine:
    """Run a scenario to the end. ``spec_k``: EAGLE with that many speculative tokens (lookahead = k)."""
    times = [round(r.arrival_step * STEP_S * PS_PER_S) for r in requests]
    kwargs = dict(
        prompt_tokens=np.array([r.prompt for r in requests]),
        output_tokens=np.array([r.output for r in requests]),
        arrivals=ArrivalSource(times=times, num_requests=len(times)),
        step_time=flat_step_model(decode_s=STEP_S),
        kv_blocks_total=engine_blocks(num_gpu_blocks),
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=chunked,
        mode=mode,
    )
    if spec_k is None:
        engine = TracedEngine(**kwargs)
    else:
        table = np.zeros(sum(r.output for r in requests), dtype=np.int32)
        offset = 0
        for r in requests:
            table[offset: offset + len(r.accept)] = r.accept
            offset += r.output
        setup = SpecSetup(
            schedule=KSchedule(spec_k, None), lookahead=spec_k, disable_by_batch_size=None,
            drafts_may_be_empty=False, drafter=DrafterCost(kind="cpu", cpu_subps_per_request=0),
            profile=load_profile({"alpha": 0.5}), uniforms=None, factors=None, accept_table=table,
        )
        engine = TracedEngine(speculation=setup, **kwargs)
    env = simpy.Environment()
    env.process(engine.process(env))
    env.run()
    return engine


def check(engine: Engine, steps: list[Step], outcomes: list[Outcome], k: int = 0) -> None:
    """Assert the engine reproduced the hand-worked steps and per-request outcomes exactly."""
    out = engine.output()
    log = out.steps
    # per step (a run-mode row of n identical decode steps stands for n steps; its KV count is its last step's)
    got, kv_ends = [], {}
    for i in range(len(log.num_steps)):
        for j in range(int(log.num_steps[i])):
            got.append((int(log.batch_size[i]), int(log.num_tokens[i]), int(log.num_waiting[i]),
                        int(log.num_preempted[i]), int(log.k[i])))
        kv_ends[len(got) - 1] = int(log.kv_blocks_used[i])
    want = [(len(s.scheduled), sum(n for _, n, _ in s.scheduled), s.num_waiting, len(s.preempted), k) for s in steps]
    assert got == want, "(batch, tokens, waiting, preempted, k) per step"
    assert kv_ends == {g: steps[g].kv_blocks_used for g in kv_ends}, "KV blocks used"
    assert np.allclose(np.diff(np.concatenate([log.start_s, [out.end_s]])) / log.num_steps, STEP_S)
    # victims, in order, with the waiting queue right after each preemption
    victims = [(g, v) for g, s in enumerate(steps) for v in s.preempted]
    assert [(g, v) for g, v, _ in engine.preemption_log] == victims, "victims"
    # R6: a step that preempted does not even try to admit (in plain decoding the head of the waiting
    # queue, the victim, could never fit anyway, so only this shows the rule there)
    assert not set(engine.admission_steps) & {g for g, _ in victims}, "admission tried in a step that preempted"
    # per request
    req = out.requests
    for r, o in enumerate(outcomes):
        assert round(req.first_scheduled_s[r] / STEP_S) == o.first_scheduled, f"request {r} first scheduled"
        assert round(req.first_token_s[r] / STEP_S) - 1 == o.first_token, f"request {r} first token"
        assert round(req.finish_s[r] / STEP_S) - 1 == o.finish, f"request {r} finish"
        assert int(req.preemptions[r]) == o.preemptions, f"request {r} preemptions"
        assert int(req.generated_tokens[r]) == int(req.output_tokens[r])
    if k:
        sched = [(r, n, d) for s in steps for r, n, d in s.scheduled]
        drafted = [d for _, _, d in sched if d > 0]
        assert out.spec_counters["num_drafts"] == len(drafted)
        assert out.spec_counters["num_draft_tokens"] == sum(drafted)


# ---------------------------------------------------------------------------------------------------------
# Plain decoding
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_victim_is_the_last_running_and_goes_to_the_front(mode):
    """R2, R3, R4, R5, R7, R11. Pool of 5 blocks (4 usable, 16 tokens each); A, B, C: 16-token prompts, 10
    output tokens; D: 32-token prompt, 2 output tokens; all arrive at step 0.

    step 0: admit A, B, C (1 block each: whole prompt 16 -> 1 block); D's whole prompt needs 2 > 1 free:
            admission stops. free 1. A, B, C sample their first token.
    step 1: A needs a 2nd block (17 tokens): takes the last free one. B needs one: pool empty -> preempt
            the LAST running request, C (frees 1, C -> front of waiting: [C, D]); B takes it. No admission.
    steps 2-9: A and B decode in their 2 blocks (up to 26 tokens); C (17 tokens = 2 blocks) cannot be
            admitted, so D behind it waits too. A and B finish at the end of step 9: 4 blocks free.
    step 10: C first (front): recomputes its 16 + 1 tokens, 2 blocks; then D: 32 tokens, 2 blocks. free 0.
    step 11: C decodes in its 2 blocks. D needs a 3rd block (33 tokens): pool empty -> the last running
            request is D itself: preempted, the running pass stops. waiting [D].
    steps 12-18: C decodes (D's 33 tokens need 3 blocks, 2 free); C finishes at the end of step 18.
    step 19: D recomputes 32 + 1 tokens (3 blocks) and samples its 2nd and last token.
    """
    reqs = [Req(0, 16, 10), Req(0, 16, 10), Req(0, 16, 10), Req(0, 32, 2)]
    engine = run(reqs, num_gpu_blocks=5, mode=mode)
    ab = [(0, 1, 0), (1, 1, 0)]
    steps = ([Step([(0, 16, 0), (1, 16, 0), (2, 16, 0)], [], 3, 4), Step(ab, [2], 4, 1)]
             + [Step(ab, [], 4, 2)] * 8
             + [Step([(2, 17, 0), (3, 32, 0)], [], 4, 2), Step([(2, 1, 0)], [3], 2, 0)]
             + [Step([(2, 1, 0)], [], 2, 1)] * 7
             + [Step([(3, 33, 0)], [], 3, 1)])
    outcomes = [Outcome(0, 0, 9), Outcome(0, 0, 9), Outcome(0, 0, 18, 1), Outcome(10, 10, 19, 1)]
    check(engine, steps, outcomes)
    # C went to the front, ahead of D, which had been waiting longer
    assert [w for _, _, w in engine.preemption_log] == [[2, 3], [3]]


@pytest.mark.parametrize("mode", MODES)
def test_whole_prompt_must_fit_not_just_its_first_chunk(mode):
    """R8, R11. Pool of 6 blocks (5 usable); token budget 48; A: 40-token prompt, 10 outputs; B: 40-token
    prompt, 2 outputs; both at step 0.

    step 0: A: whole prompt 3 blocks <= 5: admitted, 40 tokens, 3 blocks (free 2, budget 8 left). B: its
            first chunk (8 tokens) would fit in 1 block, but its whole prompt needs 3 > 2: not admitted.
    steps 1-8: A decodes (41..48 tokens: 3 blocks). step 9: A's 49th token needs a 4th block (free 1);
            A finishes at the end of step 9, freeing 4.
    step 10: B: 40 tokens, 3 blocks. step 11: B's last token.
    """
    engine = run([Req(0, 40, 10), Req(0, 40, 2)], num_gpu_blocks=6, max_num_batched_tokens=48, mode=mode)
    steps = ([Step([(0, 40, 0)], [], 3, 2)] + [Step([(0, 1, 0)], [], 3, 1)] * 8 + [Step([(0, 1, 0)], [], 4, 1)]
             + [Step([(1, 40, 0)], [], 3, 1), Step([(1, 1, 0)], [], 3, 0)])
    check(engine, steps, [Outcome(0, 0, 9), Outcome(10, 10, 11)])


@pytest.mark.parametrize("mode", MODES)
def test_chunk_sizes_follow_the_token_budget_in_running_order(mode):
    """R1, R10, R11. Token budget 20, pool of 65 blocks; A and B: 30-token prompts, 3 outputs, step 0.

    step 0: A admitted with a 20-token chunk: budget used up, B not admitted.
    step 1: A (running first) finishes its prompt: 10 tokens, samples; budget 10 left -> B admitted with a
            10-token chunk.
    step 2: A decodes 1; B gets the 19 left of the budget (its prompt has 20 to go).
    step 3: A decodes its last token; B's last prompt token: B samples.
    steps 4-5: B decodes.
    Blocks: A 2 (20 tokens) at step 0, B 1 at step 1, B 2 at step 2 (29 tokens): 2, 3, 4, 4; A's 2 free
    after step 3.
    """
    engine = run([Req(0, 30, 3), Req(0, 30, 3)], num_gpu_blocks=65, max_num_batched_tokens=20, mode=mode)
    steps = [Step([(0, 20, 0)], [], 2, 2), Step([(0, 10, 0), (1, 10, 0)], [], 3, 1),
             Step([(0, 1, 0), (1, 19, 0)], [], 4, 0), Step([(0, 1, 0), (1, 1, 0)], [], 4, 0),
             Step([(1, 1, 0)], [], 2, 0), Step([(1, 1, 0)], [], 2, 0)]
    check(engine, steps, [Outcome(0, 1, 3), Outcome(1, 3, 5)])


@pytest.mark.parametrize("mode", MODES)
def test_admission_stops_at_max_num_seqs(mode):
    """R9, R11. max_num_seqs 2, budget 64, pool of 65; A: 8-token prompt, 3 outputs; B: 8, 5; C: 8, 2.

    step 0: A and B admitted; C not (2 running = max_num_seqs), although budget and blocks are plenty.
    steps 1-2: A and B decode; A finishes at the end of step 2 (its seat frees at the step's end).
    step 3: B decodes; C admitted (8 tokens) and samples.  step 4: B and C end.
    """
    engine = run([Req(0, 8, 3), Req(0, 8, 5), Req(0, 8, 2)], num_gpu_blocks=65, max_num_batched_tokens=64,
                 max_num_seqs=2, mode=mode)
    dec = [(0, 1, 0), (1, 1, 0)]
    steps = [Step([(0, 8, 0), (1, 8, 0)], [], 2, 3), Step(dec, [], 2, 1), Step(dec, [], 2, 1),
             Step([(1, 1, 0), (2, 8, 0)], [], 2, 1), Step([(1, 1, 0), (2, 1, 0)], [], 2, 0)]
    check(engine, steps, [Outcome(0, 0, 2), Outcome(0, 0, 4), Outcome(3, 3, 4)])


@pytest.mark.parametrize("mode", MODES)
def test_a_waiting_request_that_does_not_fit_blocks_the_ones_behind_it(mode):
    """R7, R8, R11. Pool of 5 (4 usable); A: 40-token prompt, 4 outputs; B: 40, 2; C: 8, 2; all at step 0.

    step 0: A: 3 blocks (free 1). B needs 3: admission stops, so C waits although its 1 block would fit.
    steps 1-3: A decodes (41..43 tokens, 3 blocks); finishes at the end of step 3.
    step 4: B (3 blocks) then C (1 block). step 5: both end.
    """
    engine = run([Req(0, 40, 4), Req(0, 40, 2), Req(0, 8, 2)], num_gpu_blocks=5, mode=mode)
    steps = ([Step([(0, 40, 0)], [], 3, 3)] + [Step([(0, 1, 0)], [], 3, 2)] * 3
             + [Step([(1, 40, 0), (2, 8, 0)], [], 4, 2), Step([(1, 1, 0), (2, 1, 0)], [], 4, 0)])
    check(engine, steps, [Outcome(0, 0, 3), Outcome(4, 4, 5), Outcome(4, 4, 5)])


@pytest.mark.parametrize("mode", MODES)
def test_without_chunked_prefill_a_prompt_must_fit_the_budget_whole(mode):
    """R7, R10. Chunked prefill off, budget 40, pool of 65; A: 24-token prompt, 3 outputs; B: 24, 2;
    C: 8, 2; all at step 0.

    step 0: A: 24 tokens (budget 16 left). B's 24 > 16: admission stops (C's 8 would fit: it waits).
    step 1: A decodes (budget 39); B: 24 (15 left); C: 8.  step 2: all three sample their last token.
    """
    engine = run([Req(0, 24, 3), Req(0, 24, 2), Req(0, 8, 2)], num_gpu_blocks=65, max_num_batched_tokens=40,
                 chunked=False, mode=mode)
    steps = [Step([(0, 24, 0)], [], 2, 3), Step([(0, 1, 0), (1, 24, 0), (2, 8, 0)], [], 5, 2),
             Step([(0, 1, 0), (1, 1, 0), (2, 1, 0)], [], 5, 0)]
    check(engine, steps, [Outcome(0, 0, 2), Outcome(1, 1, 2), Outcome(1, 1, 2)])


def test_block_zero_is_the_null_block():
    """R13. vLLM reserves block 0 as its null block: a pool of 4 blocks holds 3 x 16 = 48 tokens. A request
    of 49 tokens can never be served; one of 48 runs in 3 blocks."""
    kwargs = dict(arrivals=ArrivalSource(times=[0], num_requests=1), step_time=flat_step_model(decode_s=STEP_S),
                  kv_blocks_total=4, block_size=16, max_num_seqs=8, max_num_batched_tokens=8192)
    Engine(prompt_tokens=np.array([47]), output_tokens=np.array([1]), **kwargs)
    with pytest.raises(ValueError, match="more KV blocks than the cache holds"):
        Engine(prompt_tokens=np.array([48]), output_tokens=np.array([1]), **kwargs)



def test_without_chunked_prefill_the_longest_request_must_fit_the_budget():
    """R10. Without chunked prefill a preempted request recomputes prompt + output in one step, so a request
    of max_num_batched_tokens + 1 tokens is refused (40 budget: 30 + 11 = 41 refused, 30 + 10 = 40 served)."""
    kwargs = dict(arrivals=ArrivalSource(times=[0], num_requests=1), step_time=flat_step_model(decode_s=STEP_S),
                  kv_blocks_total=100, block_size=16, max_num_seqs=8, max_num_batched_tokens=40,
                  enable_chunked_prefill=False)
    Engine(prompt_tokens=np.array([30]), output_tokens=np.array([10]), **kwargs)
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens=40"):
        Engine(prompt_tokens=np.array([30]), output_tokens=np.array([11]), **kwargs)

# ---------------------------------------------------------------------------------------------------------
# With speculation (EAGLE: k drafts per round, k lookahead KV slots per request)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_no_admission_in_a_step_that_preempted(mode):
    """R2, R3, R4, R6, R12. EAGLE, k = 2 (lookahead 2); pool of 4 (3 usable); A: 11-token prompt, 4 outputs;
    V: 12, 4; D: 12, 2, arriving at step 1. Every round accepts 0 drafts.

    step 0: A: 11 + 2 lookahead -> 1 block; V: 12 + 2 -> 1 block (free 1). Both sample.
    step 1: A verifies 1 + 2 tokens: 11 + 3 + 2 = 16 slots, 1 block. V: 12 + 3 + 2 = 17 -> 2nd block
            (free 0). D arrives: needs 1 block, none free. Both accept 0: A has 12 computed, V 13.
    step 2: A: 12 + 3 + 2 = 17 -> needs a 2nd block, pool empty: preempt the last, V (frees its 2 blocks;
            waiting [V, D]); A takes 1: free 1. V now needs only 1 block to resume (12 + 2 = 14 tokens
            + 2 lookahead = 16): it would fit, but nothing is admitted in a step that preempted.
    step 3: A verifies (18 slots, 2 blocks) and finishes. V first: recomputes 14 tokens (1 block, free 0);
            D (1 block) does not fit. A's 2 blocks free at the end of the step.
    step 4: V verifies (14 + 3 + 2 = 19: 2nd block, free 1); D admitted: 12 tokens, 1 block. V finishes.
    step 5: D verifies (17 slots: 2 blocks) and finishes.
    """
    reqs = [Req(0, 11, 4, [0] * 4), Req(0, 12, 4, [0] * 4), Req(1, 12, 2, [0] * 2)]
    engine = run(reqs, num_gpu_blocks=4, spec_k=2, mode=mode)
    steps = [Step([(0, 11, 0), (1, 12, 0)], [], 2, 2), Step([(0, 3, 2), (1, 3, 2)], [], 3, 1),
             Step([(0, 3, 2)], [1], 2, 1), Step([(0, 3, 2), (1, 14, 0)], [], 3, 2),
             Step([(1, 3, 2), (2, 12, 0)], [], 3, 1), Step([(2, 3, 2)], [], 2, 0)]
    check(engine, steps, [Outcome(0, 0, 3), Outcome(0, 0, 4, 1), Outcome(4, 4, 5)], k=2)
    assert [w for _, _, w in engine.preemption_log] == [[1, 2]]  # V in front of D


@pytest.mark.parametrize("mode", MODES)
def test_drafts_are_cut_by_the_token_budget(mode):
    """R1, R10, R12. EAGLE, k = 3; budget 6, max_num_seqs 4, pool of 65; A, B, C: 4-token prompts, 6
    outputs; accepted drafts per round A [3, 3], B [2, 0, 3], C [1, 1, 1].

    step 0: A: 4 tokens (budget 2 left); B: a 2-token chunk; budget 0: C not admitted.
    step 1: A verifies 1 + 3 (accepts 3: 5 tokens out); B finishes its prompt (2) and samples.
    step 2: A: 1 + 3 (accepts 3, emits its 6th and last token); B gets the 2 left: 1 + 1 draft, accepts it.
    step 3: B: 1 + 3, accepts 0 (4 out); C admitted with the 2 left.
    step 4: B: 1 + 3, accepts 3, emits 2 (its last); C's last 2 prompt tokens, samples.
    steps 5-7: C: 1 + 3, accepts 1 each round (3, 5, 6 tokens out).
    """
    reqs = [Req(0, 4, 6, [3, 3]), Req(0, 4, 6, [2, 0, 3]), Req(0, 4, 6, [1, 1, 1])]
    engine = run(reqs, num_gpu_blocks=65, max_num_batched_tokens=6, max_num_seqs=4, spec_k=3, mode=mode)
    steps = [Step([(0, 4, 0), (1, 2, 0)], [], 2, 3), Step([(0, 4, 3), (1, 2, 0)], [], 2, 1),
             Step([(0, 4, 3), (1, 2, 1)], [], 2, 1), Step([(1, 4, 3), (2, 2, 0)], [], 2, 1),
             Step([(1, 4, 3), (2, 2, 0)], [], 2, 0)] + [Step([(2, 4, 3)], [], 1, 0)] * 3
    check(engine, steps, [Outcome(0, 0, 2), Outcome(0, 1, 4), Outcome(3, 4, 7)], k=3)
    counters = engine.output().spec_counters
    assert counters["num_accepted_tokens"] == (3 + 3) + (1 + 0 + 3) + (1 + 1 + 1)
    assert counters["num_accepted_tokens_per_pos"] == [2 + 2 + 3, 2 + 1 + 0, 2 + 1 + 0]


@pytest.mark.parametrize("mode", MODES)
def test_prefill_chunks_beside_verifying_decoders(mode):
    """R1, R8, R10, R12. EAGLE, k = 2; budget 20, pool of 65; A: 15-token prompt, 4 outputs, accepts 1 per
    round; B: 30-token prompt, 2 outputs, accepts 0.

    step 0: A: 15 tokens + 2 lookahead = 17 slots -> 2 blocks (budget 5). B: whole prompt 2 blocks fit; a
            5-token chunk + 2 -> 1 block. A samples.
    step 1: A verifies 1 + 2 (15 + 3 + 2 = 20 slots, 2 blocks), accepts 1 (3 out); budget 17 -> B's next
            chunk is 17 tokens (22 + 2 slots: 2nd block).
    step 2: A verifies 1 + 2, accepts 1 and emits its 4th, last token; B's last 8 prompt tokens, samples.
    step 3: B verifies 1 + 2 (30 + 3 + 2 = 35 slots: 3 blocks), accepts 0, ends.
    """
    engine = run([Req(0, 15, 4, [1, 1]), Req(0, 30, 2, [0])], num_gpu_blocks=65, max_num_batched_tokens=20,
                 spec_k=2, mode=mode)
    steps = [Step([(0, 15, 0), (1, 5, 0)], [], 3, 2), Step([(0, 3, 2), (1, 17, 0)], [], 4, 0),
             Step([(0, 3, 2), (1, 8, 0)], [], 4, 0), Step([(1, 3, 2)], [], 3, 0)]
    check(engine, steps, [Outcome(0, 0, 2), Outcome(0, 2, 3)], k=2)


@pytest.mark.parametrize(
    "method, slots",
    [
        ("eagle", 3), ("eagle3", 3), ("mtp", 3), ("draft_model", 3), ("ngram", 0), ("suffix", 0),
        ("medusa", 0),
    ],
)
def test_lookahead_slots_per_method(method, slots):
    """R12. vLLM 0.32 (``VllmConfig.num_lookahead_tokens``): K slots for the EAGLE family (eagle, eagle3,
    mtp) and draft models, none for n-gram, suffix and Medusa."""
    from servesim.input_files import validate
    from servesim.speculation.config import SpeculativeConfig

    data = {"method": method, "num_speculative_tokens": 3, "acceptance": {"alpha": 0.5}}
    if method == "draft_model":
        data["draft_cost"] = 0.1
    assert validate(SpeculativeConfig, data, "speculative_config").lookahead_slots == slots


@pytest.mark.parametrize("mode", MODES)
def test_whole_prompt_check_leaves_out_the_lookahead(mode):
    """R8 with speculation. EAGLE, k = 2; budget 24, pool of 4 (3 usable); A: 14-token prompt, 3 outputs;
    B: 32, 2; accept 0 everywhere. vLLM's admission gate is ``cdiv(whole prompt) <= free`` (``allocate_slots
    (full_sequence_must_fit=True)`` counts no lookahead), then it allocates the first chunk + lookahead.

    step 0: A: 14 + 2 -> 1 block (free 2, budget 10). B: whole prompt 2 blocks <= 2: admitted; chunk 10
            + 2 lookahead -> 1 block (free 1).
    step 1: A verifies 14 + 3 + 2 = 19: 2nd block (free 0, budget 21). B: 10 + 21 + 2 = 33 -> 2 more
            blocks: pool empty, B is the last running: it preempts itself.
    step 2: A verifies (2 blocks), finishes. B (2 blocks) does not fit in 1.
    step 3: B: 24-token chunk + 2 (2 blocks). step 4: its last 8 (34 slots: 3 blocks), samples.
    step 5: B verifies and finishes.
    """
    engine = run([Req(0, 14, 3, [0] * 3), Req(0, 32, 2, [0] * 2)], num_gpu_blocks=4, max_num_batched_tokens=24,
                 spec_k=2, mode=mode)
    steps = [Step([(0, 14, 0), (1, 10, 0)], [], 2, 2), Step([(0, 3, 2)], [1], 2, 0), Step([(0, 3, 2)], [], 2, 1),
             Step([(1, 24, 0)], [], 2, 1), Step([(1, 8, 0)], [], 3, 0), Step([(1, 3, 2)], [], 3, 0)]
    check(engine, steps, [Outcome(0, 0, 2), Outcome(0, 4, 5, 1)], k=2)
