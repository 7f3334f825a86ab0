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
and decimal parsing are both correctly rounded); any other value (a TPOT, a share, a difference of two
times) is written as ``repr`` writes it, the shortest text that reads back as ``x``: computed for whole
columns at once (:func:`shortest_digits`, checked against ``repr``), with ``repr`` itself for the few
values that computation cannot settle.
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


def _group_table() -> np.ndarray:
    """The 30,000 four-digit groups above as uint32 (built with numpy: a loop of 30,000 byte strings took
    a noticeable share of ``servesim run``'s start-up)."""
    groups = np.arange(10_000)
    digits = (groups[:, None] // np.array([1000, 100, 10, 1])) % 10  # (10000, 4), most significant first
    zero = digits == 0
    full = (digits + _ZERO).astype(np.uint8)
    no_leading = np.where(np.cumprod(zero, axis=1).astype(bool), 0, full).astype(np.uint8)
    no_trailing = np.where(np.cumprod(zero[:, ::-1], axis=1)[:, ::-1].astype(bool), 0, full).astype(np.uint8)
    return np.concatenate([full, no_leading, no_trailing]).view(np.uint32).ravel()


_GROUPS32 = _group_table()
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
    """(n, max(width, 1)) characters of non-negative whole ``x`` < 10**width, leading zeros blanked.

    Zero is written as ``0``. (The digit groups fill 4*ceil(width/4) columns; those left of ``width`` are
    blank in every row and are left out, so that less padding is copied and dropped.)
    """
    groups = max(-(-width // 4), 1)
    out = np.empty((x.shape[0], groups), dtype=np.uint32)
    leading = np.ones(x.shape, dtype=bool)  # all more significant groups are zero
    for g, v in enumerate(_group_values(x, groups)):
        out[:, g] = _GROUPS32[v + _NO_LEADING * leading]
        leading &= v == 0
    chars = out.view(np.uint8)
    chars[:, -1] |= leading.view(np.uint8) * np.uint8(_ZERO)  # x == 0 -> "0"
    return chars[:, 4 * groups - max(width, 1):]


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


#: numpy's long double has a 64-bit (x87 extended) or wider significand, which the exact shortest ``repr``
#: below needs; elsewhere (where it is plain double) every value goes to ``repr``.
_WIDE_LONG_DOUBLE = np.finfo(np.longdouble).nmant >= 63


def _long_double_powers_of_ten() -> np.ndarray:
    """10**0 .. 10**27 as long doubles, each exact (5**27 < 2**63), built by exact multiplications."""
    powers = [np.longdouble(1)]
    for _ in range(27):
        powers.append(powers[-1] * np.longdouble(10))
    return np.array(powers, dtype=np.longdouble)


_LD_POW10 = _long_double_powers_of_ten()


def shortest_digits(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The digits of ``repr`` (Python's shortest round-tripping text) of positive floats, vectorised.

    A home-made replacement for ``repr`` per value (issue 13: about 5 times faster on the off-grid columns
    of ``requests.csv``); ``tests/test_csv_shortest.py`` checks it against ``repr`` on hundreds of
    thousands of values. Python's ``repr`` is the shortest decimal that reads back as the same float64,
    the closest to it among those of that length (David Gay's ``dtoa``, mode 0). With ``e`` the decimal
    exponent and ``c_n`` the float correctly rounded to ``n`` significant digits:

    * at most one decimal of 15 or fewer significant digits lies in a float64's rounding interval (its
      width, one unit in the last place, is below the spacing of 15-digit decimals), so if ``c_15``
      reads back, ``repr`` is ``c_15`` without its trailing zeros;
    * otherwise ``c_16`` if it reads back (the closest 16-digit decimal, in a rounding interval that is
      symmetric around the float unless the float is a power of two), else ``c_17`` (always reads back).

    ``c_17`` and the read-backs are computed in numpy's long double (64-bit significand):
    ``t = a * 10**(16 - e)`` and ``c_n / 10**(16 - e)`` are one correctly rounded operation each on exact
    operands, and ``c_16``, ``c_15`` follow from ``c_17`` in integers (the sign of ``t - c_17`` settles a
    trailing 5). A value is left to ``repr`` (``exact`` False) when that is not provably the right answer:
    ``t`` within its rounding error of a half-integer, a read-back exactly on the boundary of the rounding
    interval, ``c_n`` rounding up to ``10**n``, ``a`` a power of two (an asymmetric interval), or ``a``
    outside ``[1e-4, 1e15)`` (``repr`` writes an exponent from 1e16 on).

    Args:
        a: float64, shape (n,), positive and finite.

    Returns:
        (digits, exponent, exact): int64 (n,) the significant digits as an integer left-aligned to 17
        digits (``1.25`` -> ``12500000000000000``), int64 (n,) the decimal exponent of the first digit
        (``1.25`` -> 0, ``0.0125`` -> -2), bool (n,) where the two are exact (elsewhere undefined).
    """
    a = np.asarray(a, dtype=np.float64)
    exact = (a >= 1e-4) & (a < 1e15) & (np.frexp(a)[0] != 0.5)
    if not _WIDE_LONG_DOUBLE:
        exact[:] = False
    a = np.where(exact, a, 1.0)
    e = _decimal_exponent(a)  # -4 <= e <= 14
    wide = a.astype(np.longdouble)
    scale = _LD_POW10[16 - e]
    t = wide * scale  # 10**16 <= t < 10**17, |t - a * 10**(16 - e)| <= t * 2**-64 < 0.0055
    c17 = np.rint(t)
    above = (t - c17).astype(np.float64)  # exact: t - c17 is a short difference
    tolerance = 0.011  # twice the rounding error of t
    exact &= (np.abs(np.abs(above) - 0.5) >= tolerance) & (c17 < _LD_POW10[17])
    c17 = np.where(exact, c17, _LD_POW10[16]).astype(np.int64)
    half_ulp = np.spacing(a) / 2  # the rounding interval is a +- half_ulp
    digits = np.zeros(a.shape, dtype=np.int64)
    undecided = exact.copy()
    for n in (15, 16, 17):
        unit = 10 ** (17 - n)
        low, rest = np.divmod(c17, unit)
        if unit > 1:  # round c17 to n digits; a trailing 5 (0.5 of the unit) goes by the sign of t - c17
            tie = rest == unit // 2
            exact &= ~(tie & (np.abs(above) < tolerance))
            low += (rest > unit // 2) | (tie & (above > 0))
        candidate = low * unit  # c_n, left-aligned to 17 digits
        # c_n / 10**k rounds once and never across a +- half_ulp (both exact in long double); the difference
        # is exact in float64. It reads back as a iff it lies strictly inside; on the boundary it is left
        distance = np.abs((candidate.astype(np.longdouble) / scale - wide).astype(np.float64))
        exact &= ~(undecided & ((distance == half_ulp) | (candidate >= 10**17)))
        undecided &= exact
        take = undecided & (distance < half_ulp)
        digits[take] = candidate[take]
        undecided &= ~take
    exact &= ~undecided  # c_17 always reads back: a row left here would be a flaw, and goes to repr
    return digits, e, exact


def _repr_layouts() -> np.ndarray:
    """Where each character of ``repr``'s positional text comes from, for every (exponent, digits) pair.

    Row ``[e + 4, s]`` (decimal exponent ``-4 <= e <= 14`` of the first digit, ``1 <= s <= 17``
    significant digits) lists, left to right, columns of a source row that holds the 17 digits (columns
    0-16, zero-padded), then ``0``, ``.`` and a blank (columns 17, 18, 19): ``ddd.ddd``, ``ddd.0`` when
    every digit is before the point, ``0.000ddd`` below 1; blank-padded to 22 characters.
    """
    zero, dot, blank = 17, 18, 19
    layouts = np.full((19, 18, 22), blank, dtype=np.intp)
    for e in range(-4, 15):
        for s in range(1, 18):
            if e >= 0:
                fraction = list(range(e + 1, s)) or [zero]
                text = list(range(e + 1)) + [dot] + fraction
            else:
                text = [zero, dot] + [zero] * (-e - 1) + list(range(s))
            layouts[e + 4, s, :len(text)] = text
    return layouts


_REPR_LAYOUTS = _repr_layouts()


def _shortest_chars(x: np.ndarray) -> np.ndarray:
    """(n, width) characters of ``repr`` of each float (NaN -> empty), as :func:`_fallback_chars` writes
    them, with the exact vectorised digits of :func:`shortest_digits` and ``repr`` for the rest."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x) & (x != 0)
    digits, e, exact = shortest_digits(np.where(finite, np.abs(x), 1.0))
    exact &= finite
    if not exact.any():
        return _fallback_chars(x)
    # every row is laid out (those not exact hold harmless digits) and then blanked or overwritten
    n = x.shape[0]
    source = np.empty((n, 20), dtype=np.uint8)
    source[:, :17] = _GROUPS32[np.stack(_group_values(digits, 5), axis=1)].view(np.uint8)[:, 3:]
    source[:, 17:] = (_ZERO, _DOT, 0)
    significant = 17 - np.argmax(source[:, 16::-1] != _ZERO, axis=1)  # digits without the trailing zeros
    layout = _REPR_LAYOUTS[e + 4, significant] + (np.arange(n) * 20)[:, None]
    chars = np.empty((n, 23), dtype=np.uint8)
    chars[:, 0] = (x < 0).view(np.uint8) * np.uint8(_MINUS)
    chars[:, 1:] = source.ravel()[layout]
    chars[~exact] = 0
    rest = ~exact & ~np.isnan(x)
    if not rest.any():
        return chars
    other = _fallback_chars(x[rest])
    if other.shape[1] > chars.shape[1]:
        chars = np.concatenate([chars, np.zeros((n, other.shape[1] - chars.shape[1]), np.uint8)], axis=1)
    chars[rest, :other.shape[1]] = other
    return chars


_PS_PER_S = 10**12
#: Picosecond counts written as their decimal up to this bound (about 4.6e6 s; their int64 conversion and
#: magnitude stay exact). Above 2**53 ps (9,007 s) a float64 time no longer holds every picosecond, but the
#: rule still holds: ``P = rint(x * 1e12)`` is a whole float, and when ``P / 1e12 == x`` the decimal of
#: ``P`` picoseconds parses back to ``x`` (both operations correctly rounded), so long runs write their
#: times the same way, as whole picoseconds.
_PS_LIMIT = float(2**62)


def _exact_float_parts(x: np.ndarray) -> list[np.ndarray]:
    """Character blocks of a float column written at full precision (see the module docstring)."""
    x = x.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        ps = np.rint(x * float(_PS_PER_S))
        on_grid = np.isfinite(ps) & (np.abs(ps) < _PS_LIMIT) & (ps / float(_PS_PER_S) == x)
    on_grid &= ~np.isnan(x)
    if not on_grid.any():  # a latency column (differences of times): no exact picosecond to write
        return [_shortest_chars(x)]
    magnitude = np.where(on_grid, np.abs(ps), 0.0).astype(np.int64)
    whole = magnitude // _PS_PER_S
    fraction = (magnitude - whole * _PS_PER_S).astype(np.float64)  # 12 digits, exact in float64
    negative = on_grid & (x < 0)
    parts = [negative.view(np.uint8)[:, None] * np.uint8(_MINUS)] if negative.any() else []
    parts += [_integer_chars(whole.astype(np.float64), _width(int(whole.max()) if whole.size else 0)),
             (fraction != 0).view(np.uint8)[:, None] * np.uint8(_DOT),
             _fraction_chars(fraction, 12)]
    off = ~on_grid & ~np.isnan(x)
    if not (off.any() or np.isnan(x).any()):
        return parts
    grid_chars = np.concatenate(parts, axis=1)
    grid_chars[~on_grid] = 0  # NaN -> empty; off-grid rows are filled below
    if not off.any():
        return [grid_chars]
    other = _shortest_chars(np.where(off, x, np.nan))
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
