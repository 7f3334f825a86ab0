"""Declarative workload configs (pydantic v2), discriminated on ``type``.

``WorkloadConfig`` is the union, usable as a field annotation (``workload: WorkloadConfig``)::

    type: trace          # replay a file: path, format, rate_scale, start_s, duration_s, max_requests,
                         # bucket_policy (see servesim.workload.trace)
    type: poisson        # rate (requests/s), num_requests or duration_s, lengths
    type: gamma          # rate (requests/s), cv (of the gaps), num_requests or duration_s, lengths
    type: closed_loop    # concurrency (clients), think_time_s, num_requests, lengths
    type: multi_turn     # sessions at rate (sessions/s), turns, message_tokens, output_tokens, think times
                         # (see servesim.workload.multi_turn)

Every type also takes ``system_prompts: {num_prompts, prompt_tokens | prompt_lengths, zipf_exponent, probability}``: shared
system prompts with a Zipf popularity, prepended to the prompts (see :mod:`servesim.workload.system_prompts`).

Lengths of synthetic workloads: ``prompt_tokens`` and ``output_tokens`` (each a length distribution, see
:mod:`servesim.workload.lengths`), or ``lengths: {type: empirical, path, format}`` to resample
(prompt, output) pairs jointly from a trace. Paths are relative to the folder of the config file.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.workload.lengths import EmpiricalPairsConfig, LengthConfig, TraceFormat
from servesim.workload.system_prompts import SystemPromptsConfig

_SYSTEM_PROMPTS = "shared system prompts prepended to the prompts (Zipf popularity)"

MAX_REQUESTS = 2**31 - 1
"""Most requests (sessions, for ``multi_turn``) a synthetic workload may ask for, by count or as ``rate x
duration_s``: far beyond what fits in memory (a million requests take about 2 GB), where numpy would fail
with a traceback."""

MIN_GAP_CV = 1e-6
"""Smallest coefficient of variation of gamma gaps (arrivals, think times; a think time also takes 0, fixed):
the gaps are then constant to a millionth of their mean (the gamma's shape ``1 / cv^2`` is ``1e12``); a
smaller cv changes nothing but the chance of a traceback (``cv^2`` underflows to 0 below about 1e-154)."""

MAX_GAP_CV = 1e3
"""Largest coefficient of variation of gamma gaps: beyond, almost every gap is 0 (shape ``1e-6``), and the
draws sized for ``duration_s`` (``6 cv sqrt(rate x duration_s)`` at once) exceed memory."""


def _check_expected(rate: float, duration_s: float | None, what: str) -> None:
    if duration_s is not None and rate * duration_s > MAX_REQUESTS:
        raise ValueError(f"rate x duration_s = {rate * duration_s:.3g} {what} expected; servesim simulates at most "
                         f"{MAX_REQUESTS} (lower the rate or duration_s)")


class TraceWorkloadConfig(InputModel):
    """Replay a trace file (Azure CSV or Mooncake JSONL) open loop; see :func:`servesim.workload.load_trace`."""

    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    type: Literal["trace"]
    path: str = Field(description="trace file, relative to the config file's folder")
    format: TraceFormat = Field("auto", description="auto: .csv = azure, .jsonl = mooncake")
    rate_scale: float = Field(1.0, gt=0, description="arrival times are divided by this (2 = twice the rate)")
    start_s: float = Field(0.0, ge=0, description="window start on the original trace timeline (s)")
    duration_s: float | None = Field(None, gt=0, description="window length on the original timeline (s)")
    max_requests: int | None = Field(None, ge=1, description="keep the first N requests of the window")
    bucket_policy: Literal["burst", "spread"] = Field(
        "spread", description="Mooncake timestamps shared by m requests: all at T (burst) or T + i*w/m (spread)"
    )
    hash_ids: bool = Field(
        False,
        description="Mooncake only: describe each prompt's content from its hash_ids (Workload.content) for "
        "prefix caching; slower to parse, so off unless asked for",
    )
    system_prompts: SystemPromptsConfig | None = Field(None, description=_SYSTEM_PROMPTS)

    @model_validator(mode="after")
    def _check_hash_ids(self) -> "TraceWorkloadConfig":
        azure = self.format == "azure" or (self.format == "auto" and self.path.lower().endswith(".csv"))
        if self.hash_ids and azure:
            raise ValueError("hash_ids: only Mooncake traces (.jsonl) carry hash_ids; Azure traces have none")
        # only a non-default policy: a dumped config (capacity, sweeps) writes the default back out
        if self.bucket_policy == "burst" and azure:
            raise ValueError("bucket_policy: only Mooncake traces (.jsonl) share timestamps between requests; "
                             "Azure traces give each request its own")
        return self


class _SyntheticBase(InputModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    prompt_tokens: LengthConfig | None = Field(None, description="prompt length distribution (tokens)")
    output_tokens: LengthConfig | None = Field(None, description="output length distribution (tokens)")
    lengths: EmpiricalPairsConfig | None = Field(None, description="(prompt, output) pairs from a trace")
    system_prompts: SystemPromptsConfig | None = Field(None, description=_SYSTEM_PROMPTS)

    @model_validator(mode="after")
    def _check_lengths(self) -> _SyntheticBase:
        separate = (self.prompt_tokens is not None, self.output_tokens is not None)
        if self.lengths is not None:
            if any(separate):
                raise ValueError("give either lengths, or prompt_tokens and output_tokens, not both")
        elif not all(separate):
            raise ValueError("give prompt_tokens and output_tokens (or lengths: {type: empirical, path})")
        return self


class _OpenLoopBase(_SyntheticBase):
    num_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="number of requests")
    duration_s: float | None = Field(None, gt=0, description="or: every arrival in [0, duration_s) (s)")

    @model_validator(mode="after")
    def _check_count(self) -> _OpenLoopBase:
        if (self.num_requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of num_requests and duration_s")
        _check_expected(self.rate, self.duration_s, "requests")
        return self


class PoissonWorkloadConfig(_OpenLoopBase):
    """Poisson arrivals (exponential gaps, never clipped) at ``rate`` requests/s."""

    type: Literal["poisson"]
    rate: float = Field(gt=0, description="mean arrival rate (requests/s)")


class GammaWorkloadConfig(_OpenLoopBase):
    """Gamma-renewal arrivals: mean rate ``rate`` requests/s, gap coefficient of variation ``cv``."""

    type: Literal["gamma"]
    rate: float = Field(gt=0, description="mean arrival rate (requests/s)")
    cv: float = Field(ge=MIN_GAP_CV, le=MAX_GAP_CV,
                      description="coefficient of variation of the gaps (1 = Poisson, > 1 burstier)")


class ClosedLoopWorkloadConfig(_SyntheticBase):
    """``concurrency`` clients, each sending its next request ``think_time_s`` after its last one finished."""

    type: Literal["closed_loop"]
    concurrency: int = Field(ge=1, description="number of clients (requests in flight)")
    think_time_s: float = Field(0.0, ge=0, description="delay between a finish and the client's next request (s)")
    num_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="total requests issued")
    requests_per_client: int | None = Field(
        None, ge=1, description="alternative to num_requests: num_requests = concurrency x requests_per_client"
    )

    @model_validator(mode="after")
    def _one_count(self) -> "ClosedLoopWorkloadConfig":
        if (self.requests_per_client is not None and self.num_requests is not None
                and self.num_requests == self.concurrency * self.requests_per_client):
            return self  # both, consistent: a dumped config (num_requests is derived below) validates again
        if (self.num_requests is None) == (self.requests_per_client is None):
            raise ValueError("give exactly one of num_requests and requests_per_client")
        if self.num_requests is None:
            if self.concurrency * self.requests_per_client > MAX_REQUESTS:
                raise ValueError(f"concurrency x requests_per_client = {self.concurrency * self.requests_per_client} "
                                 f"requests; servesim simulates at most {MAX_REQUESTS}")
            self.num_requests = self.concurrency * self.requests_per_client
        return self


class MultiTurnWorkloadConfig(InputModel):
    """Multi-turn conversations: each turn's prompt = the session's history + a new message.

    See :mod:`servesim.workload.multi_turn` for the process and :mod:`servesim.workload.content` for the
    shared-prefix description it produces.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    type: Literal["multi_turn"]
    rate: float = Field(gt=0, description="session arrival rate (sessions/s)")
    cv: float = Field(1.0, ge=MIN_GAP_CV, le=MAX_GAP_CV,
                      description="coefficient of variation of the gaps between session starts (1 = Poisson)")
    num_sessions: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="number of sessions")
    duration_s: float | None = Field(None, gt=0, description="or: every session starting in [0, duration_s) (s)")
    turns: LengthConfig = Field(description="turns per session (a length distribution, >= 1)")
    message_tokens: LengthConfig = Field(description="new user message of each turn (tokens)")
    output_tokens: LengthConfig = Field(description="output of each turn (tokens)")
    think_time_s: float = Field(ge=0, description="mean gap between the arrivals of a session's consecutive turns (s)")
    think_time_cv: float = Field(1.0, ge=0, le=MAX_GAP_CV,
                                 description="coefficient of variation of the think time (0 = fixed)")
    system_prompts: SystemPromptsConfig | None = Field(None, description="one per session, before every turn")

    @model_validator(mode="after")
    def _check_count(self) -> "MultiTurnWorkloadConfig":
        if (self.num_sessions is None) == (self.duration_s is None):
            raise ValueError("give exactly one of num_sessions and duration_s")
        _check_expected(self.rate, self.duration_s, "sessions")
        if 0 < self.think_time_cv < MIN_GAP_CV:
            raise ValueError(f"think_time_cv: expected 0 (fixed) or at least {MIN_GAP_CV:g} "
                             f"(got {self.think_time_cv:g})")
        return self


WorkloadConfig = Annotated[
    Union[
        TraceWorkloadConfig,
        PoissonWorkloadConfig,
        GammaWorkloadConfig,
        ClosedLoopWorkloadConfig,
        MultiTurnWorkloadConfig,
    ],
    Field(discriminator="type"),
]
"""A workload (discriminated on ``type``: trace, poisson, gamma, closed_loop, multi_turn)."""
