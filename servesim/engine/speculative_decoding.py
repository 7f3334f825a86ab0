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
when it is scheduled and accepted drafts are cached at the next scheduling (:meth:`Engine._note_many <servesim.engine.core.Engine._note_many>`;
an aggregated decoder's round ``i`` caches ``ncb_i + 1``, :meth:`SpeculativeDecoding.round_cached`); multi-layer MTP
holds back its last ``K - 1`` tokens (``num_reprefillable_tokens``); EAGLE, EAGLE-3 and MTP hits drop their
last block (``use_eagle``). Under async scheduling the tokens in flight are not known yet, and vLLM caches
again when it processes an output (``AsyncScheduler._update_request_with_output``: computed tokens less
those in flight), which shows when a finished request's blocks are freed. Run mode stays exact for the
reasons :mod:`servesim.engine.core` gives: a run needs the waiting head blocked through it, and it is:
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

import weakref

from array import array
from dataclasses import dataclass
from typing import NamedTuple
from math import inf

import numpy as np

from servesim.engine.step_rows import KV_BLOCK_PS_MAX, IntLog, blocks_of_at_most, concatenated_ranges
from servesim.roofline import SUBPS_BITS, SUBPS_MASK
from servesim.speculation.costs import DrafterCost
from servesim.speculation.schedule import KSchedule


@dataclass(slots=True)
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
        accept_table: int8 (int16 for K > 126; same shape as uniforms), ``A(u)`` of every uniform (-1 =
            empty n-gram draft), precomputed when acceptance depends on neither the request nor its
            context; any integer dtype works (the engine casts where it computes with it).
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


class DecoderTimeline:
    """An aggregated decoder's rounds from the step it joined the aggregate at (run mode).

    Attributes:
        start_step: the step of its first round here.
        num_rounds: rounds until it emits its last token (J).
        computed_before: integer (J,), its computed tokens before each round (``ncb``).
        blocks_held: integer (J,), the KV blocks it holds after each round's allocation.
        accepted: integer (J,), drafts accepted in each round; None with k = 0.
        generated_at_start: its generated tokens before the first round.
        blocks_at_start: its KV blocks before the first round.
        round_at_start: its verification rounds before the first round (its acceptance draws' index).
        new_blocks: integer (J,), KV blocks allocated in each round.
        scheduled: tokens scheduled in each round (1 + drafts): int64 (J,) when the width varies, else an int.
        k: drafts per round.
        computed_at_start, last_computed_before: ``computed_before[0]`` and ``computed_before[J - 1]`` as
            Python ints (read when it leaves or finishes, without indexing the array).

    The arrays are int64, or of the acceptance table's and its cumulative sum's dtypes where they come from
    them (:meth:`SpeculativeDecoding._emitted_block`; ``accepted`` is then a view of the int8 table):
    nothing writes into them after the join.

    A plain class with its own ``__init__`` rather than a dataclass: one is built per join, and a
    dataclass's generated ``__init__`` runs interpreted even in the compiled engine.
    """

    __slots__ = ("start_step", "num_rounds", "computed_before", "blocks_held", "accepted", "generated_at_start",
                 "blocks_at_start", "round_at_start", "new_blocks", "scheduled", "k", "computed_at_start",
                 "last_computed_before")

    def __init__(self, start_step: int, num_rounds: int, computed_before: np.ndarray, blocks_held: np.ndarray,
                 accepted: np.ndarray | None, generated_at_start: int, blocks_at_start: int, round_at_start: int,
                 new_blocks: np.ndarray, scheduled: np.ndarray | int, k: int, computed_at_start: int,
                 last_computed_before: int) -> None:
        self.start_step = start_step
        self.num_rounds = num_rounds
        self.computed_before = computed_before
        self.blocks_held = blocks_held
        self.accepted = accepted
        self.generated_at_start = generated_at_start
        self.blocks_at_start = blocks_at_start
        self.round_at_start = round_at_start
        self.new_blocks = new_blocks
        self.scheduled = scheduled
        self.k = k
        self.computed_at_start = computed_at_start
        self.last_computed_before = last_computed_before


@dataclass(slots=True)
class EmittedBlock:
    """The fixed-width join's cumulative sum over the rounds of requests ``first_request .. end_request -
    1`` (:meth:`SpeculativeDecoding._emitted_block`).

    Attributes:
        first_request, end_request: the block's requests (``end_request`` excluded).
        first_round: the acceptance-table index of its first request's first round.
        emitted_before: int64 (rounds + 3,), ``C[j + 2]`` = tokens emitted by the block's rounds
            before its round ``j`` (1 + accepted each) with two leading zeros; strictly increasing from
            index 2 (every round emits at least one token); never written after it is built.
        key: the scalar type of ``emitted_before`` (a ``searchsorted`` key of its own dtype).
        first_before, first_stop: per request of the block, ``C`` at its first draw and the index in ``C``
            where its rounds from its first join end.
    """

    first_request: int
    end_request: int
    first_round: int
    emitted_before: np.ndarray
    key: type
    first_before: array
    first_stop: array


class RunTerms(NamedTuple):
    """The step-time terms of a fixed-width run step (2^-16 ps; :meth:`SpeculativeDecoding._run_terms`)."""

    tokens: int  # tokens scheduled in the step (decoders x (1 + verify width))
    const_subps: int  # the step's time less its context term
    subps_per_computed_token: int  # growth of the step's time per computed token of the decoders
    decode_base_subps: int  # context-free time of as many one-token requests (a run's first step, k = 0)


SHORT_RUN = 24
"""Runs of at most this many decode steps are summed in plain Python (numpy's per-call cost dominates)."""

EMITTED_CHUNK = 1 << 20
"""Rounds of the acceptance table summed at a time when the fixed-width join's cumulative sum is built."""

EMITTED_BLOCK_REQUESTS = 1 << 12
"""Requests whose rounds share one cumulative sum of the fixed-width join (:class:`EmittedBlock`): a block
is built at the first join of one of its requests and dropped once all of them have finished."""

COUNT_BLOCK_ROUNDS = 1 << 18
"""Rounds whose accepted drafts are counted at a time for vLLM's counters (bincount's intp temporaries)."""

SUBPS_SUM_MAX = 2**62
"""Bound on a vector run's summed step durations (2^-16 ps, about 70 s): int64 with room for the remainder."""

STEP_WINDOW_MIN = 1024
"""Steps the run mode's per-step sums hold at least (:meth:`SpeculativeDecoding._ensure`): twice the longest
horizon of a decoder's remaining rounds seen so far, from the next step to be taken."""


class SpeculativeDecoding:
    """Speculative decoding as the engine's decoding strategy (see the module docstring).

    Args:
        engine: the :class:`~servesim.engine.core.Engine` whose decoders this keeps.
        spec: what to speculate with.

    Raises:
        ValueError: a request's largest one-step KV need exceeds the whole cache (:meth:`check_peak_fits`).
    """

    # the whole state, as slots: read on every step and join (see Engine.__slots__; compiled, an
    # extension type)
    __slots__ = (
        "acceptance_tables", "accepted_per_pos", "base_by_tokens", "capacity", "context_cap", "draft_budget_limit",
        "draft_limit", "draft_slots", "emitted_blocks", "engine", "engine_ref", "fixed_rates", "fixed_segments",
        "fixed_table", "initial_k", "join_block_size", "join_need_offset", "join_shift", "k", "known_at_join",
        "kv_token_cap", "lookahead_slots", "mean_acceptance_length", "num_accepted_tokens", "num_decoders",
        "num_draft_tokens", "num_drafts", "num_speculative_tokens", "prefill_lookahead", "round_offset",
        "rounds_done", "run_terms", "segments", "spec", "static_k", "step_base", "step_computed", "step_new_blocks",
        "step_token_context", "step_token_pairs", "step_tokens", "table_segments", "timelines", "use_eagle",
        "variable_width", "verify_widths", "__weakref__",
    )

    speculative = True

    def __init__(self, engine, spec: SpecSetup) -> None:
        # a weak reference: the engine owns its strategy, and without a cycle it is freed as soon as its
        # run's output is taken (its logs are the largest objects of a run)
        # (a proxy for the cold paths; the hot ones dereference engine_ref once per call: every attribute
        # access through a proxy costs about four times a direct one)
        self.engine = weakref.proxy(engine)
        self.engine_ref = weakref.ref(engine)
        self.spec = spec
        num_requests = engine.num_requests
        self.num_speculative_tokens = K = spec.schedule.K
        # draft tokens scheduled per request for k speculative positions: k for a chain, the tree's nodes
        # (below the root) for a draft tree of depth K
        self.verify_widths = list(range(K + 1))
        if spec.tree_nodes is not None:
            self.verify_widths[K] = spec.tree_nodes
        self.lookahead_slots = int(spec.lookahead)
        self.draft_slots = int(spec.draft_slots)
        self.prefill_lookahead = int(spec.prefill_lookahead)
        # vLLM's use_eagle (EAGLE, EAGLE-3, MTP: prefix-cache hits drop their last block): exactly the
        # methods with a num_prefill_lookahead_tokens of 1 or more; n-gram, Medusa and draft models keep it
        self.use_eagle = self.prefill_lookahead >= 1
        self.initial_k = K if spec.schedule.entries is None else spec.schedule.k_for(1)
        self.k = self.initial_k  # drafts per round of the aggregated decoders
        output_tokens = engine.output_tokens
        # request r's acceptance draws start at the sum of the output tokens of the requests before it: an
        # int64 array of the array module, as the tokens known at join below (8 bytes a request, read as
        # Python ints, where a list would also hold an int object of 32 bytes for each value above 256);
        # the rounds done stay a list (incremented every round of a request stepped on its own, faster on a
        # list; small values, shared int objects)
        offsets = np.cumsum(np.asarray(output_tokens, dtype=np.int64)) - np.asarray(output_tokens, dtype=np.int64)
        self.round_offset = array("q", offsets.astype(np.int64).tobytes())
        self.rounds_done = [0] * num_requests  # verification rounds each request has run
        # per request (drawn at each decode phase's start when the table is not precomputed): (first round,
        # int array of A values)
        self.acceptance_tables: list = [None] * num_requests
        # async + prefix caching: tokens known when a decoder's first round is scheduled
        self.known_at_join = array("q", bytes(8 * num_requests))
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * K
        self.mean_acceptance_length = float(spec.profile.mean_acceptance_length(K))
        self.fixed_rates = np.cumprod(spec.profile.conditional_rates(K))[None, :]
        self.draft_budget_limit = bool(spec.draft_budget_limit)
        # per request, the most generated tokens + drafts a round may reach, or None when no round is capped;
        # the most KV slots a request is allocated (vLLM's max_model_len), or None when none reaches it; and,
        # under async scheduling, vLLM's max_model_len when a request comes near it (capped step by step)
        self.draft_limit, self.kv_token_cap, self.context_cap = self._context_limits(engine, spec)
        # the verify width varies from round to round (empty n-gram drafts, a draft limit); also taken when the
        # KV cap binds (the fixed-width join does not apply it)
        self.variable_width = (bool(spec.drafts_may_be_empty) or self.draft_limit is not None
                               or self.kv_token_cap is not None)
        # run mode: per step from step ``step_base`` on (element ``i`` is step ``step_base + i``), sums over
        # the aggregated decoders' timelines (see join): computed tokens before the round, new KV blocks and,
        # when the width varies, scheduled tokens q, q x computed and q (q + 1) / 2; the steps already taken
        # are dropped as the window moves on (_ensure), so that they hold the decoders' horizon, not the run
        self.step_base = 0
        self.capacity = STEP_WINDOW_MIN
        self.step_computed = np.zeros(STEP_WINDOW_MIN, dtype=np.int64)
        self.step_new_blocks = np.zeros(STEP_WINDOW_MIN, dtype=np.int64)
        width = STEP_WINDOW_MIN if self.variable_width else 0
        self.step_tokens = np.zeros(width, dtype=np.int64)
        self.step_token_context = np.zeros(width, dtype=np.int64)
        self.step_token_pairs = np.zeros(width, dtype=np.int64)
        self.num_decoders = 0
        self.timelines: dict[int, DecoderTimeline] = {}
        # the rounds of the timelines that left: accepted drafts per round, by k with a fixed width, else
        # (accepted, tokens) per round
        self.fixed_segments: dict[int, list[np.ndarray]] = {}
        # ... and those whose accepted drafts are the precomputed table's own (k = K, fixed width: A <= K):
        # (first table index, rounds) each, not a view object per segment
        self.table_segments = IntLog(2)
        self.segments: list[tuple[np.ndarray, np.ndarray]] = []
        self.base_by_tokens = np.full(engine.max_num_batched_tokens + 1, -1, dtype=np.int64)  # tokens_subps memo
        # a fixed verify width over a precomputed table: a decoder verifying k = K drafts accepts A(u) (<= K)
        # every round, so its timeline follows from a cumulative sum of the table (_emitted_block)
        self.fixed_table = spec.accept_table is not None and not self.variable_width
        # k proposed every step when neither a batch-size schedule nor disable_by_batch_size varies it
        self.static_k = K if spec.schedule.entries is None and spec.disable_by_batch_size is None else None
        self.run_terms: dict[tuple[int, int, int], RunTerms] = {}  # _run_terms memo
        # the fixed-width join's cumulative sums, a block of requests each, by block index (_emitted_block)
        self.emitted_blocks: dict[int, EmittedBlock] = {}
        # the fixed-width join's scalar operands as 0-d int64 arrays (the values written in per join): numpy 2
        # converts a Python int operand of a ufunc at about three times the cost of the whole operation on
        # an array of a decoder's rounds (measured, 60 int64 elements: 0.97 us against 0.29 us with a 0-d
        # array; the same int64 results)
        self.join_shift = np.zeros((), dtype=np.int64)
        self.join_need_offset = np.zeros((), dtype=np.int64)
        self.join_block_size = np.array(engine.block_size, dtype=np.int64)
        if num_requests:
            self.check_peak_fits()

    def _context_limits(self, engine, spec: SpecSetup) -> tuple[array | None, int | None, int | None]:
        """The draft limit, the KV cap and the async context cap (see ``__init__``), each None when it never
        binds.

        The draft limit, per request, is the most ``generated + drafts`` a verification round may reach
        (tokens). Two rules cap a round's drafts ``d`` at ``g`` generated tokens: llama.cpp's draft budget
        (``d <= O - g - 1``: limit ``O - 1``) and vLLM's context bound (``scheduler.py``: a running request's
        new tokens are at most ``max_model_len - num_computed - 1``; a verify of ``1 + d`` tokens from ``P +
        g - 1`` computed gives ``d <= max_model_len - P - g - 1``: limit ``max_model_len - P - 1``). The KV
        cap is ``max_model_len`` (``kv_cache_manager.allocate_slots`` allocates slots for at most
        ``max_model_len`` tokens, lookahead slots included). Both bind only for a request within ``K + L``
        tokens of ``max_model_len`` (``L`` lookahead slots). Under async scheduling vLLM's
        ``num_computed_tokens`` also counts the previous step's drafts still in flight, so the bound depends
        on the previous round's rejections and can leave no token at all (vLLM then skips the request for a
        step): the engine applies it step by step instead (``Engine.context_cap``: no draft limit, exact
        steps), for a request within twice the drafts plus ``L`` of ``max_model_len``.
        """
        prompt = np.asarray(engine.prompt_tokens, dtype=np.int64)
        output = np.asarray(engine.output_tokens, dtype=np.int64)
        limit = output - 1 if spec.draft_budget_limit else None
        max_len = engine.max_model_len
        if max_len is None or not len(prompt):
            return (None if limit is None else array("q", limit.tobytes())), None, None
        # a request's last round (g = O - 1) may verify at most max_model_len - P - O drafts, and its KV need
        # there (P + O - 1 + drafts + L) may reach max_model_len; under async scheduling also counting the
        # previous round's rejected drafts (up to the verify width again)
        widest = self.verify_widths[self.num_speculative_tokens]
        slack = max_len - prompt - output
        near = slack < widest * (2 if engine.async_scheduling else 1) + self.lookahead_slots
        if not near.any():
            return (None if limit is None else array("q", limit.tobytes())), None, None
        if engine.async_scheduling:  # (llama.cpp's draft budget never runs async: no draft limit here)
            return None, max_len, max_len
        context = max_len - prompt - 1
        if (context - (output - 1) < widest).any():
            limit = context if limit is None else np.minimum(limit, context)
        return (None if limit is None else array("q", limit.tobytes())), max_len, None

    def check_peak_fits(self) -> None:
        """Refuse a request whose largest one-step KV need exceeds the whole cache (it would stall the run).

        A decoding request with ``P + g`` known tokens (``g <= O - 1`` generated) verifies ``1 + d`` tokens
        and allocates slots for ``P + g + d + L``: its peak is ``P + O - 1 + w + L`` with ``w`` the widest
        verify (K drafts, or the tree's nodes) capped by the token budget (``w <= M - 1``), and ``w = 0``
        under llama.cpp's draft budget (``d <= O - g - 1``). A (re)prefill needs at most ``P + O - 1 + L``.
        Both are capped at ``max_model_len`` when it is set (vLLM ``kv_cache_manager.allocate_slots``
        allocates slots for at most ``max_model_len`` tokens, lookahead slots included). Without
        speculation the engine needs ``P + O`` (checked by the engine).

        Raises:
            ValueError: one line naming the request, its peak (tokens, blocks) and the settings to change.
        """
        engine = self.engine_ref()
        drafts = 0 if self.draft_budget_limit else min(self.verify_widths[self.num_speculative_tokens],
                                                       engine.max_num_batched_tokens - 1)
        total = np.asarray(engine.prompt_tokens, dtype=np.int64) + np.asarray(engine.output_tokens, dtype=np.int64)
        peak = total - 1 + drafts + self.lookahead_slots
        if engine.max_model_len is not None:
            np.minimum(peak, engine.max_model_len, out=peak)
        r = int(np.argmax(peak))
        need = -(-int(peak[r]) // engine.block_size)
        if need > engine.total_blocks:
            raise ValueError(
                f"request {r} ({engine.prompt_tokens[r]} prompt + {engine.output_tokens[r]} output tokens) can need "
                f"{int(peak[r])} KV slots ({need} blocks of {engine.block_size} tokens) in one step under speculation "
                f"({drafts} draft tokens verified, {self.lookahead_slots} lookahead slots), more than the cache's "
                f"{engine.total_blocks} blocks: raise engine.num_gpu_blocks_override or gpu_memory_utilization, or "
                "lower speculative_config.num_speculative_tokens"
            )

    # ------------------------------------------------------------------ prefix caching
    def round_cached(self, timeline: DecoderTimeline, r: int, i: int) -> int:
        """Tokens aggregated decoder ``r``'s blocks cache when its round ``i`` is scheduled (as the engine's
        ``_note_many`` notes): its known tokens ``ncb_i + 1``, under async scheduling those before the
        previous round's output (``ncb_{i-1} + 1``; for round 0, noted at join)."""
        ncb = timeline.computed_before
        held_back = self.engine.reprefill_tokens
        if not self.engine.async_scheduling:
            known = int(ncb[i]) + 1
        elif i:
            known = int(ncb[i - 1]) + 1
        else:
            known = self.known_at_join[r]
        return known - held_back if known > held_back else 0

    def cached_tokens(self, r: int, g: int) -> int:
        """Tokens aggregated decoder ``r``'s blocks cache when it is scheduled in step ``g``."""
        timeline = self.timelines[r]
        return self.round_cached(timeline, r, g - timeline.start_step)

    # ------------------------------------------------------------------ acceptance (the exact step)
    def start_decode(self, r: int) -> None:
        """Build request r's acceptance table for the rest of its rounds (at the start of a decode phase)."""
        spec = self.spec
        engine = self.engine_ref()
        output_tokens = engine.output_tokens[r]
        if spec.accept_table is not None:  # precomputed for every round of every request: read in place
            return
        first_round = self.rounds_done[r]
        remaining = output_tokens - engine.num_generated[r]
        start = self.round_offset[r] + first_round
        uniforms = spec.uniforms[start:start + remaining]
        profile = spec.profile
        factors = None if spec.factors is None else np.full(len(uniforms), spec.factors[r])
        context = None
        decay = getattr(profile, "context_decay", None)
        if decay is not None and decay.enabled:
            context = engine.num_computed[r] + np.arange(len(uniforms)) * self.mean_acceptance_length
        if factors is None and context is None:
            table = (uniforms[:, None] < self.fixed_rates).sum(axis=1)
        else:
            rates = np.cumprod(profile.conditional_rates(self.num_speculative_tokens, factors, context), axis=1)
            table = (uniforms[:, None] < rates).sum(axis=1)
        table = table.astype(np.int64)
        if spec.drafts_may_be_empty:
            table[profile.draft_is_empty(uniforms)] = -1
        self.acceptance_tables[r] = (first_round, table)

    def acceptance_draw(self, r: int) -> int:
        """``A_r(u)`` of ``r``'s next round: drafts it would accept of K (-1: an empty n-gram draft)."""
        accept_table = self.spec.accept_table
        if accept_table is not None:  # the request's rounds start at round_offset in the precomputed table
            return int(accept_table[self.round_offset[r] + self.rounds_done[r]])
        first_round, table = self.acceptance_tables[r]
        return int(table[self.rounds_done[r] - first_round])

    def drafts_for(self, r: int, k: int, draw: int) -> int:
        """Draft tokens ``r`` verifies in its next step with ``k`` drafts proposed (``draw``: its acceptance
        draw): the verify width, none for an empty n-gram draft, and at most its draft limit less its
        generated tokens (llama.cpp's draft budget, vLLM's ``max_model_len``: :meth:`_context_limits`)."""
        drafts = 0 if (k == 0 or draw < 0) else self.verify_widths[k]
        limit = self.draft_limit
        if limit is not None:
            cap = limit[r] - self.engine_ref().num_generated[r]
            if drafts > cap:
                drafts = cap  # llama.cpp's draft budget, or vLLM's max_model_len (_context_limits)
        return drafts

    def verify_width(self, k: int) -> int:
        """Draft tokens scheduled per decoder for ``k`` speculative positions (chain: k; tree: its nodes)."""
        return self.verify_widths[k] if k else 0

    def record_round(self, r: int, drafts: int, accepted: int) -> None:
        """Count a verification round of ``r`` (vLLM's counters, ``vllm/v1/spec_decode/metrics.py``)."""
        self.rounds_done[r] += 1
        if drafts > 0:
            self.num_drafts += 1
            self.num_draft_tokens += drafts
            self.num_accepted_tokens += accepted
            pos = self.accepted_per_pos
            for i in range(accepted):
                pos[i] += 1

    def k_for_next_step(self, batch_size: int) -> int:
        """Drafts to propose in this step for the next one: the schedule's k for this step's batch size,
        or 0 when V0's ``disable_by_batch_size`` turns speculation off (running requests >= threshold)."""
        if self.static_k is not None:  # neither a schedule nor a threshold: always K
            return self.static_k
        threshold = self.spec.disable_by_batch_size
        if threshold is not None and len(self.engine.running) >= threshold:
            return 0
        return self.spec.schedule.k_for(batch_size)

    def drafter_subps(self, num_tokens: int, num_sampled: int, k: int, kv_tokens: int) -> int:
        """The drafter's time in a step (2^-16 ps, :class:`~servesim.speculation.costs.DrafterCost`)."""
        return self.spec.drafter.step_subps(num_tokens, num_sampled, k, kv_tokens)

    def counters(self) -> dict:
        """vLLM's speculative-decoding counters over the whole run (call after the aggregate is written back)."""
        self._segment_counters()
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }

    # ------------------------------------------------------------------ run mode: decoder timelines
    # A decoding request's future is fixed once k is: its acceptance table gives, round by round, the
    # tokens it schedules (1 + drafts), its context, its new KV blocks and the round it finishes in. At
    # join, these per-round arrays are added into global per-step arrays (see join) indexed by
    # the absolute step number; a run of decode steps is then a few vector operations on slices of them,
    # and a finish, an arrival or a failing block allocation ends the run. When the global k changes
    # (batch-size schedule), every decoder's remaining timeline is recomputed. With a fixed verify width,
    # k = K and a precomputed table (the common case), a join reads its rounds off a cumulative sum of
    # the table, built a block of requests at a time (_join_fixed, _emitted_block); runs of at most
    # SHORT_RUN steps are summed in plain integers (_short_run).

    def _ensure(self, g: int, end: int) -> None:
        """Room in the per-step sums for steps ``g`` (the first a caller reads or writes) to ``end``
        (exclusive): the window moves to start at the earliest step still to be taken (``g``, or the
        engine's next step if earlier), dropping the steps before it, and doubles when the decoders'
        horizon outgrows it. Each move copies at most the horizon's steps, after at least as many steps
        were taken: amortised O(1) per step."""
        keep_from = max(self.step_base, min(g, self.engine_ref().step_index))
        shift = keep_from - self.step_base
        capacity = max(self.capacity, 2 * (end - keep_from))
        live = max(self.capacity - shift, 0)  # steps kept (none when no decoder ran for a whole window)
        names = (("step_computed", "step_new_blocks", "step_tokens", "step_token_context", "step_token_pairs")
                 if self.variable_width else ("step_computed", "step_new_blocks"))
        for name in names:
            old = getattr(self, name)
            if capacity == self.capacity:  # in place: numpy copies overlapping slices correctly
                old[:live] = old[shift:shift + live]
                old[live:] = 0
            else:
                new = np.zeros(capacity, dtype=np.int64)
                new[:live] = old[shift:shift + live]
                setattr(self, name, new)
        self.step_base = keep_from
        self.capacity = capacity

    def note_stale_join(self, r: int, g: int) -> None:
        """Decoder ``r`` joined at step ``g`` after a step without it: nothing to note (its join reads
        whether an output of it is in flight from its last emission, ``known_at_join``)."""

    def begin_aggregate(self) -> None:
        """The aggregate is rebuilt from per-request state: its rounds verify the last proposed k."""
        self.k = self.engine.k_next

    def before_step(self, g: int) -> None:
        """Step ``g`` is about to be taken on the aggregate: retime the decoders if k changed."""
        k_next = self.engine.k_next
        if k_next != self.k and self.timelines:
            self._retime(g, k_next)
        self.k = k_next

    def after_step(self, g_next: int, k_new: int) -> None:
        """A step ended; the next, ``g_next``, verifies ``k_new`` drafts."""
        if k_new != self.k and self.timelines:
            self._retime(g_next, k_new)
        self.k = k_new

    def _emitted_block(self, block: int) -> EmittedBlock:
        """Build the :class:`EmittedBlock` of requests ``block * B .. (block + 1) * B - 1`` (``B`` =
        :data:`EMITTED_BLOCK_REQUESTS`), if every round verified K drafts: request ``r``'s rounds ``j >=
        j0`` emit ``C[s_r + j + 3] - C[s_r + j0 + 2]`` tokens by round ``j``'s end, ``s_r`` its first round
        in the block. Drops the blocks whose requests have all finished first (nothing joins them again):
        the sums held follow the requests in flight, not the whole table (8 bytes per table entry, one per
        output token)."""
        engine = self.engine_ref()
        finish = np.frombuffer(engine.finish_ps, dtype=np.int64)
        for index in [i for i, b in self.emitted_blocks.items() if finish[b.first_request:b.end_request].min() >= 0]:
            del self.emitted_blocks[index]
        first_request = block * EMITTED_BLOCK_REQUESTS
        end_request = min(first_request + EMITTED_BLOCK_REQUESTS, engine.num_requests)
        first_round = self.round_offset[first_request]
        end_round = self.round_offset[end_request - 1] + engine.output_tokens[end_request - 1]
        table = self.spec.accept_table[first_round:end_round]
        num_rounds = table.shape[0]
        # int64 even where int32 would hold the sums: the join's slices then add to the int64 token counts
        # and step sums without a conversion (measured: 3.0 against 3.5 us of numpy per join)
        out = np.zeros(num_rounds + 3, dtype=np.int64)
        for start in range(0, num_rounds, EMITTED_CHUNK):  # in chunks: no temporary as large as the block
            stop = min(start + EMITTED_CHUNK, num_rounds)
            chunk = out[start + 3:stop + 3]
            np.cumsum(table[start:stop] + 1, dtype=out.dtype, out=chunk)
            chunk += out[start + 2]
        # each request's first join (no round yet, its first token generated by its prefill): C at its
        # first draw and the end of its rounds, for the whole block at once
        first = np.asarray(self.round_offset[first_request:end_request], dtype=np.int64) - first_round + 2
        before = out[first]
        remaining = np.asarray(engine.output_tokens[first_request:end_request], dtype=np.int64) - 1
        stop = out.searchsorted((before + remaining).astype(out.dtype))
        emitted = EmittedBlock(first_request, end_request, first_round, out, out.dtype.type,
                               array("q", before.astype(np.int64).tobytes()),
                               array("q", stop.astype(np.int64).tobytes()))
        self.emitted_blocks[block] = emitted
        return emitted

    def _join_fixed(self, r: int, g: int, k: int, computed0: int, generated0: int, remaining: int) -> None:
        """:meth:`join` for ``k = K`` drafts with a fixed verify width over the precomputed table (accepted
        ``min(A, K) = A``): the same timeline from a few slices of its block's cumulative sum ``C``
        (:meth:`_emitted_block`). With ``s`` the decoder's first draw in the block and ``b = C[s + 2]``:
        its rounds are those until ``C`` reaches ``b + remaining``, ``ncb_i = computed0 + C[s + 2 + i] - b``, and its KV need ``(ncb_i + q + L + bs - 1) //
        bs``; under async scheduling round ``i >= 1`` adds the previous round's rejected drafts, and
        ``ncb_i + rejected_i = ncb_{i-1} + 1 + a_{i-1} + q - 1 - a_{i-1} = ncb_{i-1} + q``, so its need
        reads ``C`` one round earlier (round 0's rejected drafts are the request's own)."""
        engine = self.engine_ref()
        block = self.emitted_blocks.get(r // EMITTED_BLOCK_REQUESTS)
        if block is None:
            block = self._emitted_block(r // EMITTED_BLOCK_REQUESTS)
        emitted_before = block.emitted_before
        round0 = self.rounds_done[r]
        s = self.round_offset[r] + round0 - block.first_round  # its next round's index in the block
        if round0 == 0 and generated0 == 1:
            before, stop = block.first_before[r - block.first_request], block.first_stop[r - block.first_request]
        else:
            before = int(emitted_before[s + 2])
            # C[stop] is the first >= before + remaining (a key of C's own dtype: a Python int would make
            # searchsorted convert all of C)
            stop = int(emitted_before.searchsorted(block.key(before + remaining)))
        num_rounds = stop - 2 - s
        shift = computed0 - before
        scalar = self.join_shift
        scalar[()] = shift
        ncb = emitted_before[s + 2:stop] + scalar
        q = self.verify_widths[k] + 1
        bs = engine.block_size
        blocks0 = engine.num_blocks[r]
        rejected0 = (engine.rejected_drafts[r] if engine.async_scheduling and engine.rejected_at_step[r] == g - 1
                     else 0)
        first_need = (computed0 + rejected0 + q + self.lookahead_slots + bs - 1) // bs
        # need[j] is the KV need of round j - 1 (need[0] is replaced by the blocks held before round 0)
        offset = self.join_need_offset
        if engine.async_scheduling:
            offset[()] = shift + 2 * q + self.lookahead_slots + bs - 1
            need = emitted_before[s:stop - 1] + offset
            need //= self.join_block_size
            need[1] = first_need
        else:
            offset[()] = shift + q + self.lookahead_slots + bs - 1
            need = emitted_before[s + 1:stop] + offset
            need //= self.join_block_size  # need[1] == first_need
        need[0] = blocks0
        if rejected0 > q:  # round 0's need could exceed round 1's (a wider verify before the join)
            np.maximum(need, blocks0, out=need)
            np.maximum.accumulate(need, out=need)
        elif first_need < blocks0:  # else need is non-decreasing from a first round that needs >= blocks0
            np.maximum(need, blocks0, out=need)
        held = need[1:]
        new_blocks = held - need[:-1]
        end = g + num_rounds
        if end - self.step_base > self.capacity:
            self._ensure(g, end)
        lo = g - self.step_base
        sums = self.step_computed[lo:lo + num_rounds]
        sums += ncb
        sums = self.step_new_blocks[lo:lo + num_rounds]
        sums += new_blocks
        table_start = block.first_round + s
        accepted = self.spec.accept_table[table_start:table_start + num_rounds]
        # ncb[0] is computed0 (C[s + 2] is before); its last entry from C as a Python int
        self.timelines[r] = DecoderTimeline(g, num_rounds, ncb, held, accepted, generated0, blocks0, round0,
                                            new_blocks, q, k, computed0, int(emitted_before[stop - 1]) + shift)
        self.num_decoders += 1
        engine.add_finish(r, end - 1)

    def join(self, r: int, g: int, k: int | None = None) -> None:
        """Add decoder r's timeline from step g (k drafts per round) to the per-step sums.

        Per round i: ``ncb_i`` computed tokens before the round, ``q_i = 1 + drafts`` scheduled tokens,
        ``newblk_i`` KV blocks allocated. Sums kept per absolute step: computed tokens, new blocks and,
        when the width varies (n-gram), q, q * ncb and q (q + 1) / 2; with a fixed q those three follow
        from the decoder count and the computed tokens. The rounds actually run are recorded as a segment
        when the decoder leaves, and counted (vLLM's counters) once, at the end.
        """
        engine = self.engine_ref()
        if k is None:
            k = self.k
            if engine.async_scheduling and engine.prefix_caching:  # retimed decoders keep theirs (set at leave)
                inflight = engine.emitted_tokens[r] if engine.last_emit_ps[r] == engine.now else 0
                self.known_at_join[r] = engine.prompt_tokens[r] + engine.num_generated[r] - inflight
        computed0, generated0 = engine.num_computed[r], engine.num_generated[r]
        remaining = engine.output_tokens[r] - generated0
        if k == self.num_speculative_tokens and self.fixed_table and remaining > 0:
            self._join_fixed(r, g, k, computed0, generated0, remaining)
            return
        blocks0, round0 = engine.num_blocks[r], self.rounds_done[r]
        if self.spec.accept_table is not None:  # precomputed: the request's rounds from round_offset on
            start = self.round_offset[r] + round0
            table = self.spec.accept_table[start: start + remaining]
        else:
            first_round, table = self.acceptance_tables[r]
            table = table[round0 - first_round: round0 - first_round + remaining]
        # int64: the precomputed table is int8, and arithmetic with a request's token counts must not wrap
        draws = table.astype(np.int64)
        variable = self.variable_width
        if k == 0:
            num_rounds = remaining
            accepted = None
            ncb = np.arange(computed0, computed0 + num_rounds, dtype=np.int64)
            q = np.ones(num_rounds, dtype=np.int64) if variable else 1
        else:
            if variable:
                drafts = np.where(draws < 0, 0, self.verify_widths[k])
                accepted = np.minimum(np.minimum(drafts, k), draws.clip(0))
            else:
                drafts = None
                accepted = np.minimum(draws, k)
            emitted = accepted + 1
            cum = np.cumsum(emitted)
            if self.draft_limit is not None:
                headroom = self.draft_limit[r] - generated0
                drafts, accepted, emitted, cum = self._limit_drafts(drafts, accepted, emitted, cum, draws, k, remaining,
                                                                    headroom)
            num_rounds = int(np.searchsorted(cum, remaining)) + 1
            accepted = accepted[:num_rounds]
            ncb = (computed0 - emitted[:num_rounds]) + cum[:num_rounds]
            q = (drafts[:num_rounds] + 1) if variable else self.verify_widths[k] + 1
        bs = engine.block_size
        lookahead = self.lookahead_slots
        if engine.async_scheduling:  # the previous round's rejected drafts still count while this round is scheduled
            rejected = np.zeros(num_rounds, dtype=np.int64)
            rejected[0] = engine.rejected_drafts[r] if engine.rejected_at_step[r] == g - 1 else 0
            if accepted is not None and num_rounds > 1:
                rejected[1:] = (q[:num_rounds - 1] if variable else q) - 1 - accepted[:num_rounds - 1]
            need = (ncb + rejected + (q + lookahead + bs - 1)) // bs
        elif self.kv_token_cap is not None:  # vLLM allocates slots for at most max_model_len tokens
            need = (np.minimum(ncb + (q + lookahead), self.kv_token_cap) + (bs - 1)) // bs
        else:
            need = (ncb + (q + lookahead + bs - 1)) // bs
        if variable or engine.async_scheduling:
            held = np.maximum.accumulate(np.maximum(need, blocks0))
        else:
            held = np.maximum(need, blocks0)  # non-decreasing: ncb grows every round, q is fixed
        new_blocks = held.copy()
        new_blocks[1:] -= held[:-1]
        new_blocks[0] -= blocks0
        end = g + num_rounds
        if end - self.step_base > self.capacity:
            self._ensure(g, end)
        lo = g - self.step_base
        hi = lo + num_rounds
        self.step_computed[lo:hi] += ncb
        self.step_new_blocks[lo:hi] += new_blocks
        if variable:
            self.step_tokens[lo:hi] += q
            self.step_token_context[lo:hi] += q * ncb
            self.step_token_pairs[lo:hi] += q * (q + 1) // 2
        self.timelines[r] = DecoderTimeline(g, num_rounds, ncb, held, accepted, generated0, blocks0, round0,
                                            new_blocks, q, k, int(ncb[0]) if num_rounds else computed0,
                                            int(ncb[num_rounds - 1]) if num_rounds else computed0)
        self.num_decoders += 1
        engine.add_finish(r, end - 1)

    def _segment_counters(self) -> None:
        """Add the vLLM counters of the rounds run by aggregated decoders (recorded as segments at leave)."""
        if not self.segments and not self.fixed_segments and not len(self.table_segments):
            return
        accs, drafted_rounds, draft_tokens = [], 0, 0
        counts = np.zeros(self.num_speculative_tokens + 1, dtype=np.int64)
        if len(self.table_segments):
            starts, lengths = self.table_segments.array().T
            rounds = int(lengths.sum())
            drafted_rounds += rounds
            draft_tokens += self.verify_widths[self.num_speculative_tokens] * rounds
            table = self.spec.accept_table
            for lo, hi in blocks_of_at_most(lengths, COUNT_BLOCK_ROUNDS):  # the rounds' table indices, a block at a time
                index = concatenated_ranges(starts[lo:hi], lengths[lo:hi])
                counts += np.bincount(table[index], minlength=self.num_speculative_tokens + 1)
            self.table_segments = IntLog(2)
        for k, arrays in self.fixed_segments.items():  # k drafts every round
            accepted = np.concatenate(arrays)
            accs.append(accepted)
            drafted_rounds += len(accepted)
            draft_tokens += self.verify_widths[k] * len(accepted)
        for accepted, q in self.segments:
            mask = q > 1
            accs.append(accepted[mask])
            drafted_rounds += int(mask.sum())
            draft_tokens += int((q - 1).sum())
        self.fixed_segments = {}
        self.segments = []
        if accs:
            accepted = accs[0] if len(accs) == 1 else np.concatenate(accs)  # int8 / int16 like the acceptance table
            # counted a block at a time: bincount works in intp, 8 bytes per round for the whole array at once
            for lo in range(0, len(accepted), COUNT_BLOCK_ROUNDS):
                counts += np.bincount(accepted[lo:lo + COUNT_BLOCK_ROUNDS], minlength=self.num_speculative_tokens + 1)
        counts = counts.tolist()
        self.num_drafts += drafted_rounds
        self.num_draft_tokens += draft_tokens
        at_least = 0
        for i in range(self.num_speculative_tokens, 0, -1):
            at_least += counts[i]
            self.num_accepted_tokens += i * counts[i]
            self.accepted_per_pos[i - 1] += at_least

    @staticmethod
    def _limit_drafts(drafts, accepted, emitted, cum, draws, k, remaining, headroom):
        """The draft limit (:meth:`SpeculativeDecoding._context_limits`): a round drafts at most ``headroom``
        (the limit less the generated tokens at join) less the tokens emitted before it. Only the last few
        rounds of a request can hit the cap; from the first one that does, redo them in order."""
        before = cum - emitted
        capped = np.flatnonzero(headroom - before < drafts)
        if not len(capped):
            return drafts, accepted, emitted, cum
        drafts, accepted, emitted = drafts.copy(), accepted.copy(), emitted.copy()
        i = int(capped[0])
        done = int(before[i])
        while i < len(drafts):
            d_i = min(int(drafts[i]), max(headroom - done, 0))
            a_i = min(d_i, k, max(int(draws[i]), 0))
            drafts[i], accepted[i], emitted[i] = d_i, a_i, a_i + 1
            done += a_i + 1
            i += 1
            if done >= remaining:
                break
        return drafts, accepted, emitted, np.cumsum(emitted)

    def leave(self, r: int, g: int) -> int:
        """Remove decoder r at step g (its rounds before g done); write back its state; return its blocks."""
        engine = self.engine_ref()
        timeline = self.timelines.pop(r)
        ncb, q = timeline.computed_before, timeline.scheduled
        m = g - timeline.start_step
        num_rounds = timeline.num_rounds
        end = timeline.start_step + num_rounds
        variable = self.variable_width
        if m < num_rounds:
            lo, hi = g - self.step_base, end - self.step_base
            self.step_computed[lo:hi] -= ncb[m:]
            self.step_new_blocks[lo:hi] -= timeline.new_blocks[m:]
            if variable:
                qs = q[m:]
                self.step_tokens[lo:hi] -= qs
                self.step_token_context[lo:hi] -= qs * ncb[m:]
                self.step_token_pairs[lo:hi] -= qs * (qs + 1) // 2
        accepted = timeline.accepted
        if m:
            last_accepted = 0
            if accepted is not None:
                last_accepted = int(accepted[m - 1])
                # the rounds run (a whole timeline's arrays hold exactly its rounds)
                if variable:
                    self.segments.append((accepted[:m], q[:m]) if m < num_rounds else (accepted, q))
                elif timeline.k == self.num_speculative_tokens and self.fixed_table:
                    self.table_segments.items += (self.round_offset[r] + timeline.round_at_start, m)
                    if self.table_segments.full():
                        self.table_segments.compact()
                else:
                    self.fixed_segments.setdefault(timeline.k, []).append(accepted[:m] if m < num_rounds else accepted)
                engine.rejected_drafts[r] = (int(q[m - 1]) if variable else q) - 1 - last_accepted
                engine.rejected_at_step[r] = g - 1
            output_tokens = engine.output_tokens[r]
            if m < num_rounds:
                computed = int(ncb[m])
                generated = timeline.generated_at_start + computed - timeline.computed_at_start
            else:
                computed = timeline.last_computed_before + 1 + last_accepted
                generated = output_tokens
            engine.num_computed[r] = computed
            engine.num_generated[r] = min(generated, output_tokens)
            blocks = int(timeline.blocks_held[m - 1])
            if engine.prefix_caching:
                self._leave_cached(r, timeline, m)
        else:
            blocks = timeline.blocks_at_start
        engine.num_blocks[r] = blocks
        self.rounds_done[r] = timeline.round_at_start + m
        self.num_decoders -= 1
        engine.finish_step[r] = -1
        return blocks

    def _leave_cached(self, r: int, timeline: DecoderTimeline, m: int) -> None:
        """Prefix caching: what decoder ``r``, leaving after ``m >= 1`` rounds, noted at its last round's
        scheduling (as the engine's ``_note_many`` does in an exact step), and its newly full
        shareable blocks."""
        engine = self.engine_ref()
        ncb = timeline.computed_before
        # its computed tokens when its last round was scheduled
        before = timeline.last_computed_before if m == timeline.num_rounds else int(ncb[m - 1])
        cached = self.round_cached(timeline, r, m - 1)
        engine.kv_cached_tokens[r] = cached
        if engine.async_scheduling:
            held_back = engine.reprefill_tokens
            engine.kv_output_tokens[r] = before - held_back if before > held_back else 0
            engine.emitted_tokens[r] = engine.num_generated[r] - (timeline.generated_at_start + before
                                                                  - timeline.computed_at_start)
            self.known_at_join[r] = before + 1  # known when the next step is scheduled (its last round in flight)
        lagging = engine.kv.lagging
        if lagging and r in lagging:
            engine.kv.cache(r, cached)

    def trace_tokens(self, r: int, g: int):
        """(tokens, drafts) per step from step g of aggregated decoder r (lists, or ints when fixed)."""
        timeline = self.timelines[r]
        q = timeline.scheduled
        if isinstance(q, np.ndarray):
            q = q[g - timeline.start_step:].tolist()
            return q, [x - 1 for x in q]
        return q, q - 1

    def need_at(self, r: int, g: int) -> int:
        """New KV blocks decoder r allocates at step g."""
        timeline = self.timelines[r]
        return int(timeline.new_blocks[g - timeline.start_step])

    def leave_finished(self, r: int, g: int) -> bool:
        """:meth:`leave` for decoder ``r``, whose last token step ``g - 1`` emits (the engine's finish path,
        once per request). Returns True when vLLM knew, as it scheduled that last round, that the request
        would finish (its output needed one more token), False when it learnt it from the round's accepted
        drafts."""
        timeline = self.timelines[r]
        before = timeline.generated_at_start + timeline.last_computed_before - timeline.computed_at_start
        sure = before + 1 >= self.engine_ref().output_tokens[r]
        self.leave(r, g)
        return sure

    def demand_at(self, g: int) -> tuple[int, int]:
        """(tokens the aggregated decoders schedule, new KV blocks they allocate) in step ``g``."""
        if not self.num_decoders:
            return 0, 0
        i = g - self.step_base
        tokens = int(self.step_tokens[i]) if self.variable_width else self.num_decoders * (self.verify_widths[self.k] + 1)
        return tokens, int(self.step_new_blocks[i])

    def new_blocks_at(self, g: int) -> int:
        """New KV blocks the aggregated decoders allocate in step ``g``."""
        return int(self.step_new_blocks[g - self.step_base]) if self.num_decoders else 0

    def sums_at(self, g: int) -> tuple[int, int, int]:
        """(scheduled tokens, sum of attended contexts, attention pairs) of the aggregated decoders at step g."""
        num_decoders = self.num_decoders
        if not num_decoders:
            return 0, 0, 0
        i = g - self.step_base
        ncb = int(self.step_computed[i])
        if self.variable_width:
            tokens = int(self.step_tokens[i])
            return tokens, ncb + tokens, int(self.step_token_context[i]) + int(self.step_token_pairs[i])
        q = self.verify_widths[self.k] + 1
        return num_decoders * q, ncb + num_decoders * q, q * ncb + num_decoders * (q * (q + 1) // 2)

    def _retime(self, g: int, k: int) -> None:
        """All decoders continue from step g with k drafts per round."""
        members = [r for r in self.engine.running if r in self.timelines]
        for r in members:
            self.leave(r, g)
        self.k = k
        for r in members:
            self.join(r, g, k)

    def _base_vec(self, tokens: np.ndarray) -> np.ndarray:
        """The step time's token terms (2^-16 ps) for each step's scheduled ``tokens`` (int64 array), memoised."""
        memo = self.base_by_tokens
        hi = int(tokens.max())
        if hi >= len(memo):
            grown = np.full(max(hi + 1, 2 * len(memo)), -1, dtype=np.int64)
            grown[: len(memo)] = memo
            self.base_by_tokens = memo = grown
        values = memo[tokens]
        if (values < 0).any():
            for t in np.unique(tokens[values < 0]).tolist():
                memo[t] = self.engine.step_time.tokens_subps(t, t)
            values = memo[tokens]
        return values

    def _admissible_at(self, tokens: np.ndarray, head_tokens: int) -> int | None:
        """First step of a run (index into ``tokens``, the decoders' scheduled tokens per step) whose token
        budget would admit the waiting head of ``head_tokens`` tokens (chunked prefill: any budget left;
        without: the whole prompt), or None. The verify width varies within a run (empty n-gram drafts,
        llama.cpp's draft budget), so a head blocked at the run's first step can become admissible later."""
        engine = self.engine_ref()
        room = engine.max_num_batched_tokens - tokens - (self.num_decoders + 1) * engine.draft_slots  # the decoders' and the head's drafting slots
        ok = room > 0 if engine.enable_chunked_prefill else room >= head_tokens
        return int(np.argmax(ok)) if ok.any() else None

    def _run_terms(self, num_decoders: int, k_step: int, k_new: int) -> RunTerms:
        """The :class:`RunTerms` of a fixed-width run step of ``num_decoders`` decoders verifying ``k_step``
        drafts and proposing ``k_new``, memoised in ``run_terms``."""
        st, drafter = self.engine.step_time, self.spec.drafter
        kv_rate = st.kv_subps_per_token + drafter.kv_subps_per_draft_token * k_new
        q = self.verify_widths[k_step] + 1
        first_tokens = num_decoders * q
        const = (st.base_subps(first_tokens, first_tokens, num_decoders) + kv_rate * first_tokens
                 + st.attn_subps_per_pair * num_decoders * (q * (q + 1) // 2)
                 + drafter.const_subps(first_tokens, num_decoders, k_new))
        terms = RunTerms(first_tokens, const, kv_rate + st.attn_subps_per_pair * q,
                         st.base_subps(num_decoders, num_decoders, num_decoders))
        self.run_terms[(num_decoders, k_step, k_new)] = terms
        return terms

    def run(self, g: int, head_tokens: int | None = None) -> None:
        """A run of decode-only steps from step ``g`` up to the next event, as vector operations on the
        per-step sums.

        ``head_tokens``: tokens of the waiting head when only the token budget keeps it out; the run then
        ends before the first step whose budget admits it (:meth:`_admissible_at`)."""
        engine = self.engine_ref()
        num_decoders = self.num_decoders
        t0 = engine.now
        k_step = self.k
        k_new = self.static_k if self.static_k is not None else self.k_for_next_step(num_decoders)
        first_finish, first_decoder = engine.finish_heap[0]
        if engine.finish_step[first_decoder] != first_finish:  # a stale entry on top (a preempted decoder)
            first_finish = engine.next_finish()
        n = first_finish - g + 1
        if engine.stale or k_new != k_step or engine.finishing:
            n = 1
        if n > 4096:
            n = 4096
        st, drafter = engine.step_time, self.spec.drafter
        kv_draft = drafter.kv_subps_per_draft_token * k_new
        t_lim = engine.arrivals.next_time() if engine.max_time_ps is None else engine.limit_time()
        fixed = not self.variable_width
        if fixed:
            terms = self.run_terms.get((num_decoders, k_step, k_new)) or self._run_terms(num_decoders, k_step, k_new)
        if t_lim is not None and n > 1:
            # step times only grow within a run (contexts grow), so the first step's time bounds how many
            # steps can pass before t_lim: evaluate no more than that
            base = terms.decode_base_subps if fixed else st.base_subps(num_decoders, num_decoders, num_decoders)
            d_first = (base + (st.kv_subps_per_token + kv_draft) * int(self.step_computed[g - self.step_base])) >> SUBPS_BITS
            n = min(n, (t_lim - t0) // max(d_first, 1) + 2)
        if n <= SHORT_RUN and fixed:
            self._short_run(g, n, t_lim, k_step, k_new, terms)
            return
        lo = g - self.step_base  # the run's first step in the per-step sums
        ncb = self.step_computed[lo:lo + n]
        if self.variable_width:
            tokens = self.step_tokens[lo:lo + n]
            over = tokens > engine.max_num_batched_tokens
            if over.any():
                n = int(np.argmax(over))
                if n == 0:
                    engine.fallback()
                    return
                ncb, tokens = ncb[:n], tokens[:n]
            if head_tokens is not None:
                first = self._admissible_at(tokens, head_tokens)
                if first is not None:  # >= 1: the first step keeps the head out
                    n = first
                    ncb, tokens = ncb[:n], tokens[:n]
            context = ncb + tokens
            durations = (self._base_vec(tokens) + st.request_subps_per_request * num_decoders
                         + (st.kv_subps_per_token + kv_draft) * context
                         + st.attn_subps_per_pair * (self.step_token_context[lo:lo + n] + self.step_token_pairs[lo:lo + n]))
            if k_new > 0:
                durations += np.array([drafter.const_subps(t, num_decoders, k_new) for t in tokens.tolist()],
                                      dtype=np.int64)
            first_tokens = int(tokens[0])
            longest = int(durations.max())
        else:
            first_tokens, const, slope, _ = terms
            durations = slope * ncb + const
            longest = int(durations[n - 1])  # contexts only grow within a run
        if longest * n >= SUBPS_SUM_MAX:  # keep the run's sum (2^-16 ps) within int64
            n = max(1, SUBPS_SUM_MAX // longest)
        # the steps' ends after t0 in 2^-16 ps from the clock's remainder, then on the ps clock
        fine = np.cumsum(durations[:n])
        fine += engine.clock_subps
        ends = fine >> SUBPS_BITS
        if t_lim is not None and ends[n - 1] >= t_lim - t0:
            n = int(np.searchsorted(ends, t_lim - t0, side="left")) + 1
        cum_blocks = np.cumsum(self.step_new_blocks[lo:lo + n])
        if cum_blocks[n - 1] > engine.free_blocks:
            n = int(np.searchsorted(cum_blocks, engine.free_blocks, side="right"))
        used_before = engine.total_blocks - engine.free_blocks
        duration = int(ends[n - 1])
        if (used_before + int(cum_blocks[n - 1])) * duration >= KV_BLOCK_PS_MAX:
            span = KV_BLOCK_PS_MAX // (used_before + int(cum_blocks[n - 1]))
            n = max(1, int(np.searchsorted(ends[:n], span, side="left")))
            duration = int(ends[n - 1])
        engine.clock_subps = int(fine[n - 1]) & SUBPS_MASK
        if engine.tracer is not None:
            engine.trace_run(g, n, [t0] + (ends[:n - 1] + t0).tolist(), cum_blocks[:n].tolist(), k_new)
        engine.free_blocks -= int(cum_blocks[n - 1])
        used = engine.total_blocks - engine.free_blocks
        # blocks in use at the end of step j: used_before + cum_blocks[j]; the row's integral is used x
        # duration less the blocks of step i (i >= 1) over the steps before it, nb_i x (end of step i - 1)
        # (every term < KV_BLOCK_PS_MAX: no overflow)
        late = int(np.dot(self.step_new_blocks[lo + 1:lo + n], ends[:n - 1])) if n > 1 else 0
        if late:
            engine.kv_late.extend((len(engine.row_log), late))
        self._end_run(g, n, ends[:n], int(ends[0]), duration, first_tokens, used, k_step, k_new)

    def _end_run(self, g: int, n: int, ends, d0: int, duration: int, first_tokens: int, used: int, k_step: int,
                 k_new: int) -> None:
        """Log a run of ``n`` steps from step ``g`` (``ends``: its steps' ends after its start, ps, ``d0`` the
        first and ``duration`` the last; each step scheduling ``first_tokens`` tokens at its first step;
        ``used`` blocks in use at its end), advance the clock to its end, and let the decoders that finish
        in its last step leave."""
        engine = self.engine_ref()
        num_decoders = self.num_decoders
        t0 = engine.now
        itl = num_decoders - engine.flush_stale(t0 + d0) if engine.stale else num_decoders
        inc = (duration - int(ends[n - 2]) - d0) // (n - 1) if n > 1 else 0
        engine.rows.append((t0, n, d0, inc, duration, num_decoders, first_tokens, 0, itl, used,
                            len(engine.waiting), 0, k_step))
        if n > 1:
            engine.record_summed_run(ends)
        t1 = t0 + duration
        engine.now = t1
        engine.step_index = g + n
        engine.k_next = k_new
        if engine.finishing:
            engine.release_finishing()
        first_finish, _ = engine.finish_heap[0]
        if first_finish == g + n - 1:  # some decoders emit their last token in the run's last step
            engine.finish_decoders(g + n - 1, t1)

    def _short_run(self, g: int, n: int, t_lim, k_step: int, k_new: int, terms: RunTerms) -> None:
        """:meth:`run` for at most SHORT_RUN steps with a fixed verify width, in plain integers: the same
        sums, step by step, without the per-call cost of numpy on a handful of elements (``terms``:
        :meth:`_run_terms`)."""
        engine = self.engine_ref()
        first_tokens, const, slope, _ = terms
        t0 = engine.now
        lo = g - self.step_base
        ncb = self.step_computed[lo:lo + n].tolist()
        new_blocks = self.step_new_blocks[lo:lo + n].tolist()
        total = engine.total_blocks
        used = total - engine.free_blocks
        fine = engine.clock_subps  # the clock's remainder below the step's start (2^-16 ps)
        limit = t_lim - t0 if t_lim is not None else inf  # the run ends with the step that reaches t_lim
        ends = []
        append = ends.append
        elapsed = kv_ps = 0
        bits, mask, kv_max = SUBPS_BITS, SUBPS_MASK, KV_BLOCK_PS_MAX
        for computed, blocks in zip(ncb, new_blocks):
            held = used + blocks
            if held > total:  # this step's block allocation would fail: the run ends before it
                break
            step = fine + const + slope * computed
            d = step >> bits  # the step's duration on the ps clock
            step_kv = held * d
            if kv_ps + step_kv >= kv_max and ends:  # keep the row's KV integral within int64
                break
            fine = step & mask
            used = held
            kv_ps += step_kv
            elapsed += d
            append(elapsed)
            if elapsed >= limit:
                break
        m = len(ends)
        engine.clock_subps = fine
        if engine.tracer is not None:
            engine.trace_run(g, m, [t0] + [t0 + e for e in ends[:-1]], [sum(new_blocks[:j + 1]) for j in range(m)], k_new)
        engine.free_blocks = total - used
        if kv_ps != used * elapsed:
            engine.kv_late.extend((len(engine.row_log), used * elapsed - kv_ps))
        self._end_run(g, m, ends, ends[0], elapsed, first_tokens, used, k_step, k_new)
