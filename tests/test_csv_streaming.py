"""Streamed CSV writing (issue 13, item 2): the same bytes as before, one chunk in memory at a time."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from servesim.metrics.csv_text import CHUNK_ROWS, csv_bytes, csv_chunks, iter_csv_chunks

#: SHA-256 of csv_bytes(golden_columns()) as written by the code before streaming (main at 4808b15, which
#: built the whole file's chunks in a list): full precision, then the rounded 12-digit format.
GOLDEN_FULL_PRECISION = "ebf0b2bdfc0d9c2bc7c87c8e8161865dd0d623df1051149cc3fb288a7c3e6236"
GOLDEN_ROUNDED = "a7aca0e097ffa2b16cc0d9769b5dbb7f9620a860fd436282b745b9da024cc90b"


def golden_columns() -> dict[str, np.ndarray]:
    """20,000 rows (three chunks) of every kind of column: ps-grid times, off-grid differences with NaN,
    a mix (zero, negative, below 1e-4), signed ints and bools."""
    rng = np.random.default_rng(np.random.SeedSequence(13))
    n = 20_000
    ps = rng.integers(0, 4 * 10**15, n)
    on_grid = ps / 1e12
    first = on_grid + rng.integers(1, 10**10, n) / 1e12
    off_grid = first - on_grid
    off_grid[rng.random(n) < 0.05] = np.nan
    mixed = np.where(rng.random(n) < 0.5, on_grid, off_grid * rng.random(n))
    mixed[:3] = [0.0, -2.5, 1e-7]
    return {"request_id": np.arange(n), "arrival_s": on_grid, "ttft_s": off_grid, "mixed_s": mixed,
            "tokens": rng.integers(-5, 10**6, n), "flag": rng.random(n) < 0.3}


@pytest.mark.parametrize("full_precision, golden", [(True, GOLDEN_FULL_PRECISION), (False, GOLDEN_ROUNDED)])
def test_streamed_csv_bytes_equal_the_pre_streaming_golden(full_precision, golden):
    streamed = b"".join(iter_csv_chunks(golden_columns(), full_precision=full_precision))
    assert hashlib.sha256(streamed).hexdigest() == golden
    assert csv_bytes(golden_columns(), full_precision=full_precision) == streamed


def test_chunks_are_formatted_one_at_a_time():
    columns = golden_columns()
    chunks = iter_csv_chunks(columns, full_precision=True)
    assert not isinstance(chunks, list)
    assert next(chunks) == b"request_id,arrival_s,ttft_s,mixed_s,tokens,flag\n"
    first = next(chunks)
    assert first.count(b"\n") == CHUNK_ROWS  # one block of rows, not the rest of the file
    rest = list(chunks)
    assert [c.count(b"\n") for c in rest] == [CHUNK_ROWS, 20_000 - 2 * CHUNK_ROWS]
    assert csv_chunks(columns, full_precision=True) == [b"request_id,arrival_s,ttft_s,mixed_s,tokens,flag\n",
                                                          first, *rest]


def test_bad_columns_are_refused_when_called_not_when_written():
    with pytest.raises(ValueError, match="different lengths"):
        iter_csv_chunks({"a": np.zeros(3), "b": np.zeros(4)})
