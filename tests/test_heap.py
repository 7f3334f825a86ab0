"""servesim.heap: with large blocks mapped on their own, freed arrays below glibc's raised threshold return their
memory to the operating system (and without it they stay resident: the test can tell the two apart)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from servesim import heap

# In a fresh process: free a 30 MiB array (glibc's dynamic threshold rises to it), allocate arrays of 600 kB
# (below the step log's chunks' parts) and a small one above them in the heap, free the 600 kB arrays and report
# how much of their memory is still resident (MiB).
SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from servesim import heap
    if sys.argv[1] == "mapped":
        assert heap.map_large_blocks()
    def resident_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    big = np.ones(30 * 2**20 // 8)
    del big
    chunks = [np.ones(75_000) for _ in range(200)]  # 600 kB each (a step-log chunk's parts: 645 and 726 kB), 120 MB
    above = np.ones(2**13)  # 64 KiB from the heap, after the chunks
    before = resident_mib()
    del chunks
    print(before - resident_mib())
""")


def _released_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def _is_glibc() -> bool:
    import ctypes

    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _is_glibc(), reason="glibc's malloc tunable (elsewhere map_large_blocks changes nothing)")
def test_freed_arrays_return_to_the_os_only_with_large_blocks_mapped():
    assert _released_mib("mapped") > 110  # the 114 MiB of arrays, less a page or so each
    assert _released_mib("default") < 10  # glibc's own threshold: they stay in the heap


def test_threshold_is_512_kib_below_the_step_logs_chunks():
    from servesim.engine.step_rows import LOG_CHUNK_VALUES, StepRowLog

    assert heap.MMAP_THRESHOLD_BYTES == 2**19
    rows = StepRowLog().full_rows  # a chunk's rows: its times (int64) and counts (int32) are mapped on their own
    assert rows * len(StepRowLog.TIME_INDEX) * 8 >= heap.MMAP_THRESHOLD_BYTES
    assert rows * len(StepRowLog.COUNT_INDEX) * 4 >= heap.MMAP_THRESHOLD_BYTES
    assert LOG_CHUNK_VALUES * 4 >= heap.MMAP_THRESHOLD_BYTES  # the runs' int64 and int32 chunks too
    with pytest.raises(ValueError, match="positive"):
        heap.map_large_blocks(0)


def test_the_servesim_command_maps_large_blocks(monkeypatch):
    from servesim import cli

    calls = []
    monkeypatch.setattr(heap, "map_large_blocks", lambda *args: calls.append(args) or True)
    with pytest.raises(SystemExit):  # argparse's --help exits once it has printed
        cli.main(["--help"])
    assert calls == [()]
