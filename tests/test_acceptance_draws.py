"""The acceptance of every round, tabulated at load time from uniforms drawn in chunks, is the table one
draw of all the uniforms gives (``servesim.wiring.ACCEPTANCE_DRAW_CHUNK``): same config and seed, same
results, whatever the chunk size, for EAGLE and for n-gram (whose empty drafts come from the same draws)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import servesim.wiring as wiring
from servesim import simulate
from test_modes_summary import CASES


@pytest.mark.parametrize("name", ["eagle-preemption", "ngram-preemption"])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_acceptance_draws_give_the_same_run(name, chunk, monkeypatch):
    whole = simulate(CASES[name])
    monkeypatch.setattr(wiring, "ACCEPTANCE_DRAW_CHUNK", chunk)
    chunked = simulate(CASES[name])
    pd.testing.assert_frame_equal(whole.requests, chunked.requests)
    pd.testing.assert_frame_equal(whole.steps, chunked.steps)
    assert whole.summary == chunked.summary


def _tables_built(monkeypatch, widen: bool = False) -> list[np.ndarray]:
    """From now on, each run's acceptance table as ``wiring._spec_setup`` builds it (appended to the list
    returned); ``widen``: the run then gets it as int64."""
    seen = []
    original = wiring._spec_setup

    def spy(*args, **kwargs):
        setup = original(*args, **kwargs)
        seen.append(setup.accept_table)
        if widen:
            setup.accept_table = setup.accept_table.astype("int64")
        return setup

    monkeypatch.setattr(wiring, "_spec_setup", spy)
    return seen


def test_the_table_is_what_one_draw_gives(monkeypatch):
    """A chunk boundary that dropped or repeated a draw would shift every later round's acceptance."""
    seen = _tables_built(monkeypatch)
    simulate(CASES["eagle"])
    monkeypatch.setattr(wiring, "ACCEPTANCE_DRAW_CHUNK", 3)
    simulate(CASES["eagle"])
    assert len(seen) == 2 and seen[0].size > 1000
    assert (seen[0] == seen[1]).all()


#: k per batch size: decoders join with k below K and are retimed when k changes (the general join)
K_TABLE = dict(CASES["eagle-preemption"], speculative_config={
    "method": "eagle", "num_speculative_tokens": 3,
    "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 5, 2], [6, 4096, 1]]})


@pytest.mark.parametrize("name", ["eagle-preemption", "ngram-preemption", "k-table"])
def test_the_one_byte_table_gives_the_run_of_a_wide_one(name, monkeypatch):
    """The table is int8 (one byte per output token); the engine computes with it in int64 where a round's
    draw meets token counts (the general join: n-gram's varying width, k below K, retimed decoders), so
    the run equals the run of the same table widened to int64."""
    config = K_TABLE if name == "k-table" else CASES[name]
    narrow = simulate(config)
    seen = _tables_built(monkeypatch, widen=True)
    wide = simulate(config)
    assert [table.dtype for table in seen] == [np.dtype("int8")]
    pd.testing.assert_frame_equal(narrow.requests, wide.requests)
    pd.testing.assert_frame_equal(narrow.steps, wide.steps)
    assert narrow.summary == wide.summary


def test_a_table_for_more_than_126_drafts_is_int16(monkeypatch):
    """A(u) reaches K and the join adds 1: beyond K = 126 an int8 would wrap."""
    seen = _tables_built(monkeypatch)
    spec = {"method": "eagle", "num_speculative_tokens": 127,
            "acceptance": {"source": "test", "per_position_acceptance": [0.999] * 127}}
    simulate(dict(CASES["eagle"], speculative_config=spec,
                  workload=dict(CASES["eagle"]["workload"], num_requests=20)))
    assert seen[0].dtype == np.dtype("int16") and int(seen[0].max()) > 100
