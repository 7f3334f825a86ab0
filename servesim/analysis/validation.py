"""Validation cases: servesim's predictions against published measurements.

A case file (YAML, read with :func:`servesim.input_files.load_yaml`) holds ``cases:``, a list of
:class:`ValidationCase` mappings::

    cases:
      - name: pr16937-eagle-k2
        source: "vLLM PR 16937 (2025-04)"
        setup: "Llama-3.1-8B BF16, one H100, batch 1, MT-Bench, EAGLE K = 2"
        measured: {metric: output_throughput, unit: tok/s, value: 201.7}
        config: {hardware: h100-sxm, model: llama-3.1-8b, workload: {...}, speculative_config: {...}}
        fast: true
        tolerance: 0.10
        notes: "why the simulation may deviate"

Metrics:

* a dotted key of the run's summary (``output_throughput`` tok/s, ``e2e_s.mean`` s,
  ``spec_decode.mean_acceptance_length`` tokens, ...): the value of one run of ``config``;
* ``speedup``: ``speedup_of`` (a summary key) of ``config`` against the run with the ``baseline``
  overrides applied (dotted keys, e.g. ``{speculative_config: null}``); for latencies (a first key ending
  in ``_s``) the speedup is baseline / config, otherwise config / baseline;
* ``crossover_qps``: the speedup (as above, default ``speedup_of: e2e_s.mean``) at each of ``points``
  (values of a dotted key, default ``workload.rate`` requests/s); the simulated value is the first point
  where the speedup falls from >= 1 to < 1, linearly interpolated. The measured value is usually an
  interval (``interval: [8, 10]``).

Errors: relative error = (simulated - measured) / measured; for an interval it is 0 inside and measured
against the nearer end outside. A case is within tolerance if ``|relative error| <= tolerance``, i.e. for
an interval if the simulated value lies in ``[low x (1 - tolerance), high x (1 + tolerance)]``.
"""

from __future__ import annotations

import csv
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from servesim.input_models import InputModel
from servesim.analysis.bench_replay import BenchCase
from servesim.errors import ConfigError
from servesim.shipped import shipped_dir

CSV_COLUMNS = [
    "case", "source", "metric", "unit", "measured", "measured_low", "measured_high", "simulated",
    "relative_error", "tolerance", "within_tolerance", "role", "detail", "notes",
]


