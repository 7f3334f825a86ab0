"""The rows of the engine's step log as the engine writes them (integer picoseconds), their bounds, and the
chunked logs that hold them (:class:`StepRowLog`: int64 times, int32 counts) and the runs' records
(:class:`IntLog`: int64) during a run."""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np

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


OUTPUT_BLOCK_STEPS = 2**16
"""Steps the engine's output evaluates at a time (bounded temporaries): its blocks of rows hold at most this
many steps, or one row (:func:`blocks_of_at_most`)."""


def blocks_of_at_most(counts: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive ``(lo, hi)`` index ranges covering ``counts`` (non-negative ints, shape (R,)) in order,
    each as long as its counts sum to at most ``limit``, and at least one element long (an element over
    ``limit`` is a block of its own).

    Raises:
        ValueError: ``limit`` < 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    cum = np.cumsum(counts)
    bounds, lo, num = [], 0, len(counts)
    while lo < num:
        before = int(cum[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(cum, before + limit, side="right")), lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def concatenated_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop: int64
    (sum(lengths),) from integer arrays ``starts`` and ``lengths`` (>= 0) of shape (R,)."""
    offsets = np.cumsum(lengths) - lengths  # where each range begins in the result
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


LOG_CHUNK_VALUES = 2**18
"""Values a log gathers as Python objects before they move into an int64 chunk (2 MiB of chunk)."""


def _joined(chunks: list[np.ndarray], rows: int, width: int, dtype) -> np.ndarray:
    """The arrays of ``chunks`` ((n_i, width) each, in order, ``rows`` in all) joined into one (rows, width)
    array of ``dtype``, each chunk dropped from the list as soon as it is copied, so that the chunks and their
    join never both exist whole (``np.concatenate`` would hold twice the log at its end); the list is left
    empty."""
    joined = np.empty((rows, width), dtype=dtype)
    start = 0
    chunks.reverse()  # popped from the end, in order
    while chunks:
        chunk = chunks.pop()
        joined[start:start + chunk.shape[0]] = chunk
        start += chunk.shape[0]
        del chunk
    return joined


class IntLog:
    """A log of records of ``width`` integers each, kept as Python objects while recent and moved into int64
    (or ``dtype``) numpy chunks by :meth:`compact` (a long run then holds 8 bytes per value instead of a
    Python int and a pointer to it; the engine compacts between SimPy events, :meth:`Engine.process
    <servesim.engine.core.Engine.process>`).

    Attributes:
        width: integers per record.
        items: the recent records, flat (``width`` integers each); the engine extends this list directly on
            its hot paths.
        chunks: arrays (records, width) of ``dtype`` holding the older records, in order.
        records_before: records held in ``chunks``.
        dtype: the chunks' integer dtype (int64 unless every value is known to fit a narrower one).

    Raises:
        OverflowError: (at :meth:`compact`) a value outside the dtype.
    """

    __slots__ = ("width", "items", "chunks", "records_before", "dtype")

    def __init__(self, width: int, dtype=np.int64) -> None:
        self.width = width
        self.dtype = np.dtype(dtype)
        self.items: list = []
        self.chunks: list[np.ndarray] = []
        self.records_before = 0

    def __len__(self) -> int:
        """Records logged so far (the index the next record gets)."""
        return self.records_before + len(self.items) // self.width

    def full(self) -> bool:
        """Whether the recent records hold at least :data:`LOG_CHUNK_VALUES` values."""
        return len(self.items) >= LOG_CHUNK_VALUES

    def compact(self) -> None:
        """Move the recent records into a chunk (``items`` is emptied in place: aliases stay valid)."""
        items = self.items
        if not items:
            return
        count = len(items) // self.width
        self.chunks.append(np.fromiter(items, dtype=self.dtype, count=count * self.width).reshape(count, self.width))
        self.records_before += count
        items.clear()

    def append_array(self, values: np.ndarray) -> None:
        """Log the records of integer array ``values`` ((records * width,) or (records, width)) after those
        logged so far, as a chunk of their own (a copy: ``values`` may be a view of a larger array)."""
        self.compact()
        chunk = np.array(values, dtype=self.dtype).reshape(-1, self.width)
        self.chunks.append(chunk)
        self.records_before += chunk.shape[0]

    def array(self) -> np.ndarray:
        """Every record, (records, width) of the log's dtype; the log keeps it as its one chunk (the chunks
        are joined one at a time, :func:`_joined`)."""
        self.compact()
        if len(self.chunks) != 1:
            self.chunks.append(_joined(self.chunks, self.records_before, self.width, self.dtype))
        return self.chunks[0]


NARROW_STEP_COLUMNS: tuple[str, ...] = ("num_steps", "batch_size", "num_tokens", "num_prefill_tokens", "itl_samples",
                                        "kv_blocks_used", "num_waiting", "num_preempted", "k")
"""The step log's columns of counts (steps, requests, tokens, blocks, drafts), held as int32 by
:class:`StepRowLog`; the other four are times in picoseconds (int64)."""


class StepRowLog:
    """The engine's step log: :class:`StepRow` tuples while recent, then chunks of two arrays each, the
    picosecond columns as int64 and the counts (:data:`NARROW_STEP_COLUMNS`) as int32: 68 bytes a row
    instead of 104 (2.9 million rows at 10^6 requests). Should a count ever exceed int32, the counts of
    the whole log become int64 (nothing is lost; :meth:`compact` checks every chunk).

    Attributes:
        items: the recent rows (tuples of StepRow's fields in its order); the engine appends to this list
            directly on its hot paths.
        chunks: ``(times, counts)`` per chunk, in order: int64 (rows, 4) and (rows, 9) of ``counts_dtype``.
        records_before: rows held in ``chunks``.
        counts_dtype: int32, or int64 once a count did not fit.
        full_rows: the recent rows from which :meth:`full` holds.
    """

    __slots__ = ("items", "chunks", "records_before", "counts_dtype", "full_rows")

    TIME_INDEX = np.array([i for i, name in enumerate(StepRow._fields) if name not in NARROW_STEP_COLUMNS])
    COUNT_INDEX = np.array([StepRow._fields.index(name) for name in NARROW_STEP_COLUMNS])

    def __init__(self) -> None:
        self.items: list[tuple] = []
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self.records_before = 0
        self.counts_dtype = np.dtype(np.int32)
        self.full_rows = -(-LOG_CHUNK_VALUES // len(StepRow._fields))  # rows of at least LOG_CHUNK_VALUES values

    def __len__(self) -> int:
        """Rows logged so far (the index the next row gets)."""
        return self.records_before + len(self.items)

    def full(self) -> bool:
        """Whether the recent rows hold at least :data:`LOG_CHUNK_VALUES` values (asked between SimPy
        events)."""
        return len(self.items) >= self.full_rows

    def compact(self) -> None:
        """Move the recent rows into a chunk (``items`` is emptied in place: aliases stay valid)."""
        items = self.items
        if not items:
            return
        width = len(StepRow._fields)
        rows = np.fromiter(chain.from_iterable(items), dtype=np.int64, count=len(items) * width).reshape(-1, width)
        wide_counts = rows[:, self.COUNT_INDEX]
        counts = wide_counts.astype(self.counts_dtype)
        if not np.array_equal(counts, wide_counts):  # a count beyond int32: the whole log's counts widen
            self.counts_dtype = np.dtype(np.int64)
            self.chunks = [(times, older.astype(np.int64)) for times, older in self.chunks]
            counts = wide_counts
        self.chunks.append((rows[:, self.TIME_INDEX], counts))
        self.records_before += rows.shape[0]
        items.clear()

    def columns(self) -> dict[str, np.ndarray]:
        """Every row's value of each field of :class:`StepRow`, by name: read-only views of two joined
        arrays, (rows, 4) int64 and (rows, 9) of ``counts_dtype``, which the log keeps as its one chunk.

        The chunks are joined one at a time (:func:`_joined`), so that the log and its joined copy never both
        exist whole."""
        self.compact()
        chunks = self.chunks
        if len(chunks) != 1:
            time_chunks, count_chunks = [times for times, _ in chunks], [counts for _, counts in chunks]
            chunks.clear()
            times = _joined(time_chunks, self.records_before, len(self.TIME_INDEX), np.int64)
            counts = _joined(count_chunks, self.records_before, len(self.COUNT_INDEX), self.counts_dtype)
            chunks.append((times, counts))
        times, counts = chunks[0]
        times.flags.writeable = counts.flags.writeable = False  # the step log's columns are views of them
        named = dict(zip((StepRow._fields[i] for i in self.TIME_INDEX), times.T))
        named.update(zip(NARROW_STEP_COLUMNS, counts.T))
        return {name: named[name] for name in StepRow._fields}
