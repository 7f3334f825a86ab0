"""Capacity search: SLO parsing, the pass rule, bisection and replica search (fake and real simulators)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from servesim.analysis.capacity import CapacitySearch, RateAxis, parse_slo, trace_mean_rate
from servesim.input_files import validate
from servesim.config.models import SimConfig
from servesim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "workloads" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def poisson_cfg(rate=4.0, n=200, **extra):
    data = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
            "workload": {"type": "poisson", "rate": rate, "num_requests": n,
                         "prompt_tokens": {"type": "fixed", "value": 500},
                         "output_tokens": {"type": "fixed", "value": 100}}}
    data.update(extra)
    return validate(SimConfig, data, "test")


class FakeSimulate:
    """itl p99 = 0.01 s x rate / replicas (plus 0.001 s x replication index); every request completes."""

    def __init__(self):
        self.calls = []

    def __call__(self, config, *, seed=None, base_dir=None):
        rate, replicas = config["workload"]["rate"], config["deployment"]["replicas"]
        self.calls.append((rate, replicas, tuple(seed.spawn_key)))
        value = 0.01 * rate / replicas + 0.001 * seed.spawn_key[0]
        summary = {"num_requests": 10, "completed": 10, "request_throughput": rate, "output_throughput": 100 * rate,
                   "itl_s": {"p99": value, "mean": value / 2}}
        return SimpleNamespace(summary=summary)


@pytest.mark.parametrize("text,expected", [("ttft_p99=0.5", ("ttft", "p99", 0.5)),
                                           ("tpot_mean = 0.05", ("tpot", "mean", 0.05)),
                                           ("e2e_p50=12", ("e2e", "p50", 12.0))])
def test_parse_slo(text, expected):
    s = parse_slo(text)
    assert (s.metric, s.stat, s.target_s) == expected and s.name == f"{expected[0]}_{expected[1]}"


@pytest.mark.parametrize("text,needle", [("ttft=0.5", "METRIC_STAT"), ("foo_p99=1", "unknown metric"),
                                         ("ttft_p42=1", "unknown statistic"), ("ttft_p99=-1", "positive"),
                                         ("ttft_p99=abc", "positive")])
def test_parse_slo_errors_are_one_line(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_slo(text)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_bisection_finds_the_threshold_within_tolerance():
    # replication means: itl_p99 = 0.01 rate + 0.001 (mean of 0 and 0.002) <= 0.201  <=>  rate <= 20.0
    fake = FakeSimulate()
    search = CapacitySearch(poisson_cfg(3.0), Path("."), [parse_slo("itl_p99=0.201")], replications=3,
                            simulate=fake)
    result = search.max_rate(tolerance=0.02)
    passed = [e.rate for e in result.evaluations if e.passed]
    failed = [e.rate for e in result.evaluations if not e.passed]
    assert result.capacity == max(passed) and result.capacity <= 20.0 + 1e-9
    hi = min(r for r in failed if r > result.capacity)
    assert hi - result.capacity <= 0.02 * result.capacity and hi > 20.0 - 1e-9
    # doubling from 3: 3, 6, 12, 24 (fails), then bisection
    assert [e.rate for e in result.evaluations[:4]] == [3.0, 6.0, 12.0, 24.0]
    # replications: the same three independent seeds at every rate
    assert {c[2] for c in fake.calls} == {(0,), (1,), (2,)}
    assert all(e.values["itl_p99"] == pytest.approx(0.01 * e.rate + 0.001) for e in result.evaluations)



def test_bisection_stops_when_the_bracket_is_within_tolerance_of_the_passing_rate():
    # threshold 20 requests/s as above; tolerance 0.15 relative to lo (the passing rate): doubling 3, 6, 12, 24
    # (fails); bracket [12, 24]: 12 > 0.15 x 12 -> 18 passes; [18, 24]: 6 > 2.7 -> 21 fails; [18, 21]: 3 > 2.7
    # -> 19.5 passes; [19.5, 21]: 1.5 <= 2.925 stops. (Relative to hi, 3 <= 0.15 x 21 would stop at 18.)
    search = CapacitySearch(poisson_cfg(3.0), Path("."), [parse_slo("itl_p99=0.201")], replications=3,
                            simulate=FakeSimulate())
    result = search.max_rate(tolerance=0.15)
    assert [e.rate for e in result.evaluations] == [3.0, 6.0, 12.0, 24.0, 18.0, 21.0, 19.5]
    assert result.capacity == 19.5


def test_search_downward_and_max_rate_cap():
    fake = FakeSimulate()
    down = CapacitySearch(poisson_cfg(100.0), Path("."), [parse_slo("itl_p99=0.05")], replications=1,
                          simulate=fake).max_rate(tolerance=0.05)
    assert down.capacity <= 5.0 and 5.0 - down.capacity <= 0.05 * down.capacity + 1e-12
    assert [e.rate for e in down.evaluations[:5]] == [100.0, 50.0, 25.0, 12.5, 6.25]
    capped = CapacitySearch(poisson_cfg(1.0), Path("."), [parse_slo("itl_p99=10")], replications=1,
                            simulate=FakeSimulate()).max_rate(max_rate=3.0)
    assert capped.capacity == 3.0 and capped.capped



def test_downward_search_brackets_from_the_first_passing_halving():
    # itl_p99 = 0.01 rate <= 0.05 <=> rate <= 5 (one replication). Halving from 100: 50, 25, 12.5, 6.25 fail,
    # 3.125 passes: bracket [3.125, 6.25] -> 4.6875 passes, 5.46875 fails, 5.078125 fails, 4.8828125 passes;
    # [4.8828125, 5.078125]: 0.1953125 <= 0.05 x 4.8828125 stops
    down = CapacitySearch(poisson_cfg(100.0), Path("."), [parse_slo("itl_p99=0.05")], replications=1,
                          simulate=FakeSimulate()).max_rate(tolerance=0.05)
    assert [e.rate for e in down.evaluations] == [100.0, 50.0, 25.0, 12.5, 6.25, 3.125, 4.6875, 5.46875,
                                                  5.078125, 4.8828125]
    assert down.capacity == 4.8828125


def test_a_statistic_equal_to_its_target_meets_it():
    # "<=": 0.01 x 4.0 = 0.04 exactly in floats (a power-of-two multiple), and an SLO of 0.04 is met
    ev = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=0.04")], replications=1,
                        simulate=FakeSimulate()).evaluate(4.0)
    assert ev.values["itl_p99"] == 0.04 and ev.passed
    # a goodput share equal to the attainment is met too (every request completes: attainment 1.0)
    ev = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=10")], replications=1, goodput_share=1.0,
                        simulate=FakeSimulate()).evaluate(1.0)
    assert ev.slo_attainment == 1.0 and ev.passed


def test_attainment_uses_the_tightest_target_of_a_metric():
    # two SLOs on TTFT (p50 <= 1.0, p99 <= 0.5): a request is good when its TTFT <= 0.5, the smaller target.
    # test_metrics.small_output(): TTFTs 1.0, 0.5, 0.25 of 3 completed requests of 4 -> 2 good of 4
    from servesim.metrics import summarize
    from test_metrics import small_output

    def simulate(config, *, seed=None, base_dir=None):
        out = small_output()
        return SimpleNamespace(summary=summarize(out), output=out)

    ev = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("ttft_p50=1.0"), parse_slo("ttft_p99=0.5")],
                        replications=1, simulate=simulate).evaluate(1.0)
    assert ev.slo_attainment == 0.5
    assert ev.goodput == pytest.approx(2 / 4.25)  # good requests over the run's 4.25 s


def test_min_replicas_search():
    # itl_p99 = 0.01 x 37 / R <= 0.1  <=>  R >= 3.7: fewest replicas 4
    fake = FakeSimulate()
    result = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=0.1")], replications=1,
                            simulate=fake).min_replicas(37.0)
    assert result.capacity == 4
    assert [e.replicas for e in result.evaluations] == [1, 2, 4, 3]
    assert all(e.rate == 37.0 for e in result.evaluations)


def test_goodput_share_rule_and_incomplete_runs_fail():
    class Partial(FakeSimulate):
        def __call__(self, config, *, seed=None, base_dir=None):
            res = super().__call__(config, seed=seed, base_dir=base_dir)
            res.summary["completed"] = 9
            return res

    ev = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=10")], replications=1,
                        simulate=Partial()).evaluate(1.0)
    assert not ev.passed and ev.completed_share == 0.9
    ev = CapacitySearch(poisson_cfg(), Path("."), [parse_slo("itl_p99=10")], replications=1, goodput_share=0.95,
                        simulate=FakeSimulate()).evaluate(1.0)
    assert ev.passed and ev.slo_attainment == 1.0


def test_trace_rate_axis_uses_the_mean_rate_of_the_window():
    cfg = validate(SimConfig, {"hardware": "h100-sxm", "model": "llama-3.1-8b",
                               "workload": {"type": "trace", "path": str(TRACE), "max_requests": 500,
                                            "rate_scale": 2.0}}, "test")
    times = pd.to_datetime(pd.read_csv(TRACE, nrows=500)["TIMESTAMP"])
    span = (times.iloc[-1] - times.iloc[0]).total_seconds()
    assert trace_mean_rate(cfg, Path(".")) == pytest.approx(499 / span, rel=1e-9)
    axis = RateAxis(cfg, Path("."))
    assert axis.start_rate == pytest.approx(2 * 499 / span, rel=1e-9)
    data, scale = axis.apply(cfg.model_dump(), 3 * 499 / span)
    assert scale == pytest.approx(3.0) and data["workload"]["rate_scale"] == pytest.approx(3.0)


def test_closed_loop_is_refused():
    cfg = validate(SimConfig, {"hardware": "h100-sxm", "model": "llama-3.1-8b",
                               "workload": {"type": "closed_loop", "concurrency": 4, "num_requests": 10,
                                            "prompt_tokens": {"type": "fixed", "value": 10},
                                            "output_tokens": {"type": "fixed", "value": 10}}}, "test")
    with pytest.raises(ConfigError, match="open-loop"):
        CapacitySearch(cfg, Path("."), [parse_slo("ttft_p99=1")])


def test_real_search_brackets_the_capacity(tmp_path):
    """A real (small) search: the capacity passes and a rate tolerance above it fails, per the rule."""
    from servesim.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("hardware: h100-sxm\nmodel: llama-3.1-8b\nengine: {max_num_seqs: 16}\n"
                      "workload: {type: poisson, rate: 8, num_requests: 150, prompt_tokens: {type: fixed, value: 1000},"
                      " output_tokens: {type: fixed, value: 100}}\n")
    out = tmp_path / "out"
    status = main(["capacity", str(config), "--slo", "ttft_p90=0.3", "--replications", "2", "--tolerance", "0.1",
                   "--out", str(out), "--quiet"])
    assert status == 0
    frame = pd.read_csv(out / "capacity.csv")
    good = frame[frame["passed"]]
    bad = frame[~frame["passed"]]
    assert len(good) and len(bad)
    cap = good["rate"].max()
    assert (good["ttft_p90_s"] <= 0.3).all() and (bad["ttft_p90_s"] > 0.3).all()
    above = bad[bad["rate"] > cap]["rate"].min()
    assert above - cap <= 0.1 * cap + 1e-9
    # replication columns average to the mean column
    np.testing.assert_allclose(frame[["ttft_p90_s_r0", "ttft_p90_s_r1"]].mean(axis=1), frame["ttft_p90_s"])
    # the figure's data, beside it: one row per rate tried, ascending, with the search's statistics
    drawn = pd.read_csv(out / "slo_attainment.csv")
    assert list(drawn.columns) == ["rate", "replicas", "rate_scale", "ttft_p90_s", "slo_attainment", "passed"]
    assert drawn["rate"].is_monotonic_increasing and set(drawn["rate"]) == set(frame["rate"])
    by_rate = frame.drop_duplicates("rate").set_index("rate")
    for _, row in drawn.iterrows():
        assert row["ttft_p90_s"] == by_rate.loc[row["rate"], "ttft_p90_s"]
        assert row["passed"] == (row["ttft_p90_s"] <= 0.3)
    assert (out / "slo_attainment.png").stat().st_size > 0


def test_cli_bad_slo_is_one_line_error(tmp_path, capsys):
    from servesim.cli import main

    status = main(["capacity", str(ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"), "--slo", "ttft=1",
                   "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "--slo" in err


class ConstantSimulate(FakeSimulate):
    """itl p99 = ``value`` s at every rate (an SLO met at every rate, or at none)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def __call__(self, config, *, seed=None, base_dir=None):
        result = super().__call__(config, seed=seed, base_dir=base_dir)
        result.summary["itl_s"] = {"p99": self.value, "mean": self.value}
        return result


