"""One run's headline numbers as a JSON-serialisable dict (what ``summary.json`` holds)."""

from __future__ import annotations

import math

import numpy as np

from servesim.engine.output import EngineOutput
from servesim.errors import ConfigError
from servesim.metrics.latencies import request_latencies
from servesim.metrics.percentiles import distribution_stats
from servesim.metrics.saturation import detect_saturation
from servesim.metrics.steps import busy_time_weighted, itl_samples, row_durations_ps

#: SLO keys understood by :func:`summarize` (seconds): a request is "good" when each given one is met.
SLO_KEYS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s")


def measurement_window(out: EngineOutput, measure) -> dict:
    """Throughput over a steady-state window (see :class:`servesim.config.models.MeasureWindow`).

    Args:
        out: the engine's output.
        measure: the window (``after_s``, ``until_s``, ``after_completed``, ``until_completed``).

    Returns:
        ``{start_s, end_s, completed, request_throughput, output_throughput, total_token_throughput,
        tpot_s}`` (requests/s, tokens/s; ``tpot_s`` as in :func:`summarize`); throughputs are 0 and
        ``tpot_s`` has ``None`` entries when the window is empty.
    """
    req = out.requests
    lat = request_latencies(req)
    done = lat["completed"]
    finish = np.asarray(req.finish_s, dtype=np.float64)
    order = np.sort(finish[done])
    start = float(measure.after_s or 0.0)
    end = float(order[-1]) if len(order) else 0.0
    if measure.after_completed and len(order):
        start = max(start, float(order[min(measure.after_completed, len(order)) - 1]))
    if measure.until_s is not None:
        end = min(end, float(measure.until_s))
    if measure.until_completed and len(order):
        end = min(end, float(order[min(measure.until_completed, len(order)) - 1]))
    inside = done & (finish > start) & (finish <= end)
    span = end - start
    out_tokens = float(np.asarray(req.output_tokens, dtype=np.int64)[inside].sum())
    in_tokens = float(np.asarray(req.prompt_tokens, dtype=np.int64)[inside].sum())
    count = int(np.count_nonzero(inside))
    tpot = lat["tpot_s"][inside]
    return {
        "start_s": start,
        "end_s": end,
        "completed": count,
        "request_throughput": count / span if span > 0 else 0.0,
        "output_throughput": out_tokens / span if span > 0 else 0.0,
        "total_token_throughput": (out_tokens + in_tokens) / span if span > 0 else 0.0,
        "tpot_s": distribution_stats(tpot[~np.isnan(tpot)]),
    }


#: The top-level keys of a run's summary (:func:`summarize`; ``replicas`` and ``router`` for a deployment)
#: whose values are numbers: each is a column of a sweep's summary.csv as it is named.
SCALAR_METRICS: tuple[str, ...] = (
    "num_requests", "arrived", "completed", "duration_s", "request_throughput", "output_throughput",
    "total_token_throughput", "preemptions", "saturated", "waiting_queue_slope_per_s", "goodput",
    "slo_attainment",
)
#: The top-level keys whose values are groups (mappings, lists): their columns in summary.csv are
#: ``key.part`` (``ttft_s.p99``, ``spec_decode.per_position_acceptance_rate.1``).
GROUPED_METRICS: tuple[str, ...] = (
    "ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "kv_cache_utilization", "batch_size", "spec_decode",
    "prefix_cache", "measurement_window", "replicas", "router",
)


def is_metric_column(name: str) -> bool:
    """Whether ``name`` is (or could be) a metric column of a sweep's summary.csv: a scalar metric, or a
    part of a grouped one (``ttft_s.mean``). A grouped metric's own name (``batch_size``) is not a column."""
    return name in SCALAR_METRICS or name.split(".")[0] in GROUPED_METRICS and "." in name


