"""``latency.png``: TTFT and TPOT distributions, batch size and KV-cache utilisation over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servesim.engine.output import EngineOutput
from servesim.metrics.latencies import request_latencies
from servesim.plots.style import P50_COLOR, P99_COLOR, plain_log_ticks, pyplot, save_figure


def _cdf(ax, values_s: np.ndarray, stats: dict | None, name: str) -> None:
    """Empirical CDF of a latency sample (seconds) drawn in milliseconds, p50 and p99 marked."""
    values_ms = np.sort(values_s[~np.isnan(values_s)]) * 1e3
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{name} distribution (CDF)")
    if values_ms.size == 0:
        ax.text(0.5, 0.5, f"no {name} samples", ha="center", va="center", transform=ax.transAxes)
        return
    ax.step(values_ms, np.arange(1, values_ms.size + 1) / values_ms.size, where="post", color="tab:blue")
    stats = stats or {}
    for key, color in (("p50", P50_COLOR), ("p99", P99_COLOR)):
        if stats.get(key) is not None:
            ms = stats[key] * 1e3
            ax.axvline(ms, color=color, linestyle="--", linewidth=1, label=f"{key} = {ms:.1f} ms")
    ax.set_ylim(0, 1.02)
    if values_ms[0] > 0 and values_ms[-1] / values_ms[0] > 100:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    ax.legend(loc="lower right")


#: Time bins of the over-time panels when the StepLog has more rows than twice this.
TIME_BINS = 300


#: Most replicas the over-time panels draw one line each for; more are drawn as one band across replicas.
MAX_REPLICA_LINES = 8


def _over_time(ax, out: EngineOutput, values: np.ndarray, ylabel: str, title: str, color: str) -> None:
    """Per-row StepLog quantity against simulated time (s); in a multi-replica run one line per replica
    (its own rows, ``out.step_replica``), up to :data:`MAX_REPLICA_LINES` replicas, else one band over
    every replica's rows.

    Few rows: each row is a horizontal segment over [start, end), idle gaps left blank. Many rows: the
    time axis is cut into :data:`TIME_BINS` bins and each bin shows the duration-weighted mean of the
    rows that start in it (line) and their min-max range (band).
    """
    steps = out.steps
    start = np.asarray(steps.start_s, dtype=np.float64)
    duration = np.asarray(steps.duration_s, dtype=np.float64)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if start.size == 0:
        ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
        return
    t0, t1 = float(start.min()), float((start + duration).max())
    replica = out.step_replica
    if replica is None or out.num_replicas > MAX_REPLICA_LINES:
        _draw_rows(ax, start, duration, values, t0, t1, color, "" if replica is None else " (all replicas)")
    else:
        from matplotlib import colormaps

        palette = colormaps["tab10"]
        for j in range(out.num_replicas):
            mine = replica == j
            if mine.any():
                _draw_rows(ax, start[mine], duration[mine], values[mine], t0, t1, palette(j % 10),
                           f" replica {j}", band=False)
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlim(t0, t1)
    ax.set_ylim(bottom=0)


def _draw_rows(ax, start: np.ndarray, duration: np.ndarray, values: np.ndarray, t0: float, t1: float, color,
               label: str, band: bool = True) -> None:
    """Draw rows ``(start, duration, value)`` (seconds) over ``[t0, t1]``: segments when few, else the binned
    duration-weighted mean (and, with ``band``, the min-max band) of :data:`TIME_BINS` bins."""
    end = start + duration
    if start.size <= 2 * TIME_BINS or t1 <= t0:
        # NaN separators break the line between rows
        x = np.column_stack([start, end, np.full(start.shape, np.nan)]).ravel()
        y = np.column_stack([values, values, np.full(start.shape, np.nan)]).ravel()
        ax.plot(x, y, color=color, linewidth=1.0, label=label.strip() or None)
        return
    edges = np.linspace(t0, t1, TIME_BINS + 1)
    index = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, TIME_BINS - 1)
    weight = np.bincount(index, weights=duration, minlength=TIME_BINS)
    count = np.bincount(index, minlength=TIME_BINS)
    weighted = np.bincount(index, weights=values * duration, minlength=TIME_BINS)
    plain = np.bincount(index, weights=values, minlength=TIME_BINS)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(weight > 0, weighted / weight, plain / count)
    empty = count == 0
    mean[empty] = np.nan
    centre = (edges[:-1] + edges[1:]) / 2
    if band:
        low = np.full(TIME_BINS, np.inf)
        high = np.full(TIME_BINS, -np.inf)
        np.minimum.at(low, index, values)
        np.maximum.at(high, index, values)
        low[empty], high[empty] = np.nan, np.nan
        ax.fill_between(centre, low, high, color=color, alpha=0.25, linewidth=0, label="min-max per bin" + label)
        ax.plot(centre, mean, color=color, linewidth=1.2, label="time-weighted mean" + label)
        ax.legend(loc="upper right")
    else:
        ax.plot(centre, mean, color=color, linewidth=1.2, label=label.strip())


def plot_latency(out: EngineOutput, summary: dict, path: Path) -> Path:
    """Draw ``latency.png``: a 2x2 figure.

    Top: empirical CDFs of TTFT and TPOT over completed requests (ms; p50 and p99 from ``summary``
    marked as dashed lines; log x axis when the sample spans more than two decades). Bottom: batch size
    (requests per step) and KV-cache utilisation (% of one replica's blocks, ``kv_blocks_total`` divided
    by the replicas, at the end of each row) over simulated time (s), from the StepLog rows (binned when
    there are many; one line per replica in a multi-replica run, see :func:`_over_time`).

    Args:
        out: the engine output.
        summary: :func:`servesim.metrics.summarize` of ``out`` (for the p50/p99 markers and the title).
        path: the PNG file to write, or an existing folder (then ``<path>/latency.png``).

    Returns:
        The path written (atomically).

    Raises:
        OSError: the file cannot be written.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "latency.png"
    return save_figure(latency_figure(out, summary), path)


def latency_figure(out: EngineOutput, summary: dict):
    """The open matplotlib figure that :func:`plot_latency` saves (axes ``[[TTFT, TPOT], [batch, KV]]``)."""
    plt = pyplot()
    lat = request_latencies(out.requests)
    done = lat["completed"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    _cdf(axes[0, 0], lat["ttft_s"][done], summary.get("ttft_s"), "TTFT")
    _cdf(axes[0, 1], lat["tpot_s"][done], summary.get("tpot_s"), "TPOT")
    _over_time(axes[1, 0], out, np.asarray(out.steps.batch_size, dtype=np.float64),
               "batch size (requests)", "Batch size", "tab:purple")
    # every row is one replica's: its blocks against one replica's pool
    per_replica = out.kv_blocks_total // out.num_replicas
    total = per_replica if per_replica > 0 else np.nan
    pool = (f"{per_replica} blocks" if out.num_replicas == 1
            else f"{per_replica} blocks per replica, {out.num_replicas} replicas")
    _over_time(axes[1, 1], out, 100.0 * np.asarray(out.steps.kv_blocks_used, dtype=np.float64) / total,
               "KV cache used (%)", f"KV-cache utilisation ({pool})", "tab:orange")
    axes[1, 1].set_ylim(0, 105)
    title = (f"{summary.get('completed', 0)}/{summary.get('num_requests', 0)} requests, "
             f"{summary.get('request_throughput', 0.0):.2f} req/s, "
             f"{summary.get('output_throughput', 0.0):.0f} output tok/s"
             + (" - SATURATED" if summary.get("saturated") else ""))
    fig.suptitle(title)
    fig.tight_layout()
    return fig
