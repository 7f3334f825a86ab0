"""Fast CSV text from numpy columns, without pandas and without a Python loop over cells.

Each column becomes a (rows, width) ``uint8`` matrix of ASCII characters in which byte 0 means "no
character" (padding); the columns are laid side by side with commas and a newline, and the non-zero
bytes, read row by row, are the CSV text. Digits come from a lookup table of the 10,000 four-digit
groups, so the cost is a few passes over the output bytes (tens of milliseconds for 100,000 rows of a
dozen columns, against ~0.5 s for ``repr`` per cell).

Number formats: integers in full; floats in positional notation rounded to :data:`SIGNIFICANT_DIGITS`
significant digits, trailing zeros dropped (``0.0125``, ``1234.5``, ``0.000000027``, ``3``); NaN as an
empty field. A float column holding infinities or magnitudes outside ``[1e-15, 1e15)`` falls back to
``repr`` per value.

Full precision (``csv_chunks(..., full_precision=True)``, used for ``requests.csv`` and ``steps.csv``):
every float reads back as the same float64. The engine's times are whole picoseconds divided by 1e12, so
a value ``x`` for which ``p / 1e12 == x`` with ``p = rint(x * 1e12)`` is written as the exact decimal of
``p`` picoseconds (``3504.340000123457``: at most 12 decimals), which parses back to ``x`` (IEEE division
and decimal parsing are both correctly rounded); any other value (a TPOT, a share) is written with
``repr``, the shortest text that reads back as ``x``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

#: Significant digits written for floats (relative rounding error <= 5e-12).
SIGNIFICANT_DIGITS = 12
_MIN_EXP, _MAX_EXP = -15, 14
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_ZERO, _DOT, _MINUS, _COMMA, _NEWLINE = 48, 46, 45, 44, 10
# The four-digit groups 0..9999 as uint32 whose bytes are ASCII digits: rows 0..9999 in full ("0042"),
# rows 10000.. without leading zeros ("\0\042", 0 -> blank), rows 20000.. without trailing zeros.
_NO_LEADING, _NO_TRAILING = 10_000, 20_000
_GROUP_TEXT = [b"%04d" % k for k in range(10_000)]
_GROUPS32 = np.frombuffer(
    b"".join(_GROUP_TEXT)
    + b"".join(t.lstrip(b"0").rjust(4, b"\0") for t in _GROUP_TEXT)
    + b"".join(t.rstrip(b"0").ljust(4, b"\0") for t in _GROUP_TEXT),
    dtype=np.uint32)
_FPOW10 = np.array([10.0**k for k in range(40)])
_LOG10_2 = 0.30102999566398120
#: rows formatted per block: keeps the temporaries in cache and reuses their memory
CHUNK_ROWS = 8192


def _group_values(x: np.ndarray, groups: int) -> list[np.ndarray]:
    """Base-10,000 digits of non-negative whole numbers ``x``, most significant first (``groups`` of them).

    ``x`` is float64 (whole numbers below 2**53, or multiples of 10**4 below 2**57: every quotient and
    remainder is then exact, and float division is several times faster than int64 division) or int64.
    """
    values = []
    rest = x
    for _ in range(groups):
        if rest.dtype.kind == "f":
            high = np.floor(rest / 10_000.0)
            values.append((rest - high * 10_000.0).astype(np.intp))
        else:
            high = rest // 10_000
            values.append(rest - high * 10_000)
        rest = high
    return values[::-1]


def _integer_chars(x: np.ndarray, width: int) -> np.ndarray:
    """(n, 4*ceil(width/4)) characters of non-negative whole ``x`` < 10**width, leading zeros blanked.

    Zero is written as ``0``.
    """
    groups = max(-(-width // 4), 1)
    out = np.empty((x.shape[0], groups), dtype=np.uint32)
    leading = np.ones(x.shape, dtype=bool)  # all more significant groups are zero
    for g, v in enumerate(_group_values(x, groups)):
        out[:, g] = _GROUPS32[v + _NO_LEADING * leading]
        leading &= v == 0
    chars = out.view(np.uint8)
    chars[:, -1] |= leading.view(np.uint8) * np.uint8(_ZERO)  # x == 0 -> "0"
    return chars


def _fraction_chars(x: np.ndarray, digits: int) -> np.ndarray:
    """(n, 4*ceil(digits/4)) characters of the ``digits``-digit fraction ``x`` (left-aligned, zero-padded),
    trailing zeros blanked; a zero fraction is all blank. Groups blank in every row are dropped."""
    groups = -(-digits // 4)
    x = x * float(10 ** (4 * groups - digits))
    out = np.empty((x.shape[0], groups), dtype=np.uint32)
    trailing = np.ones(x.shape, dtype=bool)  # all less significant groups are zero
    used = groups
    for g, v in reversed(list(enumerate(_group_values(x, groups)))):
        out[:, g] = _GROUPS32[v + _NO_TRAILING * trailing]
        trailing &= v == 0
        if trailing.all():
            used = g  # this group and all later ones are blank in every row
    return out[:, :used].view(np.uint8)


def _width(top: int) -> int:
    return max(len(str(top)), 1)


def _int_chars(x: np.ndarray) -> np.ndarray:
    """(n, width) characters of an integer column (0 = no character)."""
    x = x.astype(np.int64, copy=False)
    neg = x < 0
    mag = np.abs(x)
    top = int(mag.max())
    digits = _integer_chars(mag.astype(np.float64) if top < 2**53 else mag, _width(top))
    if not neg.any():
        return digits
    sign = neg.view(np.uint8) * np.uint8(_MINUS)
    return np.concatenate([sign[:, None], digits], axis=1)  # padding between sign and digits is blank


def _fallback_chars(x: np.ndarray) -> np.ndarray:
    """(n, width) characters via ``repr`` per value (NaN -> empty); only for unusual float columns."""
    text = ["" if v != v else repr(v) for v in x.tolist()]
    arr = np.array(text, dtype="S")
    width = max(arr.dtype.itemsize, 1)
    return arr.astype(f"S{width}").view(np.uint8).reshape(len(text), width)


def _scale(a: np.ndarray, exp10: np.ndarray) -> np.ndarray:
    """``a * 10**exp10`` elementwise (one rounding for |exp10| <= 22, where powers of ten are exact)."""
    up = a * _FPOW10[np.maximum(exp10, 0)]
    down = a / _FPOW10[np.maximum(-exp10, 0)]
    return np.where(exp10 >= 0, up, down)


def _decimal_exponent(a: np.ndarray) -> np.ndarray:
    """floor(log10(a)) for positive finite ``a``, possibly one too low (callers correct it)."""
    _, exp2 = np.frexp(a)  # a = f * 2**exp2, 0.5 <= f < 1
    e = np.floor((exp2 - 1) * _LOG10_2).astype(np.int64)
    e += a >= _scale(np.ones_like(a), e + 1)
    return e


def _float_parts(x: np.ndarray, sig: int = SIGNIFICANT_DIGITS) -> list[np.ndarray]:
    """Character blocks (each (n, width_i), 0 = no character) of a float column, left to right.

    With ``m`` the value rounded to ``sig`` significant digits as an integer and ``e`` its decimal
    exponent, the text is ``[-]I[.ZF]``: integer part ``I``, then ``Z`` = ``max(0, -e - 1)`` zeros and the
    fraction digits ``F`` (trailing zeros removed), each laid out in a fixed-width block padded with 0.
    """
    x = x.astype(np.float64, copy=False)
    nan = np.isnan(x)
    if np.isinf(x).any():
        return [_fallback_chars(x)]
    nonzero = ~nan & (x != 0)
    a = np.where(nonzero, np.abs(x), 1.0)
    e = _decimal_exponent(a)
    if e.min() < _MIN_EXP or e.max() > _MAX_EXP:
        return [_fallback_chars(x)]
    m = np.rint(_scale(a, sig - 1 - e))
    for _ in range(2):  # e may be one off; rounding may carry into a new digit (9.99.. -> 10.0)
        high = m >= _POW10[sig]
        low = m < _POW10[sig - 1]
        if not (high.any() or low.any()):
            break
        e = e + high - low
        m = np.rint(_scale(a, sig - 1 - e))
    m = np.where(nonzero, m, 0.0)  # whole numbers < 10**sig, exact in float64
    e = np.where(nonzero, e, 0)
    frac_digits = np.minimum(np.maximum(sig - 1 - e, 0), sig)  # digits of m after the decimal point
    head = np.floor(m / _FPOW10[frac_digits])  # exact: see _group_values
    fraction = (m - head * _FPOW10[frac_digits]) * _FPOW10[sig - frac_digits]  # left-aligned in sig digits
    integer = np.where(e >= sig - 1, m * _FPOW10[np.maximum(e - sig + 1, 0)], head)
    zeros = np.maximum(-e - 1, 0)
    parts = [(nonzero & (x < 0)).view(np.uint8)[:, None] * np.uint8(_MINUS),
             _integer_chars(integer, _width(int(integer.max()))),
             (fraction != 0).view(np.uint8)[:, None] * np.uint8(_DOT)]
    zero_width = int(zeros.max())
    if zero_width:
        parts.append((np.arange(zero_width)[None, :] < zeros[:, None]).view(np.uint8) * np.uint8(_ZERO))
    parts.append(_fraction_chars(fraction, sig))
    parts[1][nan] = 0  # NaN: m = 0 wrote "0"; every other part is already blank
    return parts


_PS_PER_S = 10**12
_PS_LIMIT = float(2**53)  # picosecond counts below this are exact in float64


def _exact_float_parts(x: np.ndarray) -> list[np.ndarray]:
    """Character blocks of a float column written at full precision (see the module docstring)."""
    x = x.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        ps = np.rint(x * float(_PS_PER_S))
        on_grid = np.isfinite(ps) & (np.abs(ps) < _PS_LIMIT) & (ps / float(_PS_PER_S) == x)
    on_grid &= ~np.isnan(x)
    magnitude = np.where(on_grid, np.abs(ps), 0.0).astype(np.int64)
    whole = magnitude // _PS_PER_S
    fraction = (magnitude - whole * _PS_PER_S).astype(np.float64)  # 12 digits, exact in float64
    parts = [(on_grid & (x < 0)).view(np.uint8)[:, None] * np.uint8(_MINUS),
             _integer_chars(whole.astype(np.float64), _width(int(whole.max()) if whole.size else 0)),
             (fraction != 0).view(np.uint8)[:, None] * np.uint8(_DOT),
             _fraction_chars(fraction, 12)]
    off = ~on_grid & ~np.isnan(x)
    if not (off.any() or np.isnan(x).any()):
        return parts
    grid_chars = np.concatenate(parts, axis=1)
    grid_chars[~on_grid] = 0  # NaN -> empty; off-grid rows are filled below
    if not off.any():
        return [grid_chars]
    other = _fallback_chars(np.where(off, x, np.nan))
    width = max(grid_chars.shape[1], other.shape[1])
    chars = np.zeros((x.shape[0], width), dtype=np.uint8)
    chars[:, :grid_chars.shape[1]] = grid_chars
    chars[off] = 0
    chars[off, :other.shape[1]] = other[off]
    return [chars]


def column_parts(x: np.ndarray, full_precision: bool = False) -> list[np.ndarray]:
    """Character blocks of one column, (n, width_i) uint8 each (0 = padding), to be laid side by side:
    ints in full, floats per this module's format (round-tripping every float64 with ``full_precision``)."""
    x = np.asarray(x)
    if x.dtype.kind == "b":
        x = x.astype(np.int64)
    if x.dtype.kind in "iu":
        return [_int_chars(x)]
    if x.dtype.kind == "f":
        return _exact_float_parts(x) if full_precision else _float_parts(x)
    raise TypeError(f"cannot write a column of dtype {x.dtype} as CSV")