def summarize(out: EngineOutput, slo: dict | None = None, measure=None) -> dict:
    """Summarise one engine run, following ``vllm bench serve``'s definitions.

    Latency distributions are over COMPLETED requests (``finish_s`` set), as ``vllm bench serve`` counts
    only successful requests; see :mod:`servesim.metrics.latencies` for TTFT, TPOT, E2E and queueing
    delay. Requests with one output token have no TPOT and are left out of ``tpot_s``. ITL is every gap
    between consecutive token emissions of a request: each step's duration repeated ``itl_samples``
    times, plus ``extra_itl_s`` (see :func:`servesim.metrics.steps.itl_samples`); its percentiles are
    exact weighted percentiles (:func:`servesim.metrics.percentiles.weighted_percentiles`).

    Args:
        out: the engine's output.
        slo: optional service-level objectives in seconds, any of ``ttft_s``, ``tpot_s``, ``e2e_s``. A
            completed request is good when each given latency is ``<=`` its objective (a request with one
            output token counts TPOT as 0, as ``vllm bench serve`` does).

    Returns:
        A dict of plain ints, floats, bools, lists and dicts (``None`` where a value is undefined):
        ``num_requests`` (the workload's), ``arrived`` (those that arrived before the run stopped: all of
        them unless ``simulation.max_time_s`` cut it off), ``completed``; ``duration_s`` = last finish -
        first arrival (s);
        ``request_throughput`` (completed requests/s), ``output_throughput`` (output tokens of completed
        requests/s), ``total_token_throughput`` (prompt + output tokens of completed requests/s), all over
        ``duration_s``; ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s``, ``queue_s``: each
        ``{mean, p50, p90, p95, p99}`` in seconds over the completed requests only (a run cut off by
        ``simulation.max_time_s`` leaves the others out); ``preemptions`` (total over requests);
        ``kv_cache_utilization`` and ``batch_size``: ``{mean, max}`` over busy time, exact (integer
        picoseconds; the KV mean integrates the blocks in use step by step, ``kv_block_ps``, so a run of
        steps and the same steps one at a time agree bit for bit), utilisation = blocks used /
        ``kv_blocks_total``, the max over the rows' ends;
        ``saturated`` (bool, rule of :mod:`servesim.metrics.saturation`) and
        ``waiting_queue_slope_per_s`` (requests/s); with ``slo``: ``goodput`` (good requests/s over
        ``duration_s``) and ``slo_attainment`` (good requests / ``arrived``: a request still waiting or
        running when the run stopped counts as not good, one that had not arrived is not counted); with speculative
        decoding counters: ``spec_decode`` (see :func:`spec_decode_summary`); with ``measure`` (a
        :class:`~servesim.config.models.MeasureWindow`): ``measurement_window`` (see
        :func:`measurement_window`).

    Raises:
        ConfigError: ``slo`` has an unknown key or a non-positive/non-numeric objective.
    """
    req = out.requests
    lat = request_latencies(req)
    done = lat["completed"]
    n = len(req)
    completed = int(np.count_nonzero(done))
    arrival = np.asarray(req.arrival_s, dtype=np.float64)
    arrived = int(np.count_nonzero(~np.isnan(arrival)))  # NaN: not arrived when max_time_s stopped the run
    finish = np.asarray(req.finish_s, dtype=np.float64)
    duration = float(finish[done].max() - np.nanmin(arrival)) if completed else 0.0  # NaN: not arrived
    output_tokens = int(np.asarray(req.output_tokens, dtype=np.int64)[done].sum())
    prompt_tokens = int(np.asarray(req.prompt_tokens, dtype=np.int64)[done].sum())

    def rate(count: float) -> float:
        return float(count / duration) if duration > 0 else 0.0

    summary: dict = {
        "num_requests": n,
        "arrived": arrived,
        "completed": completed,
        "duration_s": duration,
        "request_throughput": rate(completed),
        "output_throughput": rate(output_tokens),
        "total_token_throughput": rate(output_tokens + prompt_tokens),
    }
    tpot = lat["tpot_s"][done]
    summary["ttft_s"] = distribution_stats(lat["ttft_s"][done])
    summary["tpot_s"] = distribution_stats(tpot[~np.isnan(tpot)])
    summary["itl_s"] = distribution_stats(*itl_samples(out))
    summary["e2e_s"] = distribution_stats(lat["e2e_s"][done])
    summary["queue_s"] = distribution_stats(lat["queue_s"][done])
    summary["preemptions"] = int(np.asarray(req.preemptions, dtype=np.int64).sum())

    steps = out.steps
    row_ps = row_durations_ps(steps)
    if out.kv_blocks_total > 0:
        summary["kv_cache_utilization"] = busy_time_weighted(steps.kv_blocks_used, row_ps, steps.kv_block_ps,
                                                             scale=out.kv_blocks_total)
    else:
        summary["kv_cache_utilization"] = {"mean": None, "max": None}
    summary["batch_size"] = busy_time_weighted(steps.batch_size, row_ps)
    sat = detect_saturation(out)
    summary["saturated"] = sat.saturated
    summary["waiting_queue_slope_per_s"] = sat.slope_per_s

    if slo is not None:
        good = _good_requests(lat, slo)
        n_good = int(np.count_nonzero(good))
        summary["goodput"] = rate(n_good)
        summary["slo_attainment"] = float(n_good / arrived) if arrived else 0.0
    if out.spec_counters:
        summary["spec_decode"] = spec_decode_summary(out.spec_counters)
    if out.prefix_cache:
        summary["prefix_cache"] = prefix_cache_summary(out.prefix_cache)
    if measure is not None:
        summary["measurement_window"] = measurement_window(out, measure)
    return summary