class _Strict(InputModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Measured(_Strict):
    """A published figure: ``value`` or ``interval: [low, high]`` in ``unit``, of ``metric``."""

    metric: str = Field(min_length=1, description="summary key (dotted), 'speedup' or 'crossover_qps'")
    unit: str = Field(min_length=1, description="unit of the value, e.g. tok/s, s, x, requests/s")
    value: float | None = Field(None, gt=0)
    interval: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Measured:
        if (self.value is None) == (self.interval is None):
            raise ValueError("give exactly one of value and interval")
        if self.interval is not None and not 0 < self.interval[0] <= self.interval[1]:
            raise ValueError("interval must be [low, high] with 0 < low <= high")
        if any(part.endswith("_s") for part in self.metric.split(".")) and self.unit.strip() != "s":
            # the value is compared with the summary's as written: 20 ms of TTFT read as 20 s
            raise ValueError(f"unit {self.unit!r} for metric {self.metric}, which servesim reports in seconds "
                             "(expected unit s, with the value in seconds: 20 ms is 0.02)")
        return self

    @property
    def low(self) -> float:
        """Lower end of the published figure (the value itself when it is a point)."""
        return float(self.value if self.interval is None else self.interval[0])

    @property
    def high(self) -> float:
        """Upper end of the published figure."""
        return float(self.value if self.interval is None else self.interval[1])

    @property
    def central(self) -> float:
        """The value, or the midpoint of the interval (for plots)."""
        return 0.5 * (self.low + self.high)


class Points(_Strict):
    """The grid of a curve: ``values`` of the dotted config ``key`` (increasing)."""

    key: str = "workload.rate"
    values: list[float] = Field(min_length=2)

    @model_validator(mode="after")
    def _increasing(self) -> Points:
        if any(b <= a for a, b in zip(self.values, self.values[1:])):
            raise ValueError("values must be strictly increasing")
        return self


class ValidationCase(_Strict):
    """One published measurement and the servesim setup that should reproduce it (see module docstring)."""

    name: str = Field(min_length=1)
    source: str = Field(min_length=1, description="citation: PR, blog or paper, with its date")
    setup: str = Field(min_length=1, description="the published setup, in words")
    measured: Measured
    config: dict[str, Any] | str = Field(description="run config mapping, or a path relative to the case file")
    baseline: dict[str, Any] | None = Field(None, description="dotted overrides of config for the baseline run")
    speedup_of: str | None = Field(None, description="summary key compared by speedup/crossover_qps")
    points: Points | None = None
    seed: int = Field(0, ge=0)
    fast: bool = False
    tolerance: float = Field(0.10, gt=0, lt=1)
    tolerance_source: str = Field("", description="why this tolerance: the source's own uncertainty")
    role: Literal["fit", "prediction", "closed_form"] = Field(
        "prediction", description="fit: a servesim parameter was fitted to this figure; prediction: not; "
        "closed_form: a formula the engine must reproduce (the seed lesson)")
    notes: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ValidationCase:
        metric = self.measured.metric
        if metric in ("speedup", "crossover_qps") and self.baseline is None:
            raise ValueError(f"metric '{metric}' needs 'baseline' (dotted overrides for the plain run)")
        if metric == "crossover_qps" and self.points is None:
            raise ValueError("metric 'crossover_qps' needs 'points' (the grid of rates)")
        if metric != "crossover_qps" and self.points is not None:
            raise ValueError("'points' applies only to metric 'crossover_qps'")
        return self


class CaseFile(_Strict):
    """A case file: ``cases:``, a list of :class:`ValidationCase`, and/or ``vllm_bench:``, a list of
    :class:`~servesim.analysis.bench_replay.BenchCase` (a user's ``vllm bench serve`` results)."""

    cases: list[ValidationCase] = Field(default_factory=list)
    vllm_bench: list[BenchCase] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> CaseFile:
        if not self.cases and not self.vllm_bench:
            raise ValueError("cases: expected at least one case (or a vllm_bench entry)")
        return self


@dataclass
class LoadedCase:
    """A validated case with where it came from (``file``, ``index`` in its ``cases`` list)."""

    case: ValidationCase | BenchCase
    file: Path
    index: int
    key: str = "cases"

    @property
    def where(self) -> str:
        """``FILE: cases[i]`` (or ``vllm_bench[i]``) for error messages."""
        return f"{self.file}: {self.key}[{self.index}]"


@dataclass
class CaseResult:
    """The outcome of one case (values in ``unit``; ``simulated`` is None when it could not be derived)."""

    name: str
    source: str
    metric: str
    unit: str
    measured_low: float
    measured_high: float
    simulated: float | None
    relative_error: float | None
    tolerance: float
    within: bool
    detail: str = ""
    notes: str = ""
    points: list[tuple[float, float]] = field(default_factory=list)
    role: str = "prediction"

    @property
    def measured(self) -> float:
        """The published value (midpoint of an interval)."""
        return 0.5 * (self.measured_low + self.measured_high)

    def measured_text(self) -> str:
        """The published figure as text: ``201.7`` or ``[8, 10]``."""
        if self.measured_low == self.measured_high:
            return _fmt(self.measured_low)
        return f"[{_fmt(self.measured_low)}, {_fmt(self.measured_high)}]"


# ---------------------------------------------------------------- loading


def default_cases_dir() -> Path:
    """The cases ``servesim validate`` runs by default: the clone's ``experiments/validation/`` or an
    installed package's copy of it (:func:`servesim.shipped.shipped_dir`)."""
    return shipped_dir("experiments/validation")


def load_case_file(path: str | Path) -> list[LoadedCase]:
    """Read and validate one case file (top-level keys starting with ``_`` are ignored: YAML anchors).

    Raises:
        ConfigError: unreadable file, invalid YAML, an invalid field or an unknown summary metric (one line
            naming file and field).
    """
    from servesim.input_files import load_yaml, validate

    p = Path(path)
    data = load_yaml(p)
    if isinstance(data, dict):
        # top-level keys starting with "_" only hold YAML anchors shared by the cases
        data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(data, dict) and {"hardware", "model", "workload"} <= set(data):
        raise ConfigError(f"{p}: a run config (hardware, model, workload), not a validation case file: give it "
                          "to `servesim run`, or to `servesim validate --server` with --vllm-bench RESULT.json")
    parsed = validate(CaseFile, data, str(p))
    cases = [LoadedCase(case=c, file=p, index=i) for i, c in enumerate(parsed.cases)]
    for lc in cases:  # a metric's name is checked before any case runs
        if lc.case.measured.metric not in ("speedup", "crossover_qps"):
            _check_metric_name(lc.case.measured.metric, f"{lc.where}.measured.metric")
        if lc.case.speedup_of is not None:
            _check_metric_name(lc.case.speedup_of, f"{lc.where}.speedup_of")
    return cases + [LoadedCase(case=c, file=p, index=i, key="vllm_bench") for i, c in enumerate(parsed.vllm_bench)]


def load_cases(paths: list[str | Path] | None = None, *, fast_only: bool = False) -> list[LoadedCase]:
    """Load the cases of ``paths`` (files, or folders whose ``*.yaml`` files are read in name order).

    Args:
        paths: case files or folders; default :func:`default_cases_dir`.
        fast_only: keep only cases with ``fast: true``.

    Raises:
        ConfigError: a path does not exist, a folder holds no case file, a file is invalid, or two cases
            share a name.
    """
    if not paths:
        paths = [default_cases_dir()]
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml"))
            if not found:
                raise ConfigError(f"{p}: no case files (*.yaml) in this folder")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"{p}: file not found (expected a case file or a folder of them)")
    loaded: list[LoadedCase] = []
    seen: dict[str, str] = {}
    for f in files:
        for lc in load_case_file(f):
            if lc.case.name in seen:
                raise ConfigError(f"{lc.where}.name: duplicate case name {lc.case.name!r} (also in {seen[lc.case.name]})")
            seen[lc.case.name] = lc.where
            loaded.append(lc)
    if fast_only:
        loaded = [lc for lc in loaded if lc.case.fast]
    return loaded


