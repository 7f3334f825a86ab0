"""A user's ``vllm bench serve --save-result`` JSON as a validation case: replay its requests, compare.

A case file may list, beside ``cases:``, ``vllm_bench:`` entries (:class:`BenchCase`)::

    vllm_bench:
      - name: my-h100
        bench_result: bench-8.json         # vllm bench serve ... --save-result --result-filename bench-8.json
        config:                            # the server's settings (a run config without the workload)
          hardware: h100-sxm
          model: llama-3.1-8b
          engine: {max_num_seqs: 256}
        tolerance: 0.05

or ``servesim validate --vllm-bench bench-8.json --server server.yaml``. The workload is rebuilt from the
result: its requests' (input, output) lengths (``input_lens``/``output_lens``, written with
``--save-detailed``; otherwise every request gets the mean lengths ``total_input_tokens / completed`` and
``total_output_tokens / completed``), ``completed`` requests in all, sent like the benchmark sent them:
``max_concurrency`` clients in a closed loop when it was set, else Poisson arrivals at ``request_rate``
(gamma gaps of coefficient of variation ``1 / sqrt(burstiness)`` when ``burstiness`` is not 1), else all at
once (``request_rate: inf``). With per-request lengths the closed and Poisson loops resample the pairs
(``lengths: {type: empirical}``); the all-at-once replay keeps them in order. Reported: mean TTFT
(``mean_ttft_ms``), mean TPOT (``mean_tpot_ms``) and output throughput (``output_throughput``), measured
against simulated (keys of vLLM's ``benchmarks/serve`` result JSON).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from servesim.input_models import InputModel
from servesim.errors import ConfigError
from servesim.workload.config import MAX_REQUESTS
from servesim.workload.rawtrace import MAX_TOKEN_COUNT

METRICS: tuple[tuple[str, str, str, float], ...] = (
    # (result key, servesim summary key, unit, factor from the result's unit to servesim's)
    ("mean_ttft_ms", "ttft_s.mean", "s", 1e-3),
    ("mean_tpot_ms", "tpot_s.mean", "s", 1e-3),
    ("output_throughput", "output_throughput", "tok/s", 1.0),
)
"""What a replay reports: measured key of the result, simulated summary key, unit, unit factor."""


class BenchCase(InputModel):
    """A ``vllm bench serve --save-result`` result and the server settings it was measured with."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    bench_result: str = Field(min_length=1, description="the result JSON, relative to the case file")
    config: dict[str, Any] | str = Field(description="run config without workload, or a path to one")
    source: str = "vllm bench serve --save-result"
    tolerance: float = Field(0.10, gt=0, lt=1)
    tolerance_source: str = ""
    seed: int = Field(0, ge=0)
    fast: bool = True
    notes: str = ""


def result_number(obj: dict, key: str, where: str, *, allow_inf: bool = False) -> float | None:
    """The number >= 0 at ``obj[key]`` of a bench result (None when absent; ``"inf"`` allowed with ``allow_inf``).

    Raises:
        ConfigError: the value is not a finite number >= 0 (names ``where`` and ``key``).
    """
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, str) and allow_inf and value.lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == math.inf:
        # JSON's NaN and Infinity parse as floats: neither is a count, a time or a rate here
        raise ConfigError(f"{where}: {key}: expected a number >= 0 (got {value!r})")
    return float(value)


def result_count(obj: dict, key: str, where: str) -> int | None:
    """The whole number >= 0 at ``obj[key]`` of a bench result (a request count; None when absent).

    Raises:
        ConfigError: the value is not a whole number >= 0 (names ``where`` and ``key``).
    """
    value = result_number(obj, key, where)
    if value is not None and not value.is_integer():
        raise ConfigError(f"{where}: {key}: expected a whole number (got {obj[key]!r})")
    return None if value is None else int(value)


def _token_counts(values: list, key: str, where: str) -> list[int]:
    """A result's ``input_lens`` or ``output_lens``: integer token counts in ``0..MAX_TOKEN_COUNT``.

    Raises:
        ConfigError: an entry that is not such a count (names ``where``, ``key`` and the index).
    """
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_COUNT:
            raise ConfigError(f"{where}: {key}[{i}]: expected a token count, an integer in 0..{MAX_TOKEN_COUNT} "
                              f"(got {v!r})")
    return values