def test_search_is_bounded_when_the_slo_is_always_or_never_met():
    from servesim.analysis.capacity import MAX_RATE_STEPS
    from servesim.cli.capacity import format_result

    search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                            simulate=ConstantSimulate(0.5))
    always = search.max_rate()
    assert always.capped and always.capacity == 2.0 * 2**MAX_RATE_STEPS
    assert len(always.evaluations) == MAX_RATE_STEPS + 1 and always.stopped == f"after {MAX_RATE_STEPS} doublings"
    assert "meets the SLOs at every rate up to 2.097e+06 requests/s" in format_result(always, search)
    search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                            simulate=ConstantSimulate(5.0))
    never = search.max_rate()
    assert never.capacity is None and never.lowest_rate == 2.0 / 2**MAX_RATE_STEPS
    assert len(never.evaluations) == MAX_RATE_STEPS + 1
    assert "meets the SLOs at no rate down to 1.907e-06 requests/s" in format_result(never, search)


class DrainedBurst(ConstantSimulate):
    """Every rate passes, and the 10 requests are served at ``served`` requests/s whatever the rate."""

    def __init__(self, served):
        super().__init__(0.5)
        self.served = served

    def __call__(self, config, *, seed=None, base_dir=None):
        result = super().__call__(config, seed=seed, base_dir=base_dir)
        result.summary["request_throughput"] = min(self.served, config["workload"]["rate"])
        return result