def _good_requests(lat: dict[str, np.ndarray], slo: dict) -> np.ndarray:
    """Bool mask (N,) of completed requests whose latencies are all within ``slo`` (seconds)."""
    good = lat["completed"].copy()
    for key, limit in slo.items():
        if key not in SLO_KEYS:
            raise ConfigError(f"slo: unknown key {key!r}; expected one of {', '.join(SLO_KEYS)} (seconds)")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigError(f"slo.{key}: expected a positive number of seconds, got {limit!r}")
        values = lat[key]
        if key == "tpot_s":
            values = np.where(np.isnan(values) & lat["completed"], 0.0, values)
        good &= values <= limit
    return good


def prefix_cache_summary(counters: dict) -> dict:
    """vLLM's prefix-cache metrics from an engine's counters (tokens).

    ``queries`` and ``hits`` are ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``: the known
    tokens of each request admitted from the waiting queue for the first time and its prefix-cache hit;
    re-admissions after a preemption count in ``preempted_queries`` / ``preempted_hits`` (vLLM 0.32
    ``PrefixCacheStats``). ``hit_rate`` = hits / queries (None without queries).

    Args:
        counters: :class:`~servesim.engine.block_manager.PrefixCacheStats` fields as a dict (ints).
    """
    out = {key: int(value) for key, value in counters.items()}
    out["hit_rate"] = out["hits"] / out["queries"] if out.get("queries") else None
    return out


def spec_decode_summary(counters: dict) -> dict:
    """Rates derived from vLLM's speculative-decoding counters (``v1/spec_decode/metrics.py``).

    Args:
        counters: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` (ints) and
            ``num_accepted_tokens_per_pos`` (sequence of ints, one per draft position).

    Returns:
        The counters (as ints / list of ints) plus ``mean_acceptance_length`` = 1 + accepted / drafts
        (tokens per verification step, bonus token included), ``draft_acceptance_rate`` = accepted /
        draft tokens, and ``per_position_acceptance_rate`` = accepted_per_pos[i] / drafts
        (unconditional); ``None`` where a denominator is zero.
    """
    drafts = int(counters.get("num_drafts", 0))
    draft_tokens = int(counters.get("num_draft_tokens", 0))
    accepted = int(counters.get("num_accepted_tokens", 0))
    per_pos = [int(v) for v in counters.get("num_accepted_tokens_per_pos", [])]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": per_pos,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "per_position_acceptance_rate": [v / drafts for v in per_pos] if drafts else None,
    }


def json_safe(value: object) -> object:
    """``value`` with numpy scalars/arrays turned into Python ones and NaN/inf into ``None``.

    Used before writing ``summary.json`` so the file is strict JSON.
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