# ---------------------------------------------------------------- running


def _base_config(lc: LoadedCase) -> tuple[dict[str, Any], Path]:
    from servesim.input_files import load_yaml, shown_found

    cfg = lc.case.config
    if isinstance(cfg, str):
        path = Path(cfg)
        if not path.is_absolute():
            path = lc.file.parent / path
        data = load_yaml(path)
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level (got {shown_found(data)})")
        return data, path.resolve().parent
    return dict(cfg), lc.file.resolve().parent


def _with_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    from servesim.config.overrides import set_dotted

    for key, value in overrides.items():
        data = set_dotted(data, key, value, source=source)
    return data


def _simulate(data: dict[str, Any], folder: Path, lc: LoadedCase, what: str) -> dict:
    from servesim.api import simulate
    from servesim.config.models import validate_config

    cfg = validate_config(data, f"{lc.where}.{what}")
    return simulate(cfg, seed=lc.case.seed, base_dir=folder).summary


def summary_value(summary: dict, key: str, source: str) -> float:
    """The number at dotted ``key`` of a run summary (``e2e_s.mean``).

    Raises:
        ConfigError: the key is not in the summary or holds no number (names ``source``).
    """
    from servesim.metrics.summary import is_metric_column

    node: Any = summary
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            if not is_metric_column(key):
                raise _unknown_metric(key, source)
            if depth == 0:  # a metric of the summary's kind that this run does not have
                raise ConfigError(f"{source}: summary metric {key!r}: this run's summary has no {part!r} (e.g. "
                                  "spec_decode needs a speculative_config, replicas a deployment of several)")
            have = ", ".join(map(str, node)) if isinstance(node, dict) else type(node).__name__
            raise ConfigError(f"{source}: summary metric {key!r}: this run's {'.'.join(parts[:depth])} has no "
                              f"{part!r} (it holds {have})")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)) or node is None:
        raise ConfigError(f"{source}: summary metric {key!r} holds no number (got {node!r})")
    return float(node)


