"""servesim/progress.py: the run loop with a progress bar gives the same results as env.run(), and the bar
shows on a terminal only."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

import servesim.progress
from servesim import simulate
from servesim.cli import main

WORKLOAD = {"type": "poisson", "rate": 30, "num_requests": 400,
            "prompt_tokens": {"type": "uniform", "low": 5, "high": 900},
            "output_tokens": {"type": "uniform", "low": 1, "high": 300}}
CONFIGS = {
    "plain": {},
    "EAGLE, tight KV": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3},
                        "engine": {"num_gpu_blocks_override": 500}},
    "3 replicas": {"deployment": {"replicas": 3, "router": "least_outstanding"}},
}


class Terminal(io.StringIO):
    """A text stream that says it is a terminal (tqdm draws on it)."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_progress_loop_gives_the_results_of_env_run(name, monkeypatch):
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOAD, "seed": 2, **CONFIGS[name]}
    plain = simulate(config)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(servesim.progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(servesim.progress, "REDRAW_S", 0.001)  # redrawn whenever the thread gets the GIL
    shown = simulate(config, progress=True)
    assert json.dumps(shown.summary, sort_keys=True) == json.dumps(plain.summary, sort_keys=True)
    pd.testing.assert_frame_equal(shown.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(shown.steps, plain.steps, check_exact=True)
    drawn = terminal.getvalue()
    assert "simulating:" in drawn and "/400 [" in drawn  # counts of completed requests out of the workload's
    counts = [int(part.split("/400")[0].split()[-1]) for part in drawn.split("\r") if "/400 [" in part]
    assert counts == sorted(counts) and counts[-1] <= 400


def test_the_bar_counts_completed_requests_while_the_run_goes_on(monkeypatch):
    # 3,000 requests: the run lasts tenths of a second, many of Python's 5 ms thread switches, after the
    # last arrival in one SimPy event (the count still moves: the bar's thread reads it)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(servesim.progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(servesim.progress, "REDRAW_S", 0.001)
    simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "seed": 1,
              "workload": {**WORKLOAD, "rate": 1000, "num_requests": 3000}}, progress=True)
    parts = [part for part in terminal.getvalue().split("\r") if "/3000 [" in part]
    counts = [int(part.split("/3000")[0].split()[-1]) for part in parts]
    assert counts == sorted(counts) and len(set(counts)) >= 3 and 0 < counts[-1] <= 3000


def test_no_bar_off_a_terminal_or_before_the_delay(monkeypatch, capsys):
    config = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOAD}
    simulate(config, progress=True)  # stderr captured: not a terminal
    assert capsys.readouterr().err == ""
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    simulate(config, progress=True)  # a terminal, but the run ends within the 1 s delay
    assert "simulating" not in terminal.getvalue()


def test_run_draws_the_bar_unless_quiet(tmp_path, monkeypatch):
    from test_cli import write_yaml

    cfg = write_yaml(tmp_path / "c.yaml", {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOAD})
    monkeypatch.setattr(servesim.progress, "PROGRESS_DELAY_S", 0.0)
    for quiet, drawn in ((False, True), (True, False)):
        terminal = Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        args = ["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"] + (["--quiet"] if quiet else [])
        assert main(args) == 0
        assert ("simulating:" in terminal.getvalue()) is drawn


def test_every_redraw_shows_the_count_however_little_it_moved(monkeypatch):
    # tqdm's dynamic miniters would skip redraws after a big step (here +100) until the count moved as much
    # again: the run's last counts (+1 each, long apart) would never show
    import time

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(servesim.progress, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(servesim.progress, "REDRAW_S", 0.005)
    count = [0]

    class SlowEnv:
        def run(self) -> None:
            for step in (100, 1, 1, 1):
                count[0] += step
                time.sleep(0.1)  # twenty redraw periods: the bar's thread reads every value

    servesim.progress.run_to_end(SlowEnv(), lambda: count[0], 1000, show=True)
    text = terminal.getvalue()
    assert all(f"{n}/1000 [" in text for n in (100, 101, 102, 103)), text


def test_a_count_that_does_not_move_is_still_drawn(monkeypatch):
    # miniters=1 makes tqdm skip update(0): before any request completes (or while none does) the bar
    # must still appear after the delay and keep redrawing its elapsed time
    import time

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(servesim.progress, "PROGRESS_DELAY_S", 0.05)
    monkeypatch.setattr(servesim.progress, "REDRAW_S", 0.01)

    class StalledEnv:
        def run(self) -> None:
            time.sleep(0.4)

    servesim.progress.run_to_end(StalledEnv(), lambda: 0, 10, show=True)
    text = terminal.getvalue()
    assert text.count("0/10 [") >= 3, text
