"""The rows of the engine's step log as the engine writes them (integer picoseconds), and their bounds."""

from __future__ import annotations

from typing import NamedTuple

KV_BLOCK_PS_MAX = 2**62
"""Largest KV-block integral (blocks x ps) of one step-log row: longer runs are split so that it fits int64."""

ROW_SUBPS_MAX = 2**62
"""Rows shorter than this (2^-16 ps, about 70 s) have their steps' ends rebuilt in one int64 expression."""


class StepRow(NamedTuple):
    """One row of the step log: one engine step, or a run of decode steps.

    The columns of :class:`~servesim.engine.output.StepLog` (which see), with times in integer
    picoseconds where the log has seconds: ``start_ps``, ``first_step_ps``, ``step_increment_ps``,
    ``duration_ps``. The engine stores each row as a plain tuple of these fields in this order (exact
    tuples of ints are untracked by the garbage collector; instances of this class would not be) and reads
    the columns by these names (``Engine.output``).
    """

    start_ps: int
    num_steps: int
    first_step_ps: int
    step_increment_ps: int
    duration_ps: int
    batch_size: int
    num_tokens: int
    num_prefill_tokens: int
    itl_samples: int
    kv_blocks_used: int
    num_waiting: int
    num_preempted: int
    k: int
