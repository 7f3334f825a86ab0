"""Fit a hardware card's step-time fields to measured step times.

``servesim calibrate`` fits the fields of :data:`FITTED_FIELDS` of a :class:`~servesim.cards.HardwareCard`
(``bandwidth_efficiency``, ``compute_efficiency``, ``gemm_transition_exponent``, ``step_overhead_s``,
``per_request_s``) so that the step-time model of :mod:`servesim.roofline` (its
formula is documented there and in ``hardware/README.md``) reproduces steps measured on a real server.
The fit minimises the sum of squared RELATIVE errors ``((t_pred - t_meas) / t_meas)^2`` (every step counts
alike, fast decode steps as much as long prefills) within physical bounds, with
:func:`scipy.optimize.least_squares`; a field the data cannot determine (e.g. ``compute_efficiency`` from
decode steps at small batch) keeps the base card's value and the report says so. The predictions come
from :func:`servesim.roofline.build_step_time_model` with the fitted card, so calibration and simulation
agree by construction. The non-GEMM, sampler and attention fields keep the base card's values.

Inputs (``--data``, repeatable):

1. **Step-time CSV** (what ``benchmarks/measure_step_times.py`` writes). Columns, any order, others
   ignored, lines starting with ``#`` are comments::

       batch_size, context_tokens, scheduled_tokens, step_time_s

   one row per measured step: ``batch_size`` requests, each with ``context_tokens`` tokens already in its
   KV cache, ``scheduled_tokens`` new tokens in the step in total (split as evenly as possible over the
   requests: a decode step has ``scheduled_tokens == batch_size``, a prefill chunk ``batch_size == 1``),
   ``step_time_s`` the measured duration in seconds. Each request computes one position's logits.
2. **``vllm bench serve`` results** (``--save-result``; a ``.json`` file holding one result object, a list
   of them, or JSON lines). Each result gives ONE decode-step point: ``batch_size = max_concurrency``
   (or, when the run had no ``--max-concurrency``, Little's law ``completed * mean_e2el_ms / duration``),
   ``context_tokens = (total_input_tokens + total_output_tokens / 2) / completed`` (the mean KV length
   over a request's decode), ``scheduled_tokens = batch_size`` and ``step_time_s = median_tpot_ms / 1000``
   (``mean_tpot_ms`` when the median is absent). TPOT includes the prefill steps that interleave with
   decodes, so this over-estimates a pure decode step somewhat; prefer the CSV when you can measure it.

How to measure on your own server:

* ``python benchmarks/measure_step_times.py --model llama-3.1-8b --out steps.csv`` on one GPU (PyTorch,
  random weights shaped like the model card, no download; about 7 minutes). It times the forward pass
  only (no sampler, scheduler or detokenizer), so the fitted ``step_overhead_s`` is the GPU-side overhead;
  vLLM's CPU-side per-step overhead (~1-1.5 ms, vLLM V1 blog) comes on top unless the server overlaps it.
* or ``vllm serve MODEL`` and ``vllm bench serve --max-concurrency N --save-result --result-filename
  bench-N.json`` for several ``N`` (e.g. 1, 4, 16, 64, 128), then ``--data bench-1.json --data bench-4.json
  ...``: this calibrates the whole server, overhead included, but only on decode-dominated steps (add a
  CSV with prefill chunks to pin ``compute_efficiency``).

Sources: roofline form and factor ranges from ``docs/reference/roofline.md`` (Vidur's profiled H100
GEMMs, vLLM PR 16937, vLLM V1 blog); result keys from vLLM's ``benchmarks/serve`` result JSON.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from servesim.cards import HardwareCard, ModelCard
from servesim.input_files import parse_json, read_text
from servesim.errors import ConfigError
from servesim.roofline import build_step_time_model, compute_dtype

__all__ = [
    "CSV_COLUMNS",
    "StepPoint",
    "CalibrationFit",
    "read_step_times_csv",
    "read_vllm_bench_json",
    "read_step_data",
    "step_counts",
    "predict_step_times",
    "fit_step_times",
    "calibrated_card",
    "calibrated_card_yaml",
    "fit_table",
    "fit_summary",
    "synthetic_step_points",
    "write_step_times_csv",
]

CSV_COLUMNS: tuple[str, ...] = ("batch_size", "context_tokens", "scheduled_tokens", "step_time_s")
"""Required columns of a step-time CSV (counts in tokens/requests, time in seconds)."""

MIN_STEP_TIME_S = 1e-6
"""Shortest step time read (s): no GPU forward pass takes less than a microsecond (a kernel launch alone
takes a few); a smaller value is a unit mistake, and its relative error would overflow the fit."""



@dataclass(frozen=True)
class StepPoint:
    """One measured engine step.

    Attributes:
        batch_size: requests in the step (>= 1).
        context_tokens: tokens already in each request's KV cache before the step (>= 0).
        scheduled_tokens: new tokens in the step over all requests (>= batch_size).
        step_time_s: measured duration in seconds (>= MIN_STEP_TIME_S, 1e-6).
        where: ``FILE:line N`` (or ``FILE: result N``) for reports and errors.
    """

    batch_size: int
    context_tokens: int
    scheduled_tokens: int
    step_time_s: float
    where: str = ""


# ---------------------------------------------------------------------------------------------- reading
def _int_field(text: str, name: str, where: str, minimum: int) -> int:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name}: expected an integer >= {minimum} (got {text!r})") from None
    if not math.isfinite(value) or value != int(value) or value < minimum:
        raise ConfigError(f"{where}: {name}: expected an integer >= {minimum} (got {text!r})")
    return int(value)


def _positive_float(text: Any, name: str, where: str) -> float:
    try:
        if isinstance(text, bool):  # a JSON true is not a number (it was read as 1)
            raise TypeError
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name}: expected a positive number (got {text!r})") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: {name}: expected a positive number (got {text!r})")
    return value


def _step_time(text: Any, name: str, where: str, unit_s: float = 1.0) -> float:
    """A measured step time ``text`` in units of ``unit_s`` seconds, as seconds (>= :data:`MIN_STEP_TIME_S`)."""
    seconds = _positive_float(text, name, where) * unit_s
    if seconds < MIN_STEP_TIME_S:
        unit = "s" if unit_s == 1.0 else "ms"
        raise ConfigError(f"{where}: {name}: expected a step time of at least {MIN_STEP_TIME_S / unit_s:g} {unit} "
                          f"(got {text!r}; is it in another unit?)")
    return seconds


def read_step_times_csv(path: str | Path) -> list[StepPoint]:
    """Read a step-time CSV (columns :data:`CSV_COLUMNS`; ``#`` lines are comments; other columns ignored).

    Returns:
        one :class:`StepPoint` per data row, in file order.

    Raises:
        ConfigError: missing/unreadable file, missing column, a bad value (the message names the file, the
        line and the column), ``scheduled_tokens < batch_size``, or no data rows.
    """
    p = Path(path)
    text = read_text(p)
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise ConfigError(f"{p}: no header line (expected columns {', '.join(CSV_COLUMNS)})")
    rows = csv.reader([line for _, line in numbered])
    header_no = numbered[0][0]
    header = [h.strip() for h in next(rows)]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise ConfigError(f"{p}: line {header_no}: missing column(s) {', '.join(missing)} "
                          f"(expected {', '.join(CSV_COLUMNS)})")
    idx = {c: header.index(c) for c in CSV_COLUMNS}
    points = []
    for (no, _), row in zip(numbered[1:], rows):
        where = f"{p}: line {no}"
        if len(row) < len(header):
            raise ConfigError(f"{where}: expected {len(header)} fields like the header (got {len(row)})")
        b = _int_field(row[idx["batch_size"]].strip(), "batch_size", where, 1)
        c = _int_field(row[idx["context_tokens"]].strip(), "context_tokens", where, 0)
        t = _int_field(row[idx["scheduled_tokens"]].strip(), "scheduled_tokens", where, 1)
        s = _step_time(row[idx["step_time_s"]].strip(), "step_time_s", where)
        if t < b:
            raise ConfigError(f"{where}: scheduled_tokens: expected >= batch_size = {b} (every request in the "
                              f"step schedules at least one token; got {t})")
        points.append(StepPoint(b, c, t, s, f"{p}:{no}"))
    if not points:
        raise ConfigError(f"{p}: no data rows after the header")
    return points


def _bench_point(obj: Any, where: str) -> StepPoint:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object (a `vllm bench serve --save-result` result)")
    completed = obj.get("completed")
    if not isinstance(completed, (int, float)) or isinstance(completed, bool) or completed <= 0:
        raise ConfigError(f"{where}: completed: expected a positive number of requests (got {completed!r})")
    tpot_key = "median_tpot_ms" if obj.get("median_tpot_ms") is not None else "mean_tpot_ms"
    tpot_s = _step_time(obj.get(tpot_key), tpot_key, where, unit_s=1e-3)
    conc = obj.get("max_concurrency")
    if conc is not None:
        batch = _positive_float(conc, "max_concurrency", where)
    else:
        if obj.get("mean_e2el_ms") is None or obj.get("duration") is None:
            raise ConfigError(f"{where}: max_concurrency: expected a number (run `vllm bench serve` with "
                              "--max-concurrency N, or keep e2el in --percentile-metrics and the duration)")
        e2e = _positive_float(obj.get("mean_e2el_ms"), "mean_e2el_ms", where) / 1000.0
        batch = completed * e2e / _positive_float(obj.get("duration"), "duration", where)
    batch = min(batch, float(completed))
    b = max(1, int(round(batch)))
    inp = obj.get("total_input_tokens")
    out = obj.get("total_output_tokens")
    for key, val in (("total_input_tokens", inp), ("total_output_tokens", out)):
        if not isinstance(val, (int, float)) or isinstance(val, bool) or val < 0:
            raise ConfigError(f"{where}: {key}: expected a number of tokens >= 0 (got {val!r})")
    ctx = int(round((inp + out / 2.0) / completed))
    return StepPoint(b, ctx, b, tpot_s, where)


def read_vllm_bench_json(path: str | Path) -> list[StepPoint]:
    """Read ``vllm bench serve --save-result`` output: one object, a list of objects, or JSON lines.

    Each result becomes one decode-step point (see the module docstring for the mapping).

    Raises:
        ConfigError: missing file, invalid JSON (with the line), or a result without ``completed``,
        ``median_tpot_ms``/``mean_tpot_ms``, ``total_input_tokens``, ``total_output_tokens`` or a way to
        know the concurrency.
    """
    p = Path(path)
    text = read_text(p)
    try:
        data = parse_json(text, str(p))
        objects = data if isinstance(data, list) else [data]
        wheres = [f"{p}: result {i + 1}" if isinstance(data, list) else str(p) for i in range(len(objects))]
    except json.JSONDecodeError:
        objects, wheres = [], []
        for no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                objects.append(parse_json(line, f"{p}: line {no}"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{p}: line {no}: invalid JSON ({exc.msg})") from None
            wheres.append(f"{p}: line {no}")
    if not objects:
        raise ConfigError(f"{p}: no results found")
    return [_bench_point(o, w) for o, w in zip(objects, wheres)]


def read_step_data(path: str | Path) -> list[StepPoint]:
    """Read measured steps from a step-time CSV (``.csv``) or ``vllm bench serve`` JSON (``.json``/``.jsonl``).

    Raises:
        ConfigError: an unknown suffix, or any error of :func:`read_step_times_csv` /
        :func:`read_vllm_bench_json`.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".csv", ".txt"):
        return read_step_times_csv(p)
    if suffix in (".json", ".jsonl"):
        return read_vllm_bench_json(p)
    raise ConfigError(f"{p}: expected a step-time .csv or a `vllm bench serve` .json result (got {suffix!r})")


