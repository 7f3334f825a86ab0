"""A simulation run to its end, with a progress bar of completed requests for long runs in a terminal.

``servesim run`` of a million requests takes tens of seconds, a saturated Mooncake trace with prefix
caching several: without a sign of life such a run looks hung. The bar is tqdm's, on stderr, shown only
when stderr is a terminal and the run has lasted :data:`PROGRESS_DELAY_S` (short runs, pipes, CI logs
and the sweep's workers print nothing), and cleared when the run ends, so the summary table below it
reads as without it.

The simulation itself is ``env.run()``, untouched (the same events, the same results bit for bit,
``tests/test_progress.py``): a daemon thread reads the completed count every :data:`REDRAW_S` seconds
and redraws the bar. A thread, not a check between SimPy events: with one replica the engine runs a
whole stretch of steps per event, after the last arrival the rest of the run in one.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import simpy

#: Wall seconds a run lasts before its bar appears (tqdm's ``delay``).
PROGRESS_DELAY_S = 1.0
#: Wall seconds between two redraws of the bar.
REDRAW_S = 0.2


def run_to_end(env: simpy.Environment, completed: Callable[[], int], total: int, show: bool) -> None:
    """Run ``env`` until no event is left (``env.run()``), drawing a bar of completed requests with ``show``.

    Args:
        env: the simulation's environment.
        completed: the number of requests completed so far (read from the bar's thread: it must only read
            state, e.g. an engine's ``finished`` counter).
        total: the workload's requests (the bar's end).
        show: draw the bar (on stderr, when it is a terminal and the run outlasts :data:`PROGRESS_DELAY_S`).

    Raises:
        Whatever a simulated process raises, as ``env.run()`` would (the bar is stopped and cleared first).
    """
    if not show:
        env.run()
        return
    from tqdm import tqdm

    # miniters=1: every redraw shows the count (tqdm's dynamic miniters would skip a redraw whose count
    # moved less than the previous one's: on a long run, one redraw in two or three)
    bar = tqdm(total=total, unit="req", desc="simulating", delay=PROGRESS_DELAY_S, mininterval=0.0, miniters=1,
               leave=False, disable=None, file=sys.stderr, dynamic_ncols=True)
    if bar.disable:  # stderr is not a terminal
        env.run()
        return
    done = threading.Event()

    def redraw() -> None:
        while not done.wait(REDRAW_S):
            moved = completed() - bar.n
            if moved:
                bar.update(moved)
            elif time.monotonic() - started >= delay_s:
                # miniters=1 skips an update(0): a count that has not moved (no request completed yet, or
                # none for a while) is still redrawn, with its elapsed time, as a sign of life
                bar.refresh()

    started, delay_s = time.monotonic(), PROGRESS_DELAY_S
    thread = threading.Thread(target=redraw, name="servesim-progress", daemon=True)
    thread.start()
    try:
        env.run()
    finally:
        done.set()
        thread.join()
        bar.close()
