"""The engine of one model replica: vLLM V1 scheduling over a paged KV cache, advanced by SimPy.

Scheduling mirrors vLLM 0.32's v1 scheduler (``vllm/v1/core/sched/scheduler.py``, see ``docs/reference/vllm-semantics.md``; checked step by step
against it on the golden traces of ``tests/data/golden/``, written by ``oracle/vllm_oracle.py``):

* the KV pool has ``num_gpu_blocks - 1`` usable blocks (block 0 is vLLM's null block);

* every step walks the RUNNING requests in admission order, giving each the tokens it still has to
  compute (``prompt + generated - num_computed``: 1 for a decoding request, a chunk of the prompt for a
  prefilling one) capped by what is left of the token budget ``max_num_batched_tokens``;
* each scheduled request gets the KV blocks for ``num_computed + num_new`` tokens; when the pool is empty
  the most recently admitted running request is preempted (recompute: its blocks are freed, its computed
  tokens reset to 0, it goes to the FRONT of the waiting queue), and if that victim is the request being
  scheduled, scheduling of running requests stops for this step;
* then, only if nobody was preempted in this step, WAITING requests are admitted in FCFS order while
  budget is left and fewer than ``max_num_seqs`` run, each only if its whole sequence fits in the free
  blocks (``scheduler_reserve_full_isl``) and its first chunk plus the lookahead slots can be allocated;
  with chunked prefill a prompt takes whatever budget is left;
* a request whose computed tokens reach its known tokens samples one token at the end of the step;
  a finished request frees its blocks at the end of the step, or, with async scheduling
  (``async_scheduling``, vLLM's default on GPUs), after the next step has been scheduled.

Speculative decoding adds vLLM's per-method rules (:mod:`servesim.engine.spec_engine`): the drafting
slots a draft model takes out of the budget, the lookahead KV slots, MTP's prefill-chunk rule and, with
async scheduling, the optimistic KV allocation for the previous step's drafts.

Two modes produce the same result, bit for bit (all times are integer picoseconds):

* ``step``: the plain loop above, one engine step per SimPy timeout, per-request state in lists.
* ``run`` (default): decoding requests are kept in aggregate (how many there are, the sum of their
  contexts, how many cross a block boundary at each step phase, a heap of their finishing steps). A step
  with prefill or admission costs O(requests it touches), and a run of identical decode steps up to the
  next event (an arrival (every one: the waiting count is logged per step), a request that finishes, a block allocation that would
  fail) is advanced in O(1) with the closed-form sum of its step times. Rare events that need the
  per-request order (preemption, a token budget smaller than the decoding batch) materialise the
  per-request state and run the plain step.

KV blocks go through the block manager (:mod:`servesim.engine.block_manager`, vLLM 0.32's block pool,
with prefix caching when ``enable_prefix_caching``). The engine keeps the free-block count in ``self.free``
and allocates by decrementing it; allocations only pop the free queue's head, so a decode run (which only
allocates) needs no replay of who took which block: the manager pops the run's blocks at its next call,
before anything that depends on the queue's order (a free, a lookup, a hit), and run mode then makes the
same calls in the same order as step mode. Two points keep run mode exact with prefix caching:

* the aggregated decoders' shareable blocks (those another request could hit) are cached lazily, at the
  step they filled (``_decoder_cached_tokens``), before any other block is cached or looked up
  (``_cache_scheduled``, ``_leave``), so copies of one hash are cached in step-mode order;
* a run needs the head of the waiting queue to stay blocked through it. It does: within a run no block is
  freed and (with plain decoding, no lookahead) the admission check is ``blocks(num_tokens) - hits on held
  blocks > free blocks``, where free blocks only fall and hits on held blocks cannot change (no holder
  leaves); evictions only shorten the hit. While running requests still fill shareable blocks the head
  might hit, there is no run (each step is taken on its own).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from itertools import chain

import numpy as np

from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.block_manager import BlockManager, PrefixCacheStats
from servesim.engine.output import EngineOutput, RequestLog, StepLog
from servesim.errors import ConfigError
from servesim.roofline import PS_PER_S, SUBPS_BITS, SUBPS_MASK, SUBPS_PER_PS, StepTimeModel

KV_BLOCK_PS_MAX = 2**62
"""Largest KV-block integral (blocks x ps) of one step-log row: longer runs are split so that it fits int64."""

ROW_SUBPS_MAX = 2**62
"""Rows shorter than this (2^-16 ps, about 70 s) have their steps' ends rebuilt in one int64 expression."""


