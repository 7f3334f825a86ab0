"""Acceptance from serving logs: vLLM log lines (seed lesson Example 11), Prometheus counters, llama.cpp
timings and log lines (Example 10), and the ``servesim acceptance from-*`` sub-commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.errors import TraceError
from servesim.acceptance.logs import (
    fit_constant_alpha,
    parse_llamacpp,
    parse_prometheus,
    parse_prometheus_text,
    parse_vllm_log,
    parse_vllm_log_lines,
)
from servesim.speculation.profile import load_profile

EXAMPLES = Path(__file__).resolve().parents[1] / "workloads" / "examples"
EXAMPLE_11 = (
    "SpecDecoding metrics: Mean acceptance length: 2.65, Accepted throughput: 82.50 tokens/s, "
    "Drafted throughput: 150.00 tokens/s, Accepted: 1650 tokens, Drafted: 3000 tokens, "
    "Per-position acceptance rate: 0.750, 0.530, 0.370, Avg Draft acceptance rate: 55.0%"
)


def test_example_11_arithmetic():
    c = parse_vllm_log_lines(["INFO something else", EXAMPLE_11], "x.log")
    assert c.k == 3
    assert c.num_drafts == 1000  # 3000 drafted / k = 3
    assert (c.num_draft_tokens, c.num_accepted_tokens) == (3000, 1650)
    assert c.mean_acceptance_length == pytest.approx(2.65, abs=1e-12)  # 1 + 1650 / 1000
    assert c.draft_acceptance_rate == pytest.approx(0.55, abs=1e-12)  # 1650 / 3000
    assert c.accepted_per_position == [750, 530, 370]
    profile = c.to_profile("ex11", method="eagle3")
    assert list(profile.unconditional()) == pytest.approx([0.750, 0.530, 0.370], abs=1e-12)
    assert profile.mean_acceptance_length(3) == pytest.approx(2.65, abs=1e-12)  # 1 + sum of rates
    assert profile.rates_include_no_match is False


def test_example_log_pools_lines_by_drafts():
    c = parse_vllm_log(EXAMPLES / "vllm-specdecode-eagle3-k3.log")
    # Lines with 1000, 400 and 600 drafts: per-position counts 750+320+420, 530+240+300, 370+180+210.
    assert c.num_drafts == 2000
    assert c.accepted_per_position == [1490, 1070, 760]
    assert list(c.per_position_acceptance) == pytest.approx([0.745, 0.535, 0.380], abs=1e-12)
    # A plain mean of the three lines' rates would give 0.750 at position 1: weighting matters.
    assert c.mean_acceptance_length == pytest.approx(1 + 3320 / 2000, abs=1e-12)
    assert c.draft_acceptance_rate == pytest.approx(3320 / 6000, abs=1e-12)


def test_short_drafts_use_the_per_position_rates():
    # n-gram-like: 100 drafts of 2 tokens with k = 3; Drafted / k = 66.7 would be wrong.
    line = ("SpecDecoding metrics: Mean acceptance length: 1.90, Accepted: 90 tokens, Drafted: 200 tokens, "
            "Per-position acceptance rate: 0.600, 0.300, 0.000, Avg Draft acceptance rate: 45.0%")
    c = parse_vllm_log_lines([line], "n.log")
    assert c.num_drafts == 100
    assert c.accepted_per_position == [60, 30, 0]


@pytest.mark.parametrize(
    "lines, match",
    [
        (["nothing here"], r"x\.log: no 'SpecDecoding metrics:' lines"),
        (["ok", "SpecDecoding metrics: Accepted: 5 tokens, Per-position acceptance rate: 0.5"],
         r"x\.log: line 2: SpecDecoding metrics line without 'Drafted: N tokens'"),
        ([EXAMPLE_11, "SpecDecoding metrics: Accepted: 5 tokens, Drafted: 10 tokens, Per-position acceptance rate: "
          "0.5, 0.0"], r"x\.log: line 2: 2 per-position rates, expected 3"),
        (["SpecDecoding metrics: Accepted: 900 tokens, Drafted: 300 tokens, Per-position acceptance rate: "
          "0.900, 0.800, 0.700"], r"x\.log: line 1: .*inconsistent"),
        # a nan rate ended the number pattern: it read as one position and blamed the counts' consistency
        (["SpecDecoding metrics: Accepted: 10 tokens, Drafted: 20 tokens, Per-position acceptance rate: "
          "0.600, nan, Avg Draft acceptance rate: 50.0%"],
         r"^x\.log: line 1: per-position acceptance rate 2: expected a number from 0 to 1 \(got 'nan'\); "
         r"vLLM's line holds one rate per position$"),
    ],
)
def test_vllm_log_errors(lines, match):
    with pytest.raises(TraceError, match=match) as info:
        parse_vllm_log_lines(lines, "x.log")
    assert "\n" not in str(info.value)


def test_prometheus_example_matches_the_log():
    c = parse_prometheus(EXAMPLES / "vllm-metrics-eagle3-k3.prom")
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (2000, 6000, 3320)
    assert c.accepted_per_position == [1490, 1070, 760]
    assert c.k == 3


def test_prometheus_baseline_and_one_based_positions():
    after = "\n".join([
        "vllm:spec_decode_num_drafts 300", "vllm:spec_decode_num_draft_tokens 600",
        "vllm:spec_decode_num_accepted_tokens 250",
        'vllm:spec_decode_num_accepted_tokens_per_pos{position="1"} 160',
        'vllm:spec_decode_num_accepted_tokens_per_pos{position="2"} 90',
    ])
    before = after.replace(" 300", " 100").replace(" 600", " 200").replace(" 250", " 50").replace(
        " 160", " 40").replace(" 90", " 10")
    c = parse_prometheus_text(after, "after.prom", before, "before.prom")
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (200, 400, 200)
    assert c.accepted_per_position == [120, 80]
    with pytest.raises(TraceError, match=r"after\.prom: vllm:spec_decode_num_\w+: smaller than in before\.prom"):
        parse_prometheus_text(before, "after.prom", after, "before.prom")
    with pytest.raises(TraceError, match=r"x\.prom: counter vllm:spec_decode_num_drafts not found"):
        parse_prometheus_text("vllm:spec_decode_num_draft_tokens_total 5\n", "x.prom")


def test_prometheus_positions_must_sum_to_the_accepted_total():
    # was accepted: a total of 250 with positions summing to 600 gave a profile from the positions and a mean
    # acceptance length from the total, two different servers' figures
    scrape = "\n".join([
        "vllm:spec_decode_num_drafts 1000", "vllm:spec_decode_num_draft_tokens 2000",
        "vllm:spec_decode_num_accepted_tokens {total}",
        'vllm:spec_decode_num_accepted_tokens_per_pos{{position="0"}} 600',
        'vllm:spec_decode_num_accepted_tokens_per_pos{{position="1"}} 400',
    ])
    # within 1% (a scrape between vLLM's two updates of a step): read, the total kept as counted
    assert parse_prometheus_text(scrape.format(total=1010), "m.prom").num_accepted_tokens == 1010
    assert parse_prometheus_text(scrape.format(total=990), "m.prom").num_accepted_tokens == 990
    for total in (1011, 989, 250):  # 1% of the larger count off, or far off
        with pytest.raises(TraceError) as excinfo:
            parse_prometheus_text(scrape.format(total=total), "m.prom")
        assert str(excinfo.value) == (
            "m.prom: vllm:spec_decode_num_accepted_tokens_per_pos sums to 1000 accepted tokens over its 2 "
            f"positions, vllm:spec_decode_num_accepted_tokens counts {total} (expected the same count: both "
            "from one server and run)")


def test_a_negative_prometheus_counter_is_refused_on_its_line():
    # was "m.prom: vllm:spec_decode_num_drafts: smaller than in baseline (server restarted?)" with no
    # baseline given
    scrape = "\n".join([
        "vllm:spec_decode_num_drafts -100", "vllm:spec_decode_num_draft_tokens 200",
        "vllm:spec_decode_num_accepted_tokens 50", 'vllm:spec_decode_num_accepted_tokens_per_pos{position="0"} 50',
    ])
    with pytest.raises(TraceError) as excinfo:
        parse_prometheus_text(scrape, "m.prom")
    assert str(excinfo.value) == "m.prom: line 1: vllm:spec_decode_num_drafts: expected a count >= 0 (got -100)"


def test_fit_constant_alpha_closed_forms():
    assert fit_constant_alpha(1.7, 1) == pytest.approx(0.7, abs=1e-12)  # AL = 1 + alpha
    assert fit_constant_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-12)  # 1 + 0.5 + 0.25
    assert fit_constant_alpha(0.9, 3) == 0.0 and fit_constant_alpha(5.0, 4) == 1.0
    with pytest.raises(ValueError):
        fit_constant_alpha(2.0, 0)


def test_llamacpp_timings_example_10():
    c = parse_llamacpp(EXAMPLES / "llamacpp-responses.jsonl", k=4)
    # Greedy: 40 tokens, 31 accepted -> 40 - 1 - 31 = 8 rounds; sampled: 40 - 1 - 1 = 38 rounds.
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (46, 177, 32)
    assert c.accepted_per_position is None
    profile = c.to_profile("llamacpp", method="draft_model")
    assert profile.conditional_acceptance is not None and len(profile.conditional_acceptance) == 1
    assert profile.mean_acceptance_length(4) == pytest.approx(1 + 32 / 46, abs=1e-5)


def test_llamacpp_timings_refuse_a_k_the_counts_contradict():
    """--k 1 pooled 177 'rounds' from two responses of 40 tokens; --k 200 exceeded what servesim takes."""
    from servesim.errors import TraceError

    with pytest.raises(TraceError, match=r"line 1: 31 drafts \(31 accepted\) in 40 predicted tokens need more than "
                                         r"--k 1 drafts a round: it has at most 8 rounds, so the draft length "
                                         r"\(--spec-draft-n-max\) is at least 4$"):
        parse_llamacpp(EXAMPLES / "llamacpp-responses.jsonl", k=1)
    with pytest.raises(TraceError, match="line 1: 31 drafts .* more than --k 3 drafts"):  # 8 rounds of 3 hold 24
        parse_llamacpp(EXAMPLES / "llamacpp-responses.jsonl", k=3)
    with pytest.raises(TraceError, match=r"^--k: expected the draft length \(--spec-draft-n-max\) from 1 to 128"):
        parse_llamacpp(EXAMPLES / "llamacpp-responses.jsonl", k=200)


def test_llamacpp_log_lines_example_10(tmp_path):
    greedy = tmp_path / "g.log"
    greedy.write_text("slot print_timing: id  0 | task 0 | draft acceptance = 1.00000 (   31 accepted /    31 "
                      "generated), mean len =  4.88\n")
    c = parse_llamacpp(greedy, k=4)
    assert c.num_drafts == 8 and c.mean_acceptance_length == pytest.approx(4.875, abs=1e-12)  # 1 + 31/8
    both = parse_llamacpp(EXAMPLES / "llamacpp-server.log", k=4)
    assert (both.num_draft_tokens, both.num_accepted_tokens) == (177, 32)
    # Sampled request: mean len 1.03 (printed) allows 37-40 rounds, at least ceil(146 / 4) = 37; truth is 38.
    assert 8 + 37 <= both.num_drafts <= 8 + 40


def test_llamacpp_errors(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_text(json.dumps({"timings": {"draft_n": 4, "draft_n_accepted": 1, "predicted_n": 9}}) + "\n{nope\n")
    with pytest.raises(TraceError, match=r"r\.jsonl: line 2: invalid JSON"):
        parse_llamacpp(bad, k=4)
    bad.write_text(json.dumps({"timings": {"draft_n": 4, "draft_n_accepted": 5}}) + "\n")
    with pytest.raises(TraceError, match=r"r\.jsonl: line 1: timings\.draft_n_accepted = 5 exceeds draft_n = 4"):
        parse_llamacpp(bad, k=4)
    empty = tmp_path / "e.log"
    empty.write_text("nothing\n")
    with pytest.raises(TraceError, match=r"e\.log: no llama\.cpp speculative statistics"):
        parse_llamacpp(empty, k=3)


def test_cli_from_vllm_log_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "mine.yaml"
    rc = main(["acceptance", "from-vllm-log", "--input", str(EXAMPLES / "vllm-specdecode-eagle3-k3.log"),
               "--method", "eagle3", "--out", str(out)])
    assert rc == 0
    profile = load_profile(str(out))
    assert profile.name == "mine" and profile.method == "eagle3"
    assert list(profile.unconditional()) == pytest.approx([0.745, 0.535, 0.38], abs=1e-12)
    assert "mean acceptance length: 2.6600" in capsys.readouterr().out


def test_cli_from_prometheus_and_llamacpp(tmp_path, capsys):
    assert main(["acceptance", "from-prometheus", "--input", str(EXAMPLES / "vllm-metrics-eagle3-k3.prom"),
                 "--out", str(tmp_path / "p.yaml")]) == 0
    assert load_profile(str(tmp_path / "p.yaml")).mean_acceptance_length(3) == pytest.approx(2.66, abs=1e-12)
    assert main(["acceptance", "from-llamacpp", "--input", str(EXAMPLES / "llamacpp-responses.jsonl"), "--k", "4",
                 "--out", str(tmp_path / "l.yaml")]) == 0
    assert load_profile(str(tmp_path / "l.yaml")).mean_acceptance_length(4) == pytest.approx(1 + 32 / 46, abs=1e-5)
    rc = main(["acceptance", "from-prometheus", "--input", str(EXAMPLES / "llamacpp-server.log")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "llamacpp-server.log: counter" in err


@pytest.mark.parametrize("per_position, totals, message", [
    # rates that rise with the position, a position above the drafts, a count beyond float range: each was
    # a traceback (pydantic's ValidationError, an OverflowError)
    ((300, 700, 500), (1000, 3000, 1500),
     "p.prom: the counts: per_position_acceptance must be non-increasing, got [0.3, 0.7, 0.5]"),
    ((1700, 300, 100), (1000, 3000, 2100),
     "p.prom: the counts: per_position_acceptance.0: Input should be less than or equal to 1 (got 1.7)"),
    ((300, 200, 100), ("1e400", 3000, 600), "p.prom: vllm:spec_decode_num_drafts: expected a finite count (got inf)"),
])
def test_prometheus_counts_no_profile_can_hold_are_one_line(tmp_path, capsys, per_position, totals, message):
    drafts, draft_tokens, accepted = totals
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {draft_tokens}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {count}'
              for i, count in enumerate(per_position)]
    path = tmp_path / "p.prom"
    path.write_text("\n".join(lines) + "\n")
    assert main(["acceptance", "from-prometheus", "--input", str(path)]) == 2
    assert capsys.readouterr().err == f"servesim: error: {tmp_path}/{message}\n"