# ---------------------------------------------------------------------------------------------- model
def step_counts(point: StepPoint) -> tuple[int, int, int, int, int]:
    """The roofline inputs of a measured step: ``(num_tokens, num_logits, kv_tokens, attn_pairs,
    num_requests)``.

    The ``scheduled_tokens`` are split as evenly as possible: ``r = T mod B`` requests get ``q + 1`` new
    tokens and the others ``q = T // B``. A request with ``q`` new tokens after ``c = context_tokens``
    attends over ``c + q`` tokens and has ``q c + q (q + 1) / 2`` causal (query, key) pairs
    (:mod:`servesim.roofline`); each request computes one position's logits.
    """
    b, c, t = point.batch_size, point.context_tokens, point.scheduled_tokens
    q, r = divmod(t, b)
    kv = b * c + t
    pairs = 0
    for n_req, qi in ((b - r, q), (r, q + 1)):
        pairs += n_req * (qi * c + qi * (qi + 1) // 2)
    return t, b, kv, pairs, b


def predict_step_times(hardware: HardwareCard, model: ModelCard, points: Sequence[StepPoint],
                       tensor_parallel_size: int = 1) -> np.ndarray:
    """Step times (s) the calibrated roofline predicts for ``points``, shape ``(len(points),)``.

    Uses :func:`servesim.roofline.build_step_time_model` (``mode="calibrated"``), the simulator's own model.
    """
    stm = build_step_time_model(hardware, model, tensor_parallel_size, "calibrated")
    return np.array([stm.step_s(*step_counts(pt)) for pt in points], dtype=float)


@dataclass
class CalibrationFit:
    """Result of :func:`fit_step_times`.

    Attributes:
        bandwidth_efficiency, compute_efficiency: fitted factors in (0, 1].
        step_overhead_s: fitted per-step overhead (s, >= 0).
        gemm_transition_exponent, per_request_s: the other fitted fields (see
            :data:`FITTED_FIELDS`).
        kept_from_base: names of factors the data did not determine (base card's value kept).
        points: the measured steps, shape ``(n,)``.
        measured_s, predicted_s: step times (s), shape ``(n,)``; predictions from the real step-time model.
        relative_error: ``(predicted - measured) / measured``, shape ``(n,)``.
        r_squared: ``1 - SS_res / SS_tot`` of the step times (NaN when all measurements are equal).
    """

    bandwidth_efficiency: float
    compute_efficiency: float
    step_overhead_s: float
    gemm_transition_exponent: float
    per_request_s: float
    kept_from_base: tuple[str, ...]
    points: list[StepPoint]
    measured_s: np.ndarray
    predicted_s: np.ndarray
    relative_error: np.ndarray
    r_squared: float
    extra: dict = field(default_factory=dict)

    @property
    def max_abs_relative_error(self) -> float:
        """Largest ``|relative error|`` over the points (fraction)."""
        return float(np.max(np.abs(self.relative_error)))

    @property
    def rms_relative_error(self) -> float:
        """Root-mean-square relative error (fraction)."""
        return float(np.sqrt(np.mean(self.relative_error**2)))


FITTED_FIELDS: tuple[str, ...] = (
    "bandwidth_efficiency", "compute_efficiency", "gemm_transition_exponent", "step_overhead_s", "per_request_s",
)
"""Hardware-card fields :func:`fit_step_times` fits (the others keep the base card's values).
``gemm_launch_s`` is not among them: for one model it is a constant per step, indistinguishable from
``step_overhead_s`` (it comes from the kernel profiles)."""

_BOUNDS = {
    "bandwidth_efficiency": (0.05, 1.0), "compute_efficiency": (0.05, 1.0),
    "gemm_transition_exponent": (1.0, 16.0), "gemm_launch_s": (0.0, 1e-3),
    "step_overhead_s": (0.0, 1.0), "per_request_s": (0.0, 1e-2),
}
_SCALE = {"gemm_launch_s": 1e-6, "step_overhead_s": 1e-3, "per_request_s": 1e-6}


#: Least measured / predicted step-time ratio over all the data that calibrate refuses: no step of a real
#: server on the base card's GPU is a hundred times its roofline (a slower GPU than the card, a T4 against an
#: H100, is about ten), while milliseconds read as seconds are a thousand.
IMPLAUSIBLE_SLOWDOWN = 100.0


def _check_plausible_scale(measured_s: np.ndarray, base_predicted_s: np.ndarray,
                           points: Sequence[StepPoint]) -> None:
    """Refuse data whose every step is :data:`IMPLAUSIBLE_SLOWDOWN` times or more the base card's prediction.

    Raises:
        ConfigError: naming the data files, the ratios and the likely cause (milliseconds in step_time_s).
    """
    ratio = measured_s / base_predicted_s
    if not ratio.min() >= IMPLAUSIBLE_SLOWDOWN:
        return
    files = ", ".join(dict.fromkeys(pt.where.rsplit(":", 1)[0] for pt in points))
    raise ConfigError(
        f"{files}: step_time_s: every measured step is {ratio.min():.3g} to {ratio.max():.3g} times the base card's "
        f"roofline prediction (expected seconds, at most {IMPLAUSIBLE_SLOWDOWN:g} times the prediction: are the "
        "times in milliseconds, or the hardware or model not the measured ones?)"
    )


def fit_step_times(hardware: HardwareCard, model: ModelCard, points: Sequence[StepPoint],
                   tensor_parallel_size: int = 1) -> CalibrationFit:
    """Fit the fields of :data:`FITTED_FIELDS` to measured steps (bounded least squares, relative errors).

    The model is the simulator's own (:func:`predict_step_times`); the objective is the sum of squared
    relative errors, minimised with :func:`scipy.optimize.least_squares` (trust-region reflective, within
    physical bounds, finite differences of relative step 1e-3: the model's times are integers of 2^-16 ps)
    from the base card's values and three other starts. A field whose change by 10% moves no predicted step by
    more than 0.5% is not determined by the data: it keeps the base card's value and the report says so.

    Args:
        hardware: the base card (peaks, interconnect; fallback for undetermined fields).
        model: the model that was measured.
        points: measured steps (at least 3).
        tensor_parallel_size: TP degree of the measurement.

    Returns:
        a :class:`CalibrationFit` (predictions from the real step-time model with the fitted card).

    Raises:
        ConfigError: fewer than 3 points, or points all of one shape (batch, context, scheduled tokens) when
            more than one field moves their time.
    """
    from scipy.optimize import least_squares

    points = list(points)
    if len(points) < 3:
        where = points[0].where.rsplit(":", 1)[0] if points else "--data"
        raise ConfigError(f"{where}: expected at least 3 measured steps to fit (got {len(points)})")
    tp = int(tensor_parallel_size)
    y = np.array([pt.step_time_s for pt in points], dtype=float)
    base_pred = predict_step_times(hardware, model, points, tp)
    _check_plausible_scale(y, base_pred, points)
    free, kept = [], []
    for name in FITTED_FIELDS:
        value = float(getattr(hardware, name))
        probe = value * 1.1 if value > 0 else _SCALE.get(name, 0.1)
        lo, hi = _BOUNDS[name]
        probe = min(max(probe, lo), hi) if probe <= hi else value * 0.9
        moved = predict_step_times(hardware.model_copy(update={name: probe}), model, points, tp)
        (free if np.max(np.abs(moved / base_pred - 1)) > 0.005 else kept).append(name)
    shapes = {(pt.batch_size, pt.context_tokens, pt.scheduled_tokens) for pt in points}
    if len(shapes) == 1 and len(free) > 1:  # one step time, measured N times, cannot tell the fields apart
        (batch, context, tokens), = shapes
        where = points[0].where.rsplit(":", 1)[0] or "--data"
        raise ConfigError(f"{where}: all {len(points)} measured steps have one shape (batch {batch}, context "
                          f"{context}, {tokens} scheduled tokens): they cannot determine {', '.join(free)} apart "
                          "(expected steps of several batch sizes, contexts or token counts)")
    scale = np.array([_SCALE.get(n, 1.0) for n in free])

    def card_of(x: np.ndarray) -> HardwareCard:
        return hardware.model_copy(update={n: float(v) for n, v in zip(free, x * scale)})

    def residuals(x: np.ndarray) -> np.ndarray:
        return predict_step_times(card_of(x), model, points, tp) / y - 1.0

    values = {n: float(getattr(hardware, n)) for n in FITTED_FIELDS}
    if free:
        # start inside the bounds (a field at a bound, e.g. per_request_s = 0, has a one-sided gradient)
        x0 = np.array([min(max(values[n] or _SCALE.get(n, 0.5), _BOUNDS[n][0]), _BOUNDS[n][1]) for n in free]) / scale
        x0 = np.minimum(x0, np.array([_BOUNDS[n][1] for n in free]) / scale * 0.999)
        lower = np.array([_BOUNDS[n][0] for n in free]) / scale
        upper = np.array([_BOUNDS[n][1] for n in free]) / scale
        best = least_squares(residuals, x0, bounds=(lower, upper), diff_step=1e-3)
        for eta_bw, eta_c in ((0.6, 0.6), (0.9, 0.5), (0.5, 0.9)):  # multi-start: the roofs trade off
            start = x0.copy()
            for n, v in (("bandwidth_efficiency", eta_bw), ("compute_efficiency", eta_c)):
                if n in free:
                    start[free.index(n)] = v
            res = least_squares(residuals, start, bounds=(lower, upper), diff_step=1e-3)
            if res.cost < best.cost:
                best = res
        values.update({n: float(v) for n, v in zip(free, best.x * scale)})
    card = hardware.model_copy(update=values)
    pred = predict_step_times(card, model, points, tp)
    rel = (pred - y) / y
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((pred - y) ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    return CalibrationFit(values["bandwidth_efficiency"], values["compute_efficiency"], values["step_overhead_s"],
                          values["gemm_transition_exponent"], values["per_request_s"],
                          tuple(kept), points, y, pred, rel, r2,
                          extra={"tensor_parallel_size": tp, "model": model.name})


# ---------------------------------------------------------------------------------------------- output
def calibrated_card(hardware: HardwareCard, fit: CalibrationFit, source: str | None = None) -> HardwareCard:
    """A copy of ``hardware`` with the fitted factors (validated; ``name`` gets a ``(calibrated)`` suffix)."""
    data = hardware.model_dump()
    data.update({name: float(f"{getattr(fit, name):.4g}") for name in FITTED_FIELDS})
    if not data["name"].endswith("(calibrated)"):
        data["name"] = f"{data['name']} (calibrated)"
    if source is not None:
        data["source"] = source
    return HardwareCard.model_validate(data)


def _fmt_pct(x: float) -> str:
    return f"{100.0 * x:+.1f}%"


def fit_table(fit: CalibrationFit) -> list[str]:
    """Per-point table lines: batch, context, scheduled tokens, measured and predicted ms, relative error."""
    lines = [f"{'batch_size':>10} {'context':>8} {'scheduled':>9} {'measured_ms':>11} {'predicted_ms':>12} "
             f"{'rel_error':>9}"]
    for pt, m, pr, r in zip(fit.points, fit.measured_s, fit.predicted_s, fit.relative_error):
        lines.append(f"{pt.batch_size:>10} {pt.context_tokens:>8} {pt.scheduled_tokens:>9} {m * 1e3:>11.3f} "
                     f"{pr * 1e3:>12.3f} {_fmt_pct(r):>9}")
    return lines


def fit_summary(fit: CalibrationFit) -> list[str]:
    """Short summary lines: fitted factors, R^2, RMS and max relative error, factors kept from the base."""
    lines = [
        f"bandwidth_efficiency: {fit.bandwidth_efficiency:.4f}",
        f"compute_efficiency:   {fit.compute_efficiency:.4f}",
        f"step_overhead_s:      {fit.step_overhead_s:.4g}",
        f"gemm_transition_exponent: {fit.gemm_transition_exponent:.4g}",
        f"per_request_s:        {fit.per_request_s:.4g}",
        f"R^2 (step time): {fit.r_squared:.4f}; relative error: RMS {100 * fit.rms_relative_error:.2f}%, "
        f"max {100 * fit.max_abs_relative_error:.2f}% over {len(fit.points)} steps",
    ]
    if fit.kept_from_base:
        lines.append("not determined by the data (base card's value kept): " + ", ".join(fit.kept_from_base))
    return lines


#: What a calibrated card's ``source`` starts with: ``servesim calibrate --out`` removes an earlier card of its
#: own (a YAML mapping whose ``source`` holds this), and no other file, before it fits again.
CALIBRATED_MARK = "calibrated by servesim calibrate"


def calibrated_card_yaml(base: HardwareCard, fit: CalibrationFit, data_files: Sequence[str | Path],
                         *, base_spec: str = "", date: _dt.date | None = None) -> str:
    """The YAML text of the calibrated card: a comment block with the fit quality, then the card.

    The comment block names the base card, model, TP, data files and date, and lists R^2 and the relative
    error of every point (the card schema forbids extra keys, so the note is a comment; ``source`` says
    the card was calibrated).
    """
    import yaml

    date = date or _dt.date.today()
    files = ", ".join(str(f) for f in data_files)
    source = (f"{CALIBRATED_MARK} on {date.isoformat()} from {files} "
              f"(base: {base.name}; model {fit.extra.get('model')}, tensor_parallel_size "
              f"{fit.extra.get('tensor_parallel_size')}); base source: {base.source}")
    card = calibrated_card(base, fit, source)
    head = [
        f"# Hardware card calibrated by `servesim calibrate` on {date.isoformat()}.",
        f"# base card: {base_spec or base.name}; model: {fit.extra.get('model')}; "
        f"tensor_parallel_size: {fit.extra.get('tensor_parallel_size')}",
        f"# data: {files} ({len(fit.points)} steps)",
        "# fitted: " + ", ".join(f"{k} = {getattr(card, k)}" for k in FITTED_FIELDS),
    ]
    if fit.kept_from_base:
        head.append("# not determined by the data, base value kept: " + ", ".join(fit.kept_from_base))
    head += [
        f"# fit quality: R^2 = {fit.r_squared:.4f}; relative error RMS {100 * fit.rms_relative_error:.2f}%, "
        f"max {100 * fit.max_abs_relative_error:.2f}%",
        "# calibration (per measured step, times in ms):",
    ]
    head += [f"#   {line}" for line in fit_table(fit)]
    body = yaml.safe_dump(card.model_dump(), sort_keys=False, width=110)
    return "\n".join(head) + "\n" + body


# ---------------------------------------------------------------------------------------------- synthetic
def synthetic_step_points(
    hardware: HardwareCard,
    model: ModelCard,
    rng: np.random.Generator,
    *,
    tensor_parallel_size: int = 1,
    noise_rel: float = 0.02,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    contexts: Sequence[int] = (256, 2048, 8192),
    prefill_tokens: Sequence[int] = (128, 512, 1024, 2048, 4096, 8192),
    prefill_contexts: Sequence[int] = (0, 2048),
) -> list[StepPoint]:
    """Steps predicted by the roofline with ``hardware``'s factors, times lognormal noise (for tests/examples).

    Decode steps for every ``batch_sizes x contexts`` and single-request prefill chunks for every
    ``prefill_tokens x prefill_contexts``; each time is multiplied by ``exp(noise_rel * Z)``, ``Z ~ N(0, 1)``
    drawn from ``rng``. Not a measurement: label files made with it as synthetic.
    """
    pts = [StepPoint(b, c, b, 0.0) for b in batch_sizes for c in contexts]
    pts += [StepPoint(1, c, t, 0.0) for t in prefill_tokens for c in prefill_contexts]
    clean = predict_step_times(hardware, model, pts, tensor_parallel_size)
    noisy = clean * np.exp(noise_rel * rng.standard_normal(len(pts)))
    return [StepPoint(p.batch_size, p.context_tokens, p.scheduled_tokens, float(s)) for p, s in zip(pts, noisy)]


def write_step_times_csv(points: Sequence[StepPoint], path: str | Path, comments: Sequence[str] = ()) -> None:
    """Write ``points`` as a step-time CSV (``#`` comment lines first, then :data:`CSV_COLUMNS`)."""
    lines = [f"# {c}" for c in comments] + [",".join(CSV_COLUMNS)]
    lines += [f"{p.batch_size},{p.context_tokens},{p.scheduled_tokens},{p.step_time_s:.6e}" for p in points]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
