"""Tests of servesim.workload: trace loaders, arrival processes, length distributions, configs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.input_files import validate
from servesim.errors import ConfigError, TraceError
from servesim.workload import (
    EmpiricalLengthConfig,
    FixedLengthConfig,
    LognormalLength,
    LognormalLengthConfig,
    UniformLengthConfig,
    Workload,
    build_workload,
    gamma_arrivals,
    load_trace,
    load_workload,
    load_workload_config,
    poisson_arrivals,
    read_trace,
)
from servesim.workload.build import WorkloadFile
from servesim.workload.trace import spread_buckets

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "workloads" / "traces"
DATA = Path(__file__).resolve().parent / "data" / "workload"
AZURE_CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = TRACES / "AzureLLMInferenceTrace_code.csv"
MOONCAKE_CONV = TRACES / "conversation_trace.jsonl"
MOONCAKE_SYN = TRACES / "synthetic_trace.jsonl"


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def cfg(data: dict):
    return validate(WorkloadFile, data, "test.yaml").root


def mooncake_rows(path: Path) -> list[dict]:
    """Independent stdlib read of a Mooncake file (to check the loader against)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------ shipped traces


def test_shipped_traces_are_byte_copies():
    # SHA-256 sums from workloads/traces/SOURCES.md.
    expected = {
        AZURE_CODE: "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        AZURE_CONV: "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        MOONCAKE_CONV: "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        MOONCAKE_SYN: "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
    }
    for path, digest in expected.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, path.name
    assert (TRACES / "licenses" / "AzurePublicDataset-LICENSE-CC-BY-4.0.txt").is_file()
    assert (TRACES / "licenses" / "Mooncake-LICENSE-APACHE-2.0.txt").is_file()


@pytest.mark.parametrize(
    "path, rows, span_s, prompt_mean, output_mean",
    [
        # rows, span, and means as stated in SOURCES.md (rounded there).
        (AZURE_CODE, 8819, 3436, 2048, 28),
        (AZURE_CONV, 19366, 3502, 1155, 211),
        (MOONCAKE_CONV, 12031, 3537, 12035, None),
        (MOONCAKE_SYN, 3993, 1022, None, None),
    ],
)
def test_shipped_trace_counts_span_and_means(path, rows, span_s, prompt_mean, output_mean):
    w = load_trace(path, bucket_policy="burst")
    assert len(w) == rows
    assert w.concurrency is None
    assert w.arrival_s[0] == 0.0
    assert round(w.arrival_s[-1]) == span_s
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.dtype == np.int64 and w.output_tokens.dtype == np.int64
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1
    if prompt_mean is not None:
        assert abs(w.prompt_tokens.mean() - prompt_mean) < 0.5
    if output_mean is not None:
        assert abs(w.output_tokens.mean() - output_mean) < 0.5
    assert str(rows) in w.description


def test_azure_percentiles_and_exact_times_from_the_file_text():
    conv = load_trace(AZURE_CONV)
    # SOURCES.md: conv input p99 4,142, output p99 601, output max 1,000; code: input p99 7,436, median out 13.
    assert np.percentile(conv.prompt_tokens, 99) == pytest.approx(4142, abs=0.5)
    assert np.percentile(conv.output_tokens, 99) == pytest.approx(601, abs=0.5)
    assert conv.output_tokens.max() == 1000
    # First rows: 18:15:46.6805900 and 18:15:50.9951690; last: 19:14:08.4025270.
    assert conv.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)
    assert conv.arrival_s[-1] == pytest.approx((19 - 18) * 3600 + (14 - 15) * 60 + 8.4025270 - 46.6805900, abs=1e-9)
    code = load_trace(AZURE_CODE)
    assert np.percentile(code.prompt_tokens, 99) == pytest.approx(7436, abs=0.5)
    assert np.median(code.output_tokens) == 13
    # 18:17:03.9799600 -> 18:17:04.0319600: the 7th fractional digit is kept (100 ns resolution).
    assert code.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert code.meta is not None and code.meta.num_clamped_output == 0 and code.meta.num_clamped_prompt == 0


def test_mooncake_matches_stdlib_read_and_sources_facts():
    rows = mooncake_rows(MOONCAKE_CONV)
    w = load_trace(MOONCAKE_CONV, bucket_policy="burst", prefix_block_ids=True)
    ts = np.array([r["timestamp"] for r in rows], dtype=float) / 1000
    np.testing.assert_array_equal(w.arrival_s, ts - ts[0])
    np.testing.assert_array_equal(w.prompt_tokens, [r["input_length"] for r in rows])
    np.testing.assert_array_equal(w.output_tokens, [r["output_length"] for r in rows])
    assert len(np.unique(w.arrival_s)) == 1180  # SOURCES.md: 1,180 distinct timestamps
    ids = w.meta.prefix_block_ids
    assert ids is not None and len(ids) == 12031
    assert all(len(h) == math.ceil(p / 512) for h, p in zip(ids, w.prompt_tokens))
    # SOURCES.md: with an unbounded cache 36.6% of the blocks are reuses.
    total = sum(len(h) for h in ids)
    unique = len({b for h in ids for b in h})
    assert abs((total - unique) / total - 0.366) < 0.0005
    # without the option the block ids are not kept
    assert load_trace(MOONCAKE_CONV).meta.prefix_block_ids is None


