"""The records of the runs of steps that the step log's rows stand for, and what the engine's output rebuilds
from them: every step's end and every row's KV integral (integer picoseconds).

A row of the step log (:mod:`servesim.engine.step_rows`) is one engine step or a run of ``num_steps``
decode steps. A single step ends its row's duration after the row's start. A closed-form decode run
(plain decoding, :meth:`PlainDecoding.run <servesim.engine.plain_decoding.PlainDecoding.run>`) is
rebuilt from its clock remainder, first duration and increment (2^-16 ps): step ``j`` ends ``(rem + m d0 +
inc m(m-1)/2) >> 16`` ps after the start, ``m = j + 1``, the integers stepping gives. A run summed step by
step (speculation) logged its steps' ends as it computed them. A row's KV integral (blocks in use x step
duration, summed over its steps) is its blocks at the end x its duration, less what the blocks allocated
after its first step did not hold before they were allocated: one number per row for runs summed step by
step, and for a closed-form run the window of blocks each step phase allocates (periodic in the step
with period ``block_size``), evaluated at output. The engine writes these logs on its hot paths
(``Engine.record_closed_form_run``, ``Engine.record_summed_run``, the speculative runs' ``kv_late``).
"""

from __future__ import annotations

import numpy as np

from servesim.engine import step_rows  # OUTPUT_BLOCK_STEPS read through the module (tests set it)
from servesim.engine.step_rows import ROW_SUBPS_MAX, IntLog, blocks_of_at_most, concatenated_ranges
from servesim.roofline import PS_PER_S, SUBPS_BITS, SUBPS_MASK


