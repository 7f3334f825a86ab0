"""Multi-replica deployments: router policies, same-instant ordering, merge, equivalences."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import simpy

from engine_helpers import flat_step_model, realistic_step_model
from servesim.config.models import load_config
from servesim.deployment import Deployment, build_deployment
from servesim.engine.core import Engine
from servesim.engine.router import UrgentTimeout
from servesim.metrics.latencies import request_latencies
from servesim.metrics.steps import expand_step_durations
from servesim.wiring import arrival_source, build_engine
from servesim.workload.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"


def factory(wl, step_time=None, *, mode="run", kv_blocks=100_000, max_num_seqs=256):
    st = step_time or realistic_step_model()
    return lambda src: Engine(prompt_tokens=wl.prompt_tokens, output_tokens=wl.output_tokens, arrivals=src,
                              step_time=st, kv_blocks_total=kv_blocks, block_size=16, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=8192, mode=mode)


def run(wl, replicas, router, **kw) -> Deployment:
    dep = Deployment(wl, factory(wl, **kw), replicas, router)
    dep.env.run()
    return dep


def assert_same(a, b, where="output"):
    """Field-by-field, bit-for-bit equality of two (nested) output dataclasses."""
    for f in dataclasses.fields(a):
        u, v = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(u):
            assert_same(u, v, f"{where}.{f.name}")
        elif isinstance(u, np.ndarray):
            assert u.dtype == v.dtype and np.array_equal(u, v, equal_nan=True), f"{where}.{f.name}"
        else:
            assert u == v, f"{where}.{f.name}: {u!r} != {v!r}"


def poisson_workload(seed, n, rate, prompt=(200, 2000), output=(20, 400)):
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return Workload(arrival_s=np.cumsum(rng.exponential(1 / rate, n)), prompt_tokens=rng.integers(*prompt, n),
                    output_tokens=rng.integers(*output, n))


def closed_workload(seed, n, concurrency, think_s=0.0):
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return Workload(arrival_s=np.full(n, np.nan), prompt_tokens=rng.integers(10, 2000, n),
                    output_tokens=rng.integers(1, 300, n), concurrency=concurrency, think_time_s=think_s)


def single_engine(wl, **kw):
    engine = factory(wl, **kw)(arrival_source(wl))
    env = simpy.Environment()
    env.process(engine.process(env))
    env.run()
    return engine.output()


# ---------------------------------------------------------------- R = 1 is the single engine
def test_one_replica_from_config_equals_single_engine_bit_for_bit():
    overrides = {"workload.max_requests": 1500, "workload.rate_scale": 8.0}
    cfg, folder = load_config(CONFIG, overrides)
    engine, env, _ = build_engine(cfg, folder, np.random.SeedSequence(3))
    env.run()
    dep, env2, info = build_deployment(cfg, folder, np.random.SeedSequence(3))
    env2.run()
    assert_same(engine.output(), dep.output())
    assert info["replicas"] == 1 and info["kv_cache_blocks_total"] == info["kv_cache_blocks"]


@pytest.mark.parametrize("think_s", [0.0, 0.05])
def test_one_replica_closed_loop_equals_single_engine(think_s):
    wl = closed_workload(5, 300, 12, think_s)
    assert_same(single_engine(wl), run(wl, 1, "least_outstanding").output())


# ---------------------------------------------------------------- router policies
def test_round_robin_assignment_is_exact_and_replicas_are_independent():
    wl = poisson_workload(1, 600, 30.0)
    dep = run(wl, 3, "round_robin")
    np.testing.assert_array_equal(dep.assignment, np.arange(600) % 3)
    # open loop + round robin: replica j is exactly a single engine fed with requests j, j+3, ...
    for j, out in enumerate(dep.replica_outputs()):
        sub = Workload(arrival_s=wl.arrival_s[j::3], prompt_tokens=wl.prompt_tokens[j::3],
                       output_tokens=wl.output_tokens[j::3])
        alone = single_engine(sub)
        np.testing.assert_array_equal(out.requests.request_id, np.arange(j, 600, 3))
        for name in ("first_scheduled_s", "first_token_s", "finish_s", "generated_tokens", "preemptions"):
            np.testing.assert_array_equal(getattr(out.requests, name), getattr(alone.requests, name))
        # its runs of decode steps are also cut at the other replicas' arrivals: same steps, more rows
        np.testing.assert_array_equal(expand_step_durations(out.steps)[0], expand_step_durations(alone.steps)[0])
        itl = lambda s: int((s.itl_samples * s.num_steps).sum())  # noqa: E731
        assert itl(out.steps) == itl(alone.steps)


@pytest.mark.parametrize("replicas,concurrency,n", [(4, 8, 200), (3, 6, 200), (2, 6, 101)])
def test_least_outstanding_balances_a_symmetric_closed_loop(replicas, concurrency, n):
    wl = Workload(arrival_s=np.full(n, np.nan), prompt_tokens=np.full(n, 100), output_tokens=np.full(n, 50),
                  concurrency=concurrency)
    counts = np.bincount(run(wl, replicas, "least_outstanding").assignment, minlength=replicas)
    assert counts.sum() == n and counts.max() - counts.min() <= 1


def test_least_outstanding_counts_a_finish_at_the_arrival_instant():
    # Flat 10 ms steps. A (t=0) -> replica 0, finishes at 30 ms (3 tokens); B (5 ms) -> replica 1 (0 has
    # one outstanding), finishes at 35 ms; C arrives at exactly 30 ms: A counts as finished -> replica 0,
    # and replica 0 schedules C in the step that starts at 30 ms.
    wl = Workload(arrival_s=[0.0, 0.005, 0.030], prompt_tokens=[10, 10, 10], output_tokens=[3, 3, 3])
    dep = run(wl, 2, "least_outstanding", step_time=flat_step_model(0.01))
    np.testing.assert_array_equal(dep.assignment, [0, 1, 0])
    req = dep.output().requests
    np.testing.assert_array_equal(req.finish_s, [0.03, 0.035, 0.06])
    assert req.first_scheduled_s[2] == 0.03


def test_router_runs_before_replicas_at_the_same_instant():
    # shortest_queue, max_num_seqs = 1, flat 10 ms steps, 3 tokens each (30 ms a request). A (t=0) -> replica 0
    # (all tie); B (1 ms): both queues empty, unfinished 1 vs 0 -> replica 1; C (2 ms): queues empty, unfinished
    # 1 and 1 -> replica 0 (lowest index), where it waits behind A until A finishes at 30 ms. D arrives at
    # exactly 30 ms: the router runs BEFORE replica 0 admits C at that instant, sees C waiting there and an
    # empty queue on replica 1, and sends D to replica 1 (had replica 0 stepped first, both queues would be
    # empty and both replicas hold one unfinished request: D would go to replica 0).
    wl = Workload(arrival_s=[0.0, 0.001, 0.002, 0.030], prompt_tokens=[10] * 4, output_tokens=[3] * 4)
    dep = run(wl, 2, "shortest_queue", step_time=flat_step_model(0.01), max_num_seqs=1)
    np.testing.assert_array_equal(dep.assignment, [0, 1, 0, 1])
    req = dep.output().requests
    np.testing.assert_allclose(req.first_scheduled_s, [0.0, 0.001, 0.03, 0.031], rtol=0, atol=1e-12)
    np.testing.assert_allclose(req.finish_s, [0.03, 0.031, 0.06, 0.061], rtol=0, atol=1e-12)


def test_shortest_queue_breaks_ties_by_fewest_unfinished_requests():
    # below saturation every waiting queue is empty: the requests spread as least_outstanding spreads them
    # (the lowest index alone had sent nearly all of them to replica 0)
    wl = poisson_workload(5, 400, 20.0)
    assert np.bincount(run(wl, 4, "shortest_queue").assignment, minlength=4).min() >= 90  # 100 each if even


def test_urgent_timeout_precedes_normal_events_of_the_same_time():
    env = simpy.Environment()
    seen = []
    env.timeout(5).callbacks.append(lambda e: seen.append("normal, scheduled first"))
    UrgentTimeout(env, 5).callbacks.append(lambda e: seen.append("urgent"))
    env.timeout(4).callbacks.append(lambda e: seen.append("earlier"))
    env.run()
    assert seen == ["earlier", "urgent", "normal, scheduled first"]
    with pytest.raises(ValueError):
        UrgentTimeout(env, -1)


# ---------------------------------------------------------------- equivalences and determinism
@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "shortest_queue"])
@pytest.mark.parametrize("loop", ["open", "closed"])
def test_run_mode_equals_step_mode_with_replicas(router, loop):
    wl = poisson_workload(2, 300, 25.0) if loop == "open" else closed_workload(2, 300, 12, 0.02)
    a = run(wl, 3, router, mode="run")
    b = run(wl, 3, router, mode="step")
    np.testing.assert_array_equal(a.assignment, b.assignment)
    assert_same(a.output().requests, b.output().requests)
    np.testing.assert_array_equal(np.sort(a.output().extra_itl_s), np.sort(b.output().extra_itl_s))
    # the summary's float sums see the steps in one order in both modes (a run is one row: the merged rows
    # interleave the replicas otherwise): the ITL sample arrays and the whole summary are equal bit for bit
    from servesim.metrics import summarize
    from servesim.metrics.steps import itl_samples

    for left, right in zip(itl_samples(a.output()), itl_samples(b.output())):
        np.testing.assert_array_equal(left, right)
    assert summarize(a.output()) == summarize(b.output())


def test_deterministic_and_merge_layout():
    wl = poisson_workload(4, 400, 40.0)
    a, b = run(wl, 3, "least_outstanding"), run(wl, 3, "least_outstanding")
    out, outs = a.output(), a.replica_outputs()
    assert_same(out, b.output())
    assert out.kv_blocks_total == 3 * (100_000 - 1)  # usable blocks: vLLM keeps one null block per replica
    assert len(out.steps) == sum(len(o.steps) for o in outs)
    assert np.all(np.diff(out.steps.start_s) >= 0)
    assert out.end_s == max(o.end_s for o in outs)
    assert sorted(np.concatenate([o.requests.request_id for o in outs]).tolist()) == list(range(400))
    for j, o in enumerate(outs):  # each request's merged row is its replica's row
        rows = o.requests.request_id
        np.testing.assert_array_equal(out.requests.finish_s[rows], o.requests.finish_s)


def test_merged_rows_name_their_replica_in_the_csvs_and_the_figure(tmp_path):
    """The merged steps interleave the replicas' rows: each row and request carries its replica (the
    ``replica`` column), and the figure draws each replica's KV use against ONE replica's pool (it had
    divided by all replicas' blocks: a quarter of the truth with 4 replicas)."""
    import matplotlib

    matplotlib.use("Agg")
    from servesim.metrics import summarize
    from servesim.metrics.outputs import REPLICA_COLUMN, REQUEST_COLUMNS, STEP_COLUMNS, request_columns, step_columns
    from servesim.plots.latency import latency_figure

    wl = poisson_workload(4, 90, 40.0)
    dep = run(wl, 3, "least_outstanding", kv_blocks=2_000)
    out, outs = dep.output(), dep.replica_outputs()
    np.testing.assert_array_equal(out.request_replica, dep.assignment)
    assert out.num_replicas == 3 and len(out.step_replica) == len(out.steps)
    for j, o in enumerate(outs):
        mine = out.step_replica == j
        np.testing.assert_array_equal(out.steps.start_ps[mine], o.steps.start_ps)
        np.testing.assert_array_equal(out.steps.kv_blocks_used[mine], o.steps.kv_blocks_used)
    assert list(request_columns(out)) == [*REQUEST_COLUMNS, REPLICA_COLUMN]
    assert list(step_columns(out)) == [*STEP_COLUMNS, REPLICA_COLUMN]
    np.testing.assert_array_equal(step_columns(out)[REPLICA_COLUMN], out.step_replica)
    alone = single_engine(wl)
    assert list(request_columns(alone)) == list(REQUEST_COLUMNS) and list(step_columns(alone)) == list(STEP_COLUMNS)

    fig = latency_figure(out, summarize(out))
    kv_axis = fig.axes[3]
    lines = [line for line in kv_axis.get_lines() if line.get_label().startswith("replica")]
    assert [line.get_label() for line in lines] == ["replica 0", "replica 1", "replica 2"]
    per_replica_pool = out.kv_blocks_total // 3
    for j, line in enumerate(lines):
        peak = out.steps.kv_blocks_used[out.step_replica == j].max()
        assert np.nanmax(line.get_ydata()) == pytest.approx(100.0 * peak / per_replica_pool, rel=1e-12)
    assert "1999 blocks per replica, 3 replicas" in kv_axis.get_title()


def test_simulate_with_replicas_reports_per_replica_summaries():
    from servesim.api import simulate

    cfg, folder = load_config(CONFIG, {"workload.max_requests": 400, "workload.rate_scale": 4.0,
                                       "deployment.replicas": 2, "deployment.router": "round_robin"})
    result = simulate(cfg, base_dir=folder)
    assert len(result.summary["replicas"]) == 2
    assert [r["num_requests"] for r in result.summary["replicas"]] == [200, 200]
    assert result.summary["completed"] == 400
    assert result.output.kv_blocks_total == 2 * (result.info["kv_cache_blocks"] - 1)  # without the null blocks


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "shortest_queue", "prefix_aware"])
def test_a_run_cut_by_max_time_routes_only_the_requests_that_arrived(router):
    """simulation.max_time_s with replicas: a request no replica pulled before it stopped had not arrived;
    it is unrouted (replica -1), as a single engine leaves it unarrived, and the router's and the
    replicas' counts are those of the arrived requests."""
    from servesim.api import simulate

    cfg, folder = load_config(CONFIG, {"workload.max_requests": 600, "workload.rate_scale": 2.0,
                                       "deployment.replicas": 3, "deployment.router": router,
                                       "simulation.max_time_s": 20.0})
    result = simulate(cfg, base_dir=folder)
    summary, requests = result.summary, result.output.requests
    assign = np.asarray(result.output.request_replica)
    arrived = ~np.isnan(np.asarray(requests.arrival_s))
    assert 50 < summary["arrived"] < 400  # the cut left most of the 600 requests unarrived
    assert np.array_equal(assign >= 0, arrived)  # routed exactly when arrived
    assert summary["arrived"] == int(arrived.sum())
    per_replica = summary["router"]["requests_per_replica"]
    assert per_replica == [int(np.count_nonzero(assign == j)) for j in range(3)]
    assert sum(per_replica) == summary["arrived"]
    assert [r["num_requests"] for r in summary["replicas"]] == per_replica
    assert [r["arrived"] for r in summary["replicas"]] == per_replica
    if router == "prefix_aware":
        assert 0 <= summary["router"]["prefix_matched_blocks"] <= summary["router"]["prefix_hashed_blocks"]
    # the same config without the cut routes every request, and the cut's arrived requests went where the
    # uncut run sent them (routing decisions at arrival time do not depend on the later cut)
    whole = simulate(load_config(CONFIG, {"workload.max_requests": 600, "workload.rate_scale": 2.0,
                                          "deployment.replicas": 3, "deployment.router": router})[0],
                     base_dir=folder)
    full_assign = np.asarray(whole.output.request_replica)
    assert (full_assign >= 0).all()
    assert np.array_equal(assign[arrived], full_assign[arrived])


