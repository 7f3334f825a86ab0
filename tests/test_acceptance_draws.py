"""The acceptance of every round, tabulated at load time from uniforms drawn in chunks, is the table one
draw of all the uniforms gives (``servesim.wiring.ACCEPTANCE_DRAW_CHUNK``): same config and seed, same
results, whatever the chunk size, for EAGLE and for n-gram (whose empty drafts come from the same draws)."""

from __future__ import annotations

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


def test_the_table_is_what_one_draw_gives(monkeypatch):
    """A chunk boundary that dropped or repeated a draw would shift every later round's acceptance."""
    seen = []
    original = wiring._spec_setup

    def spy(*args, **kwargs):
        setup = original(*args, **kwargs)
        seen.append(setup.accept_table.copy())
        return setup

    monkeypatch.setattr(wiring, "_spec_setup", spy)
    simulate(CASES["eagle"])
    monkeypatch.setattr(wiring, "ACCEPTANCE_DRAW_CHUNK", 3)
    simulate(CASES["eagle"])
    assert len(seen) == 2 and seen[0].size > 1000
    assert (seen[0] == seen[1]).all()
