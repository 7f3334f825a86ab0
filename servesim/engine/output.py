"""What the engine hands to the metrics layer: plain arrays, no pandas.

Data flow: workload -> engine -> (RequestLog, StepLog) -> metrics -> reports.
All times are seconds (float64) measured from the start of the simulation; token counts are int64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestLog:
    """One entry per request, each field a numpy array of length N (number of requests).

    Attributes:
        request_id: int64, 0..N-1 in arrival order.
        arrival_s: float64, when the request reached the server (s).
        prompt_tokens: int64, prompt length (tokens).
        output_tokens: int64, tokens the request must generate (tokens).
        generated_tokens: int64, tokens it did generate (== output_tokens once finished).
        first_scheduled_s: float64, start of the first step that scheduled it (s); NaN if never.
        first_token_s: float64, end of the step that emitted its first output token (s); NaN if none.
        finish_s: float64, end of the step that emitted its last token (s); NaN if unfinished.
        preemptions: int64, times the request was preempted (recompute).
        num_cached_tokens: int64, its prefix-cache hit when first scheduled (tokens; vLLM
            ``Request.num_cached_tokens``); 0 with prefix caching off or if never scheduled.
    """

    request_id: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    generated_tokens: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    num_cached_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.num_cached_tokens is None:  # a log built without prefix caching
            self.num_cached_tokens = np.zeros(len(self.request_id), dtype=np.int64)

    def __len__(self) -> int:
        return int(self.request_id.shape[0])


@dataclass
class StepLog:
    """One row per engine step, or per run of consecutive decode steps of identical composition.

    Within a row, step ``i`` (0-based) lasts ``first_step_s + i * step_increment_s`` seconds when
    ``durations_s`` is absent (a log built by hand); the engine always gives ``durations_s``: its steps'
    durations are exact in 2^-16 ps and seen on the picosecond clock (floored), so those of a run of
    decode steps grow by the increment to within a picosecond (see :mod:`servesim.roofline`).
    Each field is a numpy array of length R (rows).

    Attributes:
        start_s: float64, start of the first step of the row (s).
        num_steps: int64, steps in the row (>= 1).
        first_step_s: float64, duration of the first step (s).
        step_increment_s: float64, duration added by each later step of the row (s): the step time's
            increment rounded to the picosecond (plain decode runs) or the row's mean increment
            (speculative runs), for display.
        duration_s: float64, total duration of the row (s).
        batch_size: int64, requests scheduled in each step.
        num_tokens: int64, tokens scheduled in each step (prefill chunks + decode tokens + drafts); in a run
            whose verify width varies (n-gram rounds without a match, llama.cpp's draft budget), the first
            step's.
        num_prefill_tokens: int64, prompt (or recompute) tokens scheduled in each step.
        itl_samples: int64, token emissions per step that follow an emission of the same request at the
            end of the previous step; each is one inter-token-latency sample equal to that step's duration.
        kv_blocks_used: int64, KV-cache blocks in use at the end of the row.
        num_waiting: int64, requests in the waiting queue at the start of the row.
        num_preempted: int64, requests preempted in this row (only single-step rows preempt).
        k: int64, speculative tokens proposed per request per step (0 without speculation).
        start_ps: int64, ``start_s`` exactly, in integer picoseconds (the engine's clock).
        kv_block_ps: int64, KV blocks in use integrated over the row (blocks x picoseconds): the sum over
            its steps of the blocks in use at the step's end times the step's duration, exact; the engine
            splits a run whose integral would exceed 2**62.
        durations_s: optional float64 (S,), the exact duration of every individual step in row order
            (S = sum of num_steps), an integer of picoseconds each. Always present in an engine's output
            (the picosecond clock floors each step's end; with speculative decoding contexts also grow by
            a random number of tokens per step).
    """

    start_s: np.ndarray
    num_steps: np.ndarray
    first_step_s: np.ndarray
    step_increment_s: np.ndarray
    duration_s: np.ndarray
    batch_size: np.ndarray
    num_tokens: np.ndarray
    num_prefill_tokens: np.ndarray
    itl_samples: np.ndarray
    kv_blocks_used: np.ndarray
    num_waiting: np.ndarray
    num_preempted: np.ndarray
    k: np.ndarray
    start_ps: np.ndarray
    kv_block_ps: np.ndarray
    durations_s: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.start_s.shape[0])


@dataclass
class EngineOutput:
    """Everything one replica's engine recorded in one simulation.

    Attributes:
        requests: per-request log.
        steps: per-step (or per-run) log.
        extra_itl_s: float64 array of inter-token gaps that are not a single step's duration (a gap
            that spans a preemption and its recompute); together with ``steps`` these are all ITLs.
        kv_blocks_total: KV-cache blocks that can hold requests' KV (vLLM's ``num_gpu_blocks`` minus its
            null block).
        block_size: tokens per KV block.
        end_s: simulated time when the last request finished or the run was cut off (s).
        spec_counters: vLLM's speculative-decoding counters (``num_drafts``, ``num_draft_tokens``,
            ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``); empty without speculation.
        prefix_cache: vLLM's prefix-cache counters (tokens; the fields of
            :class:`~servesim.engine.block_manager.PrefixCacheStats`); empty with prefix caching off.
        num_replicas: replicas whose outputs were merged into this one (1: one engine).
        request_replica: int64 (N,), the replica that served each request (-1: never routed); None for
            one engine (:func:`servesim.deployment.merge_outputs` sets it).
        step_replica: int64 (R,), the replica whose step or run each StepLog row is; None for one engine.
    """

    requests: RequestLog
    steps: StepLog
    extra_itl_s: np.ndarray
    kv_blocks_total: int
    block_size: int
    end_s: float
    spec_counters: dict = field(default_factory=dict)
    prefix_cache: dict = field(default_factory=dict)
    num_replicas: int = 1
    request_replica: np.ndarray | None = None
    step_replica: np.ndarray | None = None
