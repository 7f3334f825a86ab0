"""Parser for the Mooncake traces (JSON Lines).

Format (Qin et al., Mooncake, FAST 2025; github.com/kvcache-ai/Mooncake, ``FAST25-release/traces``): one
JSON object per line with ``timestamp`` (ms since the start of the trace), ``input_length`` and
``output_length`` (tokens), and ``hash_ids`` (one id per 512-token prefix block; equal ids = shareable
prefix). Blank lines are skipped. Other keys are ignored.

Speed: ``hash_ids`` make up most of the file; unless they are asked for, they are blanked with one regular
expression before a single ``json.loads`` of the whole file (about 30 ms for the 12,031-row conversation
trace instead of about 130 ms). Only when that fast pass fails does a line-by-line pass run, to name the
bad line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from servesim.errors import TraceError
from servesim.workload.rawtrace import RawTrace, read_trace_text

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_HASH_IDS = re.compile(r'"hash_ids"\s*:\s*\[[^\]]*\]')


def read_mooncake_jsonl(path: str | Path, prefix_block_ids: bool = False) -> RawTrace:
    """Read a Mooncake trace (JSON Lines).

    Args:
        path: the ``.jsonl`` file.
        prefix_block_ids: also return each row's ``hash_ids`` (slower); they are returned only when every
            row has them.

    Returns:
        A :class:`RawTrace` with ``time_s`` = seconds since the first row (``timestamp`` / 1000, float64,
        shape ``(N,)``) and the token columns as written (int64, >= 0).

    Raises:
        TraceError: one line naming the file and line: empty file, invalid JSON, not an object, missing key,
            non-numeric timestamp, non-integer or negative length, ``hash_ids`` not a list, timestamps not
            sorted.
    """
    p = Path(path)
    text = read_trace_text(p)
    parsed = _parse_fast(text, prefix_block_ids)
    if parsed is None:
        parsed = _parse_checked(p, text, prefix_block_ids)
    t_ms, prompt, output, ids = parsed
    time_s = (t_ms - t_ms[0]) / 1000.0
    return RawTrace(str(path), "mooncake", time_s, prompt, output, ids)


def _parse_fast(
    text: str, keep_ids: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]] | None] | None:
    body = text if keep_ids else _HASH_IDS.sub('"hash_ids": null', text)
    lines = [line for line in body.split("\n") if line.strip()]
    if not lines:
        return None
    try:
        rows = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        return None
    if len(rows) != len(lines) or not all(type(r) is dict for r in rows):
        return None
    try:
        ts = [r["timestamp"] for r in rows]
        ins = [r["input_length"] for r in rows]
        outs = [r["output_length"] for r in rows]
    except KeyError:
        return None
    if not all(type(v) is int or type(v) is float for v in ts):
        return None
    if not all(type(v) is int for v in ins) or not all(type(v) is int for v in outs):
        return None
    ids = None
    if keep_ids:
        hs = [r.get("hash_ids") for r in rows]
        if all(type(h) is list for h in hs):
            ids = hs
        elif any(h is not None and type(h) is not list for h in hs):
            return None
    try:
        t_ms = np.array(ts, dtype=np.float64)
        prompt = np.array(ins, dtype=np.int64)
        output = np.array(outs, dtype=np.int64)
    except OverflowError:
        return None
    if not np.isfinite(t_ms).all() or (np.diff(t_ms) < 0).any() or prompt.min() < 0 or output.min() < 0:
        return None
    return t_ms, prompt, output, ids


def _parse_checked(
    p: Path, text: str, keep_ids: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]] | None]:
    keys = ", ".join(MOONCAKE_KEYS)
    if not text.strip():
        raise TraceError(f"{p}: empty file (expected one JSON object per line with {keys})")
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[list[int]] | None = [] if keep_ids else None
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row: Any = json.loads(line)
        except ValueError as exc:
            raise TraceError(f"{p}: line {n}: expected one JSON object per line ({exc.args[0]})") from None
        if type(row) is not dict:
            raise TraceError(f"{p}: line {n}: expected a JSON object with {keys} (got {type(row).__name__})")
        for key in MOONCAKE_KEYS:
            if key not in row:
                raise TraceError(f"{p}: line {n}: missing key {key!r} (expected {keys})")
        t = row["timestamp"]
        if not (type(t) is int or type(t) is float) or not math.isfinite(t):
            raise TraceError(f"{p}: line {n}: timestamp: expected a number of milliseconds (got {t!r})")
        if ts and t < ts[-1]:
            raise TraceError(
                f"{p}: line {n}: timestamp {t!r} is earlier than the previous row's {ts[-1]!r} "
                "(expected rows sorted by timestamp)"
            )
        for key, dest in (("input_length", ins), ("output_length", outs)):
            v = row[key]
            if type(v) is not int or v < 0:
                raise TraceError(f"{p}: line {n}: {key}: expected an integer token count >= 0 (got {v!r})")
            dest.append(v)
        ts.append(t)
        if ids is not None:
            h = row.get("hash_ids")
            if h is None:
                ids = None
            elif type(h) is not list:
                raise TraceError(f"{p}: line {n}: hash_ids: expected a list of block ids (got {h!r})")
            else:
                ids.append(h)
    return (
        np.array(ts, dtype=np.float64),
        np.array(ins, dtype=np.int64),
        np.array(outs, dtype=np.int64),
        ids,
    )
