"""The vectorised shortest ``repr`` of :mod:`servesim.metrics.csv_text` (issue 13) against Python's ``repr``.

``shortest_digits`` replaces ``repr`` per value for the off-grid float columns of ``requests.csv`` (TTFT,
TPOT, E2E, queueing delay); the CSV must stay byte-identical, so every value it writes itself is compared
with ``repr`` here, over values chosen to hit its hard cases (ties, powers of ten and two, 15/16/17-digit
shortest forms, the exponent limits of positional notation).
"""

from __future__ import annotations

import numpy as np
import pytest

from servesim.metrics.csv_text import _WIDE_LONG_DOUBLE, _fallback_chars, _shortest_chars, shortest_digits


def _texts(chars: np.ndarray) -> list[bytes]:
    return [bytes(row).replace(b"\0", b"") for row in chars]


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(np.random.SeedSequence(1313))
    n = 40_000
    bits = rng.integers(0, 2**63, n, dtype=np.int64).view(np.float64)
    exponents = rng.integers(-6, 18, n).astype(np.float64)
    ps = rng.integers(0, 4 * 10**15, n)
    short = rng.random(n) * 10.0 ** rng.integers(-5, 16, n)
    return {
        "random bit patterns": bits[np.isfinite(bits)],
        "every decade": 10.0**exponents * (1 + rng.random(n)),
        "powers of ten and their neighbours": np.concatenate(
            [10.0**exponents, np.nextafter(10.0**exponents, 0), np.nextafter(10.0**exponents, np.inf)]),
        "differences of picosecond times (the TTFT column)": (ps + rng.integers(1, 10**10, n)) / 1e12 - ps / 1e12,
        "ratios (the TPOT column)": rng.integers(1, 10**12, n) / 1e12 / rng.integers(1, 2000, n),
        "short decimals of 1 to 17 digits": np.array(
            [float(f"{v:.{d}g}") for v, d in zip(short, rng.integers(1, 18, n))]),
        "powers of two": np.ldexp(1.0, rng.integers(-20, 50, 2000)),
        "negatives and specials": np.concatenate([-rng.random(2000) * 100, [
            0.0, -0.0, np.nan, np.inf, -np.inf, 1e-5, 1e-4, 9.999e-5, 0.0001234, 1e15, 1e16, 9999999999999998.0,
            999999999999999.9, 0.1, 0.2, 0.3, 1 / 3, 2 / 3, 1.5, 2.0, 3.0, 100.0, 0.5, 5e-324, 1.7976931348623157e308]]),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_shortest_chars_writes_what_repr_writes(name):
    x = _cases()[name]
    assert _texts(_shortest_chars(x)) == _texts(_fallback_chars(x))


def test_the_vectorised_digits_decide_nearly_every_ordinary_value():
    """The comparison above means something only if the vectorised path, not the repr fallback, wrote the
    values: it must decide at least 95% of TTFT-like values (about 97.5% on x86-64)."""
    if not _WIDE_LONG_DOUBLE:
        pytest.skip("numpy's long double is plain double here: every value goes to repr")
    x = _cases()["differences of picosecond times (the TTFT column)"]
    digits, exponent, exact = shortest_digits(x)
    assert exact.mean() > 0.95
    # and the digits themselves: 17-digit integer and first-digit exponent, read back as repr's digits
    for value, d, e in list(zip(x[exact], digits[exact], exponent[exact]))[:2000]:
        text = repr(float(value))
        mantissa = text.replace(".", "").lstrip("0").rstrip("0")
        assert str(d).rstrip("0") == mantissa
        assert 10.0**e <= value < 10.0 ** (e + 1)


def test_out_of_range_and_powers_of_two_go_to_repr():
    _, _, exact = shortest_digits(np.array([1e15, 2e16, 5e-5, 0.5, 1024.0, 0.3]))
    assert exact.tolist() == [False, False, False, False, False, _WIDE_LONG_DOUBLE]


def test_the_digit_group_table_is_the_formatted_groups():
    """``_GROUPS32`` (built with numpy at import) holds ``%04d`` of 0..9999, then without leading zeros,
    then without trailing zeros, each blank-padded to four bytes."""
    from servesim.metrics.csv_text import _GROUPS32

    text = [b"%04d" % k for k in range(10_000)]
    expected = (b"".join(text) + b"".join(t.lstrip(b"0").rjust(4, b"\0") for t in text)
                + b"".join(t.rstrip(b"0").ljust(4, b"\0") for t in text))
    assert _GROUPS32.tobytes() == expected


def test_without_a_wide_long_double_every_value_goes_to_repr(monkeypatch):
    """Where numpy's long double is plain double (Windows, macOS on ARM), the exact path is off."""
    import servesim.metrics.csv_text as csv_text

    monkeypatch.setattr(csv_text, "_WIDE_LONG_DOUBLE", False)
    x = _cases()["differences of picosecond times (the TTFT column)"][:500]
    assert not csv_text.shortest_digits(x)[2].any()
    assert _texts(csv_text._shortest_chars(x)) == _texts(_fallback_chars(x))