# ------------------------------------------------------------------------------ replay options


def test_rate_scale_divides_arrival_times():
    base = load_trace(AZURE_CONV)
    fast = load_trace(AZURE_CONV, rate_scale=4.0)
    np.testing.assert_allclose(fast.arrival_s, base.arrival_s / 4.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fast.prompt_tokens, base.prompt_tokens)
    assert "rate x4" in fast.description
    # mean rate over the span scales by 4
    assert (len(fast) - 1) / fast.arrival_s[-1] == pytest.approx(4 * (len(base) - 1) / base.arrival_s[-1])


def test_window_is_on_the_original_timeline_then_rebased_and_scaled():
    base = load_trace(AZURE_CONV)
    t = base.arrival_s
    inside = (t >= 600) & (t < 900)
    w = load_trace(AZURE_CONV, start_s=600, duration_s=300, rate_scale=2.0)
    assert len(w) == inside.sum() > 0
    np.testing.assert_allclose(w.arrival_s, (t[inside] - 600) / 2.0, atol=1e-12)
    np.testing.assert_array_equal(w.output_tokens, base.output_tokens[inside])
    assert w.arrival_s.min() >= 0 and w.arrival_s.max() < 150
    # open-ended window
    tail = load_trace(AZURE_CONV, start_s=3000)
    assert len(tail) == (t >= 3000).sum()



def test_window_excludes_its_end_and_the_clamp_counts_are_the_files():
    # azure_zero_tokens.csv: rows at 0, 1 and 2 s; (100, 0), (0, 7), (50, 3). The window [1, 2) keeps the row at
    # 1 s only (the one at exactly 2 s is outside); the rows raised to 1 token are counted over the whole
    # file ("in the file"), so the zero output at 0 s counts although it is outside the window
    w = load_trace(DATA / "azure_zero_tokens.csv", start_s=1.0, duration_s=1.0)
    assert w.arrival_s.tolist() == [0.0]
    assert w.prompt_tokens.tolist() == [1] and w.output_tokens.tolist() == [7]
    assert w.meta.num_clamped_prompt == 1 and w.meta.num_clamped_output == 1


def test_max_requests_keeps_the_first_n_of_the_window():
    base = load_trace(AZURE_CONV)
    first_in = int(np.searchsorted(base.arrival_s, 100.0))
    w = load_trace(AZURE_CONV, start_s=100, max_requests=50)
    assert len(w) == 50
    np.testing.assert_array_equal(w.prompt_tokens, base.prompt_tokens[first_in : first_in + 50])
    assert len(load_trace(AZURE_CONV, max_requests=10**9)) == 19366


def test_empty_window_is_a_trace_error_naming_the_file():
    with pytest.raises(TraceError, match=r"AzureLLMInferenceTrace_conv\.csv: no request in the window"):
        load_trace(AZURE_CONV, start_s=10_000)


def test_bucket_policies_on_a_small_file():
    path = DATA / "mooncake_buckets.jsonl"  # timestamps 0, 0, 0, 3000, 6000, 6000 ms
    burst = load_trace(path, bucket_policy="burst")
    np.testing.assert_array_equal(burst.arrival_s, [0, 0, 0, 3, 6, 6])
    spread = load_trace(path, bucket_policy="spread")
    # w = 3 s (smallest gap between distinct timestamps); request i of m at T + i*w/m
    np.testing.assert_allclose(spread.arrival_s, [0, 1, 2, 3, 6, 7.5], atol=1e-12)
    assert spread.meta.bucket_width_s == 3.0 and spread.meta.bucket_policy == "spread"
    # the zero output length is raised to 1 and counted
    assert spread.output_tokens[-1] == 1 and spread.meta.num_clamped_output == 1
    assert "1 zero outputs" in spread.description
    ids = load_trace(path, prefix_block_ids=True, max_requests=3).meta.prefix_block_ids
    assert ids == [[0], [0, 1], [2, 3]]
    with_scale = load_trace(path, rate_scale=2.0)
    np.testing.assert_allclose(with_scale.arrival_s, [0, 0.5, 1, 1.5, 3, 3.75], atol=1e-12)


def test_spread_on_the_conversation_trace():
    rows = mooncake_rows(MOONCAKE_CONV)
    ts = np.array([r["timestamp"] for r in rows], dtype=float) / 1000
    distinct = np.unique(ts)
    width = np.diff(distinct).min()  # independent of the loader
    w = load_trace(MOONCAKE_CONV)  # spread is the default
    assert w.meta.bucket_width_s == pytest.approx(width)
    assert width == pytest.approx(2.997)
    assert np.all(w.arrival_s >= ts) and np.all(w.arrival_s < ts + width)
    assert len(np.unique(w.arrival_s)) == len(w)  # every request has its own time
    assert np.all(np.diff(w.arrival_s) > 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.floats(0.1, 1.0))
