"""The engine of one model replica: vLLM V1 scheduling over a paged KV cache, advanced by SimPy.

One engine serves plain and speculative decoding. Scheduling (admission, allocate-or-preempt, the step's
cost, emission) is written once, here; how a decoding request decodes (its verify width and acceptance,
the drafter's cost, and how a run of decode steps is summed) is a decoding strategy:
:class:`~servesim.engine.plain_decoding.PlainDecoding` (one token per step) or
:class:`~servesim.engine.speculative_decoding.SpeculativeDecoding` (``1 + k`` tokens, stochastic acceptance).

Scheduling mirrors vLLM 0.32's v1 scheduler (``vllm/v1/core/sched/scheduler.py``, see
``docs/reference/vllm-semantics.md``; checked step by step against it on the golden traces of
``tests/data/golden/``, written by ``oracle/vllm_oracle.py``):

* the KV pool has ``num_gpu_blocks - 1`` usable blocks (block 0 is vLLM's null block);
* every step walks the RUNNING requests in admission order, giving each the tokens it still has to
  compute (``prompt + generated - num_computed``: 1 for a decoding request, ``1 + drafts`` with
  speculation, a chunk of the prompt for a prefilling one) capped by what is left of the token budget
  ``max_num_batched_tokens``;
* each scheduled request gets the KV blocks for ``num_computed + num_new + lookahead`` tokens; when the
  pool is empty the most recently admitted running request is preempted (recompute: its blocks are
  freed, its computed tokens reset to 0, it goes to the FRONT of the waiting queue), and if that victim is
  the request being scheduled, scheduling of running requests stops for this step;
* then, only if nobody was preempted in this step, WAITING requests are admitted in FCFS order while
  budget is left and fewer than ``max_num_seqs`` run, each only if its whole sequence fits in the free
  blocks (``scheduler_reserve_full_isl``) and its first chunk plus the lookahead slots can be allocated;
  with chunked prefill a prompt takes whatever budget is left;
* a request whose computed tokens reach its known tokens samples at the end of the step; a finished
  request frees its blocks at the end of the step, or, with async scheduling (``async_scheduling``,
  vLLM's default on GPUs), after the next step has been scheduled.

Speculative decoding adds vLLM's per-method rules (:mod:`servesim.engine.speculative_decoding`): the
drafting slots a draft model takes out of the budget, the lookahead KV slots, MTP's prefill-chunk rule
and, with async scheduling, the optimistic KV allocation for the previous step's drafts.

Two modes produce the same result, bit for bit (all times are integer picoseconds):

* ``step``: the loop above, one engine step per SimPy timeout, per-request state in lists.
* ``run`` (default): decoding requests are kept in aggregate by the decoding strategy (plain decoding: how
  many there are, the sum of their contexts, how many cross a block boundary at each step phase;
  speculation: per-step sums of their pre-drawn round timelines), with a heap of their finishing steps. A
  step with prefill or admission costs O(requests it touches), and a run of decode steps up to the next
  event (an arrival (every one: the waiting count is logged per step), a request that finishes, a block
  allocation that would fail) is advanced at once (closed form, or vector sums). Preemption works on the
  aggregate (its victims are a suffix of the running order, :meth:`Engine._preempt_aggregated`); rare
  events that need the per-request order (a token budget smaller than the decoding batch, finished
  requests scheduled once more that do not fit the budget, several requests mid-prefill) materialise the
  per-request state and run the exact step.

KV blocks go through the block manager (:mod:`servesim.engine.block_manager`, vLLM 0.32's block pool,
with prefix caching when ``enable_prefix_caching``). The engine keeps the free-block count in
``free_blocks`` and allocates by decrementing it; allocations only pop the free queue's head, so a
decode run (which only allocates) needs no replay of who took which block: the manager pops the run's
blocks at its next call, before anything that depends on the queue's order (a free, a lookup, a hit),
and run mode then makes the same calls in the same order as step mode. Two points keep run mode exact
with prefix caching:

* the aggregated decoders' shareable blocks (those another request could hit) are cached lazily, at the
  step they filled (the strategy's ``cached_tokens``), before any other block is cached or looked up
  (:meth:`Engine._cache_scheduled`, the strategy's ``leave``), so copies of one hash are cached in
  step-mode order;
* a run needs the head of the waiting queue to stay blocked through it. It does: within a run no block is
  freed and the admission check is ``blocks(num_tokens) + evictable hits - hits > free blocks``, where free
  blocks only fall and hits on held blocks cannot change (no holder leaves); evictions only shorten the
  hit. While running requests still fill shareable blocks the head might hit, there is no run (each step
  is taken on its own).
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from array import array
from collections import deque

import numpy as np

from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.block_manager import BlockManager, PrefixCacheStats
from servesim.engine.output import EngineOutput, RequestLog, StepLog
from servesim.engine.run_records import RunRecords, step_durations_s
from servesim.engine.step_rows import KV_BLOCK_PS_MAX, StepRowLog
from servesim.errors import SettingError
from servesim.heap import release_free_memory
from servesim.roofline import PS_PER_S, SUBPS_BITS, SUBPS_MASK, StepTimeModel


def _int_list(values) -> list[int]:
    """``values`` (a sequence or array of whole numbers) as a list of Python ints (the engine's hot paths
    compute with Python ints), equal values sharing one int object: token counts repeat (a trace has a few
    thousand distinct lengths), and an int object per request (28 bytes beside the list's 8) was 56 MB of
    prompt and output lengths at 10^6 requests."""
    array = np.asarray(values)
    ints = array.tolist() if array.dtype.kind in "iu" else [int(x) for x in array.tolist()]
    shared: dict[int, int] = {}
    return [shared.setdefault(value, value) for value in ints]


ARRIVALS_PER_TIMEOUT = 256
"""Arrivals a single engine (nothing observing it between steps) pulls between its steps before it yields
one SimPy timeout for the whole stretch (:meth:`Engine.process`): fewer SimPy events than one per arrival
interval, and still a return to SimPy's (interpreted) loop every few milliseconds of the run, where
Ctrl-C, SIGTERM and the progress bar's thread get their turn."""


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
        async_scheduling: vLLM's async scheduling (see :meth:`release_finishing`): the next step is
            scheduled before this step's output is processed, so a request that finishes in a step keeps
            its blocks and its place in the running list while the next step is scheduled.
        max_time_s: stop the simulation at the first step boundary at or after this time (s); None = never.
        enable_prefix_caching: vLLM's automatic prefix caching (:mod:`servesim.engine.block_manager`).
        content: the requests' :class:`~servesim.workload.content.SequenceContent` for prefix caching
            (None = no two requests share content; a preempted request still hits its own blocks).
        speculation: a :class:`~servesim.engine.speculative_decoding.SpecSetup` to decode speculatively;
            None (default) = plain decoding.
        max_model_len: vLLM's ``max_model_len`` (tokens), the longest prompt + output; None = unbounded. With
            speculation vLLM never schedules a position past ``max_model_len - 1`` nor allocates KV slots
            past ``max_model_len``, so a request within ``K`` drafts plus the lookahead of it verifies fewer
            drafts and holds fewer blocks (``SpeculativeDecoding._context_limits``; under async scheduling
            with exact steps only).

    Raises:
        ValueError: a request has no prompt or no output token (``prompt_tokens`` or ``output_tokens`` <
            1), a request can never be served (its tokens exceed the KV cache or, without chunked
            prefill, its prompt exceeds the token budget; with speculation, its largest one-step KV need
            exceeds the cache), or a setting is out of range.
    """

    # the whole state, as slots (no instance dict): the step code reads these attributes millions of times a
    # run. The compiled build makes the class an extension type with one Python-object field per slot
    # (setup.py EXTENSION_TYPES), which its own methods read at a fixed offset; a new attribute goes here
    __slots__ = (
        "_arrived", "aggregated_at_step", "arrival_ps", "arrivals", "async_scheduling", "block_size", "clock_subps",
        "closed_runs", "context_cap", "decode_ready", "decoding", "draft_slots", "emitted_tokens",
        "enable_chunked_prefill", "explicit_steps_left", "extra_itl", "fallback_stretch", "finish_heap",
        "finish_ps", "finish_step", "finished", "finished_output", "finishing", "first_scheduled_ps",
        "first_token_ps", "free_blocks", "k_next", "kv", "kv_cached_tokens", "kv_late", "kv_output_tokens",
        "kv_runs", "kv_safe_ps", "kv_token_cap", "kv_windows", "last_emit_ps", "lookahead_slots", "max_model_len",
        "max_num_batched_tokens", "max_num_seqs", "max_time_ps", "mode", "multi_partial", "now", "num_blocks",
        "num_cached_tokens", "num_computed", "num_generated", "num_preemptions", "num_requests",
        "num_unsure_finishing", "output_cached", "output_tokens", "partial", "prefill_lookahead",
        "prefix_cache_stats", "prefix_caching", "prompt_tokens", "rejected_at_step", "rejected_drafts",
        "reprefill_tokens", "row_log", "rows", "run_records", "running", "stale", "step_index", "step_time",
        "total_blocks", "tracer", "waiting", "__weakref__",
    )

    #: Longest stretch of steps (after a fallback) kept on per-request state before rebuilding the aggregate.
    MAX_FALLBACK_STRETCH = 32

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
        speculation=None,
        max_model_len: int | None = None,
    ) -> None:
        if mode not in ("run", "step"):
            raise ValueError(f"unknown engine mode {mode!r} (expected 'run' or 'step')")
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1 or kv_blocks_total < 2:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1 and KV blocks >= 2 "
                             "(vLLM keeps one null block)")
        self.prompt_tokens = _int_list(prompt_tokens)
        self.output_tokens = _int_list(output_tokens)
        num_requests = len(self.prompt_tokens)
        self.num_requests = num_requests
        self.arrivals = arrivals
        self.step_time = step_time
        self.block_size = block_size = int(block_size)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.max_num_seqs = int(max_num_seqs)
        self.enable_chunked_prefill = bool(enable_chunked_prefill)
        self.mode = mode
        # run mode after a fallback (one exact step on per-request state): how many further steps stay on
        # that state before the aggregate is rebuilt, the current stretch, and the step of the last rebuild
        self.explicit_steps_left = 0
        self.fallback_stretch = 0
        self.aggregated_at_step = 0
        self.total_blocks = int(kv_blocks_total) - 1  # usable blocks: vLLM's block pool keeps block 0 as its null block
        self.tracer = None  # a servesim.engine.step_trace.StepTracer records every step when set
        self.async_scheduling = bool(async_scheduling)
        # async scheduling: requests that finished in the previous step -> whether vLLM knew they would
        # (then it skips them; otherwise it schedules them once more and discards that output)
        self.finishing: dict[int, bool] = {}
        self.num_unsure_finishing = 0  # those vLLM did not know would finish
        self.max_time_ps = None if max_time_s is None else round(max_time_s * PS_PER_S)
        self.max_model_len = None if max_model_len is None else int(max_model_len)
        if num_requests:
            self._check_requests_fit()
        # Per-request state (materialised: always valid for non-decoders, for decoders in step mode).
        self.num_computed = [0] * num_requests  # vLLM num_computed_tokens
        self.num_generated = [0] * num_requests  # sampled (emitted) tokens
        self.num_blocks = [0] * num_requests  # KV blocks held
        self.last_emit_ps = [-1] * num_requests  # the last token emission
        # decode_ready[r]: r's next scheduling decodes (it sampled when last scheduled; with speculation the
        # drafter proposed for it then, so a recompute after a preemption has none, even when one token of
        # its recompute is left; without speculation such a recompute decodes its last token as usual)
        self.decode_ready = [False] * num_requests
        self.emitted_tokens = [0] * num_requests  # tokens each request emitted at its last emission
        # async scheduling: the drafts rejected in the step each request last verified in; while the next
        # step is scheduled vLLM still counts them as computed, so that step's KV allocation is for
        # ``num_computed + rejected + scheduled + lookahead`` tokens (0 without speculation)
        self.rejected_drafts = [0] * num_requests
        self.rejected_at_step = [-2] * num_requests
        # Records (ps; -1 = not yet): written a few times per request and read at output, so held as int64
        # arrays (8 bytes per request, no int object each; numpy reads them in place at output)
        self.arrival_ps = array("q", [-1]) * num_requests
        self.first_scheduled_ps = array("q", [-1]) * num_requests
        self.first_token_ps = array("q", [-1]) * num_requests
        self.finish_ps = array("q", [-1]) * num_requests
        self.num_preemptions = array("q", [0]) * num_requests
        # Queues.
        self.running: dict[int, None] = {}  # admission order
        self.waiting: deque[int] = deque()
        self.free_blocks = self.total_blocks
        # the decoding strategy (its per-request token costs, lookahead and aggregate), before the block
        # manager, which needs its use_eagle
        if speculation is None:
            from servesim.engine.plain_decoding import PlainDecoding

            self.decoding = PlainDecoding(self)
        else:
            from servesim.engine.speculative_decoding import SpeculativeDecoding

            self.decoding = SpeculativeDecoding(self, speculation)
        decoding = self.decoding
        # vLLM's per-request token costs in a step (0 without speculation): slots taken out of the token
        # budget per scheduled request for drafting, the prefill lookahead of multi-layer MTP, and the
        # KV lookahead slots
        self.draft_slots = decoding.draft_slots
        self.prefill_lookahead = decoding.prefill_lookahead
        self.lookahead_slots = decoding.lookahead_slots
        # vLLM allocates KV slots for at most max_model_len tokens; None where no request comes that close
        self.kv_token_cap = decoding.kv_token_cap
        # async scheduling with a request near max_model_len: vLLM's bound on a running request's new tokens,
        # max_model_len - num_computed_tokens - 1, counts the drafts in flight and may skip the request for a
        # step; applied in the exact step, so run mode takes exact steps throughout (the same results)
        self.context_cap = decoding.context_cap
        if self.context_cap is not None:
            self.mode = "step"
        # vLLM's num_reprefillable_tokens (multi-layer MTP: the last prefill_lookahead - 1 tokens are not cached yet)
        self.reprefill_tokens = max(self.prefill_lookahead - 1, 0)
        self.k_next = decoding.initial_k  # drafts proposed in the last step, verified in the next one
        # the KV block manager (vLLM's block pool); ``free_blocks`` mirrors its free-block count, decremented
        # by allocations, which the manager applies at its next call (BlockManager.sync)
        self.prefix_caching = bool(enable_prefix_caching)
        self.kv = BlockManager(self.total_blocks + 1, block_size, self.prefix_caching, content, decoding.use_eagle)
        self.num_cached_tokens = array("q", [-1]) * num_requests  # vLLM Request.num_cached_tokens: the hit at first scheduling
        # prefix caching: tokens of each request's blocks cached at its last scheduling (vLLM cache_blocks:
        # min(num_computed + num_new, num_tokens), without drafts, under async scheduling without the tokens
        # still in flight, less num_reprefillable_tokens; see _note_many) and, under async scheduling,
        # what the output in flight at that scheduling caches once processed (kv_output_tokens), and what a
        # finished request's last output caches (output_cached)
        self.kv_cached_tokens = array("q", [0]) * num_requests  # (int64 arrays: written a few times per request)
        self.kv_output_tokens = array("q", [0]) * num_requests
        self.output_cached: dict[int, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.now = 0
        self.clock_subps = 0  # the clock's remainder below self.now (ps), in 2^-16 ps: [0, SUBPS_PER_PS)
        self.step_index = 0  # index of the next engine step
        self.finished = 0
        # Aggregated decoders (run mode): their representation is the strategy's; the engine keeps which
        # request is mid-prefill and when each decoder emits its last token.
        self.partial: int | None = None  # the running request mid-prefill (the last admitted)
        self.multi_partial = False  # several requests mid-prefill (MTP's chunk rule): exact steps then
        self.finish_heap: list[tuple[int, int]] = []  # (step at which it emits its last token, request)
        self.finish_step = [-1] * num_requests  # step at which aggregated decoder r emits its last token; -1 if not one
        self.stale: dict[int, int] = {}  # decoder -> ps of its last emission, when not the previous step's end
        # Step log: one row per step or run, a plain tuple of StepRow's fields in its order, read by field
        # name at output (exact tuples of ints, which the garbage collector untracks; a NamedTuple per row
        # would be traversed by every full collection, a cost that grows with the log). ``rows`` is the
        # log's recent part, which the hot paths append to; older rows are chunks of int64 times and int32
        # counts (StepRowLog)
        self.row_log = StepRowLog()
        self.rows: list[tuple] = self.row_log.items
        # what the rows' runs need at output to rebuild their steps' ends and KV integrals; the hot paths
        # extend the recent parts of its logs through these aliases (flat lists of ints)
        self.run_records = records = RunRecords(block_size)
        self.kv_late: list[int] = records.kv_late_log.items
        self.closed_runs: list[int] = records.closed_run_log.items
        self.kv_runs: list[int] = records.kv_run_log.items
        self.kv_windows: list[int] = records.kv_window_log.items
        self.kv_safe_ps = KV_BLOCK_PS_MAX // self.total_blocks  # rows shorter than this always fit
        self.extra_itl: list[int] = []
        self._arrived: list[tuple[int, int]] = []
        self.finished_output: EngineOutput | None = None  # output() once taken

    def _check_requests_fit(self) -> None:
        """Refuse requests that could never be served.

        Raises:
            ValueError: one line naming the request or the limit, and what was expected.
        """
        bs = self.block_size
        for name, tokens in (("prompt_tokens", self.prompt_tokens), ("output_tokens", self.output_tokens)):
            if min(tokens) < 1:
                r = tokens.index(min(tokens))
                raise ValueError(f"request {r}: {name} = {tokens[r]}, expected >= 1 (vLLM needs a prompt "
                                 "token and max_tokens >= 1)")
        longest = int(max(map(operator.add, self.prompt_tokens, self.output_tokens)))
        if self.max_model_len is not None and longest > self.max_model_len:
            raise ValueError(f"a request of {longest} tokens (prompt + output) exceeds max_model_len="
                             f"{self.max_model_len}: vLLM would reject it")
        if -(-longest // bs) > self.total_blocks:
            raise ValueError(
                f"a request of {longest} tokens (prompt + output) needs more KV blocks than the cache holds "
                f"({self.total_blocks} blocks of {bs} tokens): it could never be served"
            )
        if not self.enable_chunked_prefill and longest > self.max_num_batched_tokens:
            raise ValueError(
                f"a request of {longest} tokens (prompt + output) exceeds max_num_batched_tokens="
                f"{self.max_num_batched_tokens} with chunked prefill disabled: after a preemption it could never "
                "be recomputed (vLLM requires max_num_batched_tokens >= max_model_len without chunked prefill)"
            )

    # ------------------------------------------------------------------ SimPy process
    def process(self, env):
        """The replica's SimPy process: one timeout per engine step or run of decode steps or, when nothing
        else observes the engine between its steps (one replica pulling from a plain :class:`ArrivalSource`:
        no router), per stretch of steps over up to :data:`ARRIVALS_PER_TIMEOUT` arrivals, which the engine
        pulls between its steps as it does after a timeout (a stretch ends at an idle wait, at the
        simulation's time limit, and when the step log is due for compaction). Every step starts and ends
        at the same instant either way; only the number of SimPy events changes."""
        arrivals = self.arrivals
        batch = type(arrivals) is ArrivalSource
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
            pulls_left = ARRIVALS_PER_TIMEOUT
            while True:
                if self.mode == "step":
                    self._explicit_step()
                elif self.explicit_steps_left:
                    self._explicit_step()
                    self.explicit_steps_left -= 1
                    if not self.explicit_steps_left:
                        self._aggregate()
                        self.aggregated_at_step = self.step_index
                else:
                    self._fast_step()
                if not batch or not (self.running or self.waiting):
                    break
                if self.max_time_ps is not None and self.now >= self.max_time_ps:
                    break
                t_next = arrivals.next_ps  # arrivals.next_time(), inline (hot loop)
                if t_next is not None and t_next <= self.now:
                    # what the loop's top does after a timeout: the engine is busy and before its limit
                    pulls_left -= 1
                    if not pulls_left or self.row_log.full():
                        break
                    self._pull_arrivals()
            if self.row_log.full():
                self.compact_logs()
            yield env.timeout((self.now - t0) / PS_PER_S)

    def compact_logs(self) -> None:
        """Move the step log's and the runs' recent records into numpy chunks (bounded memory per row)."""
        self.row_log.compact()
        self.run_records.compact()

    def _pull_arrivals(self) -> None:
        got = self._arrived
        self.arrivals.pop_until(self.now, got)
        if got:
            arrival, waiting = self.arrival_ps, self.waiting
            for r, t in got:
                arrival[r] = t
                waiting.append(r)
            got.clear()

    # ------------------------------------------------------------------ shared pieces
    def _admit(self, t0: int, budget: int, free: int, num_running: int, sched: list) -> tuple[int, int]:
        """Admit waiting requests (FCFS) into ``sched`` (``(request, tokens)`` pairs); returns (budget, free) left.

        A request is admitted only if its whole sequence fits in the free blocks; it gets blocks for its
        first chunk plus the lookahead slots.
        """
        waiting, prompt, gen, blocks, bs = self.waiting, self.prompt_tokens, self.num_generated, self.num_blocks, self.block_size
        running, first_sched = self.running, self.first_scheduled_ps
        ds = self.draft_slots
        lookahead = self.lookahead_slots
        caching = self.prefix_caching
        hit = None
        hit_tokens = extra = 0
        noted: list[tuple[int, int]] = []  # admissions whose cached tokens are noted at the end
        while waiting and budget > ds and num_running < self.max_num_seqs:
            r = waiting[0]
            total = prompt[r] + gen[r]
            if caching:
                hit = self.kv.lookup(r, total, free)
                hit_tokens = hit.num_blocks * bs
                extra = hit.num_evictable - hit.num_blocks  # hit blocks in the free queue cost free blocks
            if -(-total // bs) + extra > free:  # vLLM's scheduler_reserve_full_isl: the whole sequence must fit
                break
            left = total - hit_tokens
            n = left if left < budget - ds else budget - ds
            if n < left and not self.enable_chunked_prefill:
                break
            if self.prefill_lookahead > 1:
                n = self._reserve_prefill_lookahead(total, hit_tokens, n)
                if not n:
                    break
            slots = hit_tokens + n + lookahead  # the first chunk and the lookahead slots
            if self.kv_token_cap is not None and slots > self.kv_token_cap:
                slots = self.kv_token_cap
            need = -(-slots // bs) + extra
            if need > free:
                break
            free -= need
            blocks[r] = need - extra
            if caching:
                if hit_tokens:
                    self.kv.touch(r, hit)
                    self.num_computed[r] = hit_tokens
                if self.kv.shareable is not None:  # cached now: a later admission of this step may hit it
                    self._note_many(((r, n),), t0)
                    self.kv.cache(r, self.kv_cached_tokens[r])
                else:
                    noted.append((r, n))
                self.prefix_cache_stats.record(total, hit_tokens, self.num_preemptions[r] > 0)
                if self.tracer is not None:
                    self.tracer.record_hit(r, total, hit_tokens, self.num_preemptions[r] > 0)
            if self.num_cached_tokens[r] < 0:
                self.num_cached_tokens[r] = hit_tokens
            waiting.popleft()
            running[r] = None
            num_running += 1
            sched.append((r, n))
            budget -= n + ds
            if first_sched[r] < 0:
                first_sched[r] = t0
        if noted:
            self._note_many(noted, t0)
        return budget, free

    def _reserve_prefill_lookahead(self, total: int, computed: int, n: int) -> int:
        """vLLM's multi-layer MTP rule (``Scheduler._reserve_prefill_lookahead``): a prefill chunk of ``n``
        tokens never ends within ``prefill_lookahead`` tokens of the end of the request's ``total`` known
        tokens; it is shortened to leave that many for the next chunk (0 = not schedulable this step)."""
        remaining = total - computed - n
        if 0 < remaining < self.prefill_lookahead:
            n -= self.prefill_lookahead - remaining
        return max(n, 0)

    def flush_stale(self, t_emit: int) -> int:
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
        """vLLM's allocation for running request ``r`` in an exact step: while the pool cannot give it
        ``need`` blocks in all, preempt the last request of ``order`` (the running list being walked).

        Returns:
            (free blocks left, requests preempted, whether ``r`` itself was preempted: then scheduling of
            running requests stops for this step).
        """
        preempted = 0
        blocks = self.num_blocks
        while need - blocks[r] > free:
            victim = order.pop()
            self.free_blocks = free  # the pool as the victim's blocks return to it
            free += self._preempt(victim)
            preempted += 1
            if victim == r:
                return free, preempted, True
        if need > blocks[r]:
            free -= need - blocks[r]
            blocks[r] = need
        return free, preempted, False

    def _preempt(self, victim: int) -> int:
        """Preempt running request ``victim`` by recompute: free its blocks, reset its computed tokens, put
        it at the FRONT of the waiting queue (vLLM V1). Returns the blocks it held. (A request that already
        finished, under async scheduling, is not queued again: its output removes it from the queue before
        the next step.) With speculation its drafts are dropped."""
        del self.running[victim]
        if self.decoding.speculative:
            self.decode_ready[victim] = False
        self.output_cached.pop(victim, None)  # async: its last output comes after it left (see _kv_cached)
        freed = self._free_blocks_of(victim, finished=False)
        self.num_computed[victim] = 0
        self.num_preemptions[victim] += 1
        if victim not in self.finishing:
            self.waiting.appendleft(victim)
        if self.tracer is not None:
            self.tracer.victims.append(victim)
        return freed

    def _stalled(self) -> None:
        """Nothing could be scheduled although requests wait: no later step could differ, so the run would
        loop for ever. The constructors' capacity checks make this unreachable for valid settings.

        Raises:
            SettingError: one line naming the stuck request and the settings to change (the config file is
                put in front by :func:`servesim.simulate`).
        """
        r = self.waiting[0] if self.waiting else next(iter(self.running))
        raise SettingError(
            f"engine: stalled at t={self.now / PS_PER_S:.6f} s: request {r} ({self.prompt_tokens[r]} prompt + "
            f"{self.num_generated[r]} generated tokens) can never be scheduled in a cache of {self.total_blocks} "
            f"blocks of {self.block_size} tokens with max_num_batched_tokens={self.max_num_batched_tokens}: raise "
            "engine.num_gpu_blocks_override (or gpu_memory_utilization) or engine.max_num_batched_tokens"
        )

    def _emit(self, r: int, t0: int, t1: int) -> bool:
        """Request ``r`` completes its prefill (or recompute) and samples a token at ``t1``; returns True if
        it finished."""
        g = self.num_generated[r]
        if g == 0:
            self.first_token_ps[r] = t1
        elif self.last_emit_ps[r] != t0:
            self.extra_itl.append(t1 - self.last_emit_ps[r])
        self.num_generated[r] = g + 1
        self.last_emit_ps[r] = t1
        self.decode_ready[r] = True  # it samples now (with speculation, the drafter proposes for it)
        self.emitted_tokens[r] = 1
        if g + 1 >= self.output_tokens[r]:
            self._finish(r, t1)
            return True
        return False

    def _finish(self, r: int, t1: int, sure: bool = True) -> None:
        """Request ``r`` emitted its last token at ``t1``; ``sure``: vLLM knew before the step that it would
        (its output needed one more token). With async scheduling its blocks are freed after the next
        step is scheduled (:meth:`release_finishing`)."""
        self.finish_ps[r] = t1
        self.finished += 1
        self.arrivals.on_finish(t1)
        if self.async_scheduling:
            if self.prefix_caching:  # what its last output caches once processed (see _kv_cached)
                out = self._processed_output_cached(r)
                self.output_cached[r] = out if out > 0 else 0
            self.finishing[r] = sure
            if not sure:
                self.num_unsure_finishing += 1
            return
        self.free_blocks += self._free_blocks_of(r, finished=True)
        del self.running[r]

    def release_finishing(self) -> None:
        """Async scheduling (vLLM's ``AsyncScheduler`` with two batches in flight): step ``n + 1`` is
        scheduled before step ``n``'s output is processed, so requests that finished in step ``n`` still
        run (they count against ``max_num_seqs``, hold their blocks and can be preemption victims) while
        step ``n + 1`` is scheduled; processing step ``n``'s output then frees them. Called after each
        step's scheduling."""
        running = self.running
        for r in self.finishing:
            if r in running:
                del running[r]
                self.free_blocks += self._free_blocks_of(r, finished=True)
        self.finishing = {}
        self.num_unsure_finishing = 0

    def _free_blocks_of(self, r: int, finished: bool) -> int:
        """Free all blocks request ``r`` holds (through the block manager with prefix caching: vLLM
        ``FullAttentionManager.free``, its cached blocks to the free queue's tail); returns how many became
        free (fewer than it held when other requests share some)."""
        if self.prefix_caching:
            freed = self.kv.free(r, self.num_blocks[r], self._kv_cached(r), self.free_blocks, finished=finished)
        else:
            freed = self.num_blocks[r]
        self.num_blocks[r] = 0
        return freed

    def _processed_output_cached(self, r: int) -> int:
        """Tokens request ``r``'s blocks cache once vLLM has processed its last output: its computed tokens,
        at most its known ones less the last (whose KV is not computed), less ``num_reprefillable_tokens``;
        may be negative: callers clamp at 0.

        vLLM caches ``num_computed_tokens - num_output_placeholders``; when a verify's tokens are cut at
        ``max_tokens`` the placeholders of the accepted drafts past it stay, so a request that finished with
        more drafts accepted than it emitted still caches ``num_tokens - 1``, not its computed tokens.
        """
        known = self.prompt_tokens[r] + self.num_generated[r] - 1
        computed = self.num_computed[r]
        return (computed if computed < known else known) - self.reprefill_tokens

    def _kv_cached(self, r: int) -> int:
        """Tokens of request ``r``'s blocks that are cached: as noted at its last scheduling, and under async
        scheduling by the outputs processed since (vLLM 0.32 ``AsyncScheduler._update_request_with_output``
        caches ``num_computed_tokens - num_output_placeholders``: a finished request's last output is
        processed before its blocks are freed; a preempted one's in-flight output after, when it no longer
        runs and caches nothing; a request not scheduled in the previous step has no output in flight)."""
        cached = self.kv_cached_tokens[r]
        if self.async_scheduling:
            out = self.output_cached.pop(r, None)
            if out is None:
                if self.last_emit_ps[r] == self.now:  # its last output is still in flight
                    out = self.kv_output_tokens[r]
                else:  # not scheduled in the previous step: its last output was processed
                    out = self._processed_output_cached(r)
            if out > cached:
                return out
        return cached

    def _note_many(self, items, t0: int, lagging=None) -> None:
        """Requests ``items`` (``(request, tokens)`` pairs, drafts included) are scheduled in the step
        starting at ``t0``: note the tokens their blocks cache (vLLM ``allocate_slots``: ``min(num_computed
        + num_new, num_tokens)``, ``num_tokens`` without drafts, so a verify caches only verified tokens;
        under async scheduling without the tokens still in flight; less ``num_reprefillable_tokens``) and,
        for those in ``lagging``, cache their newly full shareable blocks. Under async scheduling also
        note what the previous step's output caches when vLLM processes it, after this scheduling (its
        computed tokens as they are now, see :meth:`_kv_cached`). One loop for a whole step (hot path)."""
        prompt, gen, computed, held_back = self.prompt_tokens, self.num_generated, self.num_computed, self.reprefill_tokens
        kv_cached = self.kv_cached_tokens
        if self.async_scheduling:
            last_emit, emitted, output_tokens = self.last_emit_ps, self.emitted_tokens, self.kv_output_tokens
            for r, n in items:
                c = computed[r]
                g = gen[r]
                total = prompt[r] + g
                known = total - emitted[r] if g and last_emit[r] == t0 else total
                c_known = c + n
                if held_back:
                    out = (c if c < total else total) - held_back
                    output_tokens[r] = out if out > 0 else 0
                    c_known = (c_known if c_known < known else known) - held_back
                    kv_cached[r] = c_known if c_known > 0 else 0
                else:  # every term >= 0
                    output_tokens[r] = c if c < total else total
                    kv_cached[r] = c_known if c_known < known else known
        else:
            for r, n in items:
                c_known = computed[r] + n
                total = prompt[r] + gen[r]
                c_known = (c_known if c_known < total else total) - held_back
                kv_cached[r] = c_known if c_known > 0 else 0
        if lagging:
            for r, _ in items:
                if r in lagging:
                    self.kv.cache(r, kv_cached[r])

    def _cache_scheduled(self, g: int, sched: list) -> None:
        """Cache the newly full shareable blocks of the running requests scheduled in step ``g`` so far
        (vLLM ``cache_blocks`` in ``allocate_slots``), before waiting requests are looked up: ``sched``'s
        chunks (noted already) and the aggregated decoders, in vLLM's order (the decoders precede the
        chunks in the running order), so that copies of one hash are cached in the same order as in step
        mode (a lookup takes the first)."""
        lagging = self.kv.lagging
        finish_step, cached_tokens = self.finish_step, self.decoding.cached_tokens
        for r in [r for r in lagging if finish_step[r] >= 0]:
            self.kv.cache(r, cached_tokens(r, g))
        for r, _ in sched:
            if r in lagging:
                self.kv.cache(r, self.kv_cached_tokens[r])

    # ------------------------------------------------------------------ the exact step (step mode)
    def _explicit_step(self) -> None:
        """One vLLM V1 engine step on per-request state."""
        prompt, out_tokens, gen, computed, bs = (self.prompt_tokens, self.output_tokens, self.num_generated,
                                                 self.num_computed, self.block_size)
        lookahead = self.lookahead_slots
        decode_ready = self.decode_ready
        decoding = self.decoding
        running, waiting = self.running, self.waiting
        ds = self.draft_slots
        t0 = self.now
        num_waiting = len(waiting)
        k_step = self.k_next  # drafts proposed in the previous step
        budget = self.max_num_batched_tokens
        free = self.free_blocks
        sched: list[tuple[int, int, int, int]] = []  # (request, tokens, drafts, acceptance draw)
        preempted = 0
        order = list(running)
        idx = 0
        finishing, zombies, step = self.finishing, [], self.step_index
        speculative = decoding.speculative
        inflight_drafts = speculative and self.async_scheduling  # see rejected_drafts
        kv_cap = self.kv_token_cap
        skipped = False  # a request skipped at max_model_len (context_cap)
        while idx < len(order) and budget > ds:
            r = order[idx]
            drafts = draw = 0
            if r in finishing:  # async: it finished in the previous step
                if finishing[r]:  # vLLM knew it would: skipped
                    idx += 1
                    continue
                drafts = decoding.verify_width(k_step)  # scheduled once more; the output is discarded
                n = min(1 + drafts, budget - ds)
                drafts = n - 1
                zombies.append(r)
            elif decode_ready[r] and computed[r] == prompt[r] + gen[r] - 1:  # decoding: 1 + drafts tokens
                if speculative:
                    draw = decoding.acceptance_draw(r)
                    drafts = decoding.drafts_for(r, k_step, draw)
                    n = 1 + drafts
                    if n > budget - ds:
                        n = budget - ds
                        drafts = n - 1
                else:
                    n = 1
            else:
                n = prompt[r] + gen[r] - computed[r]
                if n > budget - ds:
                    n = budget - ds
                if self.prefill_lookahead > 1:
                    n = self._reserve_prefill_lookahead(prompt[r] + gen[r], computed[r], n)
                    if not n:  # vLLM skips it (``continue``) and schedules the requests after it
                        idx += 1
                        continue
            inflight = self.rejected_drafts[r] if inflight_drafts and self.rejected_at_step[r] == step - 1 else 0
            if self.context_cap is not None:
                room = self.context_cap - computed[r] - inflight - 1  # vLLM's num_computed_tokens counts inflight
                if n > room:
                    if room <= 0:  # vLLM skips it (``continue``)
                        if zombies and zombies[-1] == r:
                            zombies.pop()
                        skipped = True
                        idx += 1
                        continue
                    n = room
                    if drafts > n - 1:
                        drafts = n - 1
            slots = computed[r] + inflight + n + lookahead
            if kv_cap is not None and slots > kv_cap:
                slots = kv_cap  # vLLM allocates slots for at most max_model_len tokens
            free, count, stop = self._make_room(order, r, -(-slots // bs), free)
            preempted += count
            if stop:
                break
            sched.append((r, n, drafts, draw))
            budget -= n + ds
            idx += 1
        if self.prefix_caching:
            self._note_many([(r, n) for r, n, _, _ in sched], t0, self.kv.lagging)
        if not preempted:
            admitted: list[tuple[int, int]] = []
            budget, free = self._admit(t0, budget, free, len(running), admitted)
            sched.extend((r, n, 0, 0) for r, n in admitted)
        self.free_blocks = free
        if not sched:
            if self.finishing or skipped:  # vLLM's empty async step: the previous output is processed, then it
                self.release_finishing()   # schedules again (its drafts are no longer in flight)
                if skipped:
                    self.rejected_at_step = [-2] * self.num_requests
                return
            self._stalled()
        tokens = logits = kv = pairs = prefill = num_sampled = 0
        for r, n, _, _ in sched:
            c = computed[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            if decode_ready[r] and c == prompt[r] + gen[r] - 1 or r in finishing:  # a decode / verify
                logits += n
                num_sampled += 1
            else:
                prefill += n
                if c + n == prompt[r] + gen[r]:
                    logits += 1
                    num_sampled += 1
        duration_subps = self.step_time.step_subps(tokens, logits, kv, pairs, len(sched))
        if speculative:
            k_new = decoding.k_for_next_step(len(sched))
            duration_subps += decoding.drafter_subps(tokens, num_sampled, k_new, kv)
        else:
            k_new = 0
        t1 = self._advance(duration_subps)
        duration = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self.tracer.record(t0, ((r, n, drafts) for r, n, drafts, _ in sched), used, num_waiting, k_new)
        if finishing:
            self.release_finishing()
        itl = 0
        last_emit = self.last_emit_ps
        for r, n, drafts, draw in sched:
            c = computed[r]
            if zombies and r in zombies:
                continue
            if decode_ready[r] and c == prompt[r] + gen[r] - 1:
                if speculative:
                    accepted = min(drafts, k_step, draw) if draw > 0 else 0
                    decoding.record_round(r, drafts, accepted)
                    self.rejected_drafts[r], self.rejected_at_step[r] = drafts - accepted, step
                    emitted = min(1 + accepted, out_tokens[r] - gen[r])
                else:
                    accepted = 0
                    emitted = 1
                if last_emit[r] == t0:
                    itl += 1
                else:
                    self.extra_itl.append(t1 - last_emit[r])
                gen[r] += emitted
                computed[r] = c + 1 + accepted
                last_emit[r] = t1
                self.emitted_tokens[r] = emitted
                if gen[r] >= out_tokens[r]:
                    self._finish(r, t1, sure=gen[r] - emitted + 1 >= out_tokens[r])
            else:
                computed[r] = c + n
                if computed[r] == prompt[r] + gen[r]:
                    if gen[r] >= 1 and last_emit[r] == t0:  # a recompute scheduled right after its last emission
                        itl += 1
                    if not self._emit(r, t0, t1):
                        decoding.start_decode(r)
        self.k_next = k_new
        self.now = t1
        self.step_index += 1
        self.rows.append((t0, 1, duration, 0, duration, len(sched), tokens, prefill, itl, used,
                                 num_waiting, preempted, k_step))

    def _advance(self, d_subps: int) -> int:
        """The clock after a step of ``d_subps`` (2^-16 ps) from ``self.now``: returns its end (ps, floored)
        and keeps the remainder below a picosecond in ``clock_subps`` (see :mod:`servesim.roofline`)."""
        end = self.clock_subps + d_subps
        self.clock_subps = end & SUBPS_MASK
        return self.now + (end >> SUBPS_BITS)

    # ------------------------------------------------------------------ aggregated decoders (run mode)
    def _materialize(self) -> None:
        """Write the aggregated decoders' state back to the per-request lists (at step ``step_index``)."""
        g, now, stale, last = self.step_index, self.now, self.stale, self.last_emit_ps
        finish_step, leave = self.finish_step, self.decoding.leave
        for r in [r for r in self.running if finish_step[r] >= 0]:
            leave(r, g)
            last[r] = stale.get(r, now)
        self.finish_heap = []
        self.stale = {}
        self.partial = None

    def _aggregate(self) -> None:
        """Rebuild the aggregate from the per-request lists (after an exact step)."""
        prompt, gen, computed, now, last = self.prompt_tokens, self.num_generated, self.num_computed, self.now, self.last_emit_ps
        decode_ready, join = self.decode_ready, self.decoding.join
        self.decoding.begin_aggregate()
        prefilling = 0
        g = self.step_index
        for r in self.running:
            if r in self.finishing:
                continue
            if decode_ready[r] and computed[r] == prompt[r] + gen[r] - 1:
                join(r, g)
                if last[r] != now:
                    self.stale[r] = last[r]
                    if self.prefix_caching:
                        self.decoding.note_stale_join(r, g)
            else:
                self.partial = r  # the last admitted (several only under MTP's chunk rule)
                prefilling += 1
        self.multi_partial = prefilling > 1

    def add_finish(self, r: int, step: int) -> None:
        """Aggregated decoder ``r`` emits its last token in step ``step``."""
        self.finish_step[r] = step
        heapq.heappush(self.finish_heap, (step, r))

    def fallback(self) -> None:
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
        if self.step_index - self.aggregated_at_step <= 8:
            self.fallback_stretch = min(2 * self.fallback_stretch + 1, self.MAX_FALLBACK_STRETCH)
        else:
            self.fallback_stretch = 0
        self.explicit_steps_left = self.fallback_stretch
        if not self.explicit_steps_left:
            self._aggregate()
            self.aggregated_at_step = self.step_index

    def next_finish(self) -> int:
        """Step at which the first aggregated decoder emits its last token (skips stale heap entries)."""
        heap, finish_step = self.finish_heap, self.finish_step
        while True:
            step, r = heap[0]
            if finish_step[r] == step:
                return step
            heapq.heappop(heap)

    def _fast_step(self) -> None:
        """Advance by one step, or by a whole run of decode steps (run mode)."""
        if self.multi_partial:
            self.fallback()
            return
        g = self.step_index
        decoding = self.decoding
        if self.k_next != decoding.k:
            decoding.before_step(g)
        num_decoders = decoding.num_decoders
        decode_tokens, new_blocks = decoding.demand_at(g)
        budget = self.max_num_batched_tokens - decode_tokens - num_decoders * self.draft_slots
        if budget < 0:  # the token budget cannot serve every decoder: per-request order matters
            self.fallback()
            return
        zombies = None
        if self.finishing:
            # async: requests that finished in the previous step still run (their blocks held), and vLLM
            # skips them, or schedules them once more when it did not know they would finish. The aggregate
            # takes the step, preemptions included (they are victims in running order like the decoders,
            # see _preempt_aggregated), unless the repeated ones do not all fit the token budget
            zombies = self._zombies(budget) if self.num_unsure_finishing else {}
            if zombies is None:
                self.fallback()
                return
        if not zombies and self.partial is None and num_decoders and new_blocks <= self.free_blocks:
            if not self.waiting or len(self.running) >= self.max_num_seqs:
                blocked, head_tokens = True, None  # nobody to admit (head_blocked's first case)
            else:
                blocked, head_tokens = self.head_blocked(self.free_blocks - new_blocks, budget)
            if blocked:
                decoding.run(g, head_tokens)
                return
        self._mixed_step(g, budget, new_blocks, zombies)

    def head_blocked(self, free: int, budget: int) -> tuple[bool, int | None]:
        """Whether the head of the waiting queue cannot be admitted with ``free`` blocks left after the
        decoders' allocations and ``budget`` tokens left (or nothing waits, or ``max_num_seqs`` run).

        Returns:
            (blocked, head tokens): the head's tokens to compute when only the token budget keeps it out
            (a budget that varies within a run of speculative steps may let it in later), else None.
        """
        waiting = self.waiting
        ds = self.draft_slots
        if not waiting or len(self.running) >= self.max_num_seqs:
            return True, None
        if budget <= ds and not self.decoding.variable_width:
            return True, None
        h = waiting[0]
        total = self.prompt_tokens[h] + self.num_generated[h]
        need = -(-total // self.block_size)
        left = total
        if self.prefix_caching and (self.kv.shareable is not None or h in self.kv.own_runs):
            if self.kv.lagging:
                # running requests are still filling blocks the head might hit: no run (a run needs the head
                # to stay blocked; without such blocks it does: free blocks and hits only shrink in a run)
                return False, None
            if free < 0:
                return True, None
            hit = self.kv.lookup(h, total, free)
            need += hit.num_evictable - hit.num_blocks
            left = total - hit.num_blocks * self.block_size
        if need > free:
            return True, None
        # the head takes its own drafting slots (draft models) out of what the decoders leave
        return budget <= ds or (not self.enable_chunked_prefill and left > budget - ds), left

    def _zombies(self, budget: int) -> dict | None:
        """Async scheduling, run mode: the requests that finished in the previous step without vLLM knowing
        they would, which it schedules once more (``1 + k`` tokens, output discarded): request -> (tokens,
        drafts, new KV blocks). None when they do not all fit whole in the token ``budget`` the decoders
        leave (then the step needs vLLM's per-request order: an exact step); blocks that do not fit are
        found by the step's preemption (:meth:`_preempt_aggregated`)."""
        out = {}
        k_step, ds, bs, step = self.decoding.k, self.draft_slots, self.block_size, self.step_index
        for r, sure in self.finishing.items():
            if sure or r not in self.running:
                continue
            drafts = self.decoding.verify_width(k_step)
            inflight = self.rejected_drafts[r] if self.rejected_at_step[r] == step - 1 else 0
            need = max(-(-(self.num_computed[r] + inflight + 1 + drafts + self.lookahead_slots) // bs)
                       - self.num_blocks[r], 0)
            budget -= 1 + drafts + ds
            if budget < 0:
                return None
            out[r] = (1 + drafts, drafts, need)
        return out

    def finish_decoders(self, g_last: int, t1: int) -> None:
        """The aggregated decoders whose last token is emitted in step ``g_last`` (ending at ``t1``) finish."""
        heap, finish_step, decoding = self.finish_heap, self.finish_step, self.decoding
        while heap:
            step, r = heap[0]
            if step != g_last:
                break
            heapq.heappop(heap)
            if finish_step[r] != g_last:
                continue  # stale entry of a preempted decoder
            sure = decoding.leave_finished(r, g_last + 1)
            self.num_generated[r] = self.output_tokens[r]
            self.last_emit_ps[r] = t1
            self._finish(r, t1, sure)

    def _preempt_aggregated(self, g: int, new_blocks: int, need_partial: int, partial_scheduled: bool,
                            zombies: dict | None = None) -> tuple[int, bool]:
        """vLLM's preemption when the step's allocations do not fit, on the aggregate.

        Decoders (and, under async scheduling, the finished requests scheduled once more, ``zombies``,
        which this removes when they are victims) allocate in admission order and the partial prefill
        (always last) after them; whenever an allocation fails the LAST running request is preempted. So
        the victims are a suffix of the running order: the partial prefill first (if the others alone do
        not fit, or it does not fit after them), then from the most recently admitted (finished requests
        that vLLM skips allocate nothing but are victims too), until the remaining new blocks
        (``new_blocks``, the decoders' and the zombies') fit.

        Returns:
            (preempted count, partial still scheduled).
        """
        now = self.now
        free = self.free_blocks
        preempted = 0
        p = self.partial
        decoding = self.decoding
        finishing = self.finishing
        # with prefix caching, the block manager must see each victim freed into the pool as vLLM has it
        # then: the requests ahead of the first allocation that fails have taken their blocks (vLLM's
        # allocate_slots takes nothing from a request it cannot serve). Its free queue pops uncached blocks
        # first, so freeing a victim before those allocations would make them take the victim's blocks instead
        order: list[int] = []
        needs: list[int] = []
        if self.prefix_caching:
            for r in self.running:
                if r != p:
                    order.append(r)
                    if r in finishing:  # async: allocates only when scheduled once more
                        needs.append(zombies[r][2] if zombies and r in zombies else 0)
                    else:
                        needs.append(decoding.need_at(r, g))
        pos, pool = 0, free

        def pool_at_failure() -> int:
            """The pool left when the next allocation in admission order fails (the earlier ones taken)."""
            nonlocal pos, pool
            while pos < len(order) and needs[pos] <= pool:
                pool -= needs[pos]
                pos += 1
            return pool

        if p is not None and (new_blocks > free or (partial_scheduled and new_blocks + need_partial > free)):
            if self.prefix_caching:
                # the decoders allocated before the partial prefill failed to (all of them if they fit)
                self.kv.sync(free - new_blocks if new_blocks <= free else pool_at_failure())
            self.partial = None
            partial_scheduled = False
            freed = self._preempt(p)
            free += freed
            pool += freed
            preempted += 1
        if new_blocks > free:
            # the victims are the last running requests, each preempted when an allocation fails
            for v in list(reversed(self.running)):
                if v == p:
                    continue
                if self.prefix_caching:
                    self.kv.sync(pool_at_failure())
                if v in finishing:  # async: finished in the previous step, skipped or scheduled once more
                    if zombies and v in zombies:
                        _, _, need = zombies.pop(v)
                        new_blocks -= need
                    self.free_blocks = free
                    freed = self._preempt(v)
                else:
                    last = self.stale.pop(v, now)
                    new_blocks -= decoding.need_at(v, g)
                    decoding.leave(v, g)
                    self.last_emit_ps[v] = last
                    self.free_blocks = free
                    freed = self._preempt(v)
                free += freed
                preempted += 1
                if order:  # the victim is the last in admission order
                    order.pop()
                    needs.pop()
                    pool += freed
                if new_blocks <= free:
                    break
        self.free_blocks = free
        return preempted, partial_scheduled

    def _mixed_step(self, g: int, budget: int, new_blocks: int, zombies: dict | None = None) -> None:
        """One step: aggregated decoders plus the partial prefill, admissions and (async) finished requests
        scheduled once more (``zombies``, see :meth:`_zombies`), O(touched requests). ``budget``: the token
        budget the decoders leave; ``new_blocks``: the blocks they allocate in step ``g``."""
        prompt, gen, computed, blocks, bs = self.prompt_tokens, self.num_generated, self.num_computed, self.num_blocks, self.block_size
        lookahead = self.lookahead_slots
        decoding = self.decoding
        t0 = self.now
        num_waiting = len(self.waiting)
        k_step = decoding.k
        p = self.partial
        ds = self.draft_slots
        zombie_tokens = sum(tokens + ds for tokens, _, _ in zombies.values()) if zombies else 0
        zombie_blocks = sum(need for _, _, need in zombies.values()) if zombies else 0
        budget -= zombie_tokens
        n_partial = need_partial = 0
        partial_scheduled = p is not None and budget > ds
        if partial_scheduled:
            n_partial = min(prompt[p] + gen[p] - computed[p], budget - ds)
            if self.prefill_lookahead > 1:
                n_partial = self._reserve_prefill_lookahead(prompt[p] + gen[p], computed[p], n_partial)
                partial_scheduled = n_partial > 0
            slots = computed[p] + n_partial + lookahead
            if self.kv_token_cap is not None and slots > self.kv_token_cap:
                slots = self.kv_token_cap
            need_partial = max(-(-slots // bs) - blocks[p], 0)
        preempted = 0
        if new_blocks + zombie_blocks + (need_partial if partial_scheduled else 0) > self.free_blocks:
            # the decoders and the repeated finished requests allocate before the partial prefill
            preempted, partial_scheduled = self._preempt_aggregated(g, new_blocks + zombie_blocks, need_partial,
                                                                    partial_scheduled, zombies)
            new_blocks = decoding.new_blocks_at(g)
        num_decoders = decoding.num_decoders
        decode_tokens, ctx, pairs = decoding.sums_at(g)
        free = self.free_blocks - new_blocks
        sched: list[tuple[int, int]] = []
        if partial_scheduled:
            free -= need_partial
            blocks[p] += need_partial
            sched.append((p, n_partial))
        budget = (self.max_num_batched_tokens - decode_tokens - num_decoders * ds - zombie_tokens
                  - (n_partial + ds if partial_scheduled else 0))
        if zombies:
            for z, (q, _, need) in zombies.items():
                free -= need
                blocks[z] += need
                c = computed[z]
                decode_tokens += q
                ctx += c + q
                pairs += q * c + q * (q + 1) // 2
        if self.prefix_caching:
            chunks = [(z, tokens) for z, (tokens, _, _) in zombies.items()] + sched if zombies else sched
            self._note_many(chunks, t0)
            if self.kv.lagging:
                self._cache_scheduled(g, chunks)
        if not preempted:
            budget, free = self._admit(t0, budget, free, len(self.running), sched)
        self.free_blocks = free
        if not sched and not num_decoders and not zombies:
            if self.finishing:
                self.release_finishing()
                return
            self._stalled()
        num_zombies = len(zombies) if zombies else 0
        tokens, logits, kv, prefill, num_sampled = decode_tokens, decode_tokens, ctx, 0, num_decoders + num_zombies
        decode_ready = self.decode_ready
        for r, n in sched:
            c = computed[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            if not (decode_ready[r] and c == prompt[r] + gen[r] - 1):  # as in _explicit_step: the last token
                prefill += n  # of a recompute without speculation is the request's last sampled token, a decode
            if c + n == prompt[r] + gen[r]:
                logits += 1
                num_sampled += 1
        batch = num_decoders + len(sched) + num_zombies
        duration_subps = self.step_time.step_subps(tokens, logits, kv, pairs, batch)
        if decoding.speculative:
            k_new = decoding.k_for_next_step(batch)
            duration_subps += decoding.drafter_subps(tokens, num_sampled, k_new, kv)
        else:
            k_new = 0
        t1 = self._advance(duration_subps)
        duration = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self._trace_mixed(t0, g, sched, used, num_waiting, k_new, zombies)
        if self.finishing:
            self.release_finishing()
        itl = num_decoders - self.flush_stale(t1) if self.stale else num_decoders
        self.now = t1
        self.step_index = g + 1
        if self.finish_heap:
            first_finish, _ = self.finish_heap[0]
            if first_finish == g:
                self.finish_decoders(g, t1)
        if k_new != decoding.k:
            decoding.after_step(g + 1, k_new)
        self.k_next = k_new
        # requests still mid-prefill after this step: the partial if it got no chunk, and unfinished chunks
        mids = [p] if p is not None and not partial_scheduled and p in self.running else []
        last_emit = self.last_emit_ps
        for r, n in sched:
            computed[r] += n
            if computed[r] == prompt[r] + gen[r]:
                if gen[r] >= 1 and last_emit[r] == t0:
                    itl += 1  # a recompute admitted right after its preemption (async's repeated schedule)
                if not self._emit(r, t0, t1):
                    decoding.start_decode(r)
                    decoding.join(r, g + 1)
            else:
                mids.append(r)
        self.partial = mids[-1] if mids else None
        self.multi_partial = len(mids) > 1
        self.rows.append((t0, 1, duration, 0, duration, batch, tokens, prefill, itl, used, num_waiting,
                                 preempted, k_step))

    # ------------------------------------------------------------------ runs (called by the strategies)
    def limit_time(self) -> int | None:
        """The time (ps) at which a run must end: the next arrival (every arrival ends a run, also behind a
        blocked queue, so that each row's waiting count holds for each of its steps) or ``max_time_s``."""
        t_lim = self.arrivals.next_time()
        if self.max_time_ps is not None and (t_lim is None or self.max_time_ps < t_lim):
            t_lim = self.max_time_ps
        return t_lim

    def record_closed_form_run(self, g: int, n: int, remainder: int, first_subps: int, increment_subps: int,
                               new_blocks: int, residue_window: list[int]) -> None:
        """Note the last row, a plain decode run of ``n`` steps from step ``g`` (first step ``first_subps``,
        then ``+ increment_subps`` per step, 2^-16 ps, from a clock remainder ``remainder``) that allocated
        ``new_blocks`` blocks: its steps' durations are rebuilt at output (:meth:`RunRecords.step_ends
        <servesim.engine.run_records.RunRecords.step_ends>`), and its KV integral corrected for the blocks
        allocated after its first step (:meth:`~servesim.engine.run_records.RunRecords.kv_block_ps`), from
        ``residue_window``, the blocks each of its first ``block_size`` steps allocates, last first."""
        if n > 1:
            row = self.row_log.records_before + len(self.rows) - 1  # len(self.row_log) - 1, inline (hot path)
            self.closed_runs += (row, remainder, first_subps, increment_subps)
            if new_blocks:
                self.kv_runs.append(row)
                self.kv_windows += residue_window

    def record_summed_run(self, ends) -> None:
        """Note the last row's steps' ends after its start (ps; a list of ints or an int64 array, one per
        step), for a run of more than one step summed step by step (copied: an array may be a view)."""
        count = len(ends)
        if count > 1:
            records = self.run_records
            records.summed_run_log.items += (len(self.row_log) - 1, count)
            if type(ends) is list:
                records.summed_end_log.items += ends
            else:
                records.summed_end_log.append_array(ends)

    def trace_run(self, g: int, n: int, starts: list[int], new_blocks: list[int], k: int) -> None:
        """Record the ``n`` steps of a run from step ``g`` (``starts``: their start times in ps;
        ``new_blocks``: blocks allocated from the run's start up to each step, inclusive)."""
        finish_step = self.finish_step
        order = [(r,) + tuple(self.decoding.trace_tokens(r, g)) for r in self.running if finish_step[r] >= 0]
        waiting = len(self.waiting)
        for j in range(n):
            row = [(r, tokens[j] if isinstance(tokens, list) else tokens, drafts[j] if isinstance(drafts, list) else drafts)
                   for r, tokens, drafts in order]
            self.tracer.record(starts[j], row, self.total_blocks - self.free_blocks + new_blocks[j],
                               waiting + self.arrivals.count_until(starts[j]), k)
            order = [(r, tokens, drafts) for r, tokens, drafts in order if finish_step[r] != g + j]

    def _trace_mixed(self, t0: int, g: int, sched: list, used: int, num_waiting: int, k: int, extra=None) -> None:
        """Record a run-mode step: aggregated decoders, ``sched`` (prefills, admissions) and ``extra``
        (request -> (tokens, drafts, ...): finished requests scheduled once more) in running order."""
        chunks = dict(sched)
        row = []
        for r in self.running:
            if r in chunks:
                row.append((r, chunks[r], 0))
            elif extra and r in extra:
                tokens, drafts, _ = extra[r]
                row.append((r, tokens, drafts))
            elif self.finish_step[r] >= 0:
                tokens, drafts = self.decoding.trace_tokens(r, g)
                row.append((r, tokens[0] if isinstance(tokens, list) else tokens,
                            drafts[0] if isinstance(drafts, list) else drafts))
        self.tracer.record(t0, row, used, num_waiting, k)

    @staticmethod
    def steps_to_reach(span: int, d0: int, inc: int, n_max: int) -> int:
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

    # ------------------------------------------------------------------ results
    def _drop_request_state(self) -> None:
        """Free the per-request state once :meth:`output` has read it into its RequestLog (the engine cannot
        go on after its output is taken): at 10^6 requests its lists and records are a quarter of a
        gigabyte that would otherwise live on beside the step log's arrays while they are built."""
        self.prompt_tokens = self.output_tokens = self.num_generated = self.num_computed = None
        self.num_blocks = self.last_emit_ps = self.decode_ready = self.emitted_tokens = None
        self.rejected_drafts = self.rejected_at_step = self.finish_step = self.finish_heap = None
        self.arrival_ps = self.first_scheduled_ps = self.first_token_ps = self.finish_ps = None
        self.num_preemptions = self.num_cached_tokens = self.kv_cached_tokens = self.kv_output_tokens = None
        self.kv = None  # the block manager: its block pool and, with prefix caching, its hash table

    def output(self) -> EngineOutput:
        """The engine's records as arrays in seconds (call once the SimPy run has ended: the engine cannot
        go on afterwards; later calls return the same output)."""
        if self.finished_output is not None:
            return self.finished_output
        if self.mode == "run" and (self.decoding.num_decoders or self.partial is not None):
            self._materialize()
        spec_counters = self.decoding.counters()  # before the logs' arrays exist (its temporaries are large)
        # the decoding strategy's state (acceptance tables, per-step sums) is not needed any more: freed
        # before the output's arrays are built (the largest of a run's objects otherwise live on beside them)
        self.decoding = None
        s = float(PS_PER_S)

        def secs(values):
            arr = np.asarray(values, dtype=np.int64)
            out = arr / s
            out[arr < 0] = np.nan
            return out

        requests = RequestLog(
            request_id=np.arange(self.num_requests, dtype=np.int64),
            arrival_s=secs(self.arrival_ps),
            prompt_tokens=np.asarray(self.prompt_tokens, dtype=np.int64),
            output_tokens=np.asarray(self.output_tokens, dtype=np.int64),
            generated_tokens=np.asarray(self.num_generated, dtype=np.int64),
            first_scheduled_s=secs(self.first_scheduled_ps),
            first_token_s=secs(self.first_token_ps),
            finish_s=secs(self.finish_ps),
            preemptions=np.array(self.num_preemptions, dtype=np.int64),  # a copy: not a view of the engine's
            num_cached_tokens=np.maximum(np.asarray(self.num_cached_tokens, dtype=np.int64), 0),
        )
        self._drop_request_state()
        col = self.row_log.columns()  # read-only views: the step log's integer columns (no copy of the log)
        release_free_memory()  # the log's chunks, freed into the C heap (servesim.heap)
        ends = self.run_records.step_ends(col["num_steps"], col["duration_ps"])
        kv_block_ps = self.run_records.kv_block_ps(col["kv_blocks_used"], col["duration_ps"], col["num_steps"], ends)
        self.run_records = None  # read into ``ends`` and ``kv_block_ps``
        steps = StepLog(
            start_s=col["start_ps"] / s,
            num_steps=col["num_steps"],
            first_step_s=col["first_step_ps"] / s,
            step_increment_s=col["step_increment_ps"] / s,
            duration_s=col["duration_ps"] / s,
            batch_size=col["batch_size"],
            num_tokens=col["num_tokens"],
            num_prefill_tokens=col["num_prefill_tokens"],
            itl_samples=col["itl_samples"],
            kv_blocks_used=col["kv_blocks_used"],
            num_waiting=col["num_waiting"],
            num_preempted=col["num_preempted"],
            k=col["k"],
            start_ps=col["start_ps"],
            kv_block_ps=kv_block_ps,
            durations_s=step_durations_s(ends, col["num_steps"]),
        )
        self.finished_output = EngineOutput(
            requests=requests,
            steps=steps,
            extra_itl_s=np.asarray(self.extra_itl, dtype=np.int64) / s,
            kv_blocks_total=self.total_blocks,
            block_size=self.block_size,
            end_s=self.now / s,
            spec_counters=spec_counters,
            prefix_cache=dataclasses.asdict(self.prefix_cache_stats) if self.prefix_caching else {},
        )
        release_free_memory()  # the temporaries of the steps' ends and the runs' records
        return self.finished_output
