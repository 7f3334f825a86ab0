"""Replaying a request trace: format detection, Mooncake bucket policy, window, rate scale, cap.

The order of operations, on the trace's own timeline (seconds since its first row):

1. Parse (:mod:`servesim.workload.azure`, :mod:`servesim.workload.mooncake`). Token counts of 0 are raised
   to 1 (the engine needs every request to have a prompt and to generate at least one token); the number of
   such rows is kept in :class:`TraceMeta` and said in the description. The shipped files have none.
2. Mooncake bucket policy. Mooncake timestamps are bucketed (about 3 s in the conversation trace: 12,031
   rows share 1,180 distinct timestamps). ``burst`` keeps them: every request of a bucket arrives at the
   bucket time. ``spread`` (default) puts the ``m`` requests that share timestamp ``T`` at
   ``T + i * w / m`` for ``i = 0..m-1``, where the bucket width ``w`` is the smallest positive gap between
   distinct timestamps in the whole file (2.997 s for the conversation trace); requests stay in file order
   and the result stays sorted. A file with one distinct timestamp has no width and is replayed as
   ``burst``. Azure timestamps are not bucketed (100 ns resolution), so the policy does not apply to them.
3. Window: keep requests with ``start_s <= t < start_s + duration_s`` and re-base so ``start_s`` is 0.
4. Rate scale: divide the times by ``rate_scale`` (2 = twice the request rate, half the span).
5. Cap: keep the first ``max_requests``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path

import numpy as np

from servesim.errors import TraceError
from servesim.workload.rawtrace import RawTrace, read_trace_text
from servesim.workload.workload import TraceMeta, Workload

TRACE_FORMATS = ("azure", "mooncake")
BUCKET_POLICIES = ("burst", "spread")
_EXTENSIONS = {".csv": "azure", ".jsonl": "mooncake"}
_LABEL = {"azure": "Azure", "mooncake": "Mooncake"}


def detect_format(path: str | Path, format: str = "auto") -> str:
    """Resolve ``format``: ``"auto"`` picks by extension (``.csv`` Azure, ``.jsonl`` Mooncake).

    Raises:
        TraceError: ``auto`` and the extension is neither.
        ValueError: ``format`` is not ``auto``, ``azure`` or ``mooncake``.
    """
    if format == "auto":
        ext = Path(path).suffix.lower()
        if ext not in _EXTENSIONS:
            # a folder or a missing file is the mistake, not its extension (as read_trace_text says them)
            if Path(path).is_dir():
                raise TraceError(f"{path}: is a folder (expected a trace file)")
            if not Path(path).exists():
                raise TraceError(f"{path}: trace file not found")
            raise TraceError(
                f"{path}: cannot tell the trace format from the extension {ext!r} "
                "(expected .csv for Azure or .jsonl for Mooncake, or set format: azure|mooncake)"
            )
        return _EXTENSIONS[ext]
    if format not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {format!r} (expected auto, azure or mooncake)")
    return format


def read_trace(path: str | Path, format: str = "auto", prefix_block_ids: bool = False,
               require_sorted: bool = True) -> RawTrace:
    """Parse a trace file into a :class:`RawTrace` (rows as written, file order), cached per file.

    ``require_sorted`` False reads a file whose rows are not in time order (its lengths only are used).

    The result is cached by (resolved path, size, modification time, format), so a sweep that replays one
    trace parses it once per process; the cached arrays are read-only.

    Raises:
        TraceError: the file is missing or malformed (see the format parsers).
    """
    p = Path(path)
    if p.is_dir() or not p.exists():  # said as such, not as an extension that tells no format
        read_trace_text(p)
    fmt = detect_format(p, format)
    try:
        st = p.stat()
    except OSError:
        return _parse(p, fmt, prefix_block_ids, require_sorted)  # raises the one-line error
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, fmt, prefix_block_ids, require_sorted)
    raw = _CACHE.get(key)
    if raw is None:
        raw = _parse(p, fmt, prefix_block_ids, require_sorted)
        for a in (raw.time_s, raw.prompt_tokens, raw.output_tokens):
            a.flags.writeable = False
        _CACHE[key] = raw
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    if raw.path != str(path):
        raw = dataclasses.replace(raw, path=str(path))
    return raw


_CACHE: OrderedDict[tuple, RawTrace] = OrderedDict()
_CACHE_SIZE = 8


def _parse(p: Path, fmt: str, prefix_block_ids: bool, require_sorted: bool = True) -> RawTrace:
    # each parser is imported only when a file of its format is read (start-up time of a run)
    if fmt == "azure":
        from servesim.workload.azure import read_azure_csv

        return read_azure_csv(p, require_sorted)
    from servesim.workload.mooncake import read_mooncake_jsonl

    return read_mooncake_jsonl(p, prefix_block_ids=prefix_block_ids, require_sorted=require_sorted)


def bucket_width_s(time_s: np.ndarray) -> float | None:
    """Smallest positive gap between distinct values of a sorted time array (s); None if all are equal."""
    gaps = np.diff(time_s)
    gaps = gaps[gaps > 0]
    return float(gaps.min()) if gaps.size else None


def spread_buckets(time_s: np.ndarray, width_s: float) -> np.ndarray:
    """Spread requests that share a timestamp evenly over ``[T, T + width_s)``.

    Args:
        time_s: float64, sorted, shape ``(N,)`` (s).
        width_s: bucket width (s), > 0.

    Returns:
        float64 ``(N,)``: the ``i``-th of the ``m`` requests at ``T`` moves to ``T + i * width_s / m``.
    """
    n = time_s.shape[0]
    if n == 0:
        return time_s.copy()
    starts = np.flatnonzero(np.r_[True, time_s[1:] != time_s[:-1]])
    counts = np.diff(np.r_[starts, n])
    group_start = np.repeat(starts, counts)
    rank = np.arange(n) - group_start
    m = np.repeat(counts, counts)
    return time_s + rank * (width_s / m)


def load_trace(
    path: str | Path,
    format: str = "auto",
    rate_scale: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    bucket_policy: str = "spread",
    *,
    prefix_block_ids: bool = False,
) -> Workload:
    """Replay a trace file as an open-loop :class:`Workload` (see the module docstring for the order).

    Args:
        path: an Azure CSV or Mooncake JSONL file.
        format: ``"auto"`` (by extension), ``"azure"`` or ``"mooncake"``.
        rate_scale: time compression, > 0: arrival times are divided by it (4 = four times the rate).
        start_s: start of the window on the original trace timeline (s since the first row), >= 0.
        duration_s: length of the window on the original timeline (s), > 0; None = to the end.
        max_requests: keep at most the first N requests of the window, >= 1; None = all.
        bucket_policy: Mooncake only: ``"spread"`` (default) or ``"burst"``.
        prefix_block_ids: Mooncake only: keep ``hash_ids`` in ``meta.prefix_block_ids`` and describe each
            request's tokens from them in ``Workload.content`` (512-token blocks, see
            :mod:`servesim.workload.mooncake`); slower to parse. False keeps the fast path.

    Returns:
        A Workload whose ``arrival_s`` is (t - start_s) / rate_scale (s), with ``meta`` set.

    Raises:
        TraceError: malformed file, unknown extension, or no request in the window.
        ValueError: an argument out of range (a programming error; configs are validated before).
    """
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0 (got {rate_scale})")
    if not start_s >= 0:
        raise ValueError(f"start_s must be >= 0 (got {start_s})")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 (got {duration_s})")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be >= 1 (got {max_requests})")
    if bucket_policy not in BUCKET_POLICIES:
        raise ValueError(f"bucket_policy must be 'burst' or 'spread' (got {bucket_policy!r})")

    raw = read_trace(path, format, prefix_block_ids=prefix_block_ids)
    t = raw.time_s
    width = policy = None
    if raw.format == "mooncake":
        policy = bucket_policy
        width = bucket_width_s(t)
        if bucket_policy == "spread" and width is not None:
            t = spread_buckets(t, width)

    end_s = np.inf if duration_s is None else start_s + duration_s
    lo = int(np.searchsorted(t, start_s, side="left"))
    hi = int(np.searchsorted(t, end_s, side="left"))
    if max_requests is not None:
        hi = min(hi, lo + max_requests)
    if hi <= lo:
        span = f"[{start_s:g}, {end_s:g}) s"
        raise TraceError(
            f"{path}: no request in the window {span} of the trace timeline (the trace spans 0 to {t[-1]:g} s)"
        )

    arrival_s = (t[lo:hi] - start_s) / rate_scale
    n_prompt0 = int(np.count_nonzero(raw.prompt_tokens == 0))
    n_output0 = int(np.count_nonzero(raw.output_tokens == 0))
    prompt = np.maximum(raw.prompt_tokens[lo:hi], 1)
    output = np.maximum(raw.output_tokens[lo:hi], 1)
    ids = raw.prefix_block_ids[lo:hi] if raw.prefix_block_ids is not None else None

    parts = [f"{_LABEL[raw.format]} trace {Path(path).name}", f"{hi - lo} requests", f"rate x{rate_scale:g}"]
    if start_s > 0 or duration_s is not None:
        parts.append(f"window [{start_s:g}, {end_s:g}) s")
    if policy is not None:
        parts.append(f"{policy} buckets" + (f" of {width:g} s" if width is not None else ""))
    if n_prompt0 or n_output0:
        parts.append(f"{n_prompt0} zero prompts and {n_output0} zero outputs in the file raised to 1 token")
    meta = TraceMeta(
        path=str(path),
        format=raw.format,
        num_rows=len(raw),
        num_clamped_prompt=n_prompt0,
        num_clamped_output=n_output0,
        bucket_width_s=width,
        bucket_policy=policy,
        prefix_block_ids=ids,
    )
    content = None
    if ids is not None:
        from servesim.workload.content import SequenceContent
        from servesim.workload.mooncake import MOONCAKE_BLOCK_TOKENS, hash_id_arrays

        offsets, flat = hash_id_arrays(ids)
        content = SequenceContent.from_trace_blocks(offsets, flat, MOONCAKE_BLOCK_TOKENS, prompt, output)
    return Workload(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        concurrency=None,
        think_time_s=0.0,
        description=", ".join(parts),
        meta=meta,
        content=content,
    )