def test_spread_buckets_invariants(values, fraction):
    t = np.sort(np.array(values, dtype=float)) * 3.0
    gaps = np.diff(np.unique(t))
    width = fraction * (gaps.min() if gaps.size else 3.0)  # the loader uses the smallest gap (fraction 1)
    out = spread_buckets(t, width)
    assert np.all(out >= t) and np.all(out < t + width)
    assert np.all(np.diff(out) >= 0)
    for v in np.unique(t):  # m requests at T occupy T + i*w/m, i = 0..m-1
        m = int((t == v).sum())
        np.testing.assert_allclose(out[t == v], v + np.arange(m) * width / m)


def test_azure_2024_offsets_and_unusual_but_valid_files():
    w = load_trace(DATA / "azure_2024_offsets.csv")
    # rows: 00:00:00.009930+00:00, 00:00:01.509930+00:00, 02:00:02+02:00 (= 00:00:02 UTC), 00:00:03Z
    np.testing.assert_allclose(w.arrival_s, [0, 1.5, 2 - 0.00993, 3 - 0.00993], atol=1e-9)
    # BOM, quoted fields, reordered and extra columns, CRLF and a blank line
    q = load_trace(DATA / "azure_quoted_reordered.csv")
    np.testing.assert_array_equal(q.prompt_tokens, [4808, 3180])
    np.testing.assert_array_equal(q.output_tokens, [10, 8])
    np.testing.assert_allclose(q.arrival_s, [0, 0.052], atol=1e-9)
    z = load_trace(DATA / "azure_zero_tokens.csv")
    np.testing.assert_array_equal(z.prompt_tokens, [100, 1, 50])
    np.testing.assert_array_equal(z.output_tokens, [1, 7, 3])
    assert z.meta.num_clamped_prompt == 1 and z.meta.num_clamped_output == 1



def test_azure_mixed_utc_offsets_are_subtracted_hours_and_minutes(tmp_path):
    # 00:00:00 UTC; 01:00:01 at +01:00 = 00:00:01 UTC; 05:30:02 at +05:30 = 00:00:02 UTC. Offsets that grow
    # down the file keep the rows sorted however they are (mis)applied, so the vectorised parse is the one
    # that answers (an unsorted result would fall back to the row-by-row parse)
    path = tmp_path / "offsets.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-10 00:00:00.000000+00:00,10,5\n"
                    "2024-05-10 01:00:01.000000+01:00,20,6\n"
                    "2024-05-10 05:30:02.000000+05:30,30,7\n")
    w = load_trace(path)
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.0, 2.0], atol=1e-9)