def read_bench_result(path: Path) -> dict:
    """The result object of a ``--save-result`` JSON file (the first one of a list or JSON lines).

    Raises:
        ConfigError: missing file, invalid JSON, a key given twice in one object, or not an object with
            ``completed`` > 0.
    """
    from servesim.input_files import parse_json, read_text

    text = read_text(path)
    try:
        data = parse_json(text, str(path))
    except json.JSONDecodeError:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            data = parse_json(first, str(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: invalid JSON ({exc.msg})") from None
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a `vllm bench serve --save-result` result object")
    completed = result_count(data, "completed", str(path))
    if not completed:
        raise ConfigError(f"{path}: completed: expected a positive number of requests")
    return data


def replay_workload(result: dict, where: str, folder: Path) -> tuple[dict, str]:
    """The workload config that replays ``result`` (writes a lengths file into ``folder`` when needed).

    Returns:
        (workload mapping, description of how the requests were rebuilt).

    Raises:
        ConfigError: the result lacks the lengths (``input_lens``/``output_lens`` or the totals), lists input
            and output lengths of different counts, lists fewer requests than ``completed``, has
            ``max_concurrency`` or ``request_rate`` 0 or a burstiness below 1e-6, more requests or a longer
            span of arrivals than servesim simulates, or a measured ``mean_tpot_ms`` where every replayed
            request has one output token (no TPOT to compare).
    """
    n = result_count(result, "completed", where) or 0
    if n > MAX_REQUESTS:  # numpy would try to hold them all first (a kill for lack of memory, not a message)
        raise ConfigError(f"{where}: completed: {n:.0f} requests; servesim simulates at most {MAX_REQUESTS}")
    # how the benchmark sent them, checked before the lengths and arrivals are drawn
    conc = result_count(result, "max_concurrency", where)
    if conc == 0:  # vllm bench serve writes null for no limit; 0 clients would send nothing
        raise ConfigError(f"{where}: max_concurrency: expected a positive number of clients, or null for no limit "
                          "(got 0)")
    rate = result_number(result, "request_rate", where, allow_inf=True)
    if rate == 0:  # vllm bench serve sends nothing at rate 0: not a run to replay ("inf" is all at once)
        raise ConfigError(f"{where}: request_rate: expected a positive rate in req/s, or \"inf\" for all at once "
                          "(got 0)")
    if not conc and rate is not None and math.isfinite(rate):
        from servesim.wiring import MAX_ARRIVAL_SPAN_S

        if n / rate > MAX_ARRIVAL_SPAN_S:
            raise ConfigError(f"{where}: completed / request_rate: {n} requests at {rate:g} req/s arrive over "
                              f"{n / rate:.3g} s; servesim simulates at most {MAX_ARRIVAL_SPAN_S:.3g} s "
                              "(~26 days) of arrivals")
    burst = result_number(result, "burstiness", where)
    if burst is None:
        burst = 1.0  # vllm bench serve's default: Poisson arrivals
    elif not burst >= 1e-6:  # the gamma shape: vLLM needs > 0; a vanishing one makes gaps no clock can hold
        raise ConfigError(f"{where}: burstiness: expected a positive gamma shape (1 = Poisson, smaller = burstier; "
                          f"at least 1e-06), got {result['burstiness']!r}")
    ins, outs = result.get("input_lens"), result.get("output_lens")
    if isinstance(ins, list) and isinstance(outs, list) and len(ins) != len(outs):
        raise ConfigError(f"{where}: input_lens lists {len(ins)} requests and output_lens {len(outs)} (expected "
                          "one (input, output) pair per request, as vllm bench serve --save-detailed writes them)")
    if isinstance(ins, list) and isinstance(outs, list) and ins:
        ins, outs = _token_counts(ins, "input_lens", where), _token_counts(outs, "output_lens", where)
        pairs = [(max(i, 1), max(o, 1)) for i, o in zip(ins, outs)]
        if n > len(pairs):  # vLLM lists every request it sent, the failed ones included
            raise ConfigError(f"{where}: completed: {n} requests, but input_lens and output_lens list {len(pairs)} "
                              "(expected completed <= the requests listed: a result of one benchmark run)")
        how = f"{len(pairs)} (input, output) pairs of the result"
    else:
        total_in, total_out = result_number(result, "total_input_tokens", where), result_number(result, "total_output_tokens", where)
        if total_in is None or total_out is None:
            raise ConfigError(f"{where}: expected input_lens/output_lens (--save-detailed) or "
                              "total_input_tokens and total_output_tokens")
        means = [round(total_in / n), round(total_out / n)]
        for key, total, mean in zip(("total_input_tokens", "total_output_tokens"), (total_in, total_out), means):
            if mean > MAX_TOKEN_COUNT:
                raise ConfigError(f"{where}: {key}: {total:g} tokens over {n} requests is {mean} per request "
                                  f"(expected at most {MAX_TOKEN_COUNT})")
        pairs = [(max(means[0], 1), max(means[1], 1))] * n
        how = f"{n} requests of the mean lengths {pairs[0][0]} / {pairs[0][1]} tokens (no input_lens in the result)"
    tpot = result.get("mean_tpot_ms")
    if (all(o == 1 for _, o in pairs) and isinstance(tpot, (int, float)) and not isinstance(tpot, bool)
            and tpot > 0):  # a one-token output has no TPOT: the summary's would be None
        raise ConfigError(f"{where}: mean_tpot_ms: measured, but every replayed request has one output token "
                          f"({how}), so the simulation defines no TPOT to compare; save the result with "
                          "--save-detailed (input_lens, output_lens)")
    trace = folder / "bench-requests.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2024-01-01 00:00:00.0000000,{i},{o}" for i, o in pairs]
    trace.write_text("\n".join(rows) + "\n", encoding="utf-8")
    lengths = {"type": "empirical", "path": str(trace), "format": "azure"}
    if conc:
        return ({"type": "closed_loop", "concurrency": int(conc), "num_requests": n, "lengths": lengths},
                f"{how}, resampled by {int(conc)} closed-loop client{'s' if int(conc) != 1 else ''}")
    if rate is not None and math.isfinite(rate) and rate > 0:
        if burst == 1.0:
            return ({"type": "poisson", "rate": rate, "num_requests": n, "lengths": lengths},
                    f"{how}, resampled, Poisson arrivals at {rate:g} req/s")
        return ({"type": "gamma", "rate": rate, "cv": 1.0 / math.sqrt(burst), "num_requests": n,
                 "lengths": lengths}, f"{how}, resampled, gamma arrivals at {rate:g} req/s (burstiness {burst:g})")
    return {"type": "trace", "path": str(trace), "format": "azure"}, f"{how}, all sent at once"
