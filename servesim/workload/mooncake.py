"""Parser for the Mooncake traces (JSON Lines).

Format (Qin et al., Mooncake, FAST 2025; github.com/kvcache-ai/Mooncake, ``FAST25-release/traces``): one
JSON object per line with ``timestamp`` (ms since the start of the trace), ``input_length`` and
``output_length`` (tokens), and ``hash_ids`` (one id per 512-token prefix block; equal ids = shareable
prefix). Blank lines are skipped. Other keys are ignored.

``hash_ids`` as prompt content (:func:`hash_id_arrays`, used by ``load_trace(..., prefix_block_ids=True)``
to fill ``Workload.content``): id ``j`` of a row covers prompt tokens ``[512 j, 512 (j + 1))``; a prompt of
``L`` tokens has ``ceil(L / 512)`` ids (true of every row of both shipped files), the last covering the
final ``L - 512 (ceil(L / 512) - 1)`` tokens. In the shipped files an id is always at the same position
after the same predecessor (the ids are already chained) and the id of a partial last block never appears
as a full block elsewhere. On ``B``-token KV blocks with ``B`` dividing 512, hash block ``j`` holds KV
blocks ``512 j / B .. 512 (j + 1) / B - 1``: KV block ``k`` is tokens ``[(k B) mod 512, (k B) mod 512 + B)``
of id ``floor(k B / 512)``, so a 16-token KV block is shared by two requests exactly when the ids of its
512-token block and of every block before it are equal. The last, partial hash block of ``r`` tokens gives
``floor(r / B)`` full KV blocks (shared with another request whose row has the same id there, up to the
shorter of the two) and ``r mod B`` tokens in a partial KV block, which is never cached. Sharing is known
at 512-token resolution only: where two rows' ids differ, none of that hash block's KV blocks is shared,
even if the real texts agreed on part of it.

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
from servesim.json_objects import DuplicateJSONKey, loads_unique
from servesim.workload.content import MAX_CONTENT_INDEX
from servesim.workload.rawtrace import MAX_TOKEN_COUNT, RawTrace, read_trace_text, too_many_tokens

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens covered by one Mooncake ``hash_ids`` entry (Qin et al., FAST 2025, trace README)."""
_HASH_IDS = re.compile(r'"hash_ids"\s*:\s*\[[^\]]*\]')


def _bad_hash_id(ids: list) -> int | None:
    """The index of the first entry of a row's ``hash_ids`` that is not an integer in ``0..MAX_CONTENT_INDEX``."""
    return next((i for i, h in enumerate(ids) if not (type(h) is int and 0 <= h <= MAX_CONTENT_INDEX)), None)


def read_mooncake_jsonl(path: str | Path, prefix_block_ids: bool = False, require_sorted: bool = True) -> RawTrace:
    """Read a Mooncake trace (JSON Lines).

    Args:
        path: the ``.jsonl`` file.
        prefix_block_ids: also return each row's ``hash_ids`` (slower); they are returned only when every
            row has them.
        require_sorted: refuse timestamps not sorted (a replay); False for a file read for its lengths only.

    Returns:
        A :class:`RawTrace` with ``time_s`` = seconds since the first row (``timestamp`` / 1000, float64,
        shape ``(N,)``) and the token columns as written (int64, >= 0).

    Raises:
        TraceError: one line naming the file and line: empty file, invalid JSON, not an object, missing key,
            non-numeric timestamp, non-integer or negative length, ``hash_ids`` not a list (or, when they are
            kept, an id not an integer in ``0..2^56-1``), a key given twice, timestamps not sorted.
    """
    p = Path(path)
    text = read_trace_text(p)
    parsed = _parse_fast(text, prefix_block_ids, require_sorted)
    if parsed is None:
        parsed = _parse_checked(p, text, prefix_block_ids, require_sorted)
    t_ms, prompt, output, ids = parsed
    time_s = (t_ms - t_ms[0]) / 1000.0
    return RawTrace(str(path), "mooncake", time_s, prompt, output, ids)


def _parse_fast(
    text: str, keep_ids: bool, require_sorted: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]] | None] | None:
    body = text if keep_ids else _HASH_IDS.sub('"hash_ids": null', text)
    lines = [line for line in body.split("\n") if line.strip()]
    if not lines:
        return None
    try:
        rows = loads_unique("[" + ",".join(lines) + "]")
    except ValueError:  # invalid JSON or a key given twice: the checked pass names the line
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
            if any(_bad_hash_id(h) is not None for h in hs):
                return None
            ids = hs
        elif any(h is not None and type(h) is not list for h in hs):
            return None
    try:
        t_ms = np.array(ts, dtype=np.float64)
        prompt = np.array(ins, dtype=np.int64)
        output = np.array(outs, dtype=np.int64)
    except OverflowError:
        return None
    if not np.isfinite(t_ms).all() or prompt.min() < 0 or output.min() < 0:
        return None
    if require_sorted and (np.diff(t_ms) < 0).any():
        return None
    if max(prompt.max(), output.max()) > MAX_TOKEN_COUNT:
        return None
    return t_ms, prompt, output, ids


def _parse_checked(
    p: Path, text: str, keep_ids: bool, require_sorted: bool = True
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
            row: Any = loads_unique(line)
        except DuplicateJSONKey as exc:
            raise TraceError(f"{p}: line {n}: key {exc.args[0]!r} given twice (expected each key once)") from None
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
        if require_sorted and ts and t < ts[-1]:
            raise TraceError(
                f"{p}: line {n}: timestamp {t!r} is earlier than the previous row's {ts[-1]!r} "
                "(expected rows sorted by timestamp)"
            )
        for key, dest in (("input_length", ins), ("output_length", outs)):
            v = row[key]
            if type(v) is not int or v < 0:
                raise TraceError(f"{p}: line {n}: {key}: expected an integer token count >= 0 (got {v!r})")
            if v > MAX_TOKEN_COUNT:
                raise too_many_tokens(p, n, key, v)
            dest.append(v)
        ts.append(t)
        if ids is not None:
            h = row.get("hash_ids")
            if h is None:
                ids = None
            elif type(h) is not list:
                raise TraceError(f"{p}: line {n}: hash_ids: expected a list of block ids (got {h!r})")
            elif (bad := _bad_hash_id(h)) is not None:
                raise TraceError(f"{p}: line {n}: hash_ids: expected integer ids in 0..2^56-1 (got {h[bad]!r} "
                                 f"as entry {bad + 1} of {len(h)})")
            else:
                ids.append(h)
    return (
        np.array(ts, dtype=np.float64),
        np.array(ins, dtype=np.int64),
        np.array(outs, dtype=np.int64),
        ids,
    )


def hash_id_arrays(hash_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows' ``hash_ids`` as CSR arrays (the ids were checked by :func:`read_mooncake_jsonl`).

    Args:
        hash_ids: one list of ids per row.

    Returns:
        (offsets int64 ``(N + 1,)``, ids int64 ``(total,)``): row ``i``'s ids are
        ``ids[offsets[i]:offsets[i + 1]]``.
    """
    counts = np.fromiter(map(len, hash_ids), dtype=np.int64, count=len(hash_ids))
    offsets = np.zeros(len(hash_ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets, np.array([h for row in hash_ids for h in row], dtype=np.int64)
