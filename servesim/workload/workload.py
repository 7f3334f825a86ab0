"""The runtime result of every workload source: a list of requests as numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # an annotation only: the content module loads when a workload shares content
    from servesim.workload.content import SequenceContent


@dataclass
class TraceMeta:
    """Where a trace-driven workload came from and what the loader did to it.

    Attributes:
        path: the trace file as given.
        format: ``"azure"`` or ``"mooncake"``.
        num_rows: data rows in the file (before the window and the cap).
        num_clamped_prompt: rows of the whole file whose prompt length was 0 and was raised to 1 token.
        num_clamped_output: rows of the whole file whose output length was 0 and was raised to 1 token.
        bucket_width_s: Mooncake only: smallest positive gap between distinct timestamps (s); None for
            Azure, or when every row shares one timestamp.
        bucket_policy: ``"burst"`` or ``"spread"`` (Mooncake only; None for Azure).
        prefix_block_ids: Mooncake ``hash_ids`` of each kept request (entry ``i`` belongs to request ``i``
            of the workload; one id per 512-token prefix block, equal ids = shareable prefix), or None when
            not requested or absent from the file (the lists are shared with the parse cache: read-only).
    """

    path: str
    format: str
    num_rows: int
    num_clamped_prompt: int = 0
    num_clamped_output: int = 0
    bucket_width_s: float | None = None
    bucket_policy: str | None = None
    prefix_block_ids: list[list[int]] | None = None


@dataclass
class Sessions:
    """Which conversation and turn each request is (``multi_turn`` workloads), shape ``(N,)`` each.

    Attributes:
        session_id: int64, the session (0-based, in order of the sessions' first arrivals).
        turn_index: int64, the turn within its session (0 = the session's first request).
    """

    session_id: np.ndarray
    turn_index: np.ndarray


@dataclass
class Workload:
    """N requests for the engine, one entry of each array per request (shape ``(N,)``).

    Open loop (``concurrency is None``): request ``i`` arrives at ``arrival_s[i]``.
    Closed loop (``concurrency`` set): ``arrival_s`` is all NaN; requests are issued in index order, the
    first ``concurrency`` at t = 0, and each finish issues the next request ``think_time_s`` later (like
    ``vllm bench serve --max-concurrency``).

    Attributes:
        arrival_s: float64, seconds since the start, sorted ascending; all NaN for a closed loop.
        prompt_tokens: int64, prompt length of each request (tokens, >= 1).
        output_tokens: int64, tokens each request must generate (tokens, >= 1).
        concurrency: closed loop: number of clients; None for an open loop.
        think_time_s: closed loop: delay between a finish and that client's next request (s).
        description: one line saying what this is, e.g. ``"Azure trace ..., 19366 requests, rate x1"``.
        meta: trace provenance for trace-driven workloads, else None.
        content: what each request's prompt and output tokens are, for prefix caching (segments of shared
            content and their block hashes, :class:`~servesim.workload.content.SequenceContent`), or None
            when the workload shares nothing (every request's tokens are its own). The engine's prefix
            caching reads it (:mod:`servesim.engine.block_manager`).
        sessions: session and turn of each request (``multi_turn``), else None.

    Raises:
        ValueError: the arrays disagree in length, are not sorted, or hold token counts < 1
            (a programming error: loaders and generators never produce such a workload), or ``content``
            does not describe exactly ``prompt_tokens + output_tokens`` tokens per request.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    concurrency: int | None = None
    think_time_s: float = 0.0
    description: str = ""
    meta: TraceMeta | None = field(default=None, repr=False)
    content: SequenceContent | None = field(default=None, repr=False)
    sessions: Sessions | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        n = self.arrival_s.shape[0]
        if self.arrival_s.ndim != 1 or self.prompt_tokens.shape != (n,) or self.output_tokens.shape != (n,):
            raise ValueError("Workload arrays must be 1-D and of equal length")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("Workload token counts must be >= 1")
        if self.concurrency is None:
            if n and (np.isnan(self.arrival_s).any() or (np.diff(self.arrival_s) < 0).any()):
                raise ValueError("open-loop arrival_s must be finite and sorted ascending")
        else:
            if self.concurrency < 1:
                raise ValueError("closed-loop concurrency must be >= 1")
            if self.think_time_s < 0:
                raise ValueError("closed-loop think_time_s must be >= 0")
            if not np.isnan(self.arrival_s).all():
                raise ValueError("closed-loop arrival_s must be all NaN")
        if self.content is not None and (
            len(self.content) != n
            or not np.array_equal(self.content.sequence_tokens, self.prompt_tokens + self.output_tokens)
        ):
            raise ValueError("Workload content must describe prompt_tokens + output_tokens tokens per request")

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def is_closed_loop(self) -> bool:
        """True when requests are issued by ``concurrency`` clients rather than at fixed times."""
        return self.concurrency is not None
