"""Parser for the Azure LLM inference traces (CSV), 2023 and 2024 releases.

Format (Patel et al., Splitwise, ISCA 2024; github.com/Azure/AzurePublicDataset): a header naming at least
``TIMESTAMP,ContextTokens,GeneratedTokens`` (any order, other columns ignored), then one request per row.
``TIMESTAMP`` is a wall-clock time: naive with 7 fractional digits in the 2023 files
(``2023-11-16 18:17:03.9799600``) or with a UTC offset in the 2024 files (``...+00:00``); both are read
(to 1 ns). ``ContextTokens`` is the prompt length and ``GeneratedTokens`` the output length (tokens).

Speed: the common case (plain comma-separated rows) is split with ``str.split`` and converted with numpy in
one pass (about 20 ms for the 19,366-row conversation file); only when that fails does a row-by-row pass
with the ``csv`` module run, to find and name the bad line (or to read quoted fields). pandas is never
imported.
"""

from __future__ import annotations

import csv
import re
import warnings
from pathlib import Path

import numpy as np

from servesim.errors import TraceError
from servesim.workload.rawtrace import MAX_TOKEN_COUNT, RawTrace, read_trace_text, too_many_tokens

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_EXAMPLE_TIME = "2023-11-16 18:17:03.9799600"
_NAT = np.iinfo(np.int64).min
#: A timestamp starts with its date: numpy reads a bare number ("0", "1700000000") as a year
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]|$)")


def read_azure_csv(path: str | Path, require_sorted: bool = True) -> RawTrace:
    """Read an Azure LLM inference trace CSV.

    Args:
        path: the CSV file.
        require_sorted: refuse rows not sorted by TIMESTAMP (a replay); False for a file read for its
            lengths only, whose order does not matter.

    Returns:
        A :class:`RawTrace` with ``time_s`` = seconds since the first row (float64, shape ``(N,)``) and the
        token columns as written (int64, >= 0).

    Raises:
        TraceError: one line naming the file and line: empty file, missing column, wrong number of fields,
            unparseable timestamp, mixed naive/offset timestamps, non-integer or negative token count,
            rows not sorted by TIMESTAMP (with ``require_sorted``), no data rows.
    """
    p = Path(path)
    text = read_trace_text(p)
    parsed = _parse_fast(text, require_sorted)
    if parsed is None:
        parsed = _parse_checked(p, text, require_sorted)
    t_ns, prompt, output = parsed
    time_s = (t_ns - t_ns[0]).astype(np.float64) / 1e9
    return RawTrace(str(path), "azure", time_s, prompt, output)


def _offset_s(s: str) -> int | None:
    """UTC offset of a timestamp string in seconds (``Z``, ``+HH:MM``, ``-HH:MM``), None if naive."""
    if s.endswith("Z"):
        return 0
    if len(s) > 6 and s[-6] in "+-" and s[-3] == ":" and s[-5:-3].isdigit() and s[-2:].isdigit():
        sign = -1 if s[-6] == "-" else 1
        return sign * (int(s[-5:-3]) * 3600 + int(s[-2:]) * 60)
    return None


def _strip_offset(s: str) -> str:
    return s[:-1] if s.endswith("Z") else s[:-6]


def _timestamps_ns(strs: list[str]) -> np.ndarray:
    """Parse timestamps to int64 ns (UTC when offsets are given). Raises ValueError on any bad value (one
    that does not start with a date ``YYYY-MM-DD`` too: numpy would read a bare number as a year)."""
    match = _DATE.match
    if not all(match(s) for s in strs):
        raise ValueError("a timestamp without a date")
    first_offset = _offset_s(strs[0])
    with warnings.catch_warnings():
        # numpy warns (and guesses) on strings that carry an offset; make that an error here.
        warnings.simplefilter("error")
        if first_offset is None:
            t = np.array(strs, dtype="datetime64[ns]").astype(np.int64)
        else:
            suffix = "Z" if strs[0].endswith("Z") else strs[0][-6:]
            if all(s.endswith(suffix) for s in strs):
                cut = len(suffix)
                t = np.array([s[:-cut] for s in strs], dtype="datetime64[ns]").astype(np.int64)
                t -= first_offset * 1_000_000_000
            else:
                offsets = [_offset_s(s) for s in strs]
                if any(o is None for o in offsets):
                    raise ValueError("mixed naive and offset timestamps")
                t = np.array([_strip_offset(s) for s in strs], dtype="datetime64[ns]").astype(np.int64)
                t -= np.array(offsets, dtype=np.int64) * 1_000_000_000
    if (t == _NAT).any():
        raise ValueError("empty timestamp")
    return t


