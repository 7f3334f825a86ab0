"""How the C heap serves servesim's large arrays: each from its own memory map, so that freeing one returns its
memory to the operating system (glibc only).

glibc's ``malloc`` serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at start) with its own
``mmap`` and gives it back with ``munmap`` when freed. Its threshold is dynamic: freeing a mapped block
raises it to that block's size (up to 32 MiB on 64-bit machines), and the blocks below the new threshold come
from the heap instead, where freed memory stays resident while anything above it in the heap lives. A
simulation's step log is held in chunks of 0.6-0.7 MiB that the engine's output copies into one array and
frees (:class:`~servesim.engine.step_rows.StepRowLog`), and its output and summary build and free arrays of
the runs' rows and steps: at 10^6 requests the freed heap memory kept the process's peak 95 MB higher (959
against 863 MB, ``benchmarks/bench_scale.py``'s configuration; 280 MB higher before the step log's counts
became int32; glibc manual, "Memory Allocation Tunables", ``mallopt(3)``). Setting the threshold fixes it
(``mallopt`` turns the dynamic adjustment off).
"""

from __future__ import annotations

import ctypes
import sys

MMAP_THRESHOLD_BYTES = 1 << 19
"""Blocks of at least this many bytes (512 KiB) get their own memory map: every chunk of the step log and
every array of a large run's steps, rows or requests, and none of the many small arrays of a short run (a
map costs a system call and a page fault per page; 1 MiB left the step log's chunks in the heap: 954 MB)."""

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number of the threshold (glibc's ``malloc.h``)."""


def map_large_blocks(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Have this process's ``malloc`` serve every block of at least ``threshold_bytes`` (bytes) with its own
    memory map, returned to the operating system when freed (process-wide; the ``servesim`` command calls it
    at its start, a program that imports servesim decides for itself).

    Returns:
        Whether the setting took effect: False where the C library is not glibc (macOS, Windows, musl),
        where nothing is changed.

    Raises:
        ValueError: ``threshold_bytes`` is not positive.
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not (hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")):  # musl's mallopt does nothing
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