# (fixture, what must follow "FILE: " in the message)
MALFORMED = [
    ("azure_empty.csv", r"empty file \(expected a header TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("azure_header_only.csv", r"no data rows after the header"),
    ("azure_missing_column.csv", r"line 1: missing column 'GeneratedTokens'"),
    ("azure_duplicate_column.csv", r"line 1: column 'ContextTokens' appears 2 times \(expected once\)"),
    ("azure_non_numeric.csv", r"line 3: ContextTokens: expected an integer token count >= 0 \(got 'abc'\)"),
    ("azure_negative.csv", r"line 4: GeneratedTokens: expected an integer token count >= 0 \(got '-5'\)"),
    ("azure_unsorted.csv", r"line 4: TIMESTAMP .* is earlier than the previous row's"),
    ("azure_bad_timestamp.csv", r"line 3: TIMESTAMP: expected a date and time .*\(got 'yesterday'\)"),
    ("azure_field_count.csv", r"line 3: expected 3 comma-separated fields \(got 2\)"),
    ("azure_mixed_offset.csv", r"line 3: TIMESTAMP: expected a time with a UTC offset"),
    ("mooncake_empty.jsonl", r"empty file \(expected one JSON object per line"),
    ("mooncake_bad_json.jsonl", r"line 2: expected one JSON object per line"),
    ("mooncake_missing_key.jsonl", r"line 2: missing key 'output_length'"),
    ("mooncake_float_length.jsonl", r"line 3: input_length: expected an integer token count >= 0 \(got 12\.5\)"),
    ("mooncake_negative.jsonl", r"line 2: output_length: expected an integer token count >= 0 \(got -3\)"),
    ("mooncake_unsorted.jsonl", r"line 2: timestamp 0 is earlier than the previous row's 3000"),
    ("mooncake_string_timestamp.jsonl", r"line 2: timestamp: expected a number of milliseconds \(got '10'\)"),
    ("mooncake_not_object.jsonl", r"line 2: expected a JSON object .*\(got list\)"),
    ("trace.txt", r"cannot tell the trace format from the extension '\.txt'"),
    ("no_such_file.csv", r"trace file not found"),
    # said "cannot tell the trace format from the extension ''" of a file that is not there
    ("no_such_file", r"trace file not found"),
]


_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
_ROW = "2023-11-16 18:15:46.6805900"


@pytest.mark.parametrize("rows, message", [
    # numpy read a bare number as a year: requests a year apart ("the last request arrives at 6.32e+07 s")
    ("0,100,10\n1,100,10\n", "line 2: TIMESTAMP: expected a date and time like '2023-11-16 18:17:03.9799600' "
                             "(got '0')"),
    ("1700000000,100,10\n1700000005,100,10\n", "line 2: TIMESTAMP: expected a date and time like "
                                               "'2023-11-16 18:17:03.9799600' (got '1700000000')"),
    ("0,1,1\n0,1,1\n", "line 2: TIMESTAMP: expected a date and time like '2023-11-16 18:17:03.9799600' (got '0')"),
    # int() read 1_000 as 1000, +5 as 5 and other scripts' digits
    (f"{_ROW},1_000,10\n", "line 2: ContextTokens: expected an integer token count >= 0 (got '1_000')"),
    (f"{_ROW},10,+5\n", "line 2: GeneratedTokens: expected an integer token count >= 0 (got '+5')"),
    (f"{_ROW},\u0663,10\n", "line 2: ContextTokens: expected an integer token count >= 0 (got '\u0663')"),
    # a quoted field across lines was read as one ("4\n4" as 44); an unclosed quote as a short row
    (f'{_ROW},"4\n4",10\n', "line 2: a quoted field runs on to line 3 (expected one request per line; is a "
                             "closing quote missing?)"),
    (f'"{_ROW},4,10\n{_ROW},4,10\n', "line 2: a quoted field runs on to line 4 (expected one request per line; "
                                     "is a closing quote missing?)"),
])
def test_azure_rows_that_are_not_the_formats_are_refused_naming_the_line(tmp_path, rows, message):
    path = tmp_path / "trace.csv"
    path.write_text(_HEADER + rows, encoding="utf-8")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: {message}"


def test_a_folder_given_as_a_trace_is_said_to_be_one(tmp_path):
    # said "cannot tell the trace format from the extension ''" (a lengths file too)
    from servesim.workload.lengths import EmpiricalPairsConfig

    with pytest.raises(TraceError) as info:
        load_trace(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a folder (expected a trace file)"
    with pytest.raises(TraceError) as info:
        EmpiricalPairsConfig(type="empirical", path=str(tmp_path)).build(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a folder (expected a trace file)"


@pytest.mark.parametrize("name, pattern", MALFORMED)
def test_malformed_trace_errors_are_one_line_naming_file_and_line(name, pattern):
    path = DATA / name
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert "\n" not in message
    assert re.match(re.escape(str(path)) + ": " + pattern, message), message


def test_bad_hash_ids_only_checked_when_asked_for():
    path = DATA / "mooncake_bad_hash_ids.jsonl"
    assert len(load_trace(path)) == 2
    with pytest.raises(TraceError, match=r"mooncake_bad_hash_ids\.jsonl: line 2: hash_ids: expected a list"):
        load_trace(path, prefix_block_ids=True)


def test_explicit_format_overrides_the_extension(tmp_path):
    p = tmp_path / "trace.txt"
    p.write_bytes((DATA / "mooncake_buckets.jsonl").read_bytes())
    assert len(load_trace(p, format="mooncake")) == 6


def test_read_trace_cache_is_read_only_and_sees_file_changes(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,10,2\n")
    a = read_trace(p)
    assert read_trace(p) is a
    assert not a.prompt_tokens.flags.writeable
    w = load_trace(p)
    w.prompt_tokens[0] = 99  # the workload owns its arrays
    assert a.prompt_tokens[0] == 10
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,10,2\n2023-11-16 18:00:01,20,3\n")
    os.utime(p, ns=(0, 10**18))  # a different modification time, whatever the clock's resolution
    assert len(read_trace(p)) == 2


def test_loading_a_trace_does_not_import_pandas():
    code = (
        "import sys; from servesim.workload import load_trace; "
        f"w = load_trace({str(AZURE_CONV)!r}); assert len(w) == 19366; "
        "assert 'pandas' not in sys.modules, 'pandas imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------ arrivals


def test_poisson_rate_gap_cv_and_no_clipping():
    rate, n = 10.0, 200_000
    t = poisson_arrivals(rate, rng(1), num_requests=n)
    gaps = np.diff(np.r_[0.0, t])
    assert len(t) == n and np.all(gaps >= 0)
    # relative standard error of the rate is 1/sqrt(n) = 0.22%; a 5%-hot generator fails this
    assert abs(n / t[-1] / rate - 1) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1) < 0.02
    # unclipped exponential: P(gap > 3 mean) = exp(-3) (a 3x clip makes it 0)
    assert abs((gaps > 3 / rate).mean() - math.exp(-3)) < 0.003
    assert gaps.max() > 8 / rate


def test_poisson_over_a_duration():
    rate, duration = 10.0, 20_000.0
    t = poisson_arrivals(rate, rng(2), duration_s=duration)
    assert np.all(t < duration) and np.all(np.diff(t) >= 0)
    # count ~ Poisson(200000): sd 447, so +-1% is 4.5 sd
    assert abs(len(t) / (rate * duration) - 1) < 0.01


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_rate_and_gap_cv(cv):
    rate, n = 4.0, 200_000
    t = gamma_arrivals(rate, cv, rng(3), num_requests=n)
    gaps = np.diff(np.r_[0.0, t])
    # relative standard error of the mean gap is cv/sqrt(n) <= 0.45%
    assert abs(n / t[-1] / rate - 1) < 0.02
    assert abs(gaps.std() / gaps.mean() / cv - 1) < 0.03


def test_gamma_over_a_duration_and_bad_arguments():
    t = gamma_arrivals(2.0, 3.0, rng(4), duration_s=50_000)
    assert np.all(t < 50_000) and np.all(np.diff(t) >= 0)
    # count sd ~ cv * sqrt(rate*T) = 948 on 100000
    assert abs(len(t) / 100_000 - 1) < 0.04
    with pytest.raises(ValueError):
        poisson_arrivals(1.0, rng(), num_requests=5, duration_s=5.0)
    with pytest.raises(ValueError):
        gamma_arrivals(1.0, 0.0, rng(), num_requests=5)


# ------------------------------------------------------------------------------ length distributions


def check_sample_moments(dist, n=400_000, seed=5):
    x = dist.sample(rng(seed), n)
    assert x.dtype == np.int64 and x.shape == (n,) and x.min() >= 1
    se = math.sqrt(dist.variance() / n)
    assert abs(x.mean() - dist.mean()) < 4 * se + 1e-12
    if dist.variance() > 0:
        assert abs(x.var() / dist.variance() - 1) < 0.03
    return x


def test_fixed_and_uniform_closed_forms():
    f = FixedLengthConfig(type="fixed", value=128).build()
    assert (f.mean(), f.variance()) == (128.0, 0.0)
    assert FixedLengthConfig(type="fixed", value=128, max=100).build().mean() == 100.0
    check_sample_moments(f)
    u = UniformLengthConfig(type="uniform", low=1, high=100).build()
    assert u.mean() == 50.5 and u.variance() == pytest.approx((100**2 - 1) / 12)
    x = check_sample_moments(u)
    assert x.min() == 1 and x.max() == 100  # both ends inclusive
    c = UniformLengthConfig(type="uniform", low=1, high=100, min=10, max=60).build()
    support = np.clip(np.arange(1, 101), 10, 60)
    assert c.mean() == pytest.approx(support.mean()) and c.variance() == pytest.approx(support.var())
    check_sample_moments(c)


def test_lognormal_mean_cv_and_median_sigma():
    d = LognormalLengthConfig(type="lognormal", mean=1000, cv=1.0).build()
    assert d.mean() == pytest.approx(1000, rel=1e-6)  # the min-1 clip moves it by < 1e-6
    assert d.variance() == pytest.approx(1000**2 + 1 / 12, rel=1e-6)
    check_sample_moments(d)
    m = LognormalLengthConfig(type="lognormal", median=13, sigma=1.2).build()
    assert m.mu == pytest.approx(math.log(13)) and m.sigma == 1.2
    x = check_sample_moments(m)
    assert np.median(x) == 13


def test_clipped_lognormal_moments_match_the_exact_discrete_distribution():
    # Exact: P(rint X = k) = F(k + 1/2) - F(k - 1/2), with all mass below lo at lo and above hi at hi.
    d = LognormalLengthConfig(type="lognormal", median=20, sigma=1.0, min=5, max=200).build()
    cdf = lambda v: 0.5 * math.erfc(-(math.log(v) - d.mu) / (d.sigma * math.sqrt(2)))  # noqa: E731
    ks = np.arange(5, 201)
    upper = np.array([cdf(k + 0.5) for k in ks[:-1]] + [1.0])
    lower = np.array([0.0] + [cdf(k + 0.5) for k in ks[:-1]])
    p = upper - lower
    mean = float((ks * p).sum())
    var = float((ks**2 * p).sum()) - mean**2
    assert d.mean() == pytest.approx(mean, abs=0.05)
    assert d.variance() == pytest.approx(var, rel=0.005)
    check_sample_moments(d)



def test_narrow_lognormal_variance_counts_the_rounding():
    # median 40, sigma 0.03: the continuous variance is about 1.44 tokens^2, and rounding to integers adds
    # Sheppard's 1/12 (5.8% here). The exact discrete variance, summed over P(rint X = k) = F(k + 1/2) -
    # F(k - 1/2), agrees with mean() and variance() to 1e-9 (the density is smooth on the scale of a token)
    d = LognormalLengthConfig(type="lognormal", median=40, sigma=0.03).build()
    cdf = lambda v: 0.5 * math.erfc(-(math.log(v) - d.mu) / (d.sigma * math.sqrt(2)))  # noqa: E731
    ks = np.arange(1, 200)
    p = np.array([cdf(k + 0.5) - (cdf(k - 0.5) if k > 1 else 0.0) for k in ks])
    mean = float((ks * p).sum())
    var = float((ks**2 * p).sum()) - mean**2
    assert d.mean() == pytest.approx(mean, rel=1e-9)
    assert d.variance() == pytest.approx(var, rel=1e-6)
    assert d.variance() - 1 / 12 < 0.95 * var  # without the correction it would be 5% short


def test_fixed_length_is_raised_to_its_min_and_cut_at_its_max():
    rng = np.random.default_rng(0)
    low = FixedLengthConfig(type="fixed", value=5, min=10).build()
    assert low.mean() == 10.0 and (low.sample(rng, 4) == 10).all()
    high = FixedLengthConfig(type="fixed", value=50, max=20).build()
    assert high.mean() == 20.0 and (high.sample(rng, 4) == 20).all()


def test_empirical_lengths():
    e = EmpiricalLengthConfig(type="empirical", path=str(AZURE_CODE), column="output").build()
    assert e.mean() == pytest.approx(load_trace(AZURE_CODE).output_tokens.mean())
    check_sample_moments(e)
    rel = EmpiricalLengthConfig(type="empirical", path="AzureLLMInferenceTrace_code.csv", column="prompt", max=4096)
    p = rel.build(TRACES)
    assert p.values.max() == 4096
    check_sample_moments(p)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"type": "lognormal", "mean": 100}, "give either mean and cv, or median and sigma"),
        ({"type": "lognormal", "mean": 100, "cv": 1, "median": 3, "sigma": 1}, "give either mean and cv"),
        ({"type": "uniform", "low": 10, "high": 5}, r"high \(5\) must be >= low \(10\)"),
        ({"type": "fixed", "value": 10, "min": 8, "max": 4}, r"max \(4\) must be >= min \(8\)"),
        ({"type": "fixed", "value": 0}, "greater than or equal to 1"),
    ],
)
def test_length_config_errors(data, message):
    bad = {"type": "poisson", "rate": 1, "num_requests": 3, "prompt_tokens": data, "output_tokens": FIXED}
    with pytest.raises(ConfigError, match=rf"test\.yaml: prompt_tokens.*{message}"):
        cfg(bad)


