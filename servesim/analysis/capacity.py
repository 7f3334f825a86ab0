"""Capacity search: the highest request rate (or the fewest replicas) whose latency SLOs are met.

SLOs are written ``METRIC_STAT=SECONDS``: METRIC one of ``ttft``, ``tpot``, ``itl``, ``e2e``, ``queue``;
STAT one of ``mean``, ``p50``, ``p90``, ``p95``, ``p99`` (``ttft_p99=0.5``: p99 TTFT <= 0.5 s).

A point (a rate, or a replica count at a fixed rate) is run ``replications`` times, replication ``i``
with the seed ``SeedSequence(entropy=seed, spawn_key=(i,))``, the same at every point (common random
numbers: the bisection compares rates, not seeds). It PASSES when

1. every request completed in every replication, and
2. for each SLO, the mean over replications of the named statistic is ``<=`` its target, and
3. with ``goodput_share`` S: the mean over replications of the SLO attainment (share of requests that
   meet every per-request objective among ``ttft``, ``tpot``, ``e2e``, as
   :func:`servesim.metrics.summarize` defines it) is ``>= S``.

A statistic that is undefined at a point where every request completed (TPOT or ITL of requests of one
output token) is refused (:class:`ConfigError`): no rate would define it.

The rate is varied through the workload: Poisson/Gamma ``rate`` (requests/s), or for a trace
``rate_scale`` with ``rate = trace mean rate x rate_scale``, the trace mean rate being (requests - 1) /
(last - first arrival) of the replayed window at ``rate_scale = 1`` (requests/s). Closed-loop workloads
have no rate and are refused.

Search (the pass/fail outcome is assumed monotone in the rate and in the replica count):

* rate: start at the config's own rate r0; double while passing (up to ``max_rate``), halve while
  failing, then bisect between the highest passing rate ``lo`` and the lowest failing rate ``hi`` until
  ``hi - lo <= tolerance x lo``. The capacity is ``lo``: it meets the SLOs, and a rate more than
  ``tolerance`` above it does not. The search is bounded: without ``max_rate``, at most
  :data:`MAX_RATE_STEPS` doublings (a factor of about 10^6), stopping also once a point holds
  :data:`MAX_REQUEST_GROWTH` times the requests of the first point (a workload of fixed ``duration_s``
  grows with the rate); at most :data:`MAX_RATE_STEPS` halvings; and a rate beyond the start that cannot
  be simulated (arrivals past the engine's clock) ends the search in that direction. If every rate tried
  passes, the capacity is the highest one (reported as capped: "meets the SLOs at every rate up to X");
  if none passes it is None, with the lowest rate tried ("at no rate down to Y").
* replicas (target rate given): R = 1, 2, 4, ... (up to ``max_replicas``) until one passes, then integer
  bisection between the last failing and the first passing count: the fewest replicas that pass.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from servesim.config.models import SimConfig
from servesim.errors import ConfigError, SettingError, naming_settings_of

#: Most replicas :meth:`CapacitySearch.min_replicas` tries unless told otherwise (``--max-replicas``).
DEFAULT_MAX_REPLICAS = 64

METRICS = ("ttft", "tpot", "itl", "e2e", "queue")
STATS = ("mean", "p50", "p90", "p95", "p99")
#: Metrics that also have a per-request objective (used for the SLO attainment / goodput).
PER_REQUEST = ("ttft", "tpot", "e2e")
#: Most doublings, and most halvings, of the rate from the start rate (2**20: about 10^6 either way).
MAX_RATE_STEPS = 20
#: Doubling stops once a point has this many times the requests of the first point evaluated.
MAX_REQUEST_GROWTH = 16


@dataclass(frozen=True)
class Slo:
    """One latency objective: ``stat`` of ``metric`` (s) must be ``<= target_s``."""

    metric: str
    stat: str
    target_s: float

    @property
    def name(self) -> str:
        """``ttft_p99`` etc."""
        return f"{self.metric}_{self.stat}"

    def value(self, summary: dict) -> float:
        """The statistic in a :func:`servesim.metrics.summarize` dict (s); NaN when undefined."""
        v = (summary.get(f"{self.metric}_s") or {}).get(self.stat)
        return float("nan") if v is None else float(v)


def parse_slo(text: str, source: str = "--slo") -> Slo:
    """Parse ``METRIC_STAT=SECONDS`` (e.g. ``ttft_p99=0.5``).

    Raises:
        ConfigError: unknown metric or statistic, or a target that is not a positive number (one line).
    """
    m = re.fullmatch(r"\s*([a-z0-9]+)_([a-z0-9]+)\s*=\s*(\S+)\s*", text)
    if not m:
        raise ConfigError(f"{source}: expected METRIC_STAT=SECONDS such as ttft_p99=0.5 (got {text!r})")
    metric, stat, raw = m.groups()
    if metric not in METRICS:
        raise ConfigError(f"{source}: unknown metric {metric!r} in {text!r}; expected one of {', '.join(METRICS)}")
    if stat not in STATS:
        raise ConfigError(f"{source}: unknown statistic {stat!r} in {text!r}; expected one of {', '.join(STATS)}")
    try:
        target = float(raw)
    except ValueError:
        target = float("nan")
    if not (target > 0 and math.isfinite(target)):
        raise ConfigError(f"{source}: {text!r}: expected a positive number of seconds after '='")
    return Slo(metric, stat, target)


def undefined_slo(name: str, where: str) -> ConfigError:
    """The error of an SLO statistic ``name`` undefined ``where`` (``at 2 requests/s``) although every request
    completed: no request has the metric (TPOT or ITL of one-token outputs), so no setting would meet it."""
    return ConfigError(f"--slo: {name} is undefined {where}, where every request completed (TPOT and ITL need "
                       "requests of two or more output tokens); give an objective the workload defines")


def refuse_time_limit(cfg: SimConfig, command: str, sized_by: str) -> None:
    """Refuse a config with ``simulation.max_time_s``: ``command`` (capacity, tune-k) requires every request
    to arrive and complete, and a run cut at a time leaves some unfinished or not yet arrived, so no
    setting would pass (a capacity search halved the rate ~20 times and answered "at no rate").

    Raises:
        SettingError: one line naming the config's file (or ``--set``, through
            :func:`servesim.errors.naming_set_keys`), the key, and what sizes the runs (``sized_by``).
    """
    if cfg.simulation.max_time_s is not None:
        where = f"{cfg.source}: " if cfg.source is not None else ""
        raise SettingError(f"{where}simulation.max_time_s: {command} runs every request to completion (a run "
                           f"stopped at {cfg.simulation.max_time_s:g} s leaves requests unfinished or not yet "
                           f"arrived, which no setting would pass); leave it out ({sized_by} sizes the runs)")


def parse_slos(texts: list[str], source: str = "--slo") -> list[Slo]:
    """Parse every ``METRIC_STAT=SECONDS`` of a repeated option (see :func:`parse_slo`), in order.

    Raises:
        ConfigError: as :func:`parse_slo`, or one statistic given twice (which target would hold is not
            clear: both were checked, so the stricter silently won).
    """
    slos: list[Slo] = []
    for text in texts:
        slo = parse_slo(text, source)
        earlier = next((s for s in slos if s.name == slo.name), None)
        if earlier is not None:
            raise ConfigError(f"{source}: {slo.name} given twice ({earlier.target_s:g} s and {slo.target_s:g} s; "
                              "expected each statistic once)")
        slos.append(slo)
    return slos


@dataclass
class Evaluation:
    """One evaluated point.

    Attributes:
        rate: arrival rate (requests/s) of the whole deployment.
        replicas: deployment replicas.
        rate_scale: the trace's ``rate_scale`` (None for synthetic workloads).
        values: SLO name -> mean over replications of its statistic (s).
        slo_attainment: mean SLO attainment (share of requests meeting every per-request objective).
        goodput: mean goodput (good requests/s).
        request_throughput, output_throughput: means (requests/s, output tokens/s).
        completed_share: smallest completed / requests over the replications.
        passed: the pass rule of the module docstring.
        per_replication: each replication's SLO statistics (for the CSV).
    """

    rate: float
    replicas: int
    rate_scale: float | None
    values: dict[str, float]
    slo_attainment: float
    goodput: float
    request_throughput: float
    output_throughput: float
    completed_share: float
    passed: bool
    per_replication: list[dict[str, float]] = field(default_factory=list)
    num_requests: int = 0

    def row(self) -> dict[str, Any]:
        """A flat dict for ``capacity.csv``."""
        row: dict[str, Any] = {"rate": self.rate, "replicas": self.replicas, "rate_scale": self.rate_scale}
        for name, v in self.values.items():
            row[f"{name}_s"] = v
        row.update(slo_attainment=self.slo_attainment, goodput=self.goodput,
                   request_throughput=self.request_throughput, output_throughput=self.output_throughput,
                   completed_share=self.completed_share, passed=self.passed)
        for i, rep in enumerate(self.per_replication):
            for name, v in rep.items():
                row[f"{name}_s_r{i}"] = v
        return row


@dataclass
class CapacityResult:
    """Outcome of a search.

    Attributes:
        mode: ``"rate"`` or ``"replicas"``.
        capacity: highest passing rate (requests/s; mode rate) or fewest passing replicas (mode replicas);
            None when no point passed.
        capped: mode rate: every rate tried passed (up to ``max_rate``, or until the search's bound);
            mode replicas: ``max_replicas`` failed.
        evaluations: every evaluated point, in evaluation order.
        slos, goodput_share, tolerance, replications: the search's settings.
        stopped: when the search ended at a bound rather than between a passing and a failing point: why, as
            words following "the search stopped" (``"after 20 doublings"``; mode replicas: at the most replicas
            servesim simulates, below ``max_replicas``); None otherwise.
    """

    mode: str
    capacity: float | int | None
    capped: bool
    evaluations: list[Evaluation]
    slos: list[Slo]
    goodput_share: float | None
    tolerance: float
    replications: int
    stopped: str | None = None

    @property
    def lowest_rate(self) -> float | None:
        """The lowest rate evaluated (requests/s), None before any evaluation."""
        return min((ev.rate for ev in self.evaluations), default=None)

    @property
    def highest_rate(self) -> float | None:
        """The highest rate evaluated (requests/s), None before any evaluation."""
        return max((ev.rate for ev in self.evaluations), default=None)


def trace_mean_rate(cfg: SimConfig, folder: Path) -> float:
    """Mean arrival rate (requests/s) of a trace workload's window at ``rate_scale = 1``.

    Raises:
        ConfigError: the window holds fewer than two requests or no time span.
    """
    from servesim.workload import build_workload

    wl_cfg = cfg.workload.model_copy(update={"rate_scale": 1.0})
    wl = build_workload(wl_cfg, np.random.default_rng(0), folder)
    t = np.asarray(wl.arrival_s, dtype=np.float64)
    if t.size < 2 or not t[-1] > t[0]:
        raise SettingError(f"workload.path: the trace window has no arrival span to define a rate ({t.size} requests)")
    return float((t.size - 1) / (t[-1] - t[0]))


class RateAxis:
    """How to set a config's arrival rate (requests/s).

    Raises:
        SettingError: a closed-loop workload (it has no arrival rate) or a multi-turn one (its ``rate`` is
            sessions/s, and its turns' arrivals are paced by the think time, not by that rate).
    """

    def __init__(self, cfg: SimConfig, folder: Path) -> None:
        kind = cfg.workload.type
        if kind not in ("trace", "poisson", "gamma"):
            raise SettingError("workload.type: capacity search needs an open-loop workload (trace, poisson or "
                               f"gamma), not {kind}")
        self.kind = kind
        self.trace_rate = trace_mean_rate(cfg, folder) if kind == "trace" else None
        self.start_rate = (self.trace_rate * cfg.workload.rate_scale) if kind == "trace" else float(cfg.workload.rate)

    def apply(self, data: dict, rate: float) -> tuple[dict, float | None]:
        """Set ``rate`` (requests/s) in a config mapping; returns (mapping, rate_scale or None)."""
        wl = dict(data["workload"])
        scale = None
        if self.kind == "trace":
            scale = rate / self.trace_rate
            wl["rate_scale"] = scale
        else:
            wl["rate"] = rate
        out = dict(data)
        out["workload"] = wl
        return out, scale


Simulate = Callable[..., Any]


class CapacitySearch:
    """Evaluate points of one config and search its capacity (see the module docstring).

    Args:
        cfg, folder: the validated config and the folder its relative paths resolve against.
        slos: the objectives (at least one).
        replications: runs per point (>= 1).
        goodput_share: optional minimum mean SLO attainment in (0, 1].
        simulate: ``servesim.api.simulate`` (replaceable in tests).
        progress: optional callable receiving each :class:`Evaluation` as it is made.

    Raises:
        ConfigError: no SLO, bad replications or share, or a closed-loop workload.
    """

    def __init__(self, cfg: SimConfig, folder: Path, slos: list[Slo], *, replications: int = 3,
                 goodput_share: float | None = None, simulate: Simulate | None = None,
                 progress: Callable[[Evaluation], None] | None = None) -> None:
        if not slos:
            raise ConfigError("--slo: give at least one objective, e.g. --slo ttft_p99=0.5")
        if replications < 1:
            raise ConfigError(f"--replications: expected >= 1 (got {replications})")
        if goodput_share is not None and not 0 < goodput_share <= 1:
            raise ConfigError(f"--goodput-share: expected a share in (0, 1] (got {goodput_share})")
        refuse_time_limit(cfg, "a capacity search", "--max-requests or the workload's own count")
        if simulate is None:
            from servesim.api import simulate
        self.cfg, self.folder, self.slos = cfg, folder, list(slos)
        self.replications, self.goodput_share = replications, goodput_share
        self.simulate, self.progress = simulate, progress
        with naming_settings_of(cfg.source):  # a workload the search cannot vary names the config file
            self.axis = RateAxis(cfg, folder)
        self.data = cfg.model_dump(mode="python")
        self.data["slo"] = None
        self.evaluations: list[Evaluation] = []
        self._per_request = {f"{s.metric}_s": None for s in self.slos if s.metric in PER_REQUEST}
        for s in self.slos:
            key = f"{s.metric}_s"
            if key in self._per_request:
                current = self._per_request[key]
                self._per_request[key] = s.target_s if current is None else min(current, s.target_s)

    def evaluate(self, rate: float, replicas: int | None = None) -> Evaluation:
        """Run one point ``replications`` times at ``rate`` (requests/s) with ``replicas`` replicas."""
        from servesim.metrics import summarize

        data, scale = self.axis.apply(self.data, rate)
        replicas = replicas or self.cfg.deployment.replicas
        data["deployment"] = dict(data["deployment"], replicas=replicas)
        reps, attain, good, rthr, othr, done, counts = [], [], [], [], [], [], []
        for i in range(self.replications):
            seed = np.random.SeedSequence(entropy=self.cfg.seed, spawn_key=(i,))
            with naming_settings_of(self.cfg.source):  # the point's config is a mapping built from the file's
                result = self.simulate(data, seed=seed, base_dir=self.folder)
            summary = result.summary
            reps.append({s.name: s.value(summary) for s in self.slos})
            slo_dict = dict(self._per_request)
            if slo_dict:
                extra = summarize(result.output, slo=slo_dict)
                attain.append(extra["slo_attainment"])
                good.append(extra["goodput"])
            else:
                attain.append(summary["completed"] / max(summary["num_requests"], 1))
                good.append(summary["request_throughput"])
            rthr.append(summary["request_throughput"])
            othr.append(summary["output_throughput"])
            done.append(summary["completed"] / max(summary["num_requests"], 1))
            counts.append(int(summary["num_requests"]))
        values = {s.name: float(np.mean([r[s.name] for r in reps])) for s in self.slos}
        undefined = [s.name for s in self.slos if min(done) >= 1.0 and math.isnan(values[s.name])]
        if undefined:  # every request finished and none has it: the search would halve the rate ~20 times
            raise undefined_slo(undefined[0], f"at {rate:.4g} requests/s")
        passed = min(done) >= 1.0 and all(values[s.name] <= s.target_s for s in self.slos)
        if self.goodput_share is not None:
            passed = passed and float(np.mean(attain)) >= self.goodput_share
        ev = Evaluation(rate, replicas, scale, values, float(np.mean(attain)), float(np.mean(good)),
                        float(np.mean(rthr)), float(np.mean(othr)), float(min(done)), bool(passed), reps,
                        max(counts))
        self.evaluations.append(ev)
        if self.progress is not None:
            self.progress(ev)
        return ev

    def max_rate(self, *, tolerance: float = 0.05, max_rate: float | None = None,
                 start_rate: float | None = None) -> CapacityResult:
        """Highest passing rate (requests/s), to a relative ``tolerance`` (see the module docstring).

        Raises:
            ConfigError: ``tolerance`` not in (0, 1) or a non-positive or infinite ``max_rate``/``start_rate``.
        """
        if not 0 < tolerance < 1:
            raise ConfigError(f"--tolerance: expected a relative tolerance in (0, 1) (got {tolerance})")
        if max_rate is not None and not (max_rate > 0 and math.isfinite(max_rate)):
            raise ConfigError(f"--max-rate: expected a positive rate in requests/s (got {max_rate})")
        r = float(start_rate or self.axis.start_rate)
        if max_rate is not None:
            r = min(r, max_rate)
        lo = hi = None
        capped = False
        stopped = None
        # a start that --max-rate lowered is the user's rate, not the config's
        first = self._evaluate_given(r, "--max-rate") if max_rate is not None and r == max_rate else self.evaluate(r)
        if first.passed:
            lo = r
            # with max_rate the user bounds the search; without it, at most MAX_RATE_STEPS doublings
            steps = MAX_RATE_STEPS if max_rate is None else max(MAX_RATE_STEPS, math.ceil(math.log2(max_rate / r)) + 1)
            for _ in range(steps):
                nxt = 2 * lo if max_rate is None else min(2 * lo, max_rate)
                if nxt == lo:
                    break
                grown = self.evaluations[-1].num_requests > MAX_REQUEST_GROWTH * max(first.num_requests, 1)
                if max_rate is None and grown:
                    stopped = f"at {MAX_REQUEST_GROWTH}x the first point's requests"
                    break
                ev, why = self._explore(nxt)
                if ev is None:
                    stopped = why
                    break
                if ev.passed:
                    lo = nxt
                else:
                    hi = nxt
                    break
            else:
                stopped = f"after {MAX_RATE_STEPS} doublings"
            capped = hi is None
        else:
            hi = r
            for _ in range(MAX_RATE_STEPS):
                ev, why = self._explore(hi / 2)
                if ev is None:
                    stopped = why
                    break
                if ev.passed:
                    lo = hi / 2
                    break
                hi = hi / 2
            else:
                stopped = f"after {MAX_RATE_STEPS} halvings"
        if lo is not None and hi is not None:
            while hi - lo > tolerance * lo:
                mid = (lo + hi) / 2
                if self.evaluate(mid).passed:
                    lo = mid
                else:
                    hi = mid
        return CapacityResult("rate", lo, capped, list(self.evaluations), self.slos, self.goodput_share, tolerance,
                              self.replications, stopped if lo is None or capped else None)

    def _evaluate_given(self, rate: float, option: str, replicas: int | None = None) -> Evaluation:
        """:meth:`evaluate` at a ``rate`` (requests/s) that the command-line ``option`` gave: a rate that cannot
        be simulated names the option (the config's file and its rate are not the mistake).

        Raises:
            ConfigError: one line naming ``option``, the rate and why it cannot be simulated.
        """
        from servesim.errors import ServesimError

        try:
            return self.evaluate(rate, replicas)
        except ServesimError as exc:
            prefix = f"{self.cfg.source}: " if self.cfg.source is not None else ""
            if not isinstance(exc, SettingError) or not str(exc).startswith(f"{prefix}workload: "):
                raise  # not about the arrivals the rate sets: the config's own mistake
            raise ConfigError(f"{option}: {rate:.4g} requests/s cannot be simulated "
                              f"({str(exc).removeprefix(prefix)})") from None

    def _explore(self, rate: float) -> tuple[Evaluation | None, str | None]:
        """Evaluate an exploratory rate (beyond the start rate); ``(None, why)`` when it cannot be simulated
        (e.g. arrivals past the engine's clock at a tiny rate), which ends the search in that direction."""
        from servesim.errors import ServesimError

        if not (math.isfinite(rate) and rate > 0):
            return None, f"at {rate:g} requests/s, which cannot be simulated"
        try:
            return self.evaluate(rate), None
        except ServesimError as exc:
            return None, f"at {rate:.4g} requests/s, which cannot be simulated ({exc})"

    def min_replicas(self, target_rate: float, *, max_replicas: int = DEFAULT_MAX_REPLICAS) -> CapacityResult:
        """Fewest replicas that pass at ``target_rate`` (requests/s); see the module docstring.

        Raises:
            ConfigError: a non-positive or infinite target rate or ``max_replicas < 1``.
        """
        if not (target_rate > 0 and math.isfinite(target_rate)):
            raise ConfigError(f"--replicas: expected a positive target rate in requests/s (got {target_rate})")
        from servesim.deployment import MAX_REPLICA_REQUESTS, MAX_REPLICAS

        if max_replicas < 1:
            raise ConfigError(f"--max-replicas: expected >= 1 (got {max_replicas})")
        if max_replicas > MAX_REPLICAS:
            raise ConfigError(f"--max-replicas: expected at most {MAX_REPLICAS:,}, the most replicas servesim "
                              f"simulates (got {max_replicas:,})")
        fail, ok, stopped = 0, None, None
        r = 1
        first = self._evaluate_given(target_rate, "--replicas", r)
        # every replica is built over the whole workload: at most MAX_REPLICA_REQUESTS replicas x requests
        most = min(max_replicas, max(MAX_REPLICA_REQUESTS // max(first.num_requests, 1), 1))
        while True:
            if (first if r == 1 else self.evaluate(target_rate, r)).passed:
                ok = r
                break
            fail = r
            if r >= most:
                if most < max_replicas:
                    stopped = (f"at {most:,} replicas, the most servesim simulates for {first.num_requests:,} "
                               f"requests ({MAX_REPLICA_REQUESTS:,} replicas x requests)")
                break
            r = min(2 * r, most)
        if ok is not None:
            while ok - fail > 1:
                mid = (ok + fail) // 2
                if self.evaluate(target_rate, mid).passed:
                    ok = mid
                else:
                    fail = mid
        return CapacityResult("replicas", ok, ok is None, list(self.evaluations), self.slos, self.goodput_share, 0.0,
                              self.replications, stopped if ok is None else None)


def capacity_frame(result: CapacityResult):
    """``capacity.csv`` as a pandas DataFrame: one row per evaluated point, in evaluation order."""
    import pandas as pd

    return pd.DataFrame([ev.row() for ev in result.evaluations])
