"""servesim.heap: freed arrays that glibc's malloc kept in its heap return to the operating system when the
engine's output releases the heap's free memory (and without the release they stay resident: the test can
tell the two apart)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from servesim import heap

# In a fresh process: free a 30 MiB array (glibc's dynamic threshold rises to it), allocate arrays of 600 kB
# (the size of the step log's chunks' parts) and a small one above them in the heap, free the 600 kB arrays,
# release the heap's free memory or not, and report how much of their memory is no longer resident (MiB).
SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from servesim import heap
    def resident_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20
    big = np.ones(30 * 2**20 // 8)
    del big
    chunks = [np.ones(75_000) for _ in range(200)]  # 600 kB each, 114 MiB
    above = np.ones(2**13)  # 64 KiB from the heap, after the chunks
    before = resident_mib()
    del chunks
    if sys.argv[1] == "release":
        assert heap.release_free_memory()
    print(before - resident_mib())
""")

IS_GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def _released_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


@pytest.mark.skipif(not IS_GLIBC, reason="glibc's malloc_trim (elsewhere release_free_memory changes nothing)")
def test_freed_heap_arrays_return_to_the_os_only_when_released():
    assert _released_mib("release") > 100  # the 114 MiB of arrays, less a page or so each
    assert _released_mib("keep") < 10  # glibc keeps them in its heap


@pytest.mark.skipif(IS_GLIBC, reason="checks the C libraries other than glibc, where release_free_memory does nothing")
def test_release_is_a_no_op_without_glibc():
    assert heap.release_free_memory() is False


def test_the_engine_output_releases_the_heap_after_joining_the_step_log(monkeypatch):
    from engine_helpers import run_engine
    from servesim.engine import core
    from servesim.engine.step_rows import StepRowLog

    engine = run_engine([100, 2000, 30], [50, 5, 300], [0.0, 0.001, 0.002], mode="run")
    # the step log's join frees its chunks: the first release comes right after it, the second at the end
    events = []
    join = StepRowLog.columns
    monkeypatch.setattr(StepRowLog, "columns", lambda log: (events.append("join"), join(log))[1])
    monkeypatch.setattr(core, "release_free_memory", lambda: events.append("release") or True)
    out = engine.output()
    assert events == ["join", "release", "release"]
    assert engine.output() is out and np.isfinite(out.requests.finish_s).all()  # built once
