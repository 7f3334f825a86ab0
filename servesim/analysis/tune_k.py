"""Tune vLLM's ``num_speculative_tokens_per_batch_size`` by simulation (``servesim tune-k``).

Procedure (all batch sizes in requests, throughputs in output tokens/s, times in s):

1. Grid. For each batch size ``b`` of a grid (default: powers of two up to the config's explicit
   ``engine.max_num_seqs``, else up to 256) and each ``k`` in ``0..k_max`` (``k = 0``: no
   ``speculative_config`` at all, plain decoding), the config runs as a closed loop of ``b`` clients
   (``workload: {type: closed_loop, concurrency: b, requests_per_client: n, think_time_s: 0}`` with the
   config's own length distributions; a trace workload lends its (prompt, output) pairs through
   ``lengths: {type: empirical}``), with ``speculative_config.num_speculative_tokens = k`` and neither a
   batch-size table nor ``disable_by_batch_size``.
2. Objective. Without SLOs: the mean over replications of the output throughput. With SLOs
   (``METRIC_STAT=SECONDS`` as in :mod:`servesim.analysis.capacity`): a point MEETS them when every request
   completed and, for each SLO, the mean over replications of the statistic is ``<=`` its target; its
   goodput is its output throughput when it meets them and 0 otherwise (output tokens/s). The best ``k``
   at ``b`` maximises the objective (ties: the smaller ``k``); when no ``k`` meets the SLOs at ``b``, it is
   the ``k`` closest to meeting them (smallest ``max_i statistic_i / target_i``; ties: the smaller ``k``).
   An SLO statistic undefined at a point where every request completed (TPOT or ITL of one-token
   outputs) is refused (:class:`ConfigError`).
3. Table (:func:`build_schedule`). Grid point ``b_i`` (sorted ``b_0 < b_1 < ...``) owns the batch sizes
   from its start to the next point's start minus 1; ``b_0`` starts at 1, the last point ends at
   ``max_num_seqs`` (4096 when the config does not set it). ``boundary="midpoint"`` (default) starts
   ``b_i`` at ``floor((b_(i-1) + b_i) / 2) + 1`` (a size between two grid points takes the k of the nearer
   one, the lower one on a tie); ``boundary="next"`` starts ``b_i`` at ``b_i`` (a size takes the k of the
   grid point at or below it). Consecutive ranges with equal ``k`` merge; each ``k`` is capped at
   ``num_speculative_tokens``.
4. Best fixed k: the ``k`` maximising the mean over batch sizes of ``objective(b, k) / max_k'
   objective(b, k')`` (share of the best attainable at each ``b``; batch sizes where every objective is 0
   are skipped; ties: the smaller ``k``). When no ``k`` meets the SLOs at any batch size (every objective
   0), it is the ``k`` closest to meeting them, as in step 2: the smallest mean over batch sizes of
   ``max_i statistic_i / target_i`` (ties: the smaller ``k``).
5. Check: the tuned schedule (``num_speculative_tokens`` = its largest ``k``, the table) runs at every
   grid batch size and is compared with the best fixed ``k`` and with no speculation (those two reuse
   the grid's runs: same configs, same seeds).

Seeds: one root ``SeedSequence(config.seed)``; replication ``r`` of every point uses its child ``r``
(:func:`servesim.seeding.child_seed`), the same at every point: common random numbers, so different ``k`` at
one ``b`` see the same request lengths and the same acceptance uniforms.

Note (vLLM semantics, kept by the engine): for EAGLE-family methods, MTP and draft models vLLM reserves
``num_speculative_tokens`` lookahead KV slots per request even where the table sets ``k = 0``, so the tuned
schedule can lose a little KV capacity to the fixed ``k = 0`` at large batch sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from servesim.analysis.capacity import Slo, refuse_time_limit, undefined_slo
from servesim.config.models import SimConfig
from servesim.errors import ConfigError, SettingError, naming_settings_of

#: Upper end of the table's last range when the config sets no ``engine.max_num_seqs`` (requests).
DEFAULT_TABLE_END = 4096
#: Largest default grid batch size when the config sets no ``engine.max_num_seqs`` (requests).
DEFAULT_MAX_BATCH = 256
#: Default closed-loop requests per client.
DEFAULT_REQUESTS_PER_CLIENT = 8
#: vLLM ``--speculative-config`` keys copied into the printed JSON when the config sets them.
VLLM_KEYS = ("method", "model", "draft_tensor_parallel_size", "prompt_lookup_min", "prompt_lookup_max",
             "rejection_sample_method", "synthetic_acceptance_rates")

Boundary = Literal["midpoint", "next"]


# ---------------------------------------------------------------------------------------------- the table
def default_batch_sizes(max_num_seqs: int | None) -> list[int]:
    """Powers of two 1, 2, 4, ... up to ``max_num_seqs`` (requests), or up to 256 when it is None."""
    limit = DEFAULT_MAX_BATCH if max_num_seqs is None else int(max_num_seqs)
    out, b = [], 1
    while b <= limit:
        out.append(b)
        b *= 2
    return out


def build_schedule(best_k: Mapping[int, int], max_batch_size: int, num_speculative_tokens: int | None = None,
                   boundary: Boundary = "midpoint") -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from the best ``k`` at each grid batch size.

    Args:
        best_k: grid batch size (requests, >= 1) -> best k (tokens, >= 0); at least one entry.
        max_batch_size: end of the last range (requests); >= the largest grid batch size.
        num_speculative_tokens: cap of every k (vLLM applies ``min(k, num_speculative_tokens)``), or None.
        boundary: where the range of one grid point ends and the next begins (module docstring, step 3).

    Returns:
        ``[[start, end, k], ...]``: inclusive ranges from 1 to ``max_batch_size``, contiguous, increasing,
        consecutive equal k merged.

    Raises:
        ValueError: empty ``best_k``, a batch size < 1, a k < 0, ``max_batch_size`` below the largest grid
            batch size, or an unknown ``boundary``.
    """
    if not best_k:
        raise ValueError("best_k: no batch sizes")
    if boundary not in ("midpoint", "next"):
        raise ValueError(f"boundary: expected 'midpoint' or 'next' (got {boundary!r})")
    sizes = sorted(int(b) for b in best_k)
    if sizes[0] < 1:
        raise ValueError(f"best_k: batch sizes must be >= 1 (got {sizes[0]})")
    if int(max_batch_size) < sizes[-1]:
        raise ValueError(f"max_batch_size {max_batch_size} is below the largest grid batch size {sizes[-1]}")
    starts = [1]
    for lo, hi in zip(sizes[:-1], sizes[1:]):
        starts.append((lo + hi) // 2 + 1 if boundary == "midpoint" else hi)
    table: list[list[int]] = []
    for i, b in enumerate(sizes):
        k = int(best_k[b])
        if k < 0:
            raise ValueError(f"best_k[{b}]: k must be >= 0 (got {k})")
        if num_speculative_tokens is not None:
            k = min(k, int(num_speculative_tokens))
        end = starts[i + 1] - 1 if i + 1 < len(sizes) else int(max_batch_size)
        if table and table[-1][2] == k:
            table[-1][1] = end
        else:
            table.append([starts[i], end, k])
    return table


def vllm_speculative_config(spec: Mapping[str, Any], table: list[list[int]]) -> dict[str, Any] | None:
    """The JSON for vLLM's ``--speculative-config``: the config's vLLM keys (``method``, ``model`` when it is
    a name or path, ...), ``num_speculative_tokens`` = the table's largest k, and the table.

    Returns None when every k is 0 (speculation never pays: run vLLM without ``--speculative-config``).
    servesim's own keys (``acceptance``, ``draft_cost``, ...) are left out.
    """
    k_max = max(int(row[2]) for row in table)
    if k_max == 0:
        return None
    out: dict[str, Any] = {}
    for key in VLLM_KEYS:
        value = spec.get(key)
        if value is not None and not (key == "model" and not isinstance(value, str)):
            out[key] = value
    out["num_speculative_tokens"] = k_max
    if out.get("synthetic_acceptance_rates") is not None:  # vLLM wants exactly one rate per speculative token
        out["synthetic_acceptance_rates"] = list(out["synthetic_acceptance_rates"])[:k_max]
    out["num_speculative_tokens_per_batch_size"] = [[int(a), int(b), int(k)] for a, b, k in table]
    return out


# ---------------------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Task:
    """One simulation: a point (batch size, variant) and one replication (picklable).

    ``variant`` is ``"k=N"`` for a fixed k (``k=0``: no speculation) or ``"tuned"``.
    """

    batch_size: int
    variant: str
    replication: int
    config: dict[str, Any]
    seed: np.random.SeedSequence
    base_dir: str


def run_task(task: Task) -> dict[str, Any]:
    """Simulate ``task`` (in a worker process) and return its flat metrics: ``output_throughput``
    (tokens/s), ``completed_share``, the ``ttft_s``/``tpot_s``/``itl_s``/``e2e_s``/``queue_s`` statistics
    (s) as ``METRIC_STAT`` keys, and ``mean_acceptance_length`` (tokens per round; NaN without drafts)."""
    from servesim.api import simulate

    s = simulate(task.config, seed=task.seed, base_dir=task.base_dir).summary
    row: dict[str, Any] = {"batch_size": task.batch_size, "variant": task.variant, "replication": task.replication,
                           "output_throughput": float(s["output_throughput"]),
                           "completed_share": float(s["completed"]) / max(int(s["num_requests"]), 1)}
    for metric in ("ttft", "tpot", "itl", "e2e", "queue"):
        for stat, v in (s.get(f"{metric}_s") or {}).items():
            if isinstance(v, (int, float)):
                row[f"{metric}_{stat}"] = float(v)
    spec = s.get("spec_decode") or {}
    mal = spec.get("mean_acceptance_length") if isinstance(spec, dict) else None
    row["mean_acceptance_length"] = float(mal) if isinstance(mal, (int, float)) else float("nan")
    return row


def _run_all(tasks: list[Task], executor: Executor | None,
             progress: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    if executor is None:
        rows = []
        for t in tasks:
            rows.append(run_task(t))
            if progress is not None:
                progress(rows[-1])
        return rows
    from concurrent.futures import as_completed

    futures = {executor.submit(run_task, t): i for i, t in enumerate(tasks)}
    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    try:
        for fut in as_completed(futures):
            rows[futures[fut]] = fut.result()
            if progress is not None:
                progress(rows[futures[fut]])
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return rows  # type: ignore[return-value]


def _lengths(cfg: SimConfig) -> dict[str, Any]:
    wl = cfg.workload
    if wl.type == "trace":
        return {"lengths": {"type": "empirical", "path": wl.path, "format": wl.format}}
    out = {}
    for key in ("prompt_tokens", "output_tokens", "lengths"):
        value = getattr(wl, key)
        if value is not None:
            out[key] = value.model_dump(mode="python", exclude_none=True)
    return out


def closed_loop_config(cfg: SimConfig, batch_size: int, requests_per_client: int,
                       spec: dict[str, Any] | None) -> dict[str, Any]:
    """The config mapping of one point: ``cfg`` as a closed loop of ``batch_size`` clients (each sending
    ``requests_per_client`` requests back to back, the config's lengths) with ``speculative_config`` =
    ``spec`` (None: plain decoding) and no ``slo`` (SLOs are evaluated here, on the statistics)."""
    data = cfg.model_dump(mode="python", exclude_none=True)
    data["workload"] = {"type": "closed_loop", "concurrency": int(batch_size),
                        "requests_per_client": int(requests_per_client), "think_time_s": 0.0, **_lengths(cfg)}
    data.pop("slo", None)
    data.pop("speculative_config", None)
    if spec is not None:
        data["speculative_config"] = spec
    return data


def fixed_k_spec(spec: Mapping[str, Any], k: int) -> dict[str, Any] | None:
    """``spec`` with a static ``num_speculative_tokens = k`` (None for k = 0), no table, no V0 threshold."""
    if k == 0:
        return None
    out = {key: v for key, v in spec.items()
           if key not in ("num_speculative_tokens_per_batch_size", "disable_by_batch_size")}
    out["num_speculative_tokens"] = int(k)
    if out.get("synthetic_acceptance_rates") is not None:  # vLLM's synthetic rates: one per position, first k
        out["synthetic_acceptance_rates"] = list(out["synthetic_acceptance_rates"])[: int(k)]
    return out


def tuned_spec(spec: Mapping[str, Any], table: list[list[int]]) -> dict[str, Any] | None:
    """``spec`` with the tuned table and ``num_speculative_tokens`` = its largest k (None if that is 0)."""
    k_max = max(int(r[2]) for r in table)
    if k_max == 0:
        return None
    out = fixed_k_spec(spec, k_max)
    assert out is not None
    out["num_speculative_tokens_per_batch_size"] = [list(map(int, r)) for r in table]
    return out


# ---------------------------------------------------------------------------------------------- scoring
def point_frame(rows: list[dict[str, Any]], slos: Sequence[Slo]) -> pd.DataFrame:
    """Per (batch_size, variant): replication means of the metrics, ``n``, a 95% band half-width of the
    output throughput (``output_throughput_ci``, NaN for one replication), and the objective
    ``objective`` (output tokens/s; with SLOs: ``slo_met``, ``slo_ratio`` = max statistic/target, and the
    goodput, i.e. the throughput when met, else 0)."""
    from servesim.plots.curves import mean_ci

    raw = pd.DataFrame(rows)
    out = []
    for (b, variant), g in raw.groupby(["batch_size", "variant"], sort=False):
        m, ci, n = mean_ci(g["output_throughput"])
        rec: dict[str, Any] = {"batch_size": int(b), "variant": variant, "n": n, "output_throughput": m,
                               "output_throughput_ci": ci, "completed_share": float(g["completed_share"].min()),
                               "mean_acceptance_length": float(g["mean_acceptance_length"].mean())}
        for col in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"):
            if col in g:
                rec[col] = float(g[col].mean())
        if slos:
            ratios = []
            for s in slos:
                v = float(g[s.name].mean()) if s.name in g else float("nan")
                rec[s.name] = v
                ratios.append(v / s.target_s if math.isfinite(v) else math.inf)
            rec["slo_ratio"] = max(ratios)
            rec["slo_met"] = bool(rec["completed_share"] >= 1.0 and all(r <= 1.0 for r in ratios))
            rec["goodput"] = m if rec["slo_met"] else 0.0
            rec["objective"] = rec["goodput"]
        else:
            rec["objective"] = m
        out.append(rec)
    frame = pd.DataFrame(out)
    frame["_k"] = frame["variant"].map(lambda v: int(v[2:]) if v.startswith("k=") else -1)
    return frame.sort_values(["batch_size", "_k"], kind="stable").drop(columns="_k").reset_index(drop=True)


def choose_best_k(grid: pd.DataFrame, with_slo: bool) -> dict[int, int]:
    """Best k per batch size from the grid's rows ``variant == "k=N"`` (module docstring, step 2)."""
    best: dict[int, int] = {}
    for b, g in grid[grid["variant"].str.startswith("k=")].groupby("batch_size", sort=True):
        ks = g["variant"].str[2:].astype(int).to_numpy()
        order = np.argsort(ks, kind="stable")
        ks = ks[order]
        if with_slo and not g["slo_met"].to_numpy()[order].any():
            best[int(b)] = int(ks[int(np.argmin(g["slo_ratio"].to_numpy()[order]))])
        else:
            best[int(b)] = int(ks[int(np.argmax(g["objective"].to_numpy()[order]))])
    return best


def choose_best_fixed_k(grid: pd.DataFrame) -> int:
    """The fixed k with the largest mean share of the best objective over batch sizes; where the SLOs are met
    nowhere, the k with the smallest mean SLO ratio (module docstring, step 4)."""
    shares: dict[int, list[float]] = {}
    for _, g in grid[grid["variant"].str.startswith("k=")].groupby("batch_size", sort=True):
        top = float(g["objective"].max())
        if not top > 0:
            continue
        for variant, obj in zip(g["variant"], g["objective"]):
            shares.setdefault(int(variant[2:]), []).append(float(obj) / top)
    if not shares:  # the SLOs are met nowhere: the k closest to meeting them, as choose_best_k's fallback
        spec_rows = grid[grid["variant"].str.startswith("k=")]
        if "slo_ratio" not in spec_rows or spec_rows.empty:
            return 0
        ratios = spec_rows.groupby(spec_rows["variant"].str[2:].astype(int))["slo_ratio"].mean()
        return int(ratios.index[int(np.argmin(ratios.to_numpy()))])  # sorted by k: ties keep the smaller
    ks = sorted(shares)
    means = [float(np.mean(shares[k])) for k in ks]
    return ks[int(np.argmax(means))]


# ---------------------------------------------------------------------------------------------- driver
@dataclass
class TuneKResult:
    """Outcome of :func:`tune_k`.

    Attributes:
        grid: per (batch_size, variant ``k=N``) means over replications (:func:`point_frame`).
        best_k: grid batch size (requests) -> best k (tokens).
        best_fixed_k: the best static k (0: no speculation).
        table: vLLM's ``num_speculative_tokens_per_batch_size``.
        vllm_config: the ``--speculative-config`` JSON object, or None when speculation never pays.
        check: per batch size, tuned vs best fixed k vs no speculation (:func:`check_frame`).
        tuned: per (batch_size, ``tuned``) means of the tuned schedule's runs.
        slos, boundary, max_batch_size, replications, requests_per_client: the settings used.
    """

    grid: pd.DataFrame
    best_k: dict[int, int]
    best_fixed_k: int
    table: list[list[int]]
    vllm_config: dict[str, Any] | None
    check: pd.DataFrame
    tuned: pd.DataFrame
    slos: list[Slo] = field(default_factory=list)
    boundary: str = "midpoint"
    max_batch_size: int = DEFAULT_TABLE_END
    replications: int = 1
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT

    @property
    def slo_unmet(self) -> list[int]:
        """The batch sizes at which no k meets the SLOs (ascending; empty without SLOs): the table's k there is
        the one closest to meeting them."""
        if not self.slos:
            return []
        ks = self.grid[self.grid["variant"].str.startswith("k=")]
        return [int(b) for b, g in ks.groupby("batch_size", sort=True) if not g["slo_met"].any()]

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable summary (written as ``tune_k.json``)."""
        return {
            "speculative_config": self.vllm_config,
            "objective": "goodput (output tokens/s of points meeting the SLOs)" if self.slos else
                         "output throughput (output tokens/s)",
            "slos": {s.name: s.target_s for s in self.slos},
            "slo_unmet_batch_sizes": self.slo_unmet,
            "best_k": {str(b): k for b, k in sorted(self.best_k.items())},
            "best_fixed_k": self.best_fixed_k,
            "num_speculative_tokens_per_batch_size": self.table,
            "boundary": self.boundary,
            "max_batch_size": self.max_batch_size,
            "replications": self.replications,
            "requests_per_client": self.requests_per_client,
            "check": [{k: _json_value(v) for k, v in row.items()} for row in self.check.to_dict(orient="records")],
        }


def _json_value(v: Any) -> Any:
    """numpy scalars to Python; NaN/inf floats to None (strict JSON)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def check_frame(grid: pd.DataFrame, tuned: pd.DataFrame, best_fixed_k: int, table: list[list[int]],
                with_slo: bool) -> pd.DataFrame:
    """Per grid batch size: output throughput (tokens/s; with SLOs also goodput) of no speculation, the
    best fixed k and the tuned schedule, the tuned k at that size, and the ratios tuned / fixed and
    tuned / none."""
    from servesim.speculation.schedule import KSchedule

    sched = KSchedule(max(max(r[2] for r in table), 1), table)
    idx = grid.set_index(["batch_size", "variant"])
    tix = tuned.set_index(["batch_size", "variant"])
    rows = []
    for b in sorted(grid["batch_size"].unique()):
        b = int(b)
        none = idx.loc[(b, "k=0")]
        fixed = idx.loc[(b, f"k={best_fixed_k}")]
        tun = tix.loc[(b, "tuned")] if (b, "tuned") in tix.index else none
        rec: dict[str, Any] = {"batch_size": b, "tuned_k": int(sched.k_for(b)), "best_fixed_k": best_fixed_k}
        for name, r in (("none", none), ("fixed", fixed), ("tuned", tun)):
            rec[f"{name}_output_throughput"] = float(r["output_throughput"])
            rec[f"{name}_output_throughput_ci"] = float(r["output_throughput_ci"])
            if with_slo:
                rec[f"{name}_goodput"] = float(r["goodput"])
        rec["tuned_vs_fixed"] = rec["tuned_output_throughput"] / rec["fixed_output_throughput"]
        rec["tuned_vs_none"] = rec["tuned_output_throughput"] / rec["none_output_throughput"]
        rows.append(rec)
    return pd.DataFrame(rows)


def tune_k(cfg: SimConfig, folder: str | Path, *, k_max: int | None = None, batch_sizes: Sequence[int] | None = None,
           slos: Sequence[Slo] = (), replications: int = 1, requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT,
           boundary: Boundary = "midpoint", executor: Executor | None = None,
           progress: Callable[[dict[str, Any]], None] | None = None) -> TuneKResult:
    """Tune the k-per-batch-size table of ``cfg``'s ``speculative_config`` (see the module docstring).

    Args:
        cfg, folder: the validated run config (with a ``speculative_config``) and the folder its relative
            paths resolve against.
        k_max: largest k tried (tokens; default: the config's ``num_speculative_tokens``).
        batch_sizes: grid of batch sizes (requests; default :func:`default_batch_sizes`).
        slos: objectives; when given the best k maximises goodput instead of output throughput.
        replications: runs per point (>= 1), seeds as in the module docstring.
        requests_per_client: closed-loop requests per client (>= 1).
        boundary: ``"midpoint"`` or ``"next"`` (module docstring, step 3).
        executor: a ``concurrent.futures.Executor`` to run on (None: serially in this process).
        progress: called with each finished run's metrics (a dict).

    Returns:
        A :class:`TuneKResult`. Runs: ``len(batch_sizes) x (k_max + 1 + 1) x replications`` at most.

    Raises:
        ConfigError: no ``speculative_config``, bad ``k_max``/``replications``/``requests_per_client``/
            batch sizes (one line). ServesimError: a run that cannot be set up.
    """
    from servesim.seeding import child_seed
    from servesim.speculation.config import MAX_SPEC_LEN, SpeculativeConfig
    from servesim.input_files import validate
    from servesim.workload.config import MAX_REQUESTS

    if cfg.speculative_config is None:
        where = f"{cfg.source}: " if cfg.source is not None else ""
        raise SettingError(f"{where}speculative_config: tune-k needs a config with a speculative_config (method, "
                           "acceptance)")
    refuse_time_limit(cfg, "tune-k", "--requests-per-client")
    # checked when the SimConfig was validated (its errors name the config file); a mapping changed since
    # is named as what it is
    spec_model = validate(SpeculativeConfig, cfg.speculative_config, "speculative_config")
    spec = dict(cfg.speculative_config)
    if k_max is None:
        k_max = int(spec_model.num_speculative_tokens)
    if isinstance(k_max, bool) or int(k_max) < 1:
        raise ConfigError(f"--k-max: expected a positive number of tokens (got {k_max})")
    if int(k_max) > MAX_SPEC_LEN:
        raise ConfigError(f"--k-max: expected at most {MAX_SPEC_LEN} tokens, the most drafts vLLM's rejection sampler "
                          f"verifies per request and step (got {k_max})")
    if spec_model.synthetic:  # the resolved per-position rates serve every k up to num_speculative_tokens
        if int(k_max) > int(spec_model.num_speculative_tokens):
            raise ConfigError(
                f"--k-max: {k_max} exceeds num_speculative_tokens = {spec_model.num_speculative_tokens}, the "
                "positions the synthetic acceptance rates cover"
            )
        spec.pop("synthetic_acceptance_length", None)
        spec["synthetic_acceptance_rates"] = list(spec_model.synthetic_acceptance_rates)
    if replications < 1:
        raise ConfigError(f"--replications: expected >= 1 (got {replications})")
    if requests_per_client < 1:
        raise ConfigError(f"--requests-per-client: expected >= 1 (got {requests_per_client})")
    mns = cfg.engine.max_num_seqs
    sizes = sorted({int(b) for b in (batch_sizes or default_batch_sizes(mns))})
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"--batch-sizes: expected positive integers (got {sizes})")
    if mns is not None and sizes[-1] > mns:
        raise ConfigError(f"--batch-sizes: {sizes[-1]} exceeds engine.max_num_seqs = {mns} (requests)")
    if sizes[-1] * requests_per_client > MAX_REQUESTS:
        raise ConfigError(f"--batch-sizes x --requests-per-client: {sizes[-1]} x {requests_per_client} requests is "
                          f"more than the {MAX_REQUESTS} servesim simulates")
    if mns is None and batch_sizes:  # the server's own limit: vLLM's default on the GPU
        from servesim.wiring import engine_limits, resolve_cards

        limit = engine_limits(cfg, resolve_cards(cfg, Path(folder))[0])[0]
        if sizes[-1] > limit:
            raise ConfigError(f"--batch-sizes: {sizes[-1]} exceeds max_num_seqs = {limit}, vLLM's default on this "
                              "GPU (engine.max_num_seqs is not set): the server never runs more requests at once; "
                              "set engine.max_num_seqs to tune beyond it")
    table_end = int(mns) if mns is not None else max(DEFAULT_TABLE_END, sizes[-1])
    slos = list(slos)
    root = np.random.SeedSequence(cfg.seed)
    seeds = [child_seed(root, r) for r in range(replications)]
    base = str(Path(folder).resolve())

    tasks = [Task(b, f"k={k}", r, closed_loop_config(cfg, b, requests_per_client, fixed_k_spec(spec, k)), seeds[r], base)
             for b in sizes for k in range(int(k_max) + 1) for r in range(replications)]
    with naming_settings_of(cfg.source):  # the points' configs are mappings built from the file's
        grid = point_frame(_run_all(tasks, executor, progress), slos)
    for s in slos:  # undefined where every request completed: "no k meets the SLOs" would be no answer
        undefined = grid[grid[s.name].isna() & (grid["completed_share"] >= 1.0)]
        if len(undefined):
            raise undefined_slo(s.name, f"at batch size {int(undefined['batch_size'].iloc[0])} "
                                        f"({undefined['variant'].iloc[0]})")
    best_k = choose_best_k(grid, bool(slos))
    best_fixed = choose_best_fixed_k(grid)
    table = build_schedule(best_k, table_end, int(k_max), boundary)
    tspec = tuned_spec(spec, table)
    if tspec is None:
        tuned = grid[grid["variant"] == "k=0"].assign(variant="tuned")
    else:
        ttasks = [Task(b, "tuned", r, closed_loop_config(cfg, b, requests_per_client, tspec), seeds[r], base)
                  for b in sizes for r in range(replications)]
        tuned = point_frame(_run_all(ttasks, executor, progress), slos)
    check = check_frame(grid, tuned, best_fixed, table, bool(slos))
    return TuneKResult(grid=grid, best_k=best_k, best_fixed_k=best_fixed, table=table,
                       vllm_config=vllm_speculative_config(spec, table), check=check, tuned=tuned, slos=slos,
                       boundary=boundary, max_batch_size=table_end, replications=replications,
                       requests_per_client=requests_per_client)
