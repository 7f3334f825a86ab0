"""Refuse, before anything is drawn, a workload whose run would not fit in this machine's memory.

A run holds about :data:`BYTES_PER_REQUEST` bytes per request at its peak (the engine's per-request state,
the step log, the output columns and the summary's arrays: 892 MB at 10^6 requests without speculation,
919 MB with EAGLE, ``benchmarks/bench_scale.py``, README "Performance"), so a workload of 10^8 requests
would need about 100 GB and be killed by the operating system part way, leaving nothing. It is refused
at once instead, with a message naming the field that set its size.
"""

from __future__ import annotations

import os

#: Peak resident bytes per request of a whole run, rounded up from the 10^6-request benchmark's 890-920.
BYTES_PER_REQUEST = 1_000


def available_memory_bytes() -> int | None:
    """Memory the operating system can give this process now (bytes): Linux's ``MemAvailable`` in
    ``/proc/meminfo``, else the physical memory (``os.sysconf``), else None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file's unit is KiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _gb(num_bytes: float) -> str:
    gigabytes = num_bytes / 1e9
    return f"{gigabytes:,.0f} GB" if gigabytes >= 100 else f"{gigabytes:.3g} GB"


def check_requests_fit(num_requests: int, field: str, what: str = "requests") -> None:
    """Refuse ``num_requests`` requests when :data:`BYTES_PER_REQUEST` each exceed the available memory.

    Args:
        num_requests: the workload's requests (or its expected count, for a ``duration_s``).
        field: the config field that sets the count (e.g. ``workload.num_requests``), named in the message.
        what: how the message counts them (``"requests"``, ``"turns"``, ``"expected requests"``).

    Raises:
        SettingError: one line naming ``field``, the count, the memory it needs and the memory available.
    """
    needed = num_requests * BYTES_PER_REQUEST
    available = available_memory_bytes()
    if available is None or needed <= available:
        return
    from servesim.errors import SettingError

    raise SettingError(
        f"{field}: {num_requests:,} {what} would need about {_gb(needed)} of memory (servesim holds about "
        f"{BYTES_PER_REQUEST:,} bytes per request), more than the {_gb(available)} available: simulate fewer "
        "requests"
    )


def check_synthetic_size(count: int | None, rate: float | None, duration_s: float | None, count_field: str) -> None:
    """:func:`check_requests_fit` for a synthetic workload sized by ``count`` (``workload.<count_field>``) or
    by ``rate`` (per second) over ``duration_s`` (seconds; the expected count is checked).

    Raises:
        SettingError: as :func:`check_requests_fit`.
    """
    if count is not None:
        check_requests_fit(count, f"workload.{count_field}", count_field.removeprefix("num_"))
    elif rate is not None and duration_s is not None:
        check_requests_fit(int(rate * duration_s), "workload.duration_s",
                           "expected " + count_field.removeprefix("num_"))