# ------------------------------------------------------------------------------ configs and build


LOGNORMAL = {"type": "lognormal", "mean": 500, "cv": 1.0}
FIXED = {"type": "fixed", "value": 64}


def test_build_poisson_workload_and_reproducibility():
    c = cfg({"type": "poisson", "rate": 5.0, "num_requests": 1000, "prompt_tokens": LOGNORMAL, "output_tokens": FIXED})
    a = build_workload(c, rng(7), None)
    b = build_workload(c, rng(7), None)
    other = build_workload(c, rng(8), None)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s, other.arrival_s)
    assert len(a) == 1000 and a.concurrency is None and np.all(a.output_tokens == 64)
    assert a.description.startswith("Poisson arrivals at 5 req/s, 1000 requests")


def test_changing_lengths_leaves_arrivals_unchanged():
    base = {"type": "gamma", "rate": 2.0, "cv": 2.0, "num_requests": 500, "prompt_tokens": LOGNORMAL}
    a = build_workload(cfg({**base, "output_tokens": FIXED}), rng(9))
    b = build_workload(cfg({**base, "output_tokens": {"type": "uniform", "low": 1, "high": 9}}), rng(9))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)


def test_duration_based_open_loop():
    c = cfg({"type": "poisson", "rate": 50.0, "duration_s": 100.0, "prompt_tokens": FIXED, "output_tokens": FIXED})
    w = build_workload(c, rng(10))
    assert np.all(w.arrival_s < 100.0)
    assert abs(len(w) - 5000) < 4.5 * math.sqrt(5000)
    assert f"{len(w)} requests in 100 s" in w.description