def test_an_answer_resting_on_a_drained_burst_says_so():
    # N requests at rate R served over (last finish - first arrival) = N/R + drain: below R/2 when the drain
    # exceeds the arrivals' window, i.e. the run measured one burst draining, which passes at any rate
    from servesim.cli.capacity import format_result

    search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                            simulate=DrainedBurst(served=40.0))
    result = search.max_rate()
    text = format_result(result, search)
    assert ("note: at 2.097e+06 requests/s the run's 10 requests arrive in 4.77e-06 s and are served at 40 "
            "requests/s: a burst drained") in text
    # served at half the rate or more: a sustained load, no note (the boundary itself included)
    for served in (float("inf"), 2.0 * 2**21 * 0.5):
        search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                                simulate=DrainedBurst(served=served))
        assert "note:" not in format_result(search.max_rate(), search)


@pytest.mark.parametrize(("slo", "answer", "status"), [("ttft_p99=1000", "meets the SLOs at every rate up to ", 0),
                                                       ("ttft_p99=0.000001", "meets the SLOs at no rate down to ", 1)])
def test_capacity_command_answers_when_no_boundary_exists(tmp_path, capsys, slo, answer, status):
    # no rate passing is an answer, printed and written, but a script must be able to tell it: status 1 (as
    # tune-k's unmet SLO); every rate passing is a capacity at the bound: 0
    import yaml

    from servesim.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": {
        "type": "poisson", "rate": 5.0, "num_requests": 20, "prompt_tokens": {"type": "fixed", "value": 100},
        "output_tokens": {"type": "fixed", "value": 10}}}))
    assert main(["capacity", str(cfg), "--slo", slo, "--replications", "1", "--out", str(tmp_path / "o"),
                 "--quiet"]) == status
    assert answer in capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "o" / "capacity.csv")
    assert len(frame) <= 21 and frame["passed"].nunique() == 1