def _parse_fast(text: str, require_sorted: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Vectorised parse of a well-formed file; None when anything is off (the checked pass reports it)."""
    header, _, body = text.partition("\n")
    columns = [c.strip() for c in header.rstrip("\r").split(",")]
    if any(columns.count(c) != 1 for c in AZURE_COLUMNS):
        return None
    body = body.replace("\r\n", "\n").rstrip("\n")
    if not body or '"' in body:
        return None
    ncol = len(columns)
    nrows = body.count("\n") + 1
    fields = body.replace("\n", ",").split(",")
    if len(fields) != nrows * ncol:
        return None
    it, ip, io = (columns.index(c) for c in AZURE_COLUMNS)
    counts = "".join(fields[ip::ncol]) + "".join(fields[io::ncol])
    if not (counts.isascii() and counts.isdigit()):  # numpy reads 1_000, +5 and other scripts' digits too
        return None
    try:
        t_ns = _timestamps_ns(fields[it::ncol])
        prompt = np.array(fields[ip::ncol], dtype=np.int64)
        output = np.array(fields[io::ncol], dtype=np.int64)
    except (ValueError, OverflowError, TypeError, Warning):
        return None
    if prompt.min() < 0 or output.min() < 0 or max(prompt.max(), output.max()) > MAX_TOKEN_COUNT:
        return None
    if require_sorted and (np.diff(t_ns) < 0).any():
        return None
    return t_ns, prompt, output


def _parse_checked(p: Path, text: str, require_sorted: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-by-row parse that raises a TraceError naming the first bad line."""
    expected_header = ",".join(AZURE_COLUMNS)
    if not text.strip():
        raise TraceError(f"{p}: empty file (expected a header {expected_header} and one request per row)")
    lines = [line.rstrip("\r") for line in text.split("\n")]
    reader = csv.reader(lines)
    try:
        columns = [c.strip() for c in next(reader)]
    except csv.Error as exc:
        raise _csv_error(p, 1, lines, f"cannot read the CSV header ({exc})") from None
    for name in AZURE_COLUMNS:
        if name not in columns:
            got = ",".join(columns)
            raise TraceError(
                f"{p}: line 1: missing column {name!r} (expected a header with {expected_header}; got {got!r})"
            )
        if columns.count(name) > 1:  # which one holds the requests' values would be a guess
            raise TraceError(f"{p}: line 1: column {name!r} appears {columns.count(name)} times (expected once)")
    ncol = len(columns)
    it, ip, io = (columns.index(c) for c in AZURE_COLUMNS)
    times: list[int] = []
    prompts: list[int] = []
    outputs: list[int] = []
    naive: bool | None = None
    prev_str = ""
    last_line = reader.line_num
    try:
        for row in reader:
            n = reader.line_num
            if n != last_line + 1:  # the csv module joined lines: a quoted field holds a line break
                raise TraceError(f"{p}: line {last_line + 1}: a quoted field runs on to line {n} (expected one "
                                 "request per line; is a closing quote missing?)")
            last_line = n
            if not row or all(not f.strip() for f in row):
                continue
            if len(row) != ncol:
                raise TraceError(f"{p}: line {n}: expected {ncol} comma-separated fields (got {len(row)})")
            s = row[it].strip()
            row_naive = _offset_s(s) is None
            if naive is None:
                naive = row_naive
            elif row_naive != naive:
                want = "without" if naive else "with"
                raise TraceError(
                    f"{p}: line {n}: TIMESTAMP: expected a time {want} a UTC offset like the first row (got {s!r})"
                )
            try:
                t = int(_timestamps_ns([s])[0])
            except (ValueError, OverflowError, Warning):
                raise TraceError(
                    f"{p}: line {n}: TIMESTAMP: expected a date and time like {_EXAMPLE_TIME!r} (got {s!r})"
                ) from None
            if require_sorted and times and t < times[-1]:
                raise TraceError(
                    f"{p}: line {n}: TIMESTAMP {s!r} is earlier than the previous row's {prev_str!r} "
                    "(expected rows sorted by TIMESTAMP)"
                )
            prompts.append(_token_count(p, n, "ContextTokens", row[ip]))
            outputs.append(_token_count(p, n, "GeneratedTokens", row[io]))
            times.append(t)
            prev_str = s
    except csv.Error as exc:
        raise _csv_error(p, reader.line_num, lines, f"malformed CSV ({exc})") from None
    if not times:
        raise TraceError(f"{p}: no data rows after the header (expected at least one request)")
    return (
        np.array(times, dtype=np.int64),
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
    )


def _csv_error(p: Path, line: int, lines: list[str], message: str) -> TraceError:
    """The error for a line the ``csv`` module refused; a carriage return inside it is said in servesim's words
    (the module's "new-line character seen in unquoted field" speaks of its own options)."""
    if "\r" in lines[line - 1]:
        message = ("a carriage return (\\r) inside the line (expected each line to end in \\n or \\r\\n, "
                   "with no \\r elsewhere)")
    return TraceError(f"{p}: line {line}: {message}")


def _token_count(p: Path, line: int, column: str, s: str) -> int:
    digits = s.strip()
    # ASCII digits only: int() also takes 1_000, +5 and other scripts' digits
    v = int(digits) if digits.isascii() and digits.isdigit() else -1
    if v < 0:
        raise TraceError(f"{p}: line {line}: {column}: expected an integer token count >= 0 (got {s.strip()!r})")
    if v > MAX_TOKEN_COUNT:
        raise too_many_tokens(p, line, column, v)
    return v
