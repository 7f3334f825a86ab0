"""Speculative decoding in the engine (vLLM V1 semantics, see ``vllm-semantics.md``).

In every step, each decoding request schedules ``1 + k`` tokens: its last sampled token and the ``k``
drafts the drafter proposed in the previous step (fewer when the token budget is short; none for an
n-gram round without a match). The target verifies them in the same forward pass; the request accepts a
prefix of ``a`` drafts and samples one more token, so it emits ``1 + a`` tokens and its computed tokens
advance by ``1 + a`` (rejected drafts roll back ``num_computed_tokens`` but keep their KV blocks). KV slots
are allocated for ``num_computed + scheduled + lookahead`` tokens, with ``lookahead = K`` (the static
``num_speculative_tokens``) for the EAGLE family, MTP and draft models, also when a batch-size schedule
sets ``k = 0`` (vLLM issue 49548), and 0 for n-gram. The drafter then runs in the same step (cost model in
:mod:`servesim.speculation.costs`). ``k`` for the next step's drafts is chosen from this step's batch size
(``num_speculative_tokens_per_batch_size``); V0's ``disable_by_batch_size`` turns speculation off when
running requests >= the threshold: that step drafts nothing, so the next step verifies no drafts.

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

from servesim.engine.core import Engine
from servesim.roofline import PS_PER_S
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
        uniforms: float64 (sum of output tokens,), one uniform per possible round per request.
        factors: float64 (N,) per-request acceptance factors, or None (no heterogeneity).
    """

    schedule: KSchedule
    lookahead: int
    disable_by_batch_size: int | None
    drafts_may_be_empty: bool
    drafter: DrafterCost
    profile: object
    uniforms: np.ndarray
    factors: np.ndarray | None


class SpecEngine(Engine):
    """The engine with speculative decoding (see the module docstring). Same arguments as
    :class:`~servesim.engine.core.Engine` plus ``spec``."""

    def __init__(self, *, spec: SpecSetup, **kwargs) -> None:
        super().__init__(**kwargs)
        n = self.n
        self.spec = spec
        self.K = spec.schedule.K
        self.L = int(spec.lookahead)
        self.k_next = self.K if spec.schedule.entries is None else spec.schedule.k_for(1)
        self.off = np.concatenate(([0], np.cumsum(np.asarray(self.O, dtype=np.int64))[:-1])).tolist() if n else []
        self.rounds = [0] * n
        self.acc_table: list = [None] * n  # per request: (first round, int array of A values)
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.K
        self.dur_chunks: list = []  # exact per-step durations (ps), in row order
        self.mean_len = float(spec.profile.mean_acceptance_length(self.K))
        bs, L = self.bs, self.L
        if n and L:
            longest = max(p + o for p, o in zip(self.P, self.O)) + L + self.K
            if -(-longest // bs) > self.total_blocks:
                raise ValueError(
                    f"a request of {longest} tokens (with {L} lookahead slots) needs more KV blocks than the cache holds"
                )

    # ------------------------------------------------------------------ acceptance
    def _start_decode(self, r: int) -> None:
        """Build request r's acceptance table for the rest of its rounds (at the start of a decode phase)."""
        spec = self.spec
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
            p = np.cumprod(prof.conditional_rates(self.K))
            table = (u[:, None] < p[None, :]).sum(axis=1)
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
        P, O, gen, nc, blk, bs, L = self.P, self.O, self.gen, self.nc, self.blk, self.bs, self.L
        running, waiting = self.running, self.waiting
        t0 = self.now
        nwait = len(waiting)
        k_step = self.k_next  # drafts proposed in the previous step
        budget = self.M
        free = self.free
        sched: list[tuple[int, int, int, int]] = []  # (request, tokens, drafts, A value)
        preempted = 0
        order = list(running)
        idx = 0
        while idx < len(order) and budget > 0:
            r = order[idx]
            d = a_full = 0
            if gen[r] >= 1 and nc[r] == P[r] + gen[r] - 1:  # decoding: verify 1 + k tokens
                a_full = self._a(r)
                d = 0 if (k_step == 0 or a_full < 0) else k_step
                n = 1 + d
                if n > budget:
                    n = budget
                    d = n - 1
            else:
                n = P[r] + gen[r] - nc[r]
                if n > budget:
                    n = budget
            need = -(-(nc[r] + n + L) // bs)
            stop = False
            while need - blk[r] > free:
                victim = order.pop()
                del running[victim]
                free += blk[victim]
                blk[victim] = 0
                nc[victim] = 0
                self.npre[victim] += 1
                waiting.appendleft(victim)
                preempted += 1
                if victim == r:
                    stop = True
                    break
            if stop:
                break
            if need > blk[r]:
                free -= need - blk[r]
                blk[r] = need
            sched.append((r, n, d, a_full))
            budget -= n
            idx += 1
        if not preempted:
            adm: list[tuple[int, int]] = []
            budget, free = self._admit(t0, budget, free, len(running), adm)
            for r, n in adm:
                extra = -(-(n + L) // bs) - blk[r]
                if extra > 0:  # lookahead slots for the new request too
                    free -= extra
                    blk[r] += extra
                sched.append((r, n, 0, 0))
        self.free = free
        if not sched:
            self._stalled()
        tokens = logits = kv = pairs = prefill = nsamp = 0
        for r, n, d, _ in sched:
            c = nc[r]
            tokens += n
            kv += c + n
            pairs += n * c + n * (n + 1) // 2
            is_decode = gen[r] >= 1 and c == P[r] + gen[r] - 1
            if is_decode:
                logits += n
                nsamp += 1
            else:
                prefill += n
                if c + n == P[r] + gen[r]:
                    logits += 1
                    nsamp += 1
        k_new = self._k_new(len(sched))
        d_step = self.st.step_ps(tokens, logits, kv, pairs) + self.spec.drafter.step_ps(tokens, nsamp, k_new, kv)
        t1 = t0 + d_step
        used = self.total_blocks - free
        itl = 0
        for r, n, d, a_full in sched:
            c = nc[r]
            if gen[r] >= 1 and c == P[r] + gen[r] - 1:
                acc = min(d, a_full) if a_full > 0 else 0
                self._count(d, acc)
                self.rounds[r] += 1
                e = min(1 + acc, O[r] - gen[r])
                if self.last_emit[r] == t0:
                    itl += 1
                else:
                    self.extra_itl.append(t1 - self.last_emit[r])
                gen[r] += e
                nc[r] = c + 1 + acc
                self.last_emit[r] = t1
                if gen[r] >= O[r]:
                    self._finish(r, t1)
            else:
                nc[r] = c + n
                if nc[r] == P[r] + gen[r]:
                    if not self._emit(r, t0, t1):
                        self._start_decode(r)
        self.k_next = k_new
        self.now = t1
        self.G += 1
        self.rows.append((t0, 1, d_step, 0, d_step, len(sched), tokens, prefill, itl, used, nwait, preempted, k_step))
        self.dur_chunks.append(d_step)

    def _fast_step(self) -> None:
        # Run mode with speculation: see _spec_run (decode runs) and the plain step otherwise.
        self._explicit_step()

    def output(self):
        out = super().output()
        out.spec_counters = {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }
        return out

    def _exact_durations(self):
        parts = [np.atleast_1d(np.asarray(c, dtype=np.int64)) for c in self.dur_chunks]
        if not parts:
            return np.zeros(0)
        return np.concatenate(parts) / float(PS_PER_S)
