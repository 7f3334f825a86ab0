"""Giving the C heap's free memory back to the operating system once a large run's logs are read (glibc only).

glibc's ``malloc`` serves blocks below its ``M_MMAP_THRESHOLD`` from the heap, and memory freed there stays
resident while anything above it in the heap lives. The threshold is dynamic: freeing a memory-mapped block
raises it to that block's size (up to 32 MiB on 64-bit machines), so after a run's first large temporaries
are freed, the step log's chunks (0.6-0.7 MB each, :class:`~servesim.engine.step_rows.StepRowLog`) come from
the heap. The engine's output copies them into one array and frees them, and that free heap memory stayed
resident under the output's and the summary's arrays: at 10^6 requests the peak was 959 MB without the trim
and is 872 MB with it (``benchmarks/bench_scale.py``'s configuration, without speculation).
``malloc_trim(0)`` returns the free pages, also those in the middle of the heap (glibc since 2.8; glibc
manual, "Memory Allocation Tunables", ``malloc_trim(3)``), without changing how ``malloc`` serves anything:
a process-wide threshold fixed at 512 KiB gave the same peak but cost the simulation a memory map per large
temporary (EAGLE at 10^6: 180 s against 143 s).
"""

from __future__ import annotations

import ctypes
import sys


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library is not glibc (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "malloc_trim") and hasattr(libc, "gnu_get_libc_version")):
        return None
    trim = libc.malloc_trim
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the operating system (``malloc_trim(0)``).

    Called by :meth:`Engine.output <servesim.engine.core.Engine.output>` once the step log's chunks are
    joined and freed, and at its end. Cost: one walk of the heap's free memory (milliseconds for a run of
    10^6 requests, microseconds for a short one).

    Returns:
        Whether memory was given back: False where nothing could be (the C library is not glibc) or nothing
        was free.
    """
    return bool(_TRIM(0)) if _TRIM is not None else False
