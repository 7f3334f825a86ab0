"""Plain decoding: every decoding request schedules one token per step; runs of decode steps in closed form.

The decoding strategy of :class:`~servesim.engine.core.Engine` without speculation. In run mode the
decoders are kept in aggregate: decoder ``r`` needs ``context_base[r] + g`` KV slots at step ``g``, so
the step's decode sums are ``B`` tokens and ``sum(context_base) + B g`` context tokens, its new KV blocks
are the decoders whose ``context_base mod block_size`` equals ``(1 - g) mod block_size``, and a run of
``n`` identical decode steps lasts ``sum_j (d0 + j inc)``: one closed form, O(1) however long the run.
"""

from __future__ import annotations

import weakref
from array import array

from servesim.engine.step_rows import KV_BLOCK_PS_MAX
from servesim.roofline import SUBPS_BITS, SUBPS_MASK, SUBPS_PER_PS


class PlainDecoding:
    """One token per decoding request per step (see the module docstring).

    Args:
        engine: the :class:`~servesim.engine.core.Engine` whose decoders this keeps.
    """

    # the whole state, as slots: read on every step and join (see Engine.__slots__; compiled, an
    # extension type)
    __slots__ = (
        "block_size", "blocks_at_join", "context_base", "context_base_sum", "decode_subps_per_token", "engine",
        "engine_ref", "generated_at_join", "joined_at", "k", "num_decoders", "per_residue", "per_residue_twice",
        "run_terms", "speculative", "stale_joins", "variable_width", "__weakref__",
    )

    draft_slots = 0
    prefill_lookahead = 0
    lookahead_slots = 0
    kv_token_cap = None  # without drafts or lookahead slots no request reaches max_model_len's KV cap
    context_cap = None  # ... nor its bound on a step's positions
    initial_k = 0
    use_eagle = False  # prefix-cache hits keep their last block

    def __init__(self, engine) -> None:
        # a weak reference: the engine owns its strategy, and without a cycle it is freed as soon as its
        # run's output is taken (its logs are the largest objects of a run)
        # (a proxy for the cold paths; the hot ones dereference engine_ref once per call: every attribute
        # access through a proxy costs about four times a direct one)
        self.engine = weakref.proxy(engine)
        self.engine_ref = weakref.ref(engine)
        self.block_size = engine.block_size
        num_requests = engine.num_requests
        block_size = engine.block_size
        # read by the engine on its hot path (instance attributes are found first): no speculation, the
        # aggregated decoders' rounds verify k = 0 drafts, every decoder schedules the same tokens each step
        self.speculative, self.k, self.variable_width = False, 0, False
        self.num_decoders = 0
        self.context_base_sum = 0  # sum of context_base over the decoders
        self.per_residue = [0] * block_size  # decoders per residue context_base mod block_size
        self.per_residue_twice = [0] * (2 * block_size)  # per_residue twice over: a cyclic window is one slice
        # per request, written at each join and read at its leave: int64 arrays (8 bytes per request, no int
        # object each)
        self.context_base = array("q", [0]) * num_requests  # decoder r needs context_base[r] + g KV slots at step g
        self.joined_at = array("q", [0]) * num_requests  # step it joined the aggregate at
        self.generated_at_join = array("q", [0]) * num_requests  # its generated tokens then
        self.blocks_at_join = array("q", [0]) * num_requests  # its KV blocks then
        # prefix caching: decoder -> the step it joined the aggregate at after a step without it (no output
        # of it in flight at that step: see cached_tokens)
        self.stale_joins: dict[int, int] = {}
        # a decode step's cost terms per batch size (:meth:`_run_terms`), and its growth per context token
        self.run_terms: dict[int, tuple[int, int]] = {}
        self.decode_subps_per_token = engine.step_time.decode_subps_per_token

    # ------------------------------------------------------------------ the exact step
    def acceptance_draw(self, r: int) -> int:
        """The acceptance draw of ``r``'s next round: none without drafts."""
        return 0

    def drafts_for(self, r: int, k: int, draw: int) -> int:
        """Draft tokens ``r`` verifies in its next step: none."""
        return 0

    def verify_width(self, k: int) -> int:
        """Draft tokens scheduled per decoder for ``k`` speculative positions: none."""
        return 0

    def record_round(self, r: int, drafts: int, accepted: int) -> None:
        """A decode step of ``r``: nothing to count without speculation."""

    def start_decode(self, r: int) -> None:
        """``r`` starts (or restarts) its decode phase: nothing to prepare."""

    def k_for_next_step(self, batch_size: int) -> int:
        """Drafts proposed in this step for the next one: none."""
        return 0

    def drafter_subps(self, num_tokens: int, num_sampled: int, k: int, kv_tokens: int) -> int:
        """The drafter's time in a step (2^-16 ps): no drafter."""
        return 0

    def counters(self) -> dict:
        """vLLM's speculative-decoding counters: none."""
        return {}

    # ------------------------------------------------------------------ the aggregate (run mode)
    def begin_aggregate(self) -> None:
        """The aggregate is rebuilt from per-request state."""

    def before_step(self, g: int) -> None:
        """Step ``g`` is about to be taken on the aggregate."""

    def after_step(self, g_next: int, k_new: int) -> None:
        """A step ended; the next is ``g_next``, verifying ``k_new`` drafts (always 0)."""

    def join(self, r: int, g: int) -> None:
        """Make running request ``r`` (all its known tokens computed but the last) an aggregated decoder
        from step ``g``."""
        engine = self.engine_ref()
        base = engine.num_computed[r] + 1 - g
        self.context_base[r] = base
        self.joined_at[r] = g
        self.generated_at_join[r] = engine.num_generated[r]
        self.blocks_at_join[r] = engine.num_blocks[r]
        residue = base % engine.block_size
        self.per_residue[residue] += 1
        self.per_residue_twice[residue] += 1
        self.per_residue_twice[residue + engine.block_size] += 1
        self.context_base_sum += base
        self.num_decoders += 1
        engine.add_finish(r, g + engine.output_tokens[r] - engine.num_generated[r] - 1)

    def note_stale_join(self, r: int, g: int) -> None:
        """Decoder ``r`` joined the aggregate at step ``g`` (prefix caching) after a step it was not
        scheduled in: no output of it is in flight when step ``g`` is scheduled."""
        self.stale_joins[r] = g

    def leave(self, r: int, g: int) -> int:
        """Remove decoder ``r`` from the aggregate at step ``g``; write back its state; return its blocks."""
        engine = self.engine_ref()
        base = self.context_base[r]
        residue = base % engine.block_size
        self.per_residue[residue] -= 1
        self.per_residue_twice[residue] -= 1
        self.per_residue_twice[residue + engine.block_size] -= 1
        self.context_base_sum -= base
        self.num_decoders -= 1
        engine.finish_step[r] = -1  # its heap entry is now stale and skipped
        computed = base + g - 1
        engine.num_computed[r] = computed
        engine.num_generated[r] = self.generated_at_join[r] + (g - self.joined_at[r])
        # the blocks it held at join, and those its decode steps allocated since (one whenever its context
        # crossed a block boundary)
        blocks = -(-computed // engine.block_size)
        if blocks < self.blocks_at_join[r]:
            blocks = self.blocks_at_join[r]
        engine.num_blocks[r] = blocks
        if engine.prefix_caching and g > self.joined_at[r]:  # it was last scheduled in step g - 1, aggregated
            # the tokens its blocks cached then (under async scheduling without the token in flight, see
            # cached_tokens)
            if engine.async_scheduling and (g - 1 > self.joined_at[r] or self.stale_joins.get(r) != g - 1):
                engine.kv_cached_tokens[r] = computed - 1
            else:
                engine.kv_cached_tokens[r] = computed
            engine.kv_output_tokens[r] = computed - 1  # what its output in flight then caches once processed
            lagging = engine.kv.lagging
            if lagging and r in lagging:
                engine.kv.cache(r, engine.kv_cached_tokens[r])
        return blocks

    def demand_at(self, g: int) -> tuple[int, int]:
        """(tokens the aggregated decoders schedule, new KV blocks they allocate) in step ``g``."""
        num_decoders = self.num_decoders
        if not num_decoders:
            return 0, 0
        return num_decoders, self.per_residue[(1 - g) % self.block_size]

    def sums_at(self, g: int) -> tuple[int, int, int]:
        """(scheduled tokens, sum of attended contexts, attention pairs) of the aggregated decoders at step ``g``."""
        context = self.context_base_sum + self.num_decoders * g
        return self.num_decoders, context, context

    def new_blocks_at(self, g: int) -> int:
        """New KV blocks the aggregated decoders allocate in step ``g``."""
        return self.per_residue[(1 - g) % self.block_size] if self.num_decoders else 0

    def need_at(self, r: int, g: int) -> int:
        """New KV blocks aggregated decoder ``r`` allocates at step ``g`` (1 when its context crosses a
        block boundary)."""
        bs = self.block_size
        return 1 if self.context_base[r] % bs == (1 - g) % bs else 0

    def cached_tokens(self, r: int, g: int) -> int:
        """Tokens aggregated decoder ``r``'s blocks cache when it is scheduled in step ``g``: its context
        ``context_base + g``, less the token in flight under async scheduling (it sampled in step ``g - 1``,
        unless it joined the aggregate at ``g`` after a step without it)."""
        engine = self.engine_ref()
        if engine.async_scheduling and (g > self.joined_at[r] or self.stale_joins.get(r) != g):
            return self.context_base[r] + g - 1
        return self.context_base[r] + g

    def trace_tokens(self, r: int, g: int) -> tuple[int, int]:
        """(tokens, drafts) aggregated decoder ``r`` schedules from step ``g``: 1 and 0."""
        return 1, 0

    def leave_finished(self, r: int, g: int) -> bool:
        """:meth:`leave` for decoder ``r``, whose last token step ``g - 1`` emits; returns whether vLLM knew,
        when it scheduled that last step, that the request would finish: always."""
        self.leave(r, g)
        return True

    # ------------------------------------------------------------------ runs
    def _decode_blocks(self, g: int, m: int) -> int:
        """New KV blocks the aggregated decoders need over steps g .. g+m-1."""
        bs = self.block_size
        full, rem = divmod(m, bs)
        if not rem:
            return full * self.num_decoders
        # steps g .. g+rem-1 need per_residue[(1-g) % bs], [(-g) % bs], ...: one backwards cyclic window
        top = (1 - g) % bs + bs
        return full * self.num_decoders + sum(self.per_residue_twice[top - rem + 1: top + 1])

    def _max_decode_steps(self, g: int, free: int) -> int:
        """Most consecutive decode steps from step g whose block allocations all fit in ``free`` blocks."""
        num_decoders, bs, per_residue = self.num_decoders, self.block_size, self.per_residue
        full = free // num_decoders
        left = free - full * num_decoders
        j = 0
        while j < bs:
            need = per_residue[(1 - g - j) % bs]
            if need > left:
                break
            left -= need
            j += 1
        return full * bs + j

    def _window(self, g: int) -> list[int]:
        """Blocks each of the steps g + bs - 1, ..., g allocates (a run's KV correction at output)."""
        top = (1 - g) % self.block_size
        return self.per_residue_twice[top + 1: top + 1 + self.block_size]

    def _run_terms(self, num_decoders: int) -> tuple[int, int]:
        """(context-free time, growth per step) of a decode step of ``num_decoders`` decoders (2^-16 ps),
        cached per batch size: its time at step ``g`` is ``base + inc * g + decode_subps_per_token *
        context_base_sum``."""
        st = self.engine_ref().step_time
        terms = (st.base_subps(num_decoders, num_decoders, num_decoders), st.decode_subps_per_token * num_decoders)
        self.run_terms[num_decoders] = terms
        return terms

    def run(self, g: int, head_tokens: int | None = None) -> None:
        """A run of decode-only steps from step ``g`` up to the next event, in O(1).

        Step ``j`` of the run lasts ``d0 + j * inc`` (2^-16 ps); the run ends ``(rem + n d0 + inc n(n-1)/2)
        >> 16`` ps after ``t0``, ``rem`` the clock's sub-picosecond remainder at its start: one division,
        the same integers as stepping. ``head_tokens`` is unused (the decoders' width never changes, so a
        head blocked at the first step stays blocked).
        """
        engine = self.engine_ref()
        num_decoders = self.num_decoders
        t0 = engine.now
        rem = engine.clock_subps
        terms = self.run_terms.get(num_decoders)
        if terms is None:
            terms = self._run_terms(num_decoders)
        base, inc = terms
        d0 = base + inc * g + self.decode_subps_per_token * self.context_base_sum
        first_finish, first_decoder = engine.finish_heap[0]
        if engine.finish_step[first_decoder] != first_finish:  # a stale entry on top (a preempted decoder)
            first_finish = engine.next_finish()
        n = first_finish - g + 1  # up to the step where the first decoder finishes
        released = 0
        if engine.stale:
            n = 1
        elif engine.finishing:
            # async: the requests that finished in the previous step leave once this run's first step is
            # scheduled; the run goes on only if the waiting queue's head stays blocked without them
            free_before = engine.free_blocks
            engine.release_finishing()
            released = engine.free_blocks - free_before
            bs = engine.block_size
            first_blocks = self.per_residue[(1 - g) % bs]  # the blocks of steps g and g + 1
            if n > 1:
                blocked, _ = engine.head_blocked(engine.free_blocks - first_blocks - self.per_residue[-g % bs],
                                                 engine.max_num_batched_tokens - num_decoders)
                if not blocked:
                    n = 1
        if n > 1:
            t_lim = engine.arrivals.next_time() if engine.max_time_ps is None else engine.limit_time()
            if t_lim is not None and rem + n * d0 + inc * (n * (n - 1) // 2) >= (t_lim - t0) << SUBPS_BITS:
                n = engine.steps_to_reach(((t_lim - t0) << SUBPS_BITS) - rem, d0, inc, n)
            if n > 1 and (n // engine.block_size + 1) * num_decoders > engine.free_blocks:
                n = min(n, self._max_decode_steps(g, engine.free_blocks))
        if n < 1:  # a broken rule would loop here without advancing the clock: fail instead of hanging
            raise RuntimeError(f"servesim internal error: a decode run of {n} steps from step {g}")
        new_blocks = self._decode_blocks(g, n)
        end = rem + n * d0 + inc * (n * (n - 1) // 2)
        duration = end >> SUBPS_BITS
        if (duration > engine.kv_safe_ps and n > 1
                and (engine.total_blocks - engine.free_blocks + new_blocks) * duration >= KV_BLOCK_PS_MAX):
            span = KV_BLOCK_PS_MAX // (engine.total_blocks - engine.free_blocks + new_blocks)
            n = max(1, engine.steps_to_reach((span << SUBPS_BITS) - rem, d0, inc, n) - 1)
            new_blocks = self._decode_blocks(g, n)
            end = rem + n * d0 + inc * (n * (n - 1) // 2)
            duration = end >> SUBPS_BITS
        if engine.tracer is not None:
            engine.trace_run(g, n, [t0 + ((rem + j * d0 + inc * (j * (j - 1) // 2)) >> SUBPS_BITS) for j in range(n)],
                             [self._decode_blocks(g, j + 1) + (released if j == 0 else 0) for j in range(n)], 0)
        t1 = t0 + duration
        engine.clock_subps = end & SUBPS_MASK
        first_end = rem + d0
        d0_ps = first_end >> SUBPS_BITS
        inc_ps = (inc + SUBPS_PER_PS // 2) >> SUBPS_BITS  # for display: the per-step durations are exact at output
        engine.free_blocks -= new_blocks
        used = engine.total_blocks - engine.free_blocks
        itl = num_decoders - engine.flush_stale(t0 + d0_ps) if engine.stale else num_decoders
        engine.now = t1
        engine.step_index = g + n
        num_waiting = len(engine.waiting)
        row = engine.rows.append
        if released:  # the first step still held the finished requests' blocks: a row of its own
            first_blocks = self.per_residue[(1 - g) % engine.block_size]
            first_used = used - new_blocks + first_blocks + released
            row((t0, 1, d0_ps, 0, d0_ps, num_decoders, num_decoders, 0, itl, first_used, num_waiting, 0, 0))
            if n > 1:
                rem1 = first_end & SUBPS_MASK
                d1_ps = (rem1 + d0 + inc) >> SUBPS_BITS
                row((t0 + d0_ps, n - 1, d1_ps, inc_ps, duration - d0_ps, num_decoders, num_decoders, 0,
                            num_decoders, used, num_waiting, 0, 0))
                later_blocks = new_blocks - first_blocks
                engine.record_closed_form_run(g + 1, n - 1, rem1, d0 + inc, inc, later_blocks,
                                              self._window(g + 1) if later_blocks else None)
        else:
            row((t0, n, d0_ps, inc_ps, duration, num_decoders, num_decoders, 0, itl, used, num_waiting, 0, 0))
            engine.record_closed_form_run(g, n, rem, d0, inc, new_blocks, self._window(g) if new_blocks and n > 1 else None)
        first_finish, _ = engine.finish_heap[0]
        if first_finish == g + n - 1:
            engine.finish_decoders(g + n - 1, t1)