def test_closed_loop_workload():
    c = cfg(
        {"type": "closed_loop", "concurrency": 8, "think_time_s": 0.5, "num_requests": 100,
         "prompt_tokens": LOGNORMAL, "output_tokens": FIXED}
    )
    w = build_workload(c, rng(11))
    assert len(w) == 100 and np.isnan(w.arrival_s).all()
    assert w.concurrency == 8 and w.think_time_s == 0.5 and w.is_closed_loop
    assert w.description.startswith("closed loop, 8 clients, think time 0.5 s, 100 requests")


def test_empirical_pairs_are_resampled_jointly():
    c = cfg({"type": "closed_loop", "concurrency": 4, "num_requests": 5000,
             "lengths": {"type": "empirical", "path": "traces/AzureLLMInferenceTrace_code.csv"}})
    w = build_workload(c, rng(12), ROOT / "workloads")
    trace = load_trace(AZURE_CODE)
    pairs = set(zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist()))
    assert all(p in pairs for p in zip(w.prompt_tokens.tolist(), w.output_tokens.tolist()))
    se = trace.prompt_tokens.std() / math.sqrt(5000)
    assert abs(w.prompt_tokens.mean() - trace.prompt_tokens.mean()) < 4 * se


def test_trace_config_resolves_paths_against_base_dir():
    c = cfg({"type": "trace", "path": "traces/conversation_trace.jsonl", "rate_scale": 2,
             "start_s": 600, "duration_s": 600, "bucket_policy": "burst"})
    w = build_workload(c, rng(), ROOT / "workloads")
    direct = load_trace(MOONCAKE_CONV, rate_scale=2, start_s=600, duration_s=600, bucket_policy="burst")
    np.testing.assert_array_equal(w.arrival_s, direct.arrival_s)
    with pytest.raises(TraceError, match="trace file not found"):
        build_workload(c, rng(), ROOT)