class RunRecords:
    """The runs' records of one engine's step log (see the module docstring).

    Args:
        block_size: the KV block size (tokens): the width of a closed-form run's residue window.

    Attributes:
        closed_run_log: closed-form decode runs of two or more steps: (row, clock remainder at the run's
            start, first step's duration, increment per step), the last three in 2^-16 ps.
        kv_run_log: the rows of those runs that allocated blocks after their first step: (row,).
        kv_window_log: for each of them, the blocks each of its first ``block_size`` steps allocates, last
            first (int32: decoders per residue, fewer than 2^31 requests).
        kv_late_log: runs summed step by step: (row, KV correction in block-ps), subtracted from
            ``blocks at the end x duration``.
        summed_run_log: runs summed step by step of two or more steps: (row, number of steps).
        summed_end_log: their steps' ends after their row's start (ps), flat, in the same order.
    """

    __slots__ = ("block_size", "closed_run_log", "kv_run_log", "kv_window_log", "kv_late_log", "summed_run_log",
                 "summed_end_log")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.closed_run_log = IntLog(4)
        self.kv_run_log = IntLog(1)
        self.kv_window_log = IntLog(block_size, dtype=np.int32)
        self.kv_late_log = IntLog(2)
        self.summed_run_log = IntLog(2)
        self.summed_end_log = IntLog(1)

    def compact(self) -> None:
        """Move every log's recent records into its chunks (bounded memory per record)."""
        for log in (self.closed_run_log, self.kv_run_log, self.kv_window_log, self.kv_late_log,
                    self.summed_run_log, self.summed_end_log):
            log.compact()

    def step_ends(self, steps: np.ndarray, duration: np.ndarray) -> np.ndarray:
        """Every step's end after the start of its row (ps), int64 (S,), S = sum of the rows' steps.

        ``steps``, ``duration``: the rows' numbers of steps and durations (ps), int64 (R,). A single step
        ends its row's duration after its start; step ``j`` of a closed-form decode run (clock remainder
        ``rem``, first duration ``d0``, increment ``inc``, 2^-16 ps) ends ``(rem + m d0 + inc m(m-1)/2) >>
        16`` ps after, ``m = j + 1``, evaluated as whole and sub-picosecond parts of ``d0`` and ``inc`` so
        that nothing overflows int64; the steps of a run summed step by step end where it recorded.
        Evaluated a block of rows of at most :data:`~servesim.engine.step_rows.OUTPUT_BLOCK_STEPS` steps
        at a time, so that its temporaries stay small beside the result however long the log.
        """
        first = np.cumsum(steps) - steps
        if not len(self.closed_run_log):  # single steps (their duration) and runs summed step by step (filled below)
            ends = np.repeat(duration, steps)
            return self._fill_summed(ends, first)
        runs, remainder, first_subps, increment_subps = self.closed_run_log.array().T
        rem = np.zeros_like(duration)
        rem[runs] = remainder
        exact = int(duration.max(initial=0)) < ROW_SUBPS_MAX >> SUBPS_BITS  # every row's end fits int64 in 2^-16 ps
        if exact:
            d0 = duration << SUBPS_BITS  # a single step: m = 1, T = 0, no remainder
            inc = np.zeros_like(duration)
            d0[runs], inc[runs] = first_subps, increment_subps
        else:
            whole_d0 = duration.copy()
            part_d0, whole_inc, part_inc = np.zeros_like(duration), np.zeros_like(duration), np.zeros_like(duration)
            whole_d0[runs], part_d0[runs] = first_subps >> SUBPS_BITS, first_subps & SUBPS_MASK
            whole_inc[runs], part_inc[runs] = increment_subps >> SUBPS_BITS, increment_subps & SUBPS_MASK
        num_rows = steps.shape[0]
        total = int(first[-1] + steps[-1]) if num_rows else 0
        ends = np.empty(total, dtype=np.int64)
        for lo, hi in blocks_of_at_most(steps, step_rows.OUTPUT_BLOCK_STEPS):
            step_lo, step_hi = int(first[lo]), int(first[hi - 1] + steps[hi - 1])
            row = np.repeat(np.arange(lo, hi, dtype=np.int64), steps[lo:hi])
            m = np.arange(step_lo + 1, step_hi + 1, dtype=np.int64) - first[row]
            tri = m * (m - 1) // 2
            if exact:
                ends[step_lo:step_hi] = (rem[row] + m * d0[row] + tri * inc[row]) >> SUBPS_BITS
            else:
                ends[step_lo:step_hi] = (m * whole_d0[row] + tri * whole_inc[row]
                                         + ((rem[row] + m * part_d0[row] + tri * part_inc[row]) >> SUBPS_BITS))
        return self._fill_summed(ends, first)

    def _fill_summed(self, ends: np.ndarray, first: np.ndarray) -> np.ndarray:
        """``ends`` (int64 (S,)) with the steps of the runs summed step by step set to their recorded ends
        (``first``: each row's first step in ``ends``)."""
        if not len(self.summed_run_log):
            return ends
        rows, counts = self.summed_run_log.array().T
        ends[concatenated_ranges(first[rows], counts)] = self.summed_end_log.array()[:, 0]
        return ends

    def kv_block_ps(self, used: np.ndarray, duration: np.ndarray, steps: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Each row's KV integral (blocks in use x step duration, summed over its steps; ps), int64 (R,).

        ``used * duration`` (the rows' blocks in use at their end and durations, int64 (R,); ``steps``: their
        numbers of steps, int64 (R,)), corrected for
        runs: runs summed step by step logged their correction (``kv_late_log``); in a closed-form decode run
        the blocks that step ``i`` allocates (``per_residue[(1 - g - i) mod bs]``, periodic in ``i`` with
        period ``bs``, the window saved with the run) were not in use before that step's start ``D_i`` (the
        end of step ``i - 1``, ``ends``: every step's end after its row's start, ps, int64 (S,),
        :meth:`step_ends`): subtract ``sum_i nb_i D_i``. Exact in int64: every term is at most the row's
        integral, < 2**62.
        """
        kv = used * duration
        if len(self.kv_late_log):
            late_rows, late_block_ps = self.kv_late_log.array().T
            np.subtract.at(kv, late_rows, late_block_ps)
        if not len(self.kv_run_log):
            return kv
        bs = self.block_size
        runs = self.kv_run_log.array()[:, 0]
        # the window's column bs - 1 - rho: the blocks each step i = rho (mod bs) of the run allocates (read
        # in place, flat: the log's array is C-contiguous)
        windows = self.kv_window_log.array().reshape(-1)
        later = steps[runs] - 1  # each run's steps i >= 1 (every recorded run has two or more)
        run_first = (np.cumsum(steps) - steps)[runs]  # each run's first step in ``ends``
        for lo, hi in blocks_of_at_most(later, step_rows.OUTPUT_BLOCK_STEPS):  # small temporaries
            block_later = later[lo:hi]
            offsets = np.cumsum(block_later) - block_later
            run = np.repeat(np.arange(lo, hi, dtype=np.int64), block_later)
            i = np.arange(run.shape[0], dtype=np.int64) - offsets[run - lo] + 1
            late = windows[run * bs + (bs - 1) - i % bs] * ends[run_first[run] + i - 1]
            kv[runs[lo:hi]] -= np.add.reduceat(late, offsets)
        return kv


def step_durations_s(ends: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Every step's duration (s), float64 (S,), from ``ends`` (:meth:`RunRecords.step_ends`, int64 (S,), ps),
    whose memory it takes over: each step's end less the previous step's end within its row (a row's first
    step: its end), evaluated in place a block of steps at a time from the last (no temporary of the log's
    size), then divided by ``PS_PER_S`` into the same buffer (``durations / PS_PER_S`` bit for bit).
    ``steps``: the rows' numbers of steps, int64 (R,)."""
    row_first = np.cumsum(steps) - steps
    firsts = ends[row_first]
    total = ends.shape[0]
    for hi in range(total, 1, -step_rows.OUTPUT_BLOCK_STEPS):
        lo = max(hi - step_rows.OUTPUT_BLOCK_STEPS, 1)
        ends[lo:hi] -= ends[lo - 1:hi - 1]  # the ends below lo are still whole when the next block reads them
    ends[row_first] = firsts
    durations = ends.view(np.float64)
    np.divide(ends, float(PS_PER_S), out=durations)
    return durations