class Engine:
    """One replica's scheduler, KV-block pool and step clock.

    Args:
        prompt_tokens: int array (N,), prompt length of each request (tokens, >= 1).
        output_tokens: int array (N,), tokens each request generates (>= 1).
        arrivals: the :class:`ArrivalSource` releasing requests ``0..N-1``.
        step_time: the integer-picosecond step-time model.
        kv_blocks_total: KV-cache capacity (blocks), as vLLM's ``num_gpu_blocks``: block 0 is vLLM's null
            block, so ``kv_blocks_total - 1`` blocks hold requests' KV.
        block_size: tokens per KV block.
        max_num_seqs: most requests running at once (vLLM ``max_num_seqs``).
        max_num_batched_tokens: token budget per step (vLLM ``max_num_batched_tokens``).
        enable_chunked_prefill: if False a prompt is admitted only when it fits the remaining budget whole.
        mode: ``"run"`` (fast, default) or ``"step"`` (one step at a time).
        async_scheduling: vLLM's async scheduling (see :meth:`_release_finishing`): the next step is
            scheduled before this step's output is processed, so a request that finishes in a step keeps
            its blocks and its place in the running list while the next step is scheduled.
        max_time_s: stop the simulation at the first step boundary at or after this time (s); None = never.
        enable_prefix_caching: vLLM's automatic prefix caching (:mod:`servesim.engine.block_manager`).
        content: the requests' :class:`~servesim.workload.content.SequenceContent` for prefix caching
            (None = no two requests share content; a preempted request still hits its own blocks).

    Raises:
        ValueError: a request has no prompt or no output token (``prompt_tokens`` or ``output_tokens`` <
            1), a request can never be served (its tokens exceed the KV cache or, without chunked
            prefill, its prompt exceeds the token budget), or a setting is out of range.
    """

    def __init__(
        self,
        *,
        prompt_tokens,
        output_tokens,
        arrivals: ArrivalSource,
        step_time: StepTimeModel,
        kv_blocks_total: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        mode: str = "run",
        max_time_s: float | None = None,
        async_scheduling: bool = False,
        enable_prefix_caching: bool = False,
        content=None,
    ) -> None:
        if mode not in ("run", "step"):
            raise ValueError(f"unknown engine mode {mode!r} (expected 'run' or 'step')")
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1 or kv_blocks_total < 2:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1 and KV blocks >= 2 "
                             "(vLLM keeps one null block)")
        self.P = [int(x) for x in np.asarray(prompt_tokens).tolist()]
        self.O = [int(x) for x in np.asarray(output_tokens).tolist()]
        n = len(self.P)
        self.n = n
        self.arrivals = arrivals
        self.st = step_time
        self.bs = int(block_size)
        self.M = int(max_num_batched_tokens)
        self.max_seqs = int(max_num_seqs)
        self.chunked = bool(enable_chunked_prefill)
        self.mode = mode
        # run mode after a fallback (one exact step on per-request state): how many further steps stay on
        # that state before the aggregate is rebuilt, the current stretch, and the step of the last rebuild
        self.explicit_steps_left = 0
        self.fallback_stretch = 0
        self.aggregated_at_step = 0
        self.total_blocks = int(kv_blocks_total) - 1  # usable blocks: vLLM's block pool keeps block 0 as its null block
        # vLLM's per-request token costs in a step (0 without speculation; see SpecEngine): slots taken out of
        # the token budget per scheduled request for drafting, and the prefill lookahead of multi-layer MTP
        self.draft_slots = 0
        self.prefill_lookahead = 0
        self.tracer = None  # a servesim.engine.step_trace.StepTracer records every step when set
        self.async_sched = bool(async_scheduling)
        # async scheduling: requests that finished in the previous step -> whether vLLM knew they would
        # (then it skips them; otherwise it schedules them once more and discards that output)
        self.finishing: dict[int, bool] = {}
        self.max_time_ps = None if max_time_s is None else round(max_time_s * PS_PER_S)
        bs = self.bs
        if n:
            for name, tokens in (("prompt_tokens", self.P), ("output_tokens", self.O)):
                if min(tokens) < 1:
                    i = tokens.index(min(tokens))
                    raise ValueError(f"request {i}: {name} = {tokens[i]}, expected >= 1 (vLLM needs a prompt "
                                     "token and max_tokens >= 1)")
            longest = max(p + o for p, o in zip(self.P, self.O))
            if -(-longest // bs) > self.total_blocks:
                raise ValueError(
                    f"a request of {longest} tokens (prompt + output) needs more KV blocks than the cache holds "
                    f"({self.total_blocks} blocks of {bs} tokens): it could never be served"
                )
            if not self.chunked and longest > self.M:
                raise ValueError(
                    f"a request of {longest} tokens (prompt + output) exceeds max_num_batched_tokens={self.M} "
                    "with chunked prefill disabled: after a preemption it could never be recomputed "
                    "(vLLM requires max_num_batched_tokens >= max_model_len without chunked prefill)"
                )
        # Per-request state (materialised: always valid for non-decoders, for decoders in step mode).
        self.nc = [0] * n  # num_computed_tokens
        self.gen = [0] * n  # generated (sampled) tokens
        self.blk = [0] * n  # KV blocks held
        self.last_emit = [-1] * n  # ps of the last token emission
        # Records (ps; -1 = not yet).
        self.arr = [-1] * n
        self.first_sched = [-1] * n
        self.first_tok = [-1] * n
        self.fin = [-1] * n
        self.npre = [0] * n
        # Queues.
        self.running: dict[int, None] = {}  # admission order
        self.waiting: deque[int] = deque()
        self.free = self.total_blocks
        # the KV block manager (vLLM's block pool); ``self.free`` mirrors its free-block count, decremented
        # by allocations, which the manager applies at its next call (BlockManager.sync)
        self.prefix_caching = bool(enable_prefix_caching)
        self.kv = BlockManager(self.total_blocks + 1, bs, self.prefix_caching, content, self._use_eagle())
        self.num_cached_tokens = [-1] * n  # vLLM Request.num_cached_tokens: the hit at first scheduling
        # async scheduling: tokens of each request's blocks cached at its last scheduling (vLLM cache_blocks:
        # num_computed + num_new, capped at the tokens known then, which exclude the token still in flight
        # from the step before); written after each step and, for aggregated decoders, at _leave. Without
        # async scheduling they are its computed tokens (see _kv_cached).
        self.kv_cached_tokens = [0] * n
        self.stale_joins: dict[int, int] = {}  # run mode: decoder -> step it joined the aggregate at, stale
        # whether admissions note their cached tokens (_note_scheduled): needed for async scheduling's
        # frees and for shareable blocks; the speculative engine always needs them (see _kv_cached)
        self.note_cached = self.async_sched or self.kv.shareable is not None
        self.prefix_cache_stats = PrefixCacheStats()
        self.now = 0
        self.clock_subps = 0  # the clock's remainder below self.now (ps), in 2^-16 ps: [0, SUBPS_PER_PS)
        self.G = 0  # index of the next engine step
        self.finished = 0
        # Aggregated decoders (run mode).
        self.partial: int | None = None
        self.B = 0  # number of aggregated decoders
        self.A = 0  # sum of a_r: decoder r needs a_r + g KV slots (its context) at step g
        self.cnt = [0] * bs  # decoders per residue a_r mod block_size
        self.cnt2 = [0] * (2 * bs)  # cnt twice over, so that a cyclic window is one slice
        self.heap: list[tuple[int, int]] = []  # (step at which it emits its last token, request)
        self.a = [0] * n
        self.g0 = [0] * n
        self.e0 = [0] * n
        self.stale: dict[int, int] = {}  # decoders whose last emission was not at the previous step's end
        self.fing = [-1] * n  # step at which aggregated decoder r emits its last token; -1 if not one
        # Step log: one tuple per step or run (start, steps, first duration, increment, duration, batch,
        # tokens, prefill tokens, ITL samples per step, KV blocks used, waiting, preempted, k), in ps.
        self.rows: list[tuple] = []
        # KV integral of each row (blocks in use x step duration, summed over its steps; ps) = its blocks in use
        # at the end x its duration, minus the block-ps of blocks allocated after its first step started:
        self.kv_late: list[tuple[int, int]] = []  # (row, that correction) of speculative runs
        # decode runs of more than one step, a flat list of ints (cheap to extend): (row, clock remainder at
        # its start, d0, inc), 2^-16 ps, from which the output rebuilds every step's duration in ps
        self.sub_runs: list[int] = []
        # those whose integral is corrected at output: their rows in kv_runs and cnt2's window of block_size
        # counts at the run's first step in kv_windows
        self.kv_runs: list[int] = []
        self.kv_windows: list[int] = []
        self.kv_safe_ps = KV_BLOCK_PS_MAX // self.total_blocks  # rows shorter than this always fit
        self.extra_itl: list[int] = []
        self._arrived: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ SimPy process
    def process(self, env):
        """The replica's SimPy process: one timeout per engine step or run of identical steps."""
        arrivals = self.arrivals
        while True:
            t_next = arrivals.next_time()
            if t_next is not None and t_next <= self.now:
                self._pull_arrivals()
            if not self.running and not self.waiting:
                t = arrivals.next_time()
                if t is None:
                    break
                if self.max_time_ps is not None and t >= self.max_time_ps:
                    break
                yield env.timeout((t - self.now) / PS_PER_S)
                self.now = t
                self.clock_subps = 0
                continue
            if self.max_time_ps is not None and self.now >= self.max_time_ps:
                break
            t0 = self.now
            if self.mode == "step":
                self._explicit_step()
            elif self.explicit_steps_left:
                self._explicit_step()
                self.explicit_steps_left -= 1
                if not self.explicit_steps_left:
                    self._aggregate()
                    self.aggregated_at_step = self.G
            else:
                self._fast_step()
            yield env.timeout((self.now - t0) / PS_PER_S)

    def _pull_arrivals(self) -> None:
        got = self._arrived
        self.arrivals.pop_until(self.now, got)
        if got:
            arr, waiting = self.arr, self.waiting
            for r, t in got:
                arr[r] = t
                waiting.append(r)
            got.clear()

    # ------------------------------------------------------------------ shared pieces
    def _admit(self, t0: int, budget: int, free: int, nrun: int, sched: list, lookahead: int = 0) -> tuple[int, int]:
        """Admit waiting requests (FCFS) into ``sched``; returns (budget, free) left.

        A request is admitted only if its whole prompt (plus ``lookahead`` speculative slots) fits in the
        free blocks; it gets blocks for its first chunk plus the lookahead slots.
        """
        waiting, P, gen, blk, bs = self.waiting, self.P, self.gen, self.blk, self.bs
        running, first_sched = self.running, self.first_sched
        ds = self.draft_slots
        caching = self.prefix_caching
        hit = None
        hit_tokens = extra = 0
        while waiting and budget > ds and nrun < self.max_seqs:
            r = waiting[0]
            total = P[r] + gen[r]
            if caching:
                hit = self.kv.lookup(r, total, free)
                hit_tokens = hit.num_blocks * bs
                extra = hit.num_evictable - hit.num_blocks  # hit blocks in the free queue cost free blocks
            if -(-total // bs) + extra > free:  # vLLM's scheduler_reserve_full_isl: the whole sequence must fit
                break
            left = total - hit_tokens
            n = left if left < budget - ds else budget - ds
            if n < left and not self.chunked:
                break
            if self.prefill_lookahead > 1:
                n = self._reserve_prefill_lookahead(total, hit_tokens, n)
                if not n:
                    break
            need = -(-(hit_tokens + n + lookahead) // bs) + extra  # the first chunk and the lookahead slots
            if need > free:
                break
            free -= need
            blk[r] = need - extra
            if caching:
                if hit_tokens:
                    self.kv.touch(r, hit)
                    self.nc[r] = hit_tokens
                if self.note_cached:
                    cached = self._note_scheduled(r, n, t0)
                    if self.kv.shareable is not None:
                        self.kv.cache(r, cached)
                self.prefix_cache_stats.record(total, hit_tokens, self.npre[r] > 0)
                if self.tracer is not None:
                    self.tracer.record_hit(r, total, hit_tokens, self.npre[r] > 0)
            if self.num_cached_tokens[r] < 0:
                self.num_cached_tokens[r] = hit_tokens
            waiting.popleft()
            running[r] = None
            nrun += 1
            sched.append((r, n))
            budget -= n + ds
            if first_sched[r] < 0:
                first_sched[r] = t0
        return budget, free

    def _reserve_prefill_lookahead(self, total: int, computed: int, n: int) -> int:
        """vLLM's multi-layer MTP rule (``Scheduler._reserve_prefill_lookahead``): a prefill chunk of ``n``
        tokens never ends within ``prefill_lookahead`` tokens of the end of the request's ``total`` known
        tokens; it is shortened to leave that many for the next chunk (0 = not schedulable this step)."""
        remaining = total - computed - n
        if 0 < remaining < self.prefill_lookahead:
            n -= self.prefill_lookahead - remaining
        return max(n, 0)

    def _flush_stale(self, t_emit: int) -> int:
        """Decoders whose last token came before the previous step's end (skipped by a short token budget)
        emit at ``t_emit``: record those irregular ITL gaps; returns how many there were."""
        if not self.stale:
            return 0
        for last in self.stale.values():
            self.extra_itl.append(t_emit - last)
        count = len(self.stale)
        self.stale = {}
        return count

    def _make_room(self, order: list[int], r: int, need: int, free: int) -> tuple[int, int, bool]:
        """vLLM's allocation for running request ``r`` in a plain step: while the pool cannot give it
        ``need`` blocks in all, preempt the last request of ``order`` (the running list being walked).

        Returns:
            (free blocks left, requests preempted, whether ``r`` itself was preempted: then scheduling of
            running requests stops for this step).
        """
        preempted = 0
        while need - self.blk[r] > free:
            victim = order.pop()
            self.free = free  # the pool as the victim's blocks return to it
            free += self._preempt(victim)
            preempted += 1
            if victim == r:
                return free, preempted, True
        if need > self.blk[r]:
            free -= need - self.blk[r]
            self.blk[r] = need
        return free, preempted, False

    def _preempt(self, victim: int) -> int:
        """Preempt running request ``victim`` by recompute: free its blocks, reset its computed tokens, put
        it at the FRONT of the waiting queue (vLLM V1). Returns the blocks it held. (A request that already
        finished, under async scheduling, is not queued again: its output removes it from the queue before
        the next step.)"""
        del self.running[victim]
        if self.prefix_caching:
            freed = self.kv.free(victim, self.blk[victim], self._kv_cached(victim), self.free)
        else:
            freed = self.blk[victim]
        self.blk[victim] = 0
        self.nc[victim] = 0
        self.npre[victim] += 1
        if victim not in self.finishing:
            self.waiting.appendleft(victim)
        if self.tracer is not None:
            self.tracer.victims.append(victim)
        return freed

    def _stalled(self) -> None:
        """Nothing could be scheduled although requests wait: no later step could differ, so the run would
        loop for ever. The constructors' capacity checks make this unreachable for valid settings.

        Raises:
            ConfigError: one line naming the stuck request and the settings to change.
        """
        r = self.waiting[0] if self.waiting else next(iter(self.running))
        raise ConfigError(
            f"engine: stalled at t={self.now / PS_PER_S:.6f} s: request {r} ({self.P[r]} prompt + {self.gen[r]} "
            f"generated tokens) can never be scheduled in a cache of {self.total_blocks} blocks of {self.bs} tokens "
            f"with max_num_batched_tokens={self.M}: raise engine.num_gpu_blocks_override (or gpu_memory_utilization) "
            "or engine.max_num_batched_tokens"
        )

    def _emit(self, r: int, t0: int, t1: int) -> bool:
        """Request ``r`` samples a token at ``t1``; returns True if it finished."""
        g = self.gen[r]
        if g == 0:
            self.first_tok[r] = t1
        elif self.last_emit[r] != t0:
            self.extra_itl.append(t1 - self.last_emit[r])
        self.gen[r] = g + 1
        self.last_emit[r] = t1
        if g + 1 >= self.O[r]:
            self._finish(r, t1)
            return True
        return False

    def _finish(self, r: int, t1: int, sure: bool = True) -> None:
        """Request ``r`` emitted its last token at ``t1``; ``sure``: vLLM knew before the step that it would
        (its output needed one more token). With async scheduling its blocks are freed after the next
        step is scheduled (:meth:`_release_finishing`)."""
        self.fin[r] = t1
        self.finished += 1
        self.arrivals.on_finish(t1)
        if self.async_sched:
            self.finishing[r] = sure
            return
        if self.prefix_caching:
            self.free += self.kv.free(r, self.blk[r], self._kv_cached(r), self.free, finished=True)
        else:
            self.free += self.blk[r]
        self.blk[r] = 0
        del self.running[r]

    def _release_finishing(self) -> None:
        """Async scheduling (vLLM's ``AsyncScheduler`` with two batches in flight): step ``n + 1`` is
        scheduled before step ``n``'s output is processed, so requests that finished in step ``n`` still
        run (they count against ``max_num_seqs``, hold their blocks and can be preemption victims) while
        step ``n + 1`` is scheduled; processing step ``n``'s output then frees them. Called after each
        step's scheduling."""
        running, blk = self.running, self.blk
        for r in self.finishing:
            if r in running:
                del running[r]
                if self.prefix_caching:
                    self.free += self.kv.free(r, blk[r], self._finished_kv_cached(r), self.free, finished=True)
                else:
                    self.free += blk[r]
                blk[r] = 0
        self.finishing = {}

    def _finished_kv_cached(self, r: int) -> int:
        """Tokens of finished request ``r``'s blocks cached when async scheduling frees them: its last output
        is processed first, caching ``num_computed_tokens - num_output_placeholders`` (vLLM 0.32
        ``AsyncScheduler._update_request_with_output``), and plain decoding never schedules it again (no
        placeholder): its computed tokens, ``P + O - 1``, one more than at its last scheduling."""
        return self.nc[r]

    def _kv_cached(self, r: int) -> int:
        """Tokens of request ``r``'s blocks that are cached (hashed), as of its last scheduling."""
        return self.kv_cached_tokens[r] if self.async_sched else self.nc[r]

    def _note_scheduled(self, r: int, n: int, t0: int) -> int:
        """Request ``r`` is scheduled ``n`` tokens in the step starting at ``t0``: returns (and notes) the
        tokens its blocks now cache (vLLM ``allocate_slots``: ``min(num_computed + num_new, num_tokens)``;
        under async scheduling a request that sampled in the previous step does not know that token yet)."""
        cached = self.nc[r] + n
        if self.async_sched and self.gen[r] >= 1 and self.last_emit[r] == t0:
            cached = min(cached, self.P[r] + self.gen[r] - 1)
        self.kv_cached_tokens[r] = cached
        return cached

    def _decoder_cached_tokens(self, r: int, g: int) -> int:
        """Tokens aggregated decoder ``r``'s blocks cache when it is scheduled in step ``g``: its context
        ``a_r + g``, less the token in flight under async scheduling (it sampled in step ``g - 1``, unless
        it joined the aggregate at ``g`` after a step without it)."""
        if self.async_sched and (g > self.g0[r] or self.stale_joins.get(r) != g):
            return self.a[r] + g - 1
        return self.a[r] + g

    def _cache_scheduled(self, g: int, sched: list) -> None:
        """Cache the newly full shareable blocks of the running requests scheduled in step ``g`` so far
        (vLLM ``cache_blocks`` in ``allocate_slots``), before waiting requests are looked up: ``sched``'s
        chunks and the aggregated decoders, in vLLM's order (the decoders precede the chunks in the running
        order), so that copies of one hash are cached in the same order as in step mode (a lookup takes
        the first)."""
        lagging = self.kv.lagging
        for r in [r for r in lagging if self.fing[r] >= 0]:
            self.kv.cache(r, self._decoder_cached_tokens(r, g))
        for r, n in sched:
            if r in lagging:
                self.kv.cache(r, self._note_scheduled(r, n, self.now))

    def _use_eagle(self) -> bool:
        """Whether hits drop their last block (vLLM ``use_eagle``: EAGLE-family drafters); plain: no."""
        return False

    # ------------------------------------------------------------------ the plain step (step mode)
    def _explicit_step(self) -> None:
        """One vLLM V1 engine step on per-request state."""
        P, gen, nc, bs = self.P, self.gen, self.nc, self.bs
        running, waiting = self.running, self.waiting
        t0 = self.now
        nwait = len(waiting)
        budget = self.M
        free = self.free
        sched: list[tuple[int, int]] = []
        preempted = 0
        order = list(running)
        idx = 0
        finishing = self.finishing
        while idx < len(order) and budget > 0:
            r = order[idx]
            if r in finishing:  # async: finished in the previous step (plain decoding always knows it)
                idx += 1
                continue
            n = P[r] + gen[r] - nc[r]
            if n > budget:
                n = budget
            free, count, stop = self._make_room(order, r, -(-(nc[r] + n) // bs), free)
            preempted += count
            if stop:
                break
            sched.append((r, n))
            budget -= n
            idx += 1
        if self.kv.lagging:
            self._cache_scheduled(self.G, sched)
        if not preempted:
            budget, free = self._admit(t0, budget, free, len(running), sched)
        self.free = free
        if not sched:
            if self.finishing:  # vLLM's empty async step: the previous output is processed, then it schedules again
                self._release_finishing()
                return
            self._stalled()
        # Step time.
        tokens = logits = kv = pairs = prefill = 0
        for r, n in sched:
            c = nc[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            if c + n == P[r] + gen[r]:
                logits += 1
            if not (n == 1 and gen[r] >= 1 and c == P[r] + gen[r] - 1):
                prefill += n
        t1 = self._advance(self.st.step_subps(tokens, logits, kv, pairs, len(sched)))
        d = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self.tracer.record(t0, ((r, n, 0) for r, n in sched), used, nwait, 0)
        if self.finishing:
            self._release_finishing()
        itl = 0
        track = self.prefix_caching and self.async_sched  # the tokens each request's blocks cache
        cached = self.kv_cached_tokens
        for r, n in sched:
            nc[r] += n
            if track:
                cached[r] = nc[r]
            if nc[r] == P[r] + gen[r]:
                if gen[r] >= 1 and self.last_emit[r] == t0:
                    itl += 1
                    if track:  # its last token was in flight when this step was scheduled
                        cached[r] -= 1
                self._emit(r, t0, t1)
        self.now = t1
        self.G += 1
        self.rows.append((t0, 1, d, 0, d, len(sched), tokens, prefill, itl, used, nwait, preempted, 0))

    # ------------------------------------------------------------------ aggregated decoders (run mode)
    def _join(self, r: int, g_next: int) -> None:
        """Make running request ``r`` (all its known tokens computed but the last) an aggregated decoder."""
        a = self.nc[r] + 1 - g_next
        self.a[r] = a
        self.g0[r] = g_next
        self.e0[r] = self.gen[r]
        m = a % self.bs
        self.cnt[m] += 1
        self.cnt2[m] += 1
        self.cnt2[m + self.bs] += 1
        self.A += a
        self.B += 1
        fin = g_next + self.O[r] - self.gen[r] - 1
        self.fing[r] = fin
        heapq.heappush(self.heap, (fin, r))

    def _leave(self, r: int, g: int) -> int:
        """Remove decoder ``r`` from the aggregate at step ``g``; write back its state; return its blocks."""
        a = self.a[r]
        m = a % self.bs
        self.cnt[m] -= 1
        self.cnt2[m] -= 1
        self.cnt2[m + self.bs] -= 1
        self.A -= a
        self.B -= 1
        self.fing[r] = -1  # its heap entry is now stale and skipped
        c = a + g - 1
        self.nc[r] = c
        self.gen[r] = self.e0[r] + (g - self.g0[r])
        blocks = -(-c // self.bs)
        self.blk[r] = blocks
        if self.prefix_caching and g > self.g0[r]:  # it was last scheduled in step g - 1, aggregated
            if self.async_sched:
                # the token in flight when step g - 1 was scheduled (see _decoder_cached_tokens)
                self.kv_cached_tokens[r] = c - 1 if g - 1 > self.g0[r] or self.stale_joins.get(r) != g - 1 else c
            if self.kv.lagging and r in self.kv.lagging:
                self.kv.cache(r, self._kv_cached(r))
        return blocks

    def _materialize(self) -> None:
        """Write the aggregated decoders' state back to the per-request lists (at step ``self.G``)."""
        g, now, stale, last = self.G, self.now, self.stale, self.last_emit
        for r in self.running:
            if r != self.partial and self.fing[r] >= 0:
                self._leave(r, g)
                last[r] = stale.get(r, now)
        self.heap = []
        self.stale = {}
        self.partial = None

    def _aggregate(self) -> None:
        """Rebuild the aggregate from the per-request lists (after a plain step)."""
        P, gen, nc, now, last = self.P, self.gen, self.nc, self.now, self.last_emit
        for r in self.running:
            if r in self.finishing:
                continue
            if gen[r] >= 1 and nc[r] == P[r] + gen[r] - 1:
                self._join(r, self.G)
                if last[r] != now:
                    self.stale[r] = last[r]
                    if self.prefix_caching:
                        self.stale_joins[r] = self.G
            else:
                if self.partial is not None:  # pragma: no cover - guards the invariant below
                    raise RuntimeError("engine invariant broken: two running requests are mid-prefill")
                self.partial = r  # at most one, the last admitted (see the module docstring)

    #: Longest stretch of steps (after a fallback) kept on per-request state before rebuilding the aggregate.
    MAX_FALLBACK_STRETCH = 32

    def _fallback(self) -> None:
        """One exact step on materialised per-request state (the step mode's step), then back to the aggregate.

        Fallbacks that come in a row (async scheduling next to preemptions or prefill chunks, where the
        aggregate cannot take the step) would rebuild the aggregate after every step, O(running requests)
        each: when a fallback comes within eight steps of the last rebuild, the engine stays on per-request
        state for a stretch of steps that doubles while they keep coming (1, 3, 7, ... up to
        ``MAX_FALLBACK_STRETCH``) and resets when one comes later. Every such step is the step mode's own,
        so results are unchanged; only the cost moves.
        """
        self._materialize()
        self._explicit_step()
        if self.G - self.aggregated_at_step <= 8:
            self.fallback_stretch = min(2 * self.fallback_stretch + 1, self.MAX_FALLBACK_STRETCH)
        else:
            self.fallback_stretch = 0
        self.explicit_steps_left = self.fallback_stretch
        if not self.explicit_steps_left:
            self._aggregate()
            self.aggregated_at_step = self.G

    def _next_finish(self) -> int:
        """Step at which the first aggregated decoder emits its last token (skips stale heap entries)."""
        heap, fing = self.heap, self.fing
        while fing[heap[0][1]] != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0]

    def _decode_blocks(self, g: int, m: int) -> int:
        """New KV blocks the aggregated decoders need over steps g .. g+m-1."""
        bs = self.bs
        full, rem = divmod(m, bs)
        if not rem:
            return full * self.B
        # steps g .. g+rem-1 need cnt[(1-g) % bs], cnt[(-g) % bs], ...: one backwards cyclic window
        top = (1 - g) % bs + bs
        return full * self.B + sum(self.cnt2[top - rem + 1: top + 1])

    def _max_decode_steps(self, g: int, free: int) -> int:
        """Most consecutive decode steps from step g whose block allocations all fit in ``free`` blocks."""
        B, bs, cnt = self.B, self.bs, self.cnt
        full = free // B
        left = free - full * B
        j = 0
        while j < bs:
            need = cnt[(1 - g - j) % bs]
            if need > left:
                break
            left -= need
            j += 1
        return full * bs + j

    def _fast_step(self) -> None:
        """Advance by one step, or by a whole run of identical decode steps (run mode)."""
        B = self.B
        budget = self.M - B
        if budget < 0:  # the token budget cannot serve every decoder: per-request order matters
            self._fallback()
            return
        g = self.G
        bs = self.bs
        nb = self.cnt[(1 - g) % bs] if B else 0
        if self.finishing and (self.partial is not None or nb > self.free):
            self._fallback()  # async: preemption victims or a prefill chunk next to finished requests
            return
        if self.partial is None and B and nb <= self.free and self._head_blocked(self.free - nb, budget):
            self._decode_run(g, B)
            return
        self._mixed_step(g, budget, nb)

    def _head_blocked(self, free: int, budget: int) -> bool:
        """Whether the head of the waiting queue cannot be admitted with ``free`` blocks left after the
        decoders' allocations and ``budget`` tokens left (or nothing waits, or ``max_num_seqs`` run)."""
        waiting = self.waiting
        if not waiting or budget <= 0 or len(self.running) >= self.max_seqs:
            return True
        h = waiting[0]
        total = self.P[h] + self.gen[h]
        if not self.prefix_caching or (self.kv.shareable is None and h not in self.kv.own_runs):
            return -(-total // self.bs) > free or (not self.chunked and total > budget)
        if free < 0:
            return True
        if self.kv.lagging:
            # running requests are still filling blocks the head might hit: no run (a run needs the head
            # to stay blocked; without such blocks it does: free blocks and hits only shrink in a run)
            return False
        hit = self.kv.lookup(h, total, free)
        return (-(-total // self.bs) + hit.num_evictable - hit.num_blocks > free
                or (not self.chunked and total - hit.num_blocks * self.bs > budget))

    def _advance(self, d_subps: int) -> int:
        """The clock after a step of ``d_subps`` (2^-16 ps) from ``self.now``: returns its end (ps, floored)
        and keeps the remainder below a picosecond in ``clock_subps`` (see :mod:`servesim.roofline`)."""
        end = self.clock_subps + d_subps
        self.clock_subps = end & SUBPS_MASK
        return self.now + (end >> SUBPS_BITS)

    def _decode_run(self, g: int, B: int) -> None:
        """A run of decode-only steps up to the next event, in O(1).

        Step ``j`` of the run lasts ``d0 + j * inc`` (2^-16 ps); the run ends ``(rem + n d0 + inc n(n-1)/2)
        >> 16`` ps after ``t0``, ``rem`` the clock's sub-picosecond remainder at its start: one division,
        the same integers as stepping."""
        t0 = self.now
        rem = self.clock_subps
        K = self.st.decode_subps_per_token
        d0 = self.st.base_subps(B, B, B) + K * (self.A + B * g)
        inc = K * B
        n = self._next_finish() - g + 1  # up to the step where the first decoder finishes
        released = 0
        if self.stale:
            n = 1
        elif self.finishing:
            # async: the requests that finished in the previous step leave once this run's first step is
            # scheduled; the run goes on only if the waiting queue's head stays blocked without them
            free_before = self.free
            self._release_finishing()
            released = self.free - free_before
            nb0 = self._decode_blocks(g, 1)
            if n > 1 and not self._head_blocked(self.free - nb0 - self._decode_blocks(g + 1, 1), self.M - B):
                n = 1
        if n > 1:
            # every arrival ends the run, also behind a blocked queue: each row's waiting count is then
            # the count of each of its steps (the queue is recorded at step level)
            t_lim = self.arrivals.next_time()
            if self.max_time_ps is not None and (t_lim is None or self.max_time_ps < t_lim):
                t_lim = self.max_time_ps
            if t_lim is not None and rem + n * d0 + inc * (n * (n - 1) // 2) >= (t_lim - t0) << SUBPS_BITS:
                n = self._steps_to_reach(((t_lim - t0) << SUBPS_BITS) - rem, d0, inc, n)
            if n > 1 and (n // self.bs + 1) * B > self.free:
                n = min(n, self._max_decode_steps(g, self.free))
        nb = self._decode_blocks(g, n)
        end = rem + n * d0 + inc * (n * (n - 1) // 2)
        dur = end >> SUBPS_BITS
        if dur > self.kv_safe_ps and n > 1 and (self.total_blocks - self.free + nb) * dur >= KV_BLOCK_PS_MAX:
            span = KV_BLOCK_PS_MAX // (self.total_blocks - self.free + nb)
            n = max(1, self._steps_to_reach((span << SUBPS_BITS) - rem, d0, inc, n) - 1)
            nb = self._decode_blocks(g, n)
            end = rem + n * d0 + inc * (n * (n - 1) // 2)
            dur = end >> SUBPS_BITS
        if self.tracer is not None:
            self._trace_run(g, n, [t0 + ((rem + j * d0 + inc * (j * (j - 1) // 2)) >> SUBPS_BITS) for j in range(n)],
                            [self._decode_blocks(g, j + 1) + (released if j == 0 else 0) for j in range(n)], 0)
        t1 = t0 + dur
        self.clock_subps = end & SUBPS_MASK
        first_end = rem + d0
        d0_ps = first_end >> SUBPS_BITS
        inc_ps = (inc + SUBPS_PER_PS // 2) >> SUBPS_BITS  # for display: the per-step durations are exact at output
        self.free -= nb
        used = self.total_blocks - self.free
        itl = B - self._flush_stale(t0 + d0_ps)
        self.now = t1
        self.G = g + n
        nwait = len(self.waiting)
        if released:  # the first step still held the finished requests' blocks: a row of its own
            first_used = self.total_blocks - self.free - nb + self._decode_blocks(g, 1) + released
            self.rows.append((t0, 1, d0_ps, 0, d0_ps, B, B, 0, itl, first_used, nwait, 0, 0))
            if n > 1:
                rem1 = first_end & SUBPS_MASK
                d1_ps = (rem1 + d0 + inc) >> SUBPS_BITS
                self.rows.append((t0 + d0_ps, n - 1, d1_ps, inc_ps, dur - d0_ps, B, B, 0, B, used, nwait, 0, 0))
                self._record_run(g + 1, n - 1, rem1, d0 + inc, inc, nb - self._decode_blocks(g, 1))
        else:
            self.rows.append((t0, n, d0_ps, inc_ps, dur, B, B, 0, itl, used, nwait, 0, 0))
            self._record_run(g, n, rem, d0, inc, nb)
        if self.heap[0][0] == g + n - 1:
            self._finish_decoders(g + n - 1, t1)

    def _record_run(self, g: int, n: int, rem: int, d0: int, inc: int, new_blocks: int) -> None:
        """Note the last row, a plain decode run of ``n`` steps from step ``g`` (first step ``d0``, then
        ``+ inc`` per step, 2^-16 ps, from a clock remainder ``rem``) that allocated ``new_blocks`` blocks:
        its steps' durations are rebuilt at output (:meth:`_step_ends`), and its KV integral corrected for
        the blocks allocated after its first step (:meth:`_kv_block_ps`)."""
        if n > 1:
            self.sub_runs += (len(self.rows) - 1, rem, d0, inc)
            if new_blocks:
                top = (1 - g) % self.bs + self.bs
                self.kv_runs.append(len(self.rows) - 1)
                self.kv_windows += self.cnt2[top - self.bs + 1: top + 1]

    def _trace_run(self, g: int, n: int, starts: list[int], new_blocks: list[int], k: int) -> None:
        """Record the ``n`` steps of a run from step ``g`` (``starts``: their start times in ps;
        ``new_blocks``: blocks allocated from the run's start up to each step, inclusive)."""
        order = [(r,) + self._trace_tokens(r, g) for r in self.running if self.fing[r] >= 0]
        waiting = len(self.waiting)
        for j in range(n):
            row = [(r, tokens[j] if isinstance(tokens, list) else tokens, drafts[j] if isinstance(drafts, list) else drafts)
                   for r, tokens, drafts in order]
            self.tracer.record(starts[j], row, self.total_blocks - self.free + new_blocks[j],
                               waiting + self.arrivals.count_until(starts[j]), k)
            order = [e for e in order if self.fing[e[0]] != g + j]

    def _trace_tokens(self, r: int, g: int):
        """(tokens, drafts) aggregated decoder ``r`` schedules from step ``g``: plain decoding, 1 and 0."""
        return 1, 0

    def _kv_block_ps(self, used: np.ndarray, duration: np.ndarray, steps: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Each row's KV integral (blocks in use x step duration, summed over its steps; ps), int64 (R,).

        ``used * duration`` (the rows' blocks in use at their end and durations, int64 (R,); ``steps``: their
        numbers of steps, int64 (R,)), corrected for
        runs: speculative runs logged their correction (``kv_late``); in a plain decode run the blocks that
        step ``i`` allocates (``cnt[(1 - g - i) mod bs]``, periodic in ``i`` with period ``bs``, the window
        saved with the run) were not in use before that step's start ``D_i`` (the end of step ``i - 1``,
        ``ends``: every step's end after its row's start, ps, int64 (S,)): subtract ``sum_i nb_i D_i``.
        Exact in int64: every term is at most the row's integral, < 2**62.
        """
        kv = used * duration
        for row, late in self.kv_late:
            kv[row] -= late
        if not self.kv_runs:
            return kv
        bs = self.bs
        runs = np.fromiter(self.kv_runs, dtype=np.int64, count=len(self.kv_runs))
        windows = np.fromiter(self.kv_windows, dtype=np.int64, count=len(self.kv_windows)).reshape(-1, bs)
        counts = windows[:, ::-1]  # column rho: the blocks each step i = rho (mod bs) of the run allocates
        later = steps[runs] - 1  # each run's steps i >= 1 (every recorded run has two or more)
        offsets = np.cumsum(later) - later
        run = np.repeat(np.arange(runs.shape[0], dtype=np.int64), later)
        i = np.arange(run.shape[0], dtype=np.int64) - offsets[run] + 1
        first = np.cumsum(steps) - steps  # each row's first step in ``ends``
        late = counts.ravel()[run * bs + i % bs] * ends[first[runs][run] + i - 1]
        kv[runs] -= np.add.reduceat(late, offsets)
        return kv

    def _step_ends(self, cols: np.ndarray) -> np.ndarray:
        """Every step's end after the start of its row (ps), int64 (S,), S = sum of the rows' steps.

        ``cols``: the rows' columns (13, R). A single step ends its row's duration after its start; step
        ``j`` of a plain decode run (``sub_runs``: clock remainder ``rem``, first duration ``d0``, increment
        ``inc``, 2^-16 ps) ends ``(rem + m d0 + inc m(m-1)/2) >> 16`` ps after, ``m = j + 1``, evaluated as
        whole and sub-picosecond parts of ``d0`` and ``inc`` so that nothing overflows int64.
        """
        steps, duration = cols[1], cols[4]
        row = np.repeat(np.arange(steps.shape[0], dtype=np.int64), steps)
        m = np.arange(1, row.shape[0] + 1, dtype=np.int64) - np.repeat(np.cumsum(steps) - steps, steps)
        tri = m * (m - 1) // 2
        runs = np.fromiter(self.sub_runs, dtype=np.int64, count=len(self.sub_runs)).reshape(-1, 4)
        rem = np.zeros_like(duration)
        rem[runs[:, 0]] = runs[:, 1]
        if int(duration.max(initial=0)) < ROW_SUBPS_MAX >> SUBPS_BITS:  # every row's end fits int64 in 2^-16 ps
            d0 = duration << SUBPS_BITS  # a single step: m = 1, T = 0, no remainder
            inc = np.zeros_like(duration)
            d0[runs[:, 0]], inc[runs[:, 0]] = runs[:, 2], runs[:, 3]
            return (rem[row] + m * d0[row] + tri * inc[row]) >> SUBPS_BITS
        whole_d0 = duration.copy()
        part_d0, whole_inc, part_inc = np.zeros_like(duration), np.zeros_like(duration), np.zeros_like(duration)
        whole_d0[runs[:, 0]], part_d0[runs[:, 0]] = runs[:, 2] >> SUBPS_BITS, runs[:, 2] & SUBPS_MASK
        whole_inc[runs[:, 0]], part_inc[runs[:, 0]] = runs[:, 3] >> SUBPS_BITS, runs[:, 3] & SUBPS_MASK
        return (m * whole_d0[row] + tri * whole_inc[row]
                + ((rem[row] + m * part_d0[row] + tri * part_inc[row]) >> SUBPS_BITS))

    @staticmethod
    def _steps_to_reach(span: int, d0: int, inc: int, n_max: int) -> int:
        """Smallest m in [1, n_max] with m*d0 + inc*m(m-1)/2 >= span (span > 0)."""
        if inc == 0:
            m = -(-span // d0)
        else:
            # Solve inc/2 m^2 + (d0 - inc/2) m - span = 0, then correct the float estimate exactly.
            b = d0 - inc / 2.0
            m = max(int((-b + (b * b + 2.0 * inc * span) ** 0.5) / inc), 1)
            while m > 1 and (m - 1) * d0 + inc * ((m - 1) * (m - 2) // 2) >= span:
                m -= 1
            while m * d0 + inc * (m * (m - 1) // 2) < span:
                m += 1
        return max(1, min(m, n_max))

    def _finish_decoders(self, g_last: int, t1: int) -> None:
        heap, fing = self.heap, self.fing
        while heap and heap[0][0] == g_last:
            _, r = heapq.heappop(heap)
            if fing[r] != g_last:
                continue  # stale entry of a preempted decoder
            self._leave(r, g_last + 1)
            self.gen[r] = self.O[r]
            self.last_emit[r] = t1
            self._finish(r, t1)

    def _need_at(self, r: int, g: int) -> int:
        """New KV blocks aggregated decoder ``r`` allocates at step ``g`` (1 when its context crosses a
        block boundary)."""
        return 1 if self.a[r] % self.bs == (1 - g) % self.bs else 0

    def _preempt_aggregated(self, g: int, nb: int, need_p: int, p_scheduled: bool) -> tuple[int, int, bool]:
        """vLLM's preemption when the step's allocations do not fit, on the aggregate.

        Decoders allocate in admission order and the partial prefill (always last) after them; whenever an
        allocation fails the LAST running request is preempted. So the victims are a suffix of the running
        order: the partial prefill first (if the decoders alone do not fit, or it does not fit after them),
        then decoders from the most recently admitted, until the remaining decoders' new blocks fit.

        Returns:
            (preempted count, new blocks still needed by the remaining decoders, partial still scheduled).
        """
        now = self.now
        free = self.free
        preempted = 0
        p = self.partial
        if p is not None and (nb > free or (p_scheduled and nb + need_p > free)):
            if self.prefix_caching and nb <= free:
                self.kv.sync(free - nb)  # the decoders allocated before the partial prefill failed to
            self.partial = None
            p_scheduled = False
            free += self._preempt(p)
            preempted += 1
        if nb > free:
            # Step mode frees each victim when the pool is empty, so every block free before it is taken
            # first; freeing the victims before the decoders' allocations leaves the same queue.
            for v in list(reversed(self.running)):
                if v == p:
                    continue
                last = self.stale.pop(v, now)
                nb -= self._need_at(v, g)
                self._leave(v, g)
                self.last_emit[v] = last
                self.free = free
                free += self._preempt(v)
                preempted += 1
                if nb <= free:
                    break
        self.free = free
        return preempted, nb, p_scheduled

    def _mixed_step(self, g: int, budget: int, nb: int) -> None:
        """One step: aggregated decoders plus the partial prefill and admissions, O(touched requests)."""
        P, gen, nc, blk, bs = self.P, self.gen, self.nc, self.blk, self.bs
        t0 = self.now
        nwait = len(self.waiting)
        sched: list[tuple[int, int]] = []
        p = self.partial
        n_p = need_p = 0
        p_scheduled = p is not None and budget > 0
        if p_scheduled:
            n_p = P[p] + gen[p] - nc[p]
            if n_p > budget:
                n_p = budget
            need_p = -(-(nc[p] + n_p) // bs) - blk[p]
        preempted = 0
        if nb + (need_p if p_scheduled else 0) > self.free:
            preempted, nb, p_scheduled = self._preempt_aggregated(g, nb, need_p, p_scheduled)
        free = self.free - nb
        B = self.B
        if p_scheduled:
            free -= need_p
            blk[p] += need_p
            sched.append((p, n_p))
            budget = self.M - B - n_p
        else:
            budget = self.M - B
        if self.kv.lagging:
            self._cache_scheduled(g, sched)
        if not preempted:
            budget, free = self._admit(t0, budget, free, len(self.running), sched)
        self.free = free
        if not sched and not B:
            if self.finishing:
                self._release_finishing()
                return
            self._stalled()
        ctx = self.A + B * g
        tokens, logits, kv, pairs, prefill = B, B, ctx, ctx, 0
        for r, n in sched:
            c = nc[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            if not (n == 1 and gen[r] >= 1 and c == P[r] + gen[r] - 1):  # as in _explicit_step: the last
                prefill += n  # token of a recompute is the request's last sampled token, a decode token
            if c + n == P[r] + gen[r]:
                logits += 1
        t1 = self._advance(self.st.step_subps(tokens, logits, kv, pairs, B + len(sched)))
        d = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self._trace_mixed(t0, g, sched, used, nwait, 0)
        if self.finishing:
            self._release_finishing()
        itl = B - self._flush_stale(t1)
        self.now = t1
        self.G = g + 1
        self._finish_decoders(g, t1)
        # a partial prefill that got no budget this step (the decoders took it all) stays the partial
        self.partial = p if p is not None and not p_scheduled and p in self.running else None
        track = self.prefix_caching and self.async_sched  # the tokens each request's blocks cache
        cached = self.kv_cached_tokens
        for r, n in sched:
            nc[r] += n
            if track:
                cached[r] = nc[r]
            if nc[r] == P[r] + gen[r]:
                if gen[r] >= 1 and self.last_emit[r] == t0:
                    itl += 1  # a recompute admitted right after its preemption (async's repeated schedule)
                    if track:
                        cached[r] -= 1
                if not self._emit(r, t0, t1):
                    self._join(r, g + 1)
            else:
                self.partial = r
        self.rows.append((t0, 1, d, 0, d, B + len(sched), tokens, prefill, itl, used, nwait, preempted, 0))

    def _trace_mixed(self, t0: int, g: int, sched: list, used: int, nwait: int, k: int, extra=None) -> None:
        """Record a run-mode step: aggregated decoders, ``sched`` (prefills, admissions) and ``extra``
        (request -> (tokens, drafts, ...): finished requests scheduled once more) in running order."""
        chunks = {r: n for r, n in sched}
        row = []
        for r in self.running:
            if r in chunks:
                row.append((r, chunks[r], 0))
            elif extra and r in extra:
                row.append((r, extra[r][0], extra[r][1]))
            elif self.fing[r] >= 0:
                tokens, drafts = self._trace_tokens(r, g)
                row.append((r, tokens[0] if isinstance(tokens, list) else tokens,
                            drafts[0] if isinstance(drafts, list) else drafts))
        self.tracer.record(t0, row, used, nwait, k)

    # ------------------------------------------------------------------ results
    def output(self) -> EngineOutput:
        """The engine's records as arrays in seconds (call after the SimPy run)."""
        if self.mode == "run" and (self.B or self.partial is not None):
            self._materialize()
        s = float(PS_PER_S)

        def secs(values):
            arr = np.asarray(values, dtype=np.int64)
            out = arr / s
            out[arr < 0] = np.nan
            return out

        n = self.n
        requests = RequestLog(
            request_id=np.arange(n, dtype=np.int64),
            arrival_s=secs(self.arr),
            prompt_tokens=np.asarray(self.P, dtype=np.int64),
            output_tokens=np.asarray(self.O, dtype=np.int64),
            generated_tokens=np.asarray(self.gen, dtype=np.int64),
            first_scheduled_s=secs(self.first_sched),
            first_token_s=secs(self.first_tok),
            finish_s=secs(self.fin),
            preemptions=np.asarray(self.npre, dtype=np.int64),
            num_cached_tokens=np.maximum(np.asarray(self.num_cached_tokens, dtype=np.int64), 0),
        )

        rows = np.fromiter(chain.from_iterable(self.rows), dtype=np.int64, count=13 * len(self.rows)).reshape(-1, 13)
        cols = rows.T
        ends = self._step_ends(cols)
        # each step's duration: its end less the previous step's end within its row (a row starts at 0)
        previous = np.zeros_like(ends)
        previous[1:] = ends[:-1]
        previous[np.cumsum(cols[1]) - cols[1]] = 0
        steps = StepLog(
            start_s=cols[0] / s,
            num_steps=cols[1].copy(),
            first_step_s=cols[2] / s,
            step_increment_s=cols[3] / s,
            duration_s=cols[4] / s,
            batch_size=cols[5].copy(),
            num_tokens=cols[6].copy(),
            num_prefill_tokens=cols[7].copy(),
            itl_samples=cols[8].copy(),
            kv_blocks_used=cols[9].copy(),
            num_waiting=cols[10].copy(),
            num_preempted=cols[11].copy(),
            k=cols[12].copy(),
            start_ps=cols[0].copy(),
            kv_block_ps=self._kv_block_ps(cols[9], cols[4], cols[1], ends),
            durations_s=(ends - previous) / s,
        )
        return EngineOutput(
            requests=requests,
            steps=steps,
            extra_itl_s=np.asarray(self.extra_itl, dtype=np.int64) / s,
            kv_blocks_total=self.total_blocks,
            block_size=self.bs,
            end_s=self.now / s,
            prefix_cache=dataclasses.asdict(self.prefix_cache_stats) if self.prefix_caching else {},
        )