# ---------------------------------------------------------------- statistics
def test_replica_ttft_close_to_one_replica_at_a_fraction_of_the_rate():
    """R replicas at rate lam vs one replica at lam / R (Poisson): per-replica mean TTFT within [-12%, +2%].

    least_outstanding balances load, so its per-replica arrivals are a bit smoother than Poisson and its
    TTFT a few percent lower (measured ~ -5%); a 10% error either way falls outside the interval.
    """
    R, lam, n = 4, 20.0, 2000
    multi, single = [], []
    for rep in range(2):
        wl = poisson_workload([7, rep], n, lam)
        dep = run(wl, R, "least_outstanding", kv_blocks=20_000)
        multi.append(np.mean([np.nanmean(request_latencies(o.requests)["ttft_s"]) for o in dep.replica_outputs()]))
        one = poisson_workload([8, rep], n // R, lam / R)
        single.append(np.nanmean(request_latencies(run(one, 1, "round_robin", kv_blocks=20_000).output().requests)["ttft_s"]))
    ratio = np.mean(multi) / np.mean(single)
    assert 0.88 <= ratio <= 1.02, ratio


@pytest.mark.parametrize("replicas, requests, refused", [
    (4096, 4000, False), (4097, 10, True),  # the replica limit
    (1000, 20000, False), (1001, 20000, True),  # replicas x requests: 2 x 10^7 at most
])
def test_a_deployment_too_large_to_simulate_is_refused_in_one_line(replicas, requests, refused):
    from servesim.deployment import MAX_REPLICA_REQUESTS, MAX_REPLICAS, check_deployment_size
    from servesim.errors import SettingError

    assert (MAX_REPLICAS, MAX_REPLICA_REQUESTS) == (4096, 2 * 10**7)
    if not refused:
        check_deployment_size(replicas, requests, "poisson")
        return
    with pytest.raises(SettingError) as err:
        check_deployment_size(replicas, requests, "poisson")
    message = str(err.value)
    assert message.startswith(f"deployment.replicas: {replicas} replicas of a {requests}-request workload; ")
    assert "at most 4,096 replicas and 20,000,000 replicas x requests" in message and "\n" not in message


def test_a_huge_replica_count_fails_before_any_replica_is_built(tmp_path):
    # 100,000 replicas of a 100-request workload ran for hours (every replica over the whole workload)
    from servesim.api import simulate
    from servesim.errors import ConfigError

    cfg = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "deployment": {"replicas": 100_000},
           "workload": {"type": "poisson", "rate": 1.0, "num_requests": 100,
                        "prompt_tokens": {"type": "fixed", "value": 100}, "output_tokens": {"type": "fixed", "value": 10}}}
    with pytest.raises(ConfigError, match=r"^deployment\.replicas: 100000 replicas of a 100-request workload"):
        simulate(cfg)