def _check_metric_name(key: str, source: str) -> None:
    """Refuse a ``key`` that names no summary metric (:func:`~servesim.metrics.summary.is_metric_column`; a
    part below a group, ``e2e_s.p98``, is known only once a run's summary is there)."""
    from servesim.metrics.summary import is_metric_column

    if not is_metric_column(key):
        raise _unknown_metric(key, source)


def _unknown_metric(key: str, source: str) -> ConfigError:
    return ConfigError(f"{source}: unknown summary metric {key!r} (e.g. output_throughput, e2e_s.mean, "
                       "spec_decode.mean_acceptance_length)")


def _speedup(spec: float, plain: float, key: str) -> float:
    latency = key.split(".")[0].endswith("_s")
    return plain / spec if latency else spec / plain


def crossover(xs: list[float], ys: list[float], level: float = 1.0) -> float | None:
    """First x where ``ys`` falls from ``>= level`` to ``< level``, linearly interpolated; None if it never does.

    Args:
        xs: increasing grid (e.g. QPS, requests/s), shape ``(n,)``.
        ys: values at ``xs`` (e.g. speedups), shape ``(n,)``.
    """
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if y0 >= level > y1:
            return x0 + (y0 - level) * (x1 - x0) / (y0 - y1)
    return None


def relative_error(simulated: float, low: float, high: float) -> float:
    """(simulated - measured) / measured; for an interval 0 inside, else against the nearer end."""
    if simulated < low:
        return (simulated - low) / low
    if simulated > high:
        return (simulated - high) / high
    return 0.0 if low != high else (simulated - low) / low


def run_case(lc: LoadedCase) -> CaseResult:
    """Run one case's simulation(s) and compare with the published figure.

    Raises:
        ServesimError: an invalid config or an unknown metric (one line naming the case file and field).
    """
    case = lc.case
    m = case.measured
    data, folder = _base_config(lc)
    detail = ""
    points: list[tuple[float, float]] = []
    if m.metric == "speedup":
        key = case.speedup_of or "output_throughput"
        spec = summary_value(_simulate(data, folder, lc, "config"), key, f"{lc.where}.speedup_of")
        base = _with_overrides(data, case.baseline or {}, f"{lc.where}.baseline")
        plain = summary_value(_simulate(base, folder, lc, "baseline"), key, f"{lc.where}.speedup_of")
        simulated: float | None = _speedup(spec, plain, key)
        detail = f"{key}: {_fmt(spec)} vs baseline {_fmt(plain)}"
    elif m.metric == "crossover_qps":
        key = case.speedup_of or "e2e_s.mean"
        assert case.points is not None
        for x in case.points.values:
            at = _with_overrides(data, {case.points.key: x}, f"{lc.where}.points.key")
            spec = summary_value(_simulate(at, folder, lc, "config"), key, f"{lc.where}.speedup_of")
            base = _with_overrides(at, case.baseline or {}, f"{lc.where}.baseline")
            plain = summary_value(_simulate(base, folder, lc, "baseline"), key, f"{lc.where}.speedup_of")
            points.append((x, _speedup(spec, plain, key)))
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        simulated = crossover(xs, ys)
        detail = "speedup " + " ".join(f"{_fmt(x)}:{y:.2f}" for x, y in points)
        if simulated is None:
            side = "above" if all(y >= 1 for y in ys) else "below" if all(y < 1 for y in ys) else "not falling through"
            detail = f"no crossover in the grid (speedup {side} 1); " + detail
    else:
        simulated = summary_value(_simulate(data, folder, lc, "config"), m.metric, f"{lc.where}.measured.metric")
    rel = None if simulated is None else relative_error(simulated, m.low, m.high)
    within = rel is not None and abs(rel) <= case.tolerance + 1e-12
    return CaseResult(
        name=case.name, source=case.source, metric=m.metric, unit=m.unit, measured_low=m.low,
        measured_high=m.high, simulated=simulated, relative_error=rel, tolerance=case.tolerance,
        within=within, detail=detail, notes=case.notes.strip(), points=points, role=case.role,
    )


