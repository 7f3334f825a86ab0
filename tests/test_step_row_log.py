"""The engine's step log (servesim.engine.step_rows.StepRowLog): its chunks hold the picosecond columns as int64
and the counts as int32, give back every row exactly, and widen the counts when one does not fit."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.engine.step_rows import NARROW_STEP_COLUMNS, StepRow, StepRowLog

WIDTH = len(StepRow._fields)


def _random_rows(rng: np.random.Generator, count: int, count_high: int = 5000) -> np.ndarray:
    rows = rng.integers(0, count_high, (count, WIDTH), dtype=np.int64)
    for name in StepRow._fields:
        if name not in NARROW_STEP_COLUMNS:  # times in ps: far beyond int32
            rows[:, StepRow._fields.index(name)] = rng.integers(0, 2**62, count, dtype=np.int64)
    return rows


def _log_of(rows: np.ndarray, compact_every: int) -> StepRowLog:
    log = StepRowLog()
    for index, row in enumerate(rows.tolist()):
        log.items.append(tuple(row))
        if (index + 1) % compact_every == 0:
            log.compact()
    return log


@pytest.mark.parametrize("compact_every", [1, 7, 1000, 10**6])  # one chunk per row, several, one, none
def test_columns_give_back_every_row(compact_every):
    rows = _random_rows(np.random.default_rng(np.random.SeedSequence(5)), 2500)
    log = _log_of(rows, compact_every)
    assert len(log) == rows.shape[0]
    columns = log.columns()
    assert list(columns) == list(StepRow._fields)
    for index, name in enumerate(StepRow._fields):
        np.testing.assert_array_equal(columns[name], rows[:, index], err_msg=name)
        assert columns[name].dtype == (np.int32 if name in NARROW_STEP_COLUMNS else np.int64), name
        assert not columns[name].flags.writeable
    assert len(log.chunks) == 1 and log.records_before == rows.shape[0] and not log.items


def test_a_chunk_holds_68_bytes_a_row():
    log = _log_of(_random_rows(np.random.default_rng(np.random.SeedSequence(6)), 4000), 1000)
    assert len(log.chunks) == 4
    held = sum(times.nbytes + counts.nbytes for times, counts in log.chunks)
    assert held == 4000 * (4 * 8 + 9 * 4)
    assert len(NARROW_STEP_COLUMNS) == 9 and set(NARROW_STEP_COLUMNS) <= set(StepRow._fields)


@pytest.mark.parametrize("big", [2**31, -2**31 - 1, 2**40])
def test_a_count_beyond_int32_widens_the_whole_log(big):
    rng = np.random.default_rng(np.random.SeedSequence(7))
    rows = _random_rows(rng, 300)
    rows[250, StepRow._fields.index("num_steps")] = big  # in the third chunk: the first two were int32
    log = _log_of(rows, 100)
    assert log.counts_dtype == np.int64
    assert all(counts.dtype == np.int64 for _, counts in log.chunks)
    columns = log.columns()
    for index, name in enumerate(StepRow._fields):
        np.testing.assert_array_equal(columns[name], rows[:, index], err_msg=name)
    # the largest int32 still fits
    edge = rows.copy()
    edge[:, StepRow._fields.index("num_waiting")] = 2**31 - 1
    edge[:, StepRow._fields.index("num_steps")] = -2**31
    assert _log_of(edge, 100).counts_dtype == np.int32


def test_an_empty_log_has_empty_columns():
    columns = StepRowLog().columns()
    assert all(column.shape == (0,) for column in columns.values())