SYN = {"prompt_tokens": FIXED, "output_tokens": FIXED}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"type": "poisson", "rate": 1, **SYN}, "exactly one of num_requests and duration_s"),
        ({"type": "poisson", "rate": 1, "num_requests": 3, "duration_s": 3, **SYN}, "exactly one"),
        ({"type": "poisson", "rate": 0, "num_requests": 3, **SYN}, r"test\.yaml: rate: "),
        ({"type": "gamma", "rate": 1, "num_requests": 3, **SYN}, r"test\.yaml: cv: required key is missing"),
        ({"type": "closed_loop", "concurrency": 2, "num_requests": 3, "prompt_tokens": FIXED}, "give prompt_tokens"),
        (
            {"type": "closed_loop", "concurrency": 2, "num_requests": 3, **SYN,
             "lengths": {"type": "empirical", "path": "x"}},
            "not both",
        ),
        ({"type": "trace", "path": "x.csv", "rate_scale": 0}, r"test\.yaml: rate_scale: "),
        ({"type": "trace", "path": "x.csv", "bucket_policy": "smear"}, r"test\.yaml: bucket_policy: "),
        ({"type": "trace", "path": "x.csv", "speed": 2}, r"test\.yaml: speed: unknown key"),
        ({"type": "replay"}, r"test\.yaml: type: unknown type 'replay' \(expected one of 'trace', 'poisson', "),
        ({}, r"test\.yaml: type: required key is missing$"),
        ({"rate": 1}, r"test\.yaml: type: required key is missing$"),
        ([1, 2], r"test\.yaml: expected a mapping \(key: value pairs\) \(got a list\)$"),
        ("poisson", r"test\.yaml: expected a mapping \(key: value pairs\) \(got 'poisson'\)$"),
    ],
)
def test_workload_config_errors_are_one_line(data, message):
    with pytest.raises(ConfigError, match=message) as info:
        cfg(data)
    assert "\n" not in str(info.value) and str(info.value).startswith("test.yaml:")


def test_example_workload_files_load_and_build():
    files = sorted((ROOT / "workloads").glob("*.yaml"))
    assert len(files) >= 2
    for path in files:
        w = load_workload(path, rng(13))
        assert len(w) > 0 and w.description


def test_load_workload_config_reports_the_file(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("type: poisson\nrate: fast\n")
    with pytest.raises(ConfigError, match=r"w\.yaml: rate: "):
        load_workload_config(p)


def test_workload_rejects_inconsistent_arrays():
    with pytest.raises(ValueError):
        Workload(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError):
        Workload(np.array([0.0]), np.array([0]), np.array([1]))
    with pytest.raises(ValueError):
        Workload(np.array([0.0]), np.array([1]), np.array([1]), concurrency=2)


def test_lognormal_runtime_mean_closed_form():
    # unclipped above, min 1 is ~9 sd below: mean = exp(mu + sigma^2/2)
    d = LognormalLength(mu=math.log(100), sigma=0.5)
    assert d.mean() == pytest.approx(100 * math.exp(0.125), rel=1e-9)


def test_a_run_config_names_a_workload_file_whose_paths_are_its_own(tmp_path):
    """``workload: FILE`` (the shipped workloads/*.yaml) was refused ('expected a mapping'): the file's mapping
    is used, its paths relative to its own folder; --set refines it; sweeps and the Python API take it too."""
    from servesim import simulate
    from servesim.config.models import load_config
    from servesim.errors import ConfigError
    from servesim.sweep.spec import SweepConfig, resolve_sweep

    (tmp_path / "wl").mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "wl" / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                           "2023-11-16 18:15:46.0000000,100,5\n2023-11-16 18:15:47.0000000,50,3\n")
    (tmp_path / "wl" / "w.yaml").write_text("type: trace\npath: t.csv\n")
    run = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": "../wl/w.yaml"}
    (tmp_path / "cfg" / "c.yaml").write_text(yaml.safe_dump(run))
    cfg, _ = load_config(tmp_path / "cfg" / "c.yaml", [("workload.rate_scale", 2.0)])
    assert cfg.workload.path == str((tmp_path / "wl" / "t.csv").resolve()) and cfg.workload.rate_scale == 2.0
    result = simulate(tmp_path / "cfg" / "c.yaml")
    assert list(result.requests["prompt_tokens"]) == [100, 50]
    assert list(simulate(run, base_dir=tmp_path / "cfg").requests["arrival_s"]) == [0.0, 1.0]
    sweep = resolve_sweep(SweepConfig.model_validate({"base": "cfg/c.yaml", "grid": {"engine.max_num_seqs": [8]}}), tmp_path, "s")
    assert sweep.base["workload"] == {"type": "trace", "path": str((tmp_path / "wl" / "t.csv").resolve())}
    # a mistake inside the workload file names the workload file (it named the run config)
    (tmp_path / "wl" / "bad.yaml").write_text("type: trace\npath: t.csv\nrate_scale: -2\n")
    (tmp_path / "cfg" / "c.yaml").write_text(yaml.safe_dump({**run, "workload": "../wl/bad.yaml"}))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg" / "c.yaml")
    assert str(info.value) == (f"{(tmp_path / 'wl' / 'bad.yaml').resolve()}: rate_scale: Input should be greater "
                               "than 0 (got -2)")
    (tmp_path / "cfg" / "c.yaml").write_text(yaml.safe_dump({**run, "workload": "none.yaml"}))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg" / "c.yaml")
    assert str(info.value) == f"{tmp_path / 'cfg' / 'c.yaml'}: workload: {tmp_path / 'cfg' / 'none.yaml'}: file not found"