def bench_case_config(case: BenchCase, case_file: Path, where: str, tmp: Path) -> tuple:
    """Read and check a bench case's inputs: its result file, the server config and the replayed workload
    (whose lengths file, if any, goes into ``tmp``).

    Returns:
        ``(cfg, folder, result, result_path, present, how)``: the validated run config, the folder its paths
        resolve against, the result object and its path, the measured metrics there, and how it was replayed.

    Raises:
        ConfigError: unreadable result or server config, or an invalid setting (one line).
    """
    from servesim.analysis.bench_replay import METRICS, read_bench_result, result_number, replay_workload
    from servesim.input_files import load_yaml, shown_found
    from servesim.config.models import validate_config

    base = case_file.resolve().parent
    result_path = Path(case.bench_result)
    if not result_path.is_absolute():
        result_path = base / result_path
    result = read_bench_result(result_path)
    present = [key for key, _, _, _ in METRICS
                if not (isinstance(result.get(key), float) and math.isnan(result[key]))
                and result_number(result, key, str(result_path))]
    if not present:  # nothing to compare: the run would end in an empty table
        raise ConfigError(f"{result_path}: no measured metric to compare (expected one of "
                          f"{', '.join(key for key, _, _, _ in METRICS)} > 0)")
    server = case.config
    folder = base
    source = f"{where}.config"  # an inline server config: named by its case
    if isinstance(server, str):
        path = Path(server) if Path(server).is_absolute() else base / server
        server = load_yaml(path)
        if not isinstance(server, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level (got {shown_found(server)})")
        folder = path.resolve().parent
        source = str(path)  # a mistake in the server's file (--server) names that file
    workload, how = replay_workload(result, str(result_path), tmp)
    cfg = validate_config({**server, "workload": workload}, source)
    return cfg, folder, result, result_path, present, how


def run_bench_case(case: BenchCase, case_file: Path, where: str) -> list:
    """Simulate the server on the replayed requests; one :class:`CaseResult`
    per metric of :data:`servesim.analysis.bench_replay.METRICS` the result holds.

    Raises:
        ConfigError: as :func:`bench_case_config`.
    """
    from servesim.analysis.bench_replay import METRICS, result_number
    from servesim.api import simulate

    with tempfile.TemporaryDirectory(prefix="servesim-bench-") as tmp:
        cfg, folder, result, result_path, present, how = bench_case_config(case, case_file, where, Path(tmp))
        summary = simulate(cfg, seed=case.seed, base_dir=folder).summary
    # a metric the result holds but that cannot be compared (NaN: vLLM's mean over no values; 0) is said in
    # each row's detail, not dropped silently
    skipped = [f"{key} ({'NaN' if isinstance(result[key], float) and math.isnan(result[key]) else repr(result[key])})"
               for key, _, _, _ in METRICS if key not in present and result.get(key) is not None]
    if skipped:
        how = f"{how}; not compared: {', '.join(skipped)}"
    out = []
    for key, sim_key, unit, factor in METRICS:
        if key not in present:
            continue  # absent, 0, or NaN: vLLM writes NaN for a mean over no values (every output one token)
        measured = result_number(result, key, str(result_path)) * factor
        simulated = summary_value(summary, sim_key, f"{where}")
        rel = relative_error(simulated, measured, measured)
        out.append(CaseResult(
            name=f"{case.name}-{sim_key.split('.')[0]}", source=case.source, metric=sim_key, unit=unit,
            measured_low=measured, measured_high=measured, simulated=simulated, relative_error=rel,
            tolerance=case.tolerance, within=abs(rel) <= case.tolerance + 1e-12, detail=how,
            notes=case.notes.strip(), role="prediction"))
    return out


def run_cases(cases: list[LoadedCase], progress: Any = None) -> list[CaseResult]:
    """Run every case in order; ``progress(name)`` (if given) is called before each one, after the inputs of
    every bench case are checked (a mistake is said before any run is announced).

    Raises:
        ConfigError: as :func:`bench_case_config` and :func:`run_case`.
    """
    for lc in cases:
        if isinstance(lc.case, BenchCase):
            with tempfile.TemporaryDirectory(prefix="servesim-bench-") as tmp:
                bench_case_config(lc.case, lc.file, lc.where, Path(tmp))
    results = []
    for lc in cases:
        if progress is not None:
            progress(lc.case.name)
        if isinstance(lc.case, BenchCase):
            results.extend(run_bench_case(lc.case, lc.file, lc.where))
        else:
            results.append(run_case(lc))
    return results


# ---------------------------------------------------------------- reporting


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 1000:
        return f"{x:.0f}"
    if mag >= 100:
        return f"{x:.1f}"
    if mag >= 1:
        return f"{x:.3g}" if mag < 10 else f"{x:.2f}".rstrip("0").rstrip(".")
    return f"{x:.3g}"


def table_rows(results: list[CaseResult]) -> list[list[str]]:
    """Rows of the report table: case, source, measured, simulated, relative error, within tolerance."""
    rows = [["case", "source", "metric", "measured", "simulated", "rel. error", "within", "role"]]
    for r in results:
        err = "-" if r.relative_error is None else f"{100 * r.relative_error:+.1f}%"
        rows.append([r.name, r.source, f"{r.metric} ({r.unit})", r.measured_text(), _fmt(r.simulated), err,
                     f"{'yes' if r.within else 'no'} (±{100 * r.tolerance:g}%)", r.role])
    return rows


def format_table(results: list[CaseResult], markdown: bool = False) -> str:
    """The report table as aligned text, or as a Markdown table when ``markdown``."""
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def write_csv(results: list[CaseResult], path: str | Path) -> Path:
    """Write one row per case (columns :data:`CSV_COLUMNS`) to ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in results:
            w.writerow([
                r.name, r.source, r.metric, r.unit, repr(r.measured), repr(r.measured_low), repr(r.measured_high),
                "" if r.simulated is None else repr(r.simulated),
                "" if r.relative_error is None else repr(r.relative_error),
                repr(r.tolerance), "yes" if r.within else "no", r.role, r.detail, r.notes,
            ])
    return p


def plot(results: list[CaseResult], path: str | Path) -> Path:
    """Relative error of every case, one labelled row each (so no label can overlap another).

    x: the case's relative error in percent (``relative_error`` of the table: 0 inside a published
    interval, else the distance to its nearest end), on a symmetric-log axis (linear within ±10%);
    a published interval ``[low, high]`` adds the range ``simulated / high - 1`` to
    ``simulated / low - 1`` as an error bar. The grey bar of each row is its own ``±tolerance``; green
    within tolerance, red outside. Right: simulated vs measured value with the unit. Cases without a
    simulated value are left out (the CSV and the table still list them).
    """
    from servesim.plots.style import pyplot, save_figure

    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, NullLocator

    shown = [r for r in results if r.simulated is not None and r.relative_error is not None and r.measured_low > 0]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.3 * max(len(shown), 1)))
    for row, r in enumerate(shown):
        err = 100 * r.relative_error
        ax.barh(row, 200 * r.tolerance, left=-100 * r.tolerance, height=0.6, color="tab:gray", alpha=0.25)
        low, high = 100 * (r.simulated / r.measured_high - 1), 100 * (r.simulated / r.measured_low - 1)
        xerr = [[max(err - low, 0.0)], [max(high - err, 0.0)]] if high > low else None
        ax.errorbar([err], [row], xerr=xerr, fmt="o", color="tab:green" if r.within else "tab:red", ms=5, capsize=3)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=10, linscale=2)
    left, right = ax.get_xlim()
    left, right = min(left, -12.0), max(right, 12.0)
    ax.set_xlim(left, right)
    ticks = [-1000, -300, -100, -30, -10, -5, -2, 0, 2, 5, 10, 30, 100, 300, 1000]
    ax.set_xticks([t for t in ticks if left <= t <= right])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:+g}" if v else "0"))
    ax.set_yticks(range(len(shown)), [r.name for r in shown], fontsize=8)
    ax.set_ylim(len(shown) - 0.5, -0.5)  # first case on top, as in the table
    values = ax.twinx()
    values.set_ylim(ax.get_ylim())
    values.set_yticks(range(len(shown)), [f"{r.simulated:.4g} vs {r.measured_text()} {r.unit}"
                                          for r in shown], fontsize=8)
    values.grid(False)
    ax.set_xlabel("relative error (%) of simulated vs measured; grey: the case's ±tolerance")
    ax.set_title("servesim validation: green within the case's tolerance, red outside")
    return save_figure(fig, Path(path))
