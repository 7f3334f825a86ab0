"""Bounded memory at output: the step log moved into int64 chunks during the run (IntLog, compacted between
SimPy events) and the output's per-step arrays evaluated a block of rows at a time (RunRecords.step_ends,
RunRecords.kv_block_ps) give exactly the results of one chunk and one block. Tiny chunk and block sizes force
hundreds of compactions and blocks on a 2,500-request run at 4x (closed-form runs, KV-corrected runs,
preemptions; with EAGLE, runs summed step by step)."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import pytest

import servesim.engine.step_rows as step_rows
from servesim.config.models import SimConfig
from servesim.engine.step_rows import IntLog
from servesim.wiring import build_engine
from test_modes_azure import ROOT, config


def _output(cfg: dict):
    engine, env, _ = build_engine(SimConfig.model_validate(cfg), ROOT, np.random.SeedSequence(0))
    env.run()
    compacted = engine.row_log.records_before  # rows moved into chunks during the run
    return compacted, engine.output()


@pytest.mark.parametrize("spec", [None, {"method": "eagle", "num_speculative_tokens": 3}])
def test_chunked_logs_and_blocked_output_give_the_same_results(spec, monkeypatch):
    cfg = config(4.0, "run", 60.0, 2500, spec)
    compacted, whole = _output(cfg)
    assert not compacted  # one chunk: compaction never ran
    monkeypatch.setattr(step_rows, "LOG_CHUNK_VALUES", 64)
    monkeypatch.setattr(step_rows, "OUTPUT_BLOCK_STEPS", 7)
    compacted, chunked = _output(cfg)
    rows = len(chunked.steps.num_steps)
    assert rows > 7 * 50 and compacted > rows // 2  # many blocks and chunks
    assert len(step_rows.blocks_of_at_most(chunked.steps.num_steps, 7)) > 150  # and blocks of rows
    for part in ("requests", "steps"):
        for field in dataclasses.fields(getattr(whole, part)):
            np.testing.assert_array_equal(getattr(getattr(chunked, part), field.name),
                                          getattr(getattr(whole, part), field.name), err_msg=field.name)
    assert chunked.spec_counters == whole.spec_counters


def test_int_log_keeps_records_in_order_across_chunks(monkeypatch):
    monkeypatch.setattr(step_rows, "LOG_CHUNK_VALUES", 6)
    flat = IntLog(2)
    for i in range(10):
        flat.items.extend((i, 10 * i))
        assert len(flat) == i + 1
        if i == 1:
            assert not flat.full()  # 4 flat values
        if flat.full():
            flat.compact()
    assert len(flat.chunks) == 3 and len(flat.items) == 2
    np.testing.assert_array_equal(flat.array(), [[i, 10 * i] for i in range(10)])
    assert len(flat) == 10 and len(flat.chunks) == 1 and not flat.items
    assert IntLog(4).array().shape == (0, 4)
    with pytest.raises(OverflowError):
        big = IntLog(1)
        big.items.append(2**63)
        big.compact()


def test_int_log_of_a_narrower_dtype_keeps_it_and_refuses_values_beyond_it(monkeypatch):
    monkeypatch.setattr(step_rows, "LOG_CHUNK_VALUES", 4)
    windows = IntLog(2, dtype=np.int32)
    for i in range(7):
        windows.items.extend((i, 2**31 - 1 - i))
        if windows.full():
            windows.compact()
    assert len(windows.chunks) == 3
    joined = windows.array()
    assert joined.dtype == np.int32 and joined.flags.c_contiguous
    np.testing.assert_array_equal(joined, [[i, 2**31 - 1 - i] for i in range(7)])
    assert len(windows.chunks) == 1 and windows.array() is joined  # joined once, kept as the one chunk
    assert IntLog(3, dtype=np.int32).array().dtype == np.int32
    with pytest.raises(OverflowError):
        narrow = IntLog(1, dtype=np.int32)
        narrow.items.append(2**31)
        narrow.compact()


def test_concatenated_ranges_are_the_ranges_one_after_another():
    starts = np.array([5, 0, 9, 2], dtype=np.int64)
    lengths = np.array([3, 0, 1, 2], dtype=np.int64)  # an empty range in the middle
    got = step_rows.concatenated_ranges(starts, lengths)
    assert got.dtype == np.int64 and got.tolist() == [5, 6, 7, 9, 2, 3]
    assert step_rows.concatenated_ranges(starts[:0], lengths[:0]).tolist() == []


def test_blocks_hold_at_most_the_limit_or_one_element():
    counts = np.array([3, 0, 4, 9, 1, 1, 5, 0, 0, 2], dtype=np.int64)
    # greedy, in order: 3+0 (adding 4 would make 7), 4, 9 alone (over the limit), 1+1, 5+0+0, 2
    assert step_rows.blocks_of_at_most(counts, 5) == [(0, 2), (2, 3), (3, 4), (4, 6), (6, 9), (9, 10)]
    assert step_rows.blocks_of_at_most(counts, 100) == [(0, 10)]
    assert step_rows.blocks_of_at_most(counts[:0], 5) == []
    with pytest.raises(ValueError):
        step_rows.blocks_of_at_most(counts, 0)


@pytest.mark.parametrize("spec", [None, {"method": "eagle", "num_speculative_tokens": 3}])
def test_output_frees_the_decoding_state_and_is_taken_once(spec):
    # the strategy's tables (EAGLE: acceptance table, its cumulative sum, per-step sums) are the largest
    # objects of a run: output() lets them go before it builds its arrays; a second call (a deployment asks
    # for the merged output and then each replica's) returns the same output, not a rebuilt one
    engine, env, _ = build_engine(SimConfig.model_validate(config(4.0, "run", 20.0, 600, spec)), ROOT,
                                  np.random.SeedSequence(0))
    env.run()
    strategy = weakref.ref(engine.decoding)
    per_request = [weakref.ref(engine.kv)] + [getattr(engine, name) for name in ("num_computed", "arrival_ps")]
    first = engine.output()
    assert strategy() is None
    # the per-request state and the block manager go once the RequestLog holds their values, the runs'
    # records once the step log's arrays are built
    assert per_request[0]() is None and engine.num_computed is None and engine.arrival_ps is None
    assert engine.run_records is None
    np.testing.assert_array_equal(first.requests.arrival_s, np.asarray(per_request[2]) / 1e12)
    assert engine.output() is first