def test_request_growth_bounds_doubling_only_without_max_rate():
    class GrowingSimulate(ConstantSimulate):
        def __call__(self, config, *, seed=None, base_dir=None):
            result = super().__call__(config, seed=seed, base_dir=base_dir)
            result.summary["num_requests"] = result.summary["completed"] = int(10 * config["workload"]["rate"])
            return result

    from servesim.analysis.capacity import MAX_REQUEST_GROWTH

    def search():
        return CapacitySearch(poisson_cfg(1.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                              simulate=GrowingSimulate(0.5))

    free = search().max_rate()
    assert free.capped and free.capacity == 2 * MAX_REQUEST_GROWTH  # 32 x the first point's requests: stop
    assert free.stopped == f"at {MAX_REQUEST_GROWTH}x the first point's requests"
    bounded = search().max_rate(max_rate=1000.0)
    assert bounded.capped and bounded.capacity == 1000.0 and bounded.stopped is None


def test_a_replica_count_resting_on_a_drained_burst_says_so():
    """--replicas answered 2 replicas for 100 req/s from 300 requests arriving in 3 s (served at 21 req/s)
    without the burst note the rate search prints."""
    from servesim.cli.capacity import format_result

    search = CapacitySearch(poisson_cfg(2.0), Path("."), [parse_slo("itl_p99=1")], replications=1,
                            simulate=DrainedBurst(served=40.0))
    result = search.min_replicas(1000.0, max_replicas=8)
    assert result.capacity == 1
    assert ("note: at 1000 requests/s the run's 10 requests arrive in 0.01 s and are served at 40 requests/s: "
            "a burst drained") in format_result(result, search)


@pytest.mark.parametrize("extra, message", [
    (["--replicas", "10", "--max-rate", "5"], "--max-rate: bounds the rate search; --replicas searches"),
    (["--max-replicas", "5"], "--max-replicas: bounds the replica search of --replicas TARGET_RATE"),
])
def test_capacity_refuses_an_option_of_the_other_search(tmp_path, capsys, extra, message):
    """--max-rate was ignored with --replicas, and --max-replicas without it."""
    from servesim.cli import main

    status = main(["capacity", str(ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"), "--slo", "ttft_p99=1",
                   *extra, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"servesim: error: {message}") and err.count("\n") == 1