# ---------------------------------------------------------------- memory bound (servesim.workload.memory_bound)
def test_available_memory_reads_the_kernels_figure() -> None:
    from servesim.workload.memory_bound import available_memory_bytes

    with open("/proc/meminfo", encoding="ascii") as meminfo:
        lines = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    got = available_memory_bytes()
    # MemAvailable moves while the test runs: within a few percent of a fresh reading, below MemTotal
    assert got is not None and abs(got - lines["MemAvailable"]) < 0.05 * lines["MemTotal"]
    assert got <= lines["MemTotal"]


@pytest.mark.parametrize(("workload", "message"), [
    ({"type": "poisson", "rate": 10.0, "num_requests": 2_000_001},
     "workload.num_requests: 2,000,001 requests would need about 2 GB of memory (servesim holds about 1,000 "
     "bytes per request), more than the 2 GB available: simulate fewer requests"),
    ({"type": "gamma", "rate": 10.0, "cv": 2.0, "duration_s": 200_000.1},
     "workload.duration_s: 2,000,001 expected requests would need about 2 GB of memory"),
    ({"type": "closed_loop", "concurrency": 4, "think_time_s": 0.0, "num_requests": 2_000_001},
     "workload.num_requests: 2,000,001 requests would need"),
    ({"type": "multi_turn", "rate": 1.0, "num_sessions": 2_000_001, "think_time_s": 1.0,
      "turns": {"type": "fixed", "value": 1}},
     "workload.num_sessions: 2,000,001 sessions would need"),
    ({"type": "multi_turn", "rate": 1.0, "num_sessions": 2, "think_time_s": 1.0,
      "turns": {"type": "fixed", "value": 1_000_001}},
     "workload.turns: 2,000,002 turns (requests) would need"),
])
def test_a_workload_beyond_the_memory_is_refused_before_drawing(monkeypatch: pytest.MonkeyPatch, workload,
                                                                message) -> None:
    # 10^8 requests were killed by the kernel for memory part way: now refused before drawing
    import servesim.workload.memory_bound as memory_bound
    from servesim.errors import SettingError

    monkeypatch.setattr(memory_bound, "available_memory_bytes", lambda: 2_000_000_000)
    lengths = {"prompt_tokens": {"type": "fixed", "value": 10}, "output_tokens": {"type": "fixed", "value": 5}}
    if workload["type"] == "multi_turn":
        lengths = {"message_tokens": lengths["prompt_tokens"], "output_tokens": lengths["output_tokens"]}
    config = cfg({**workload, **lengths})
    with pytest.raises(SettingError) as excinfo:
        build_workload(config, np.random.default_rng(0))
    assert str(excinfo.value).startswith(message)
    # the same kind of workload, small: built
    monkeypatch.setattr(memory_bound, "available_memory_bytes", lambda: 10**12)
    small = {**workload}
    for key in ("num_requests", "num_sessions"):
        if key in small:
            small[key] = 3
    if "duration_s" in small:
        small["duration_s"] = 1.0
    if small["type"] == "multi_turn":
        small["turns"] = {"type": "fixed", "value": 2}
    assert len(build_workload(cfg({**small, **lengths}), np.random.default_rng(0))) >= 1


def test_the_memory_bound_is_bytes_per_request_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    import servesim.workload.memory_bound as memory_bound
    from servesim.errors import SettingError

    monkeypatch.setattr(memory_bound, "available_memory_bytes", lambda: 1_000 * memory_bound.BYTES_PER_REQUEST)
    memory_bound.check_requests_fit(1_000, "workload.num_requests")  # fits exactly
    with pytest.raises(SettingError):
        memory_bound.check_requests_fit(1_001, "workload.num_requests")
    monkeypatch.setattr(memory_bound, "available_memory_bytes", lambda: None)  # unknown: not refused
    memory_bound.check_requests_fit(10**12, "workload.num_requests")


@pytest.mark.parametrize("name, text", [
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47.0000000,30,3\n"
              "2023-11-16 18:15:46.0000000,10,1\n2023-11-16 18:15:48.0000000,20,2\n"),
    ("t.jsonl", '{"timestamp": 2000, "input_length": 30, "output_length": 3}\n'
                '{"timestamp": 1000, "input_length": 10, "output_length": 1}\n'
                '{"timestamp": 3000, "input_length": 20, "output_length": 2}\n'),
])
def test_an_unsorted_trace_gives_lengths_but_is_refused_as_arrivals(tmp_path, name, text):
    # its rows' order does not matter for resampled lengths: it was refused for it
    from servesim.workload.lengths import EmpiricalLengthConfig, EmpiricalPairsConfig

    path = tmp_path / name
    path.write_text(text)
    pairs = EmpiricalPairsConfig(type="empirical", path=name).build(tmp_path)
    assert pairs.prompt_tokens.tolist() == [30, 10, 20] and pairs.output_tokens.tolist() == [3, 1, 2]
    column = EmpiricalLengthConfig(type="empirical", path=name, column="output").build(tmp_path)
    assert column.values.tolist() == [3, 1, 2]
    with pytest.raises(TraceError, match=r"line (3|2): (TIMESTAMP|timestamp) .* is earlier than the previous row's"):
        load_trace(path)  # replayed, its arrivals must be in order