def csv_chunks(columns: dict[str, np.ndarray], full_precision: bool = False) -> list[bytes]:
    """The CSV text (header line, then one ``\\n``-terminated line per row) as a list of byte chunks
    (:func:`iter_csv_chunks`, collected)."""
    return list(iter_csv_chunks(columns, full_precision))


def iter_csv_chunks(columns: dict[str, np.ndarray], full_precision: bool = False) -> Iterator[bytes]:
    """The CSV text (header line, then one ``\\n``-terminated line per row), one byte chunk at a time.

    The header comes first, then one chunk per :data:`CHUNK_ROWS` rows, each formatted when it is asked
    for: writing the chunks as they come holds one chunk's text in memory, never the whole file's.

    Args:
        columns: name -> 1-D int, bool or float array, all of shape (n,). Names must not contain commas,
            quotes or newlines.
        full_precision: write floats so that they read back as the same float64 (see the module
            docstring) instead of rounded to :data:`SIGNIFICANT_DIGITS` digits.

    Raises:
        ValueError: columns of different lengths.
        TypeError: a column that is not int, bool or float.
    """
    header = (",".join(columns) + "\n").encode("ascii")
    arrays = [np.asarray(c) for c in columns.values()]
    lengths = {a.shape[0] for a in arrays}
    if len(lengths) > 1:
        raise ValueError(f"CSV columns have different lengths: {sorted(lengths)}")
    return _chunks(header, arrays, lengths.pop() if lengths else 0, full_precision)


def _chunks(header: bytes, arrays: list[np.ndarray], n: int, full_precision: bool) -> Iterator[bytes]:
    yield header
    for lo in range(0, n, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, n - lo)
        comma = np.full((rows, 1), _COMMA, dtype=np.uint8)
        parts = []
        for a in arrays:
            parts.extend(column_parts(a[lo:lo + rows], full_precision))
            parts.append(comma)
        parts[-1] = np.full((rows, 1), _NEWLINE, dtype=np.uint8)
        yield np.concatenate(parts, axis=1).tobytes().translate(None, b"\x00")


def csv_bytes(columns: dict[str, np.ndarray], full_precision: bool = False) -> bytes:
    """The CSV file as one bytes object (see :func:`csv_chunks`)."""
    return b"".join(csv_chunks(columns, full_precision))
