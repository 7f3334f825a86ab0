"""Speculative decoding in the engine (vLLM 0.32's v1 scheduler, checked against it on golden traces;
see ``docs/reference/vllm-semantics.md``).

In every step, each decoding request schedules ``1 + k`` tokens: its last sampled token and the ``k``
drafts the drafter proposed in the previous step (a draft tree schedules all its nodes: the verify width
grows with the branching while at most ``k`` = depth drafts can be accepted), fewer when the token budget
is short, none in an n-gram round without a match. The target verifies them in the same forward pass; the request accepts a
prefix of ``a`` drafts and samples one more token, so it emits ``1 + a`` tokens and its computed tokens
advance by ``1 + a`` (rejected drafts roll back ``num_computed_tokens`` but keep their KV blocks). KV slots
are allocated for ``num_computed + scheduled + lookahead`` tokens, with ``lookahead = K`` (the static
``num_speculative_tokens``) for the EAGLE family, MTP and draft models, also when a batch-size schedule
sets ``k = 0`` (vLLM issue 49548), and 0 for n-gram and Medusa. A draft model takes one more slot of the
token budget per scheduled request (``max_num_new_slots_for_drafting``); with several MTP layers a
prefill chunk never ends within K tokens of the prompt's end (``num_prefill_lookahead_tokens``). With
async scheduling the next step is scheduled before this step's drafts are verified, so its KV allocation
counts them all as accepted (``num_computed + rejected + scheduled + lookahead``), and a request that
finished without vLLM knowing it would is scheduled once more (its output is discarded). The drafter then runs in the same step (cost model in
:mod:`servesim.speculation.costs`). ``k`` for the next step's drafts is chosen from this step's batch size
(``num_speculative_tokens_per_batch_size``); V0's ``disable_by_batch_size`` turns speculation off when
running requests >= the threshold: that step drafts nothing, so the next step verifies no drafts.

Prefix caching (vLLM 0.32 keeps it on with every method; the block manager of
:mod:`servesim.engine.block_manager`): a scheduled request caches its blocks up to ``min(num_computed +
scheduled, num_tokens)`` tokens, ``num_tokens`` without drafts, so a verify step caches the tokens known
when it is scheduled and accepted drafts are cached at the next scheduling (:meth:`SpecEngine._note_scheduled`;
an aggregated decoder's round ``i`` caches ``ncb_i + 1``, :meth:`SpecEngine._round_cached`); multi-layer MTP
holds back its last ``K - 1`` tokens (``num_reprefillable_tokens``); EAGLE, EAGLE-3 and MTP hits drop their
last block (``use_eagle``). Under async scheduling the tokens in flight are not known yet, and vLLM caches
again when it processes an output (``AsyncScheduler._update_request_with_output``: computed tokens less
those in flight), which shows when a finished request's blocks are freed. Run mode stays exact for the
reasons the plain engine's docstring gives: a run needs the waiting head blocked through it, and it is:
no block is freed within a run, its whole-sequence check ``blocks(num_tokens) + evictable hits - hits >
free`` only tightens as free blocks fall and evictions shorten the hit, and while running requests still
fill blocks the head might hit there is no run.

Acceptance. Request ``r``'s ``j``-th verification round uses the ``j``-th uniform of its own slice of one
pre-drawn stream, ``u = U[offset_r + j]``, and accepts ``min(k, A_r(u))`` drafts where ``A_r(u) = #{i :
u < p_i}`` over the (per-request, per-context) unconditional rates ``p_i`` (see
:mod:`servesim.speculation.profile`); so step mode and run mode, which visit rounds in different orders,
draw identical values. The table ``A_r`` is built when the request starts (or restarts, after a
preemption) its decode phase; with context decay, round ``i`` of that phase uses the context
``ctx0 + i * AL(K)`` (its context at the start of the phase plus the mean tokens per round), a
deterministic approximation of the true, random context.

Counters follow ``vllm/v1/spec_decode/metrics.py``: per request per step with at least one draft,
``num_drafts += 1``, ``num_draft_tokens += drafts``, ``num_accepted_tokens += accepted``,
``num_accepted_tokens_per_pos[i] += 1`` if the first ``i + 1`` drafts were accepted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from servesim.engine.core import KV_BLOCK_PS_MAX, Engine
from servesim.roofline import SUBPS_BITS, SUBPS_MASK
from servesim.speculation.costs import DrafterCost
from servesim.speculation.schedule import KSchedule


@dataclass
class SpecSetup:
    """What the engine needs to speculate.

    Attributes:
        schedule: k per batch size (vLLM's table, or the static K).
        lookahead: KV slots reserved per request beyond its scheduled tokens.
        disable_by_batch_size: V0 threshold on running requests, or None.
        drafts_may_be_empty: the proposer may find no match (n-gram).
        drafter: the drafting cost model.
        profile: the acceptance profile (:class:`~servesim.speculation.profile.AcceptanceProfile`).
        uniforms: float64 (sum of output tokens,), one uniform per possible round per request (request
            r's rounds start at the sum of the output tokens of requests before it); None when
            ``accept_table`` is given.
        factors: float64 (N,) per-request acceptance factors, or None (no heterogeneity).
        accept_table: int32 (same shape as uniforms), ``A(u)`` of every uniform (-1 = empty n-gram
            draft), precomputed when acceptance depends on neither the request nor its context.
        tree_nodes: draft tokens per round of a draft tree (its nodes below the root; the tree's depth is
            K), or None for a chain.
        draft_budget_limit: llama.cpp's rule, a round drafts at most the request's remaining output
            tokens minus one.
        draft_slots: token-budget slots each scheduled request takes for drafting (vLLM's
            ``max_num_new_slots_for_drafting``: 1 for draft models, 0 otherwise).
        prefill_lookahead: vLLM's ``num_prefill_lookahead_tokens``; above 1 (MTP with several layers) a
            prefill chunk never ends within that many tokens of the prompt's end.
    """

    schedule: KSchedule
    lookahead: int
    disable_by_batch_size: int | None
    drafts_may_be_empty: bool
    drafter: DrafterCost
    profile: object
    uniforms: np.ndarray | None
    factors: np.ndarray | None
    accept_table: np.ndarray | None = None
    tree_nodes: int | None = None
    draft_budget_limit: bool = False
    draft_slots: int = 0
    prefill_lookahead: int = 0


SHORT_RUN = 24
"""Runs of at most this many decode steps are summed in plain Python (numpy's per-call cost dominates)."""

SUBPS_SUM_MAX = 2**62
"""Bound on a vector run's summed step durations (2^-16 ps, about 70 s): int64 with room for the remainder."""


class SpecEngine(Engine):
    """The engine with speculative decoding (see the module docstring). Same arguments as
    :class:`~servesim.engine.core.Engine` plus ``spec``."""

    def __init__(self, *, spec: SpecSetup, **kwargs) -> None:
        self.spec = spec  # before the base class builds the block manager (_use_eagle)
        super().__init__(**kwargs)
        n = self.n
        self.K = spec.schedule.K
        # draft tokens scheduled per request for k speculative positions: k for a chain, the tree's nodes
        # (below the root) for a draft tree of depth K
        self.width = list(range(self.K + 1))
        if spec.tree_nodes is not None:
            self.width[self.K] = spec.tree_nodes
        self.L = int(spec.lookahead)
        self.draft_slots = int(spec.draft_slots)
        self.prefill_lookahead = int(spec.prefill_lookahead)
        # prefix caching: vLLM's num_reprefillable_tokens (multi-layer MTP: the last prefill_lookahead - 1
        # tokens are not cached yet); every scheduling notes its cached tokens (_note_scheduled), since a
        # verify step caches the tokens known when scheduled, not those computed after it (accepted drafts)
        self.reprefill = max(self.prefill_lookahead - 1, 0)
        self.note_cached = True
        self.emitted = [0] * n  # tokens each request emitted at its last emission (async: those in flight)
        self.kv_output_tokens = [0] * n  # async: tokens cached once the output before its last scheduling is processed
        self.output_cached: dict[int, int] = {}  # async: finished request -> tokens its last output caches
        self.known_at_join = [0] * n  # run mode, async: tokens known to vLLM when a decoder's first round is scheduled
        self.multi_partial = False  # run mode: several requests mid-prefill (MTP's chunk rule); plain steps then
        # async scheduling: drafts rejected in the step each request last verified in (``rej_step``); while
        # the next step is scheduled vLLM still counts them as computed, so that step's KV allocation is
        # for ``num_computed + rejected + scheduled + lookahead`` tokens
        self.rej = [0] * n
        self.rej_step = [-2] * n
        self.k_next = self.K if spec.schedule.entries is None else spec.schedule.k_for(1)
        self.off = np.concatenate(([0], np.cumsum(np.asarray(self.O, dtype=np.int64))[:-1])).tolist() if n else []
        self.rounds = [0] * n
        # drafted[r]: the drafter has proposed tokens for r (it sampled when last scheduled). A request
        # recomputing after a preemption has none, even when one token of its recompute is left.
        self.drafted = [False] * n
        self.acc_table: list = [None] * n  # per request: (first round, int array of A values)
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.K
        self.end_chunks: list = []  # per row, its steps' ends after the row's start (ps), in row order
        self.mean_len = float(spec.profile.mean_acceptance_length(self.K))
        self.p_fixed = np.cumprod(spec.profile.conditional_rates(self.K))[None, :]
        # run mode: per-step sums over the aggregated decoders' timelines (see _join)
        self.budget_limit = bool(spec.draft_budget_limit)
        self.var_q = bool(spec.drafts_may_be_empty) or self.budget_limit
        self.cap = 0
        self._arrays = ("NCB", "NB", "TOK", "QNCB", "QQ") if self.var_q else ("NCB", "NB")
        for name in ("NCB", "NB", "TOK", "QNCB", "QQ"):
            setattr(self, name, np.zeros(0, dtype=np.int64))
        self._ensure(1024)
        self.tl: dict[int, tuple] = {}
        self.segments: list[tuple] = []  # (accepted per round, tokens per round or None, k) of finished timelines
        self.k_agg = self.k_next
        self.base_tab = np.full(self.M + 1, -1, dtype=np.int64)
        if n:
            self._check_peak_fits()

    def _check_peak_fits(self) -> None:
        """Refuse a request whose largest one-step KV need exceeds the whole cache (it would stall the run).

        A decoding request with ``P + g`` known tokens (``g <= O - 1`` generated) verifies ``1 + d`` tokens
        and allocates slots for ``P + g + d + L``: its peak is ``P + O - 1 + w + L`` with ``w`` the widest
        verify (``width[K]``: K drafts, or the tree's nodes) capped by the token budget (``w <= M - 1``), and
        ``w = 0`` under llama.cpp's draft budget (``d <= O - g - 1``). A (re)prefill needs at most
        ``P + O - 1 + L``. Without speculation the engine needs ``P + O`` (checked by the base class).

        Raises:
            ValueError: one line naming the request, its peak (tokens, blocks) and the settings to change.
        """
        drafts = 0 if self.budget_limit else min(self.width[self.K], self.M - 1)
        total = np.asarray(self.P, dtype=np.int64) + np.asarray(self.O, dtype=np.int64)
        peak = total - 1 + drafts + self.L
        r = int(np.argmax(peak))
        need = -(-int(peak[r]) // self.bs)
        if need > self.total_blocks:
            raise ValueError(
                f"request {r} ({self.P[r]} prompt + {self.O[r]} output tokens) can need {int(peak[r])} KV slots "
                f"({need} blocks of {self.bs} tokens) in one step under speculation ({drafts} draft tokens verified, "
                f"{self.L} lookahead slots), more than the cache's {self.total_blocks} blocks: raise "
                "engine.num_gpu_blocks_override or gpu_memory_utilization, or lower "
                "speculative_config.num_speculative_tokens"
            )

    def _preempt(self, victim: int) -> int:  # type: ignore[override]
        self.drafted[victim] = False
        self.output_cached.pop(victim, None)  # async: its last output comes after it left (see _kv_cached)
        return super()._preempt(victim)

    # ------------------------------------------------------------------ prefix caching
    def _use_eagle(self) -> bool:  # type: ignore[override]
        """vLLM's ``use_eagle`` (EAGLE, EAGLE-3, MTP: hits drop their last block): exactly the methods
        with a ``num_prefill_lookahead_tokens`` of 1 or more; n-gram, Medusa and draft models keep it."""
        return self.spec.prefill_lookahead >= 1

    def _note_scheduled(self, r: int, n: int, t0: int) -> int:  # type: ignore[override]
        """Request ``r`` is scheduled ``n`` tokens (drafts included) in the step starting at ``t0``: note and
        return the tokens its blocks cache (see :meth:`_note_many`)."""
        self._note_many(((r, n),), t0)
        return self.kv_cached_tokens[r]

    def _note_many(self, items, t0: int, lagging=None) -> None:
        """Requests ``items`` (``(request, tokens)`` pairs, drafts included) are scheduled in the step
        starting at ``t0``: note the tokens their blocks cache (vLLM ``allocate_slots``: ``min(num_computed
        + num_new, num_tokens)``, ``num_tokens`` without drafts, so a verify caches only verified tokens;
        under async scheduling without the tokens still in flight; less ``num_reprefillable_tokens``) and,
        for those in ``lagging``, cache their newly full shareable blocks. Under async scheduling also
        note what the previous step's output caches when vLLM processes it, after this scheduling (its
        computed tokens as they are now, see :meth:`_kv_cached`). One loop for a whole step (hot path)."""
        P, gen, nc, held_back = self.P, self.gen, self.nc, self.reprefill
        kv_cached = self.kv_cached_tokens
        if self.async_sched:
            last_emit, emitted, output_tokens = self.last_emit, self.emitted, self.kv_output_tokens
        for r, n in items:
            total = P[r] + gen[r]
            cached = nc[r] + n
            if self.async_sched:
                known = total - emitted[r] if gen[r] and last_emit[r] == t0 else total
                out = (nc[r] if nc[r] < total else total) - held_back
                output_tokens[r] = out if out > 0 else 0
            else:
                known = total
            cached = (cached if cached < known else known) - held_back
            kv_cached[r] = cached = cached if cached > 0 else 0
            if lagging and r in lagging:
                self.kv.cache(r, cached)

    def _finished_kv_cached(self, r: int) -> int:  # type: ignore[override]
        """A finished request frees with :meth:`_kv_cached` (its processed outputs are noted there)."""
        return self._kv_cached(r)

    def _kv_cached(self, r: int) -> int:  # type: ignore[override]
        """Tokens of request ``r``'s blocks that are cached: as noted at its last scheduling, and under async
        scheduling by the outputs processed since (a finished request's last output is processed before its
        blocks are freed; a preempted one's in-flight output after, when it no longer runs and caches
        nothing; a request not scheduled in the previous step has no output in flight)."""
        cached = self.kv_cached_tokens[r]
        if self.async_sched:
            out = self.output_cached.pop(r, None)
            if out is None:
                if self.last_emit[r] == self.now:  # its last output is still in flight
                    out = self.kv_output_tokens[r]
                else:  # not scheduled in the previous step: its last output was processed
                    total = self.P[r] + self.gen[r]
                    out = (self.nc[r] if self.nc[r] < total else total) - self.reprefill
            if out > cached:
                return out
        return cached

    def _finish(self, r: int, t1: int, sure: bool = True) -> None:  # type: ignore[override]
        if self.async_sched and self.prefix_caching:
            known = self.P[r] + self.gen[r]
            out = (self.nc[r] if self.nc[r] < known else known) - self.reprefill
            self.output_cached[r] = out if out > 0 else 0
        super()._finish(r, t1, sure)

    def _round_cached(self, timeline: tuple, r: int, i: int) -> int:
        """Tokens aggregated decoder ``r``'s blocks cache when its round ``i`` is scheduled (see
        :meth:`_note_scheduled`): its known tokens ``ncb_i + 1``, under async scheduling those before the
        previous round's output (``ncb_{i-1} + 1``; for round 0, noted at join)."""
        ncb = timeline[2]
        if not self.async_sched:
            known = int(ncb[i]) + 1
        elif i:
            known = int(ncb[i - 1]) + 1
        else:
            known = self.known_at_join[r]
        return known - self.reprefill if known > self.reprefill else 0

    def _decoder_cached_tokens(self, r: int, g: int) -> int:  # type: ignore[override]
        timeline = self.tl[r]
        return self._round_cached(timeline, r, g - timeline[0])

    # ------------------------------------------------------------------ acceptance
    def _start_decode(self, r: int) -> None:
        """Build request r's acceptance table for the rest of its rounds (at the start of a decode phase)."""
        spec = self.spec
        if spec.accept_table is not None:  # precomputed for every round of every request
            off = self.off[r]
            self.acc_table[r] = (0, spec.accept_table[off: off + self.O[r]])
            return
        j0 = self.rounds[r]
        remaining = self.O[r] - self.gen[r]
        start = self.off[r] + j0
        u = spec.uniforms[start:start + remaining]
        prof = spec.profile
        factors = None if spec.factors is None else np.full(len(u), spec.factors[r])
        ctx = None
        decay = getattr(prof, "context_decay", None)
        if decay is not None and decay.enabled:
            ctx = self.nc[r] + np.arange(len(u)) * self.mean_len
        if factors is None and ctx is None:
            table = (u[:, None] < self.p_fixed).sum(axis=1)
        else:
            p = np.cumprod(prof.conditional_rates(self.K, factors, ctx), axis=1)
            table = (u[:, None] < p).sum(axis=1)
        table = table.astype(np.int64)
        if spec.drafts_may_be_empty:
            table[prof.draft_is_empty(u)] = -1
        self.acc_table[r] = (j0, table)

    def _a(self, r: int) -> int:
        j0, table = self.acc_table[r]
        return int(table[self.rounds[r] - j0])

    def _count(self, d: int, acc: int) -> None:
        if d > 0:
            self.num_drafts += 1
            self.num_draft_tokens += d
            self.num_accepted_tokens += acc
            pos = self.accepted_per_pos
            for i in range(acc):
                pos[i] += 1

    def _k_new(self, batch_size: int) -> int:
        """Drafts to propose in this step for the next one: the schedule's k for this step's batch size,
        or 0 when V0's ``disable_by_batch_size`` turns speculation off (running requests >= threshold)."""
        thr = self.spec.disable_by_batch_size
        if thr is not None and len(self.running) >= thr:
            return 0
        return self.spec.schedule.k_for(batch_size)

    # ------------------------------------------------------------------ the plain step, with speculation
    def _explicit_step(self) -> None:
        P, O, gen, nc, bs, L = self.P, self.O, self.gen, self.nc, self.bs, self.L
        drafted = self.drafted
        running, waiting = self.running, self.waiting
        ds = self.draft_slots
        t0 = self.now
        nwait = len(waiting)
        k_step = self.k_next  # drafts proposed in the previous step
        budget = self.M
        free = self.free
        sched: list[tuple[int, int, int, int]] = []  # (request, tokens, drafts, A value)
        preempted = 0
        order = list(running)
        idx = 0
        finishing, zombies, G = self.finishing, [], self.G
        while idx < len(order) and budget > ds:
            r = order[idx]
            d = a_full = 0
            if r in finishing:  # async: it finished in the previous step
                if finishing[r]:  # vLLM knew it would: skipped
                    idx += 1
                    continue
                d = self.width[k_step] if k_step else 0  # scheduled once more; the output is discarded
                n = min(1 + d, budget - ds)
                d = n - 1
                zombies.append(r)
            elif drafted[r] and nc[r] == P[r] + gen[r] - 1:  # decoding: verify 1 + k tokens
                a_full = self._a(r)
                d = 0 if (k_step == 0 or a_full < 0) else self.width[k_step]
                if self.budget_limit and d > O[r] - gen[r] - 1:
                    d = O[r] - gen[r] - 1  # llama.cpp: a draft never exceeds the remaining budget minus one
                n = 1 + d
                if n > budget - ds:
                    n = budget - ds
                    d = n - 1
            else:
                n = P[r] + gen[r] - nc[r]
                if n > budget - ds:
                    n = budget - ds
                if self.prefill_lookahead > 1:
                    n = self._reserve_prefill_lookahead(P[r] + gen[r], nc[r], n)
                    if not n:  # vLLM skips it (``continue``) and schedules the requests after it
                        idx += 1
                        continue
            inflight = self.rej[r] if self.async_sched and self.rej_step[r] == G - 1 else 0
            free, count, stop = self._make_room(order, r, -(-(nc[r] + inflight + n + L) // bs), free)
            preempted += count
            if stop:
                break
            sched.append((r, n, d, a_full))
            budget -= n + ds
            idx += 1
        if self.prefix_caching:
            self._note_many([(r, n) for r, n, _, _ in sched], t0, self.kv.lagging)
        if not preempted:
            adm: list[tuple[int, int]] = []
            budget, free = self._admit(t0, budget, free, len(running), adm, L)
            sched.extend((r, n, 0, 0) for r, n in adm)
        self.free = free
        if not sched:
            if self.finishing:  # vLLM's empty async step: the previous output is processed, then it schedules again
                self._release_finishing()
                return
            self._stalled()
        tokens = logits = kv = pairs = prefill = nsamp = 0
        for r, n, d, _ in sched:
            c = nc[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            is_decode = drafted[r] and c == P[r] + gen[r] - 1 or r in finishing
            if is_decode:
                logits += n
                nsamp += 1
            else:
                prefill += n
                if c + n == P[r] + gen[r]:
                    logits += 1
                    nsamp += 1
        k_new = self._k_new(len(sched))
        t1 = self._advance(self.st.step_subps(tokens, logits, kv, pairs, len(sched))
                           + self.spec.drafter.step_subps(tokens, nsamp, k_new, kv))
        d_step = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self.tracer.record(t0, ((r, n, d) for r, n, d, _ in sched), used, nwait, k_new)
        if finishing:
            self._release_finishing()
        itl = 0
        for r, n, d, a_full in sched:
            c = nc[r]
            if zombies and r in zombies:
                continue
            if drafted[r] and c == P[r] + gen[r] - 1:
                acc = min(d, k_step, a_full) if a_full > 0 else 0
                self._count(d, acc)
                self.rounds[r] += 1
                self.rej[r], self.rej_step[r] = d - acc, G
                e = min(1 + acc, O[r] - gen[r])
                if self.last_emit[r] == t0:
                    itl += 1
                else:
                    self.extra_itl.append(t1 - self.last_emit[r])
                gen[r] += e
                nc[r] = c + 1 + acc
                self.last_emit[r] = t1
                self.emitted[r] = e
                if gen[r] >= O[r]:
                    self._finish(r, t1, sure=gen[r] - e + 1 >= O[r])
            else:
                nc[r] = c + n
                if nc[r] == P[r] + gen[r]:
                    self.drafted[r] = True  # it samples now: the drafter proposes for it
                    self.emitted[r] = 1
                    if not self._emit(r, t0, t1):
                        self._start_decode(r)
        self.k_next = k_new
        self.now = t1
        self.G += 1
        self.rows.append((t0, 1, d_step, 0, d_step, len(sched), tokens, prefill, itl, used, nwait, preempted, k_step))
        self.end_chunks.append(d_step)

    # ------------------------------------------------------------------ run mode: decoder timelines
    # A decoding request's future is fixed once k is: its acceptance table gives, round by round, the
    # tokens it schedules (1 + drafts), its context, its new KV blocks and the round it finishes in. At
    # join, these per-round arrays are added into global per-step arrays (see _join) indexed by
    # the absolute step number; a run of decode steps is then a few vector operations on slices of them,
    # and a finish, an arrival or a failing block allocation ends the run. When the global k changes
    # (batch-size schedule), every decoder's remaining timeline is recomputed.

    def _ensure(self, end: int) -> None:
        if end > self.cap:
            cap = max(end, 2 * self.cap, 1024)
            for name in self._arrays:
                old = getattr(self, name)
                new = np.zeros(cap, dtype=np.int64)
                new[: self.cap] = old
                setattr(self, name, new)
            self.cap = cap

    def _join(self, r: int, g: int, k: int | None = None) -> None:  # type: ignore[override]
        """Add decoder r's timeline from step g (k drafts per round) to the per-step sums.

        Per round i: ``ncb_i`` computed tokens before the round, ``q_i = 1 + drafts`` scheduled tokens,
        ``newblk_i`` KV blocks allocated. Sums kept per absolute step: NCB (computed tokens), NB (new
        blocks) and, when drafts may be empty (n-gram), TOK (q), QNCB (q * ncb) and QQ (q (q + 1) / 2);
        with a fixed q those three follow from B and NCB. The rounds actually run are recorded as a
        segment when the decoder leaves, and counted (vLLM's counters) once, at the end.
        """
        if k is None:
            k = self.k_agg
            if self.async_sched and self.prefix_caching:  # retimed decoders keep theirs (set at _leave)
                inflight = self.emitted[r] if self.last_emit[r] == self.now else 0
                self.known_at_join[r] = self.P[r] + self.gen[r] - inflight
        nc0, gen0, blk0, j0 = self.nc[r], self.gen[r], self.blk[r], self.rounds[r]
        jt, table = self.acc_table[r]
        remaining = self.O[r] - gen0
        a_full = table[j0 - jt: j0 - jt + remaining]
        if k == 0:
            J = remaining
            acc = None
            ncb = np.arange(nc0, nc0 + J, dtype=np.int64)
            q = np.ones(J, dtype=np.int64) if self.var_q else 1
        else:
            if self.var_q:
                d = np.where(a_full < 0, 0, self.width[k])
                acc = np.minimum(np.minimum(d, k), a_full.clip(0))
            else:
                d = None
                acc = np.minimum(a_full, k)
            e = acc + 1
            cum = np.cumsum(e)
            if self.budget_limit:
                d, acc, e, cum = self._limit_drafts(d, acc, e, cum, a_full, k, remaining)
            J = int(np.searchsorted(cum, remaining)) + 1
            acc = acc[:J]
            ncb = (nc0 - e[:J]) + cum[:J]
            q = (d[:J] + 1) if self.var_q else self.width[k] + 1
        bs = self.bs
        if self.async_sched:  # the previous round's rejected drafts still count while this round is scheduled
            rej = np.zeros(J, dtype=np.int64)
            rej[0] = self.rej[r] if self.rej_step[r] == g - 1 else 0
            if acc is not None and J > 1:
                rej[1:] = (q[:J - 1] if self.var_q else q) - 1 - acc[:J - 1]
            need = (ncb + rej + (q + self.L + bs - 1)) // bs
        else:
            need = (ncb + (q + self.L + bs - 1)) // bs
        if self.var_q or self.async_sched:
            held = np.maximum.accumulate(np.maximum(need, blk0))
        else:
            held = np.maximum(need, blk0)  # non-decreasing: ncb grows every round, q is fixed
        newblk = held.copy()
        newblk[1:] -= held[:-1]
        newblk[0] -= blk0
        end = g + J
        if end > self.cap:
            self._ensure(end)
        self.NCB[g:end] += ncb
        self.NB[g:end] += newblk
        if self.var_q:
            self.TOK[g:end] += q
            self.QNCB[g:end] += q * ncb
            self.QQ[g:end] += q * (q + 1) // 2
        self.tl[r] = (g, J, ncb, held, acc, gen0, blk0, j0, newblk, q, k)
        self.B += 1
        fin = end - 1
        self.fing[r] = fin
        heapq.heappush(self.heap, (fin, r))

    def _segment_counters(self) -> None:
        """Add the vLLM counters of the rounds run by aggregated decoders (recorded as segments at leave)."""
        if not self.segments:
            return
        accs, drafted_rounds, draft_tokens = [], 0, 0
        for acc, q, k in self.segments:
            if q is None:  # fixed k drafts every round
                accs.append(acc)
                drafted_rounds += len(acc)
                draft_tokens += self.width[k] * len(acc)
            else:
                mask = q > 1
                accs.append(acc[mask])
                drafted_rounds += int(mask.sum())
                draft_tokens += int((q - 1).sum())
        self.segments = []
        acc = np.concatenate(accs)
        counts = np.bincount(acc, minlength=self.K + 1).tolist()
        self.num_drafts += drafted_rounds
        self.num_draft_tokens += draft_tokens
        at_least = 0
        for i in range(self.K, 0, -1):
            at_least += counts[i]
            self.num_accepted_tokens += i * counts[i]
            self.accepted_per_pos[i - 1] += at_least

    @staticmethod
    def _limit_drafts(d, acc, e, cum, a_full, k, remaining):
        """llama.cpp's draft budget: a round drafts at most ``remaining output - 1`` tokens. Only the last
        few rounds of a request can hit the cap; from the first one that does, redo them in order."""
        before = cum - e
        capped = np.flatnonzero(remaining - before - 1 < d)
        if not len(capped):
            return d, acc, e, cum
        d, acc, e = d.copy(), acc.copy(), e.copy()
        i = int(capped[0])
        emitted = int(before[i])
        while i < len(d):
            d_i = min(int(d[i]), max(remaining - emitted - 1, 0))
            a_i = min(d_i, k, max(int(a_full[i]), 0))
            d[i], acc[i], e[i] = d_i, a_i, a_i + 1
            emitted += a_i + 1
            i += 1
            if emitted >= remaining:
                break
        return d, acc, e, np.cumsum(e)

    def _leave(self, r: int, g: int) -> int:  # type: ignore[override]
        """Remove decoder r at step g (its rounds before g done); write back its state; return its blocks."""
        timeline = self.tl.pop(r)
        g0, J, ncb, held, acc, gen0, blk0, j0, newblk, q, k = timeline
        m = g - g0
        end = g0 + J
        if m < J:
            self.NCB[g:end] -= ncb[m:]
            self.NB[g:end] -= newblk[m:]
            if self.var_q:
                qs = q[m:]
                self.TOK[g:end] -= qs
                self.QNCB[g:end] -= qs * ncb[m:]
                self.QQ[g:end] -= qs * (qs + 1) // 2
        if m and acc is not None:
            self.segments.append((acc[:m], q[:m] if self.var_q else None, k))
            self.rej[r] = int(q[m - 1] if self.var_q else q) - 1 - int(acc[m - 1])
            self.rej_step[r] = g - 1
        if m:
            if m < J:
                nc = int(ncb[m])
                gen = gen0 + nc - int(ncb[0])
            else:
                last_acc = int(acc[J - 1]) if acc is not None else 0
                nc = int(ncb[J - 1]) + 1 + last_acc
                gen = self.O[r]
            self.nc[r] = nc
            self.gen[r] = min(gen, self.O[r])
            blocks = int(held[m - 1])
            if self.prefix_caching:
                self._leave_cached(r, timeline, m)
        else:
            blocks = blk0
        self.blk[r] = blocks
        self.rounds[r] = j0 + m
        self.B -= 1
        self.fing[r] = -1
        return blocks

    def _leave_cached(self, r: int, timeline: tuple, m: int) -> None:
        """Prefix caching: what decoder ``r``, leaving after ``m >= 1`` rounds, noted at its last round's
        scheduling (as :meth:`_note_scheduled` does in a plain step), and its newly full shareable blocks."""
        ncb = timeline[2]
        before = int(ncb[m - 1])  # its computed tokens when its last round was scheduled
        cached = self._round_cached(timeline, r, m - 1)
        self.kv_cached_tokens[r] = cached
        if self.async_sched:
            self.kv_output_tokens[r] = before - self.reprefill if before > self.reprefill else 0
            self.emitted[r] = self.gen[r] - (timeline[5] + before - int(ncb[0]))
            self.known_at_join[r] = before + 1  # known when the next step is scheduled (its last round in flight)
        lagging = self.kv.lagging
        if lagging and r in lagging:
            self.kv.cache(r, cached)

    def _trace_tokens(self, r: int, g: int):  # type: ignore[override]
        """(tokens, drafts) per step from step g of aggregated decoder r (lists, or ints when fixed)."""
        timeline = self.tl[r]
        q = timeline[9]
        if isinstance(q, np.ndarray):
            q = q[g - timeline[0]:].tolist()
            return q, [x - 1 for x in q]
        return q, q - 1

    def _need_at(self, r: int, g: int) -> int:
        """New KV blocks decoder r allocates at step g."""
        timeline = self.tl[r]
        return int(timeline[8][g - timeline[0]])

    def _dec_sums(self, g: int) -> tuple[int, int, int]:
        """(scheduled tokens, sum of attended contexts, attention pairs) of the aggregated decoders at step g."""
        B = self.B
        if not B:
            return 0, 0, 0
        ncb = int(self.NCB[g])
        if self.var_q:
            tok = int(self.TOK[g])
            return tok, ncb + tok, int(self.QNCB[g]) + int(self.QQ[g])
        q = self.width[self.k_agg] + 1
        return B * q, ncb + B * q, q * ncb + B * (q * (q + 1) // 2)

    def _retime(self, g: int, k: int) -> None:
        """All decoders continue from step g with k drafts per round."""
        members = [r for r in self.running if r in self.tl]
        for r in members:
            self._leave(r, g)
        self.k_agg = k
        for r in members:
            self._join(r, g, k)

    def _materialize(self) -> None:  # type: ignore[override]
        g, now, stale, last = self.G, self.now, self.stale, self.last_emit
        for r in list(self.tl):
            self._leave(r, g)
            last[r] = stale.get(r, now)
        self.heap = []
        self.stale = {}
        self.partial = None

    def _aggregate(self) -> None:  # type: ignore[override]
        P, gen, nc, now, last = self.P, self.gen, self.nc, self.now, self.last_emit
        self.k_agg = self.k_next
        prefilling = 0
        for r in self.running:
            if r in self.finishing:
                continue
            if self.drafted[r] and nc[r] == P[r] + gen[r] - 1:
                self._join(r, self.G)
                if last[r] != now:
                    self.stale[r] = last[r]
            else:
                self.partial = r
                prefilling += 1
        self.multi_partial = prefilling > 1

    def _finish_decoders(self, g_last: int, t1: int) -> None:  # type: ignore[override]
        heap, fing = self.heap, self.fing
        while heap and heap[0][0] == g_last:
            _, r = heapq.heappop(heap)
            if fing[r] != g_last:
                continue
            timeline = self.tl[r]
            before = timeline[5] + int(timeline[2][timeline[1] - 1]) - int(timeline[2][0])  # generated before its last round
            self._leave(r, g_last + 1)
            self.gen[r] = self.O[r]
            self.last_emit[r] = t1
            self._finish(r, t1, sure=before + 1 >= self.O[r])

    def _base_vec(self, tok: np.ndarray) -> np.ndarray:
        tab = self.base_tab
        hi = int(tok.max())
        if hi >= len(tab):
            grown = np.full(max(hi + 1, 2 * len(tab)), -1, dtype=np.int64)
            grown[: len(tab)] = tab
            self.base_tab = tab = grown
        vals = tab[tok]
        if (vals < 0).any():
            for t in np.unique(tok[vals < 0]).tolist():
                tab[t] = self.st.tokens_subps(t, t)
            vals = tab[tok]
        return vals

    def _fast_step(self) -> None:  # type: ignore[override]
        if self.multi_partial:
            self._fallback()
            return
        g = self.G
        if self.k_next != self.k_agg and self.tl:
            self._retime(g, self.k_next)
        self.k_agg = self.k_next
        B = self.B
        ds = self.draft_slots
        t_dec = (int(self.TOK[g]) if self.var_q else B * (self.width[self.k_agg] + 1)) if B else 0
        budget = self.M - t_dec - B * ds
        if budget < 0:
            self._fallback()
            return
        nb = int(self.NB[g]) if B else 0
        if self.finishing:
            zombies = None if self.partial is not None or nb > self.free else self._zombies(budget, nb)
            if zombies is None:
                self._fallback()  # async: preemption victims, a prefill chunk or a short budget next to finished requests
                return
            if zombies:
                self._spec_mixed_step(g, zombies)
                return
        if self.partial is None and B and nb <= self.free:
            waiting = self.waiting
            blocked = True
            head_tokens = None
            if waiting and len(self.running) < self.max_seqs:
                h = waiting[0]
                total = self.P[h] + self.gen[h]
                need = -(-total // self.bs)
                left = total
                if self.prefix_caching and (self.kv.shareable is not None or h in self.kv.own_runs):
                    if self.kv.lagging:
                        # running requests still fill blocks the head might hit: no run (as in the plain
                        # engine's _head_blocked; otherwise free blocks and hits only shrink within a run)
                        need = -1
                        blocked = False
                    else:
                        hit = self.kv.lookup(h, total, self.free - nb)
                        need += hit.num_evictable - hit.num_blocks
                        left = total - hit.num_blocks * self.bs
                if 0 <= need <= self.free - nb:
                    # the head takes its own drafting slots (draft models) out of what the decoders leave
                    blocked = budget <= ds or (not self.chunked and left > budget - ds)
                    head_tokens = left  # blocked by the token budget only, which varies within a run
            if blocked:
                self._spec_run(g, B, head_tokens)
                return
        self._spec_mixed_step(g)

    def _admissible_at(self, tok: np.ndarray, head_tokens: int) -> int | None:
        """First step of a run (index into ``tok``, the decoders' scheduled tokens per step) whose token
        budget would admit the waiting head of ``head_tokens`` tokens (chunked prefill: any budget left;
        without: the whole prompt), or None. The verify width varies within a run (empty n-gram drafts,
        llama.cpp's draft budget), so a head blocked at the run's first step can become admissible later."""
        room = self.M - tok - (self.B + 1) * self.draft_slots  # the decoders' and the head's drafting slots
        ok = room > 0 if self.chunked else room >= head_tokens
        return int(np.argmax(ok)) if ok.any() else None

    def _spec_run(self, g: int, B: int, head_tokens: int | None = None) -> None:
        """A run of decode-only steps up to the next event, as vector operations on the per-step sums.

        ``head_tokens``: tokens of the waiting head when only the token budget keeps it out; the run then
        ends before the first step whose budget admits it (:meth:`_admissible_at`)."""
        t0 = self.now
        k_step = self.k_agg
        k_new = self._k_new(B)
        n = self._next_finish() - g + 1
        if self.stale or k_new != k_step or self.finishing:
            n = 1
        if n > 4096:
            n = 4096
        st, dr = self.st, self.spec.drafter
        kd = dr.kv_subps_per_draft_token * k_new
        t_lim = self.arrivals.next_time()  # every arrival ends the run (the queue is recorded at step level)
        if self.max_time_ps is not None and (t_lim is None or self.max_time_ps < t_lim):
            t_lim = self.max_time_ps
        if t_lim is not None and n > 1:
            # step times only grow within a run (contexts grow), so the first step's time bounds how many
            # steps can pass before t_lim: evaluate no more than that
            d_first = (st.base_subps(B, B, B) + (st.kv_subps_per_token + kd) * int(self.NCB[g])) >> SUBPS_BITS
            n = min(n, (t_lim - t0) // max(d_first, 1) + 2)
        if n <= SHORT_RUN and not self.var_q:
            self._short_run(g, B, n, t_lim, k_step, k_new, kd)
            return
        end = g + n
        ncb = self.NCB[g:end]
        if self.var_q:
            tok = self.TOK[g:end]
            over = tok > self.M
            if over.any():
                n = int(np.argmax(over))
                if n == 0:
                    self._fallback()
                    return
                end = g + n
                ncb, tok = ncb[:n], tok[:n]
            if head_tokens is not None:
                first = self._admissible_at(tok, head_tokens)
                if first is not None:  # >= 1: the first step keeps the head out
                    n = first
                    end = g + n
                    ncb, tok = ncb[:n], tok[:n]
            ctx = ncb + tok
            d = (self._base_vec(tok) + st.request_subps_per_request * B + (st.kv_subps_per_token + kd) * ctx
                 + st.attn_subps_per_pair * (self.QNCB[g:end] + self.QQ[g:end]))
            if k_new > 0:
                d += np.array([dr.const_subps(t, B, k_new) for t in tok.tolist()], dtype=np.int64)
            tok0 = int(tok[0])
            longest = int(d.max())
        else:
            q = self.width[k_step] + 1
            tok0 = B * q
            const = (st.base_subps(tok0, tok0, B) + (st.kv_subps_per_token + kd) * tok0
                     + st.attn_subps_per_pair * B * (q * (q + 1) // 2) + dr.const_subps(tok0, B, k_new))
            d = (st.kv_subps_per_token + kd + st.attn_subps_per_pair * q) * ncb + const
            longest = int(d[n - 1])  # contexts only grow within a run
        if longest * n >= SUBPS_SUM_MAX:  # keep the run's sum (2^-16 ps) within int64
            n = max(1, SUBPS_SUM_MAX // longest)
        # the steps' ends after t0 in 2^-16 ps from the clock's remainder, then on the ps clock
        fine = np.cumsum(d[:n])
        fine += self.clock_subps
        ends = fine >> SUBPS_BITS
        if t_lim is not None and ends[n - 1] >= t_lim - t0:
            n = int(np.searchsorted(ends, t_lim - t0, side="left")) + 1
        cnb = np.cumsum(self.NB[g:g + n])
        if cnb[n - 1] > self.free:
            n = int(np.searchsorted(cnb, self.free, side="right"))
        used_before = self.total_blocks - self.free
        dur = int(ends[n - 1])
        if (used_before + int(cnb[n - 1])) * dur >= KV_BLOCK_PS_MAX:
            span = KV_BLOCK_PS_MAX // (used_before + int(cnb[n - 1]))
            n = max(1, int(np.searchsorted(ends[:n], span, side="left")))
            dur = int(ends[n - 1])
        t1 = t0 + dur
        self.clock_subps = int(fine[n - 1]) & SUBPS_MASK
        if self.tracer is not None:
            self._trace_run(g, n, [t0] + (ends[:n - 1] + t0).tolist(), cnb[:n].tolist(), k_new)
        self.free -= int(cnb[n - 1])
        used = self.total_blocks - self.free
        # blocks in use at the end of step j: used_before + cnb[j]; the row's integral is used * dur less
        # the blocks of step i (i >= 1) over the steps before it, nb_i x (end of step i - 1) (every term
        # < KV_BLOCK_PS_MAX: no overflow)
        late = int(np.dot(self.NB[g + 1:g + n], ends[:n - 1])) if n > 1 else 0
        if late:
            self.kv_late.append((len(self.rows), late))
        d0 = int(ends[0])
        itl = B - self._flush_stale(t0 + d0)
        inc = (dur - int(ends[n - 2]) - d0) // (n - 1) if n > 1 else 0
        self.rows.append((t0, n, d0, inc, dur, B, tok0, 0, itl, used, len(self.waiting), 0, k_step))
        self.end_chunks.append(ends[:n])
        self.now = t1
        self.G = g + n
        self.k_next = k_new
        if self.finishing:
            self._release_finishing()
        self._finish_decoders(g + n - 1, t1)

    def _short_run(self, g: int, B: int, n: int, t_lim, k_step: int, k_new: int, kd: int) -> None:
        """:meth:`_spec_run` for at most SHORT_RUN steps with a fixed verify width, in plain integers: the
        same sums, step by step, without the per-call cost of numpy on a handful of elements."""
        st, dr = self.st, self.spec.drafter
        t0 = self.now
        q = self.width[k_step] + 1
        tok0 = B * q
        const = (st.base_subps(tok0, tok0, B) + (st.kv_subps_per_token + kd) * tok0
                 + st.attn_subps_per_pair * B * (q * (q + 1) // 2) + dr.const_subps(tok0, B, k_new))
        slope = st.kv_subps_per_token + kd + st.attn_subps_per_pair * q
        ncb = self.NCB[g:g + n].tolist()
        nb = self.NB[g:g + n].tolist()
        free, t, m = self.free, t0, 0
        fine = self.clock_subps  # the clock's remainder below t (2^-16 ps)
        ends = []
        kv_ps = 0
        total = self.total_blocks
        for i in range(n):
            if nb[i] > free:  # this step's block allocation would fail: the run ends before it
                break
            step = fine + const + slope * ncb[i]
            d = step >> SUBPS_BITS  # the step's duration on the ps clock
            step_kv = (total - free + nb[i]) * d
            if m and kv_ps + step_kv >= KV_BLOCK_PS_MAX:  # keep the row's KV integral within int64
                break
            fine = step & SUBPS_MASK
            free -= nb[i]
            kv_ps += step_kv
            t += d
            ends.append(t - t0)
            m += 1
            if t_lim is not None and t >= t_lim:
                break
        self.clock_subps = fine
        if self.tracer is not None:
            self._trace_run(g, m, [t0] + [t0 + e for e in ends[:-1]], [sum(nb[:j + 1]) for j in range(m)], k_new)
        self.free = free
        if kv_ps != (total - free) * (t - t0):
            self.kv_late.append((len(self.rows), (total - free) * (t - t0) - kv_ps))
        used = self.total_blocks - free
        d0 = ends[0]
        itl = B - self._flush_stale(t0 + d0)
        inc = (ends[-1] - ends[-2] - d0) // (m - 1) if m > 1 else 0
        self.rows.append((t0, m, d0, inc, t - t0, B, tok0, 0, itl, used, len(self.waiting), 0, k_step))
        self.end_chunks.append(ends)
        self.now = t
        self.G = g + m
        self.k_next = k_new
        if self.finishing:
            self._release_finishing()
        self._finish_decoders(g + m - 1, t)

    def _zombies(self, budget: int, nb: int) -> dict | None:
        """Async scheduling, run mode: the requests that finished in the previous step without vLLM knowing
        they would, which it schedules once more (``1 + k`` tokens, output discarded): request -> (tokens,
        drafts, new KV blocks). None when they do not all fit whole in the budget and the free blocks
        (then the step needs vLLM's per-request order: a plain step)."""
        out = {}
        k_step, ds, bs, G = self.k_agg, self.draft_slots, self.bs, self.G
        free = self.free - nb
        for r, sure in self.finishing.items():
            if sure or r not in self.running:
                continue
            d = self.width[k_step] if k_step else 0
            inflight = self.rej[r] if self.rej_step[r] == G - 1 else 0
            need = max(-(-(self.nc[r] + inflight + 1 + d + self.L) // bs) - self.blk[r], 0)
            budget -= 1 + d + ds
            free -= need
            if budget < 0 or free < 0:
                return None
            out[r] = (1 + d, d, need)
        return out

    def _spec_mixed_step(self, g: int, zombies: dict | None = None) -> None:
        P, gen, nc, blk, bs, L = self.P, self.gen, self.nc, self.blk, self.bs, self.L
        t0 = self.now
        nwait = len(self.waiting)
        k_step = self.k_agg
        p = self.partial
        ds = self.draft_slots
        z_tokens = sum(q + ds for q, _, _ in zombies.values()) if zombies else 0
        budget = self.M - self._dec_sums(g)[0] - self.B * ds - z_tokens
        n_p = need_p = 0
        p_scheduled = p is not None and budget > ds
        if p_scheduled:
            n_p = min(P[p] + gen[p] - nc[p], budget - ds)
            if self.prefill_lookahead > 1:
                n_p = self._reserve_prefill_lookahead(P[p] + gen[p], nc[p], n_p)
                p_scheduled = n_p > 0
            need_p = max(-(-(nc[p] + n_p + L) // bs) - blk[p], 0)
        nb = int(self.NB[g]) if self.B else 0
        preempted = 0
        if nb + (need_p if p_scheduled else 0) > self.free:
            preempted, _, p_scheduled = self._preempt_aggregated(g, nb, need_p, p_scheduled)
        B = self.B
        t_dec, ctx, pairs = self._dec_sums(g)
        nb = int(self.NB[g]) if B else 0
        free = self.free - nb
        sched: list[tuple[int, int]] = []
        if p_scheduled:
            free -= need_p
            blk[p] += need_p
            sched.append((p, n_p))
        budget = self.M - t_dec - B * ds - z_tokens - (n_p + ds if p_scheduled else 0)
        if zombies:
            for z, (q, _, need) in zombies.items():
                free -= need
                blk[z] += need
                c = nc[z]
                t_dec += q
                ctx += c + q
                pairs += q * c + q * (q + 1) // 2
        if self.prefix_caching:
            chunks = [(z, entry[0]) for z, entry in zombies.items()] + sched if zombies else sched
            for r, n in chunks:
                self._note_scheduled(r, n, t0)
            if self.kv.lagging:
                self._cache_scheduled(g, chunks)
        if not preempted:
            budget, free = self._admit(t0, budget, free, len(self.running), sched, L)
        self.free = free
        if not sched and not B and not zombies:
            if self.finishing:
                self._release_finishing()
                return
            self._stalled()
        tokens, logits, kv, prefill, nsamp = t_dec, t_dec, ctx, 0, B + (len(zombies) if zombies else 0)
        for r, n in sched:
            c = nc[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            prefill += n
            if c + n == P[r] + gen[r]:
                logits += 1
                nsamp += 1
        batch = B + len(sched) + (len(zombies) if zombies else 0)
        k_new = self._k_new(batch)
        t1 = self._advance(self.st.step_subps(tokens, logits, kv, pairs, batch)
                           + self.spec.drafter.step_subps(tokens, nsamp, k_new, kv))
        d = t1 - t0
        used = self.total_blocks - free
        if self.tracer is not None:
            self._trace_mixed(t0, g, sched, used, nwait, k_new, zombies)
        if self.finishing:
            self._release_finishing()
        itl = B - self._flush_stale(t1)
        self.now = t1
        self.G = g + 1
        self._finish_decoders(g, t1)
        if k_new != self.k_agg and self.tl:
            self._retime(g + 1, k_new)
        self.k_agg = self.k_next = k_new
        # requests still mid-prefill after this step: the partial if it got no chunk, and unfinished chunks
        mids = [p] if p is not None and not p_scheduled and p in self.running else []
        for r, n in sched:
            nc[r] += n
            if nc[r] == P[r] + gen[r]:
                self.drafted[r] = True  # it samples now: the drafter proposes for it
                self.emitted[r] = 1
                if not self._emit(r, t0, t1):
                    self._start_decode(r)
                    self._join(r, g + 1)
            else:
                mids.append(r)
        self.partial = mids[-1] if mids else None
        self.multi_partial = len(mids) > 1
        self.rows.append((t0, 1, d, 0, d, batch, tokens, prefill, itl, used, nwait, preempted, k_step))
        self.end_chunks.append(d)

    def output(self):
        if self.mode == "run" and (self.tl or self.partial is not None):
            self._materialize()
        self._segment_counters()
        out = super().output()
        out.spec_counters = {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }
        return out

    def _step_ends(self, cols: np.ndarray) -> np.ndarray:  # type: ignore[override]
        """Every step's end after the start of its row (ps), int64 (S,): recorded row by row."""
        parts = [np.atleast_1d(np.asarray(c, dtype=np.int64)) for c in self.end_chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
