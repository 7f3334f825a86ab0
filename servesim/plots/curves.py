"""Curves from a sweep's tables: latency vs throughput (with confidence bands) and speedup over a baseline.

Every figure is written as PNG and SVG with its data as CSV beside it. matplotlib is imported lazily
(:func:`servesim.plots.style.pyplot`, Agg backend).

Confidence band of a mean over n replications: ``mean +- t(0.975, n-1) * sd / sqrt(n)`` (sd with
``ddof = 1``; Student's t two-sided 95% quantile from :func:`scipy.stats.t.ppf`; no band for n = 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.atomic import atomic_file

#: x-axis choices that are summary columns (throughputs achieved), with their axis labels.
THROUGHPUT_AXES = {
    "output_throughput": "achieved output throughput (tokens/s)",
    "request_throughput": "achieved request throughput (requests/s)",
    "total_token_throughput": "achieved total token throughput (tokens/s)",
}


def axis_labels(columns: dict[str, str], units: dict[str, str] | None = None) -> dict[str, str]:
    """Swept key -> column map of sweep.json turned into column -> axis label with its unit if known.

    ``units`` (column -> unit) is sweep.json's ``units``; a manifest written before it existed falls back
    to :data:`servesim.sweep.spec.KEY_UNITS` by key.
    """
    from servesim.sweep.spec import KEY_UNITS

    if units is None:
        units = {col: KEY_UNITS[key] for key, col in columns.items() if key in KEY_UNITS}
    return {col: f"{col} ({units[col]})" if col in units else col for col in columns.values()}


#: Markers of the curves, one per round of the colour cycle (curve i: colour i mod C, marker i // C).
CURVE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: The p99 curves' line style: dashes long enough to tell from the solid p50 in the legend.
P99_DASHES = (0, (5, 2.5))

#: Latency panels: (summary column prefix, title).
PANELS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))


def t975(df: int) -> float:
    """Two-sided 95% Student-t quantile ``t(0.975, df)`` for ``df`` >= 1 degrees of freedom (scipy.stats).

    Raises:
        ValueError: ``df < 1``.
    """
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    from scipy import stats  # lazy: scipy's import costs more than a short run

    return float(stats.t.ppf(0.975, df))


def mean_ci(values) -> tuple[float, float, int]:
    """(mean, half-width of the 95% band, n) of the finite values; half-width NaN when n < 2."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(v[0]), float("nan"), 1
    return float(v.mean()), t975(n - 1) * float(v.std(ddof=1)) / math.sqrt(n), n


def save_png_svg(fig, path: Path, svg: bool = True) -> list[Path]:
    """Save ``fig`` as ``path`` (PNG) and, with ``svg``, as the same name with ``.svg``; close it.

    Both files are written atomically (temporary file + rename). Returns the paths written.
    """
    from servesim.plots.style import save_figure

    path = Path(path)
    written = []
    if svg:
        target = path.with_suffix(".svg")
        with atomic_file(target, "wb") as handle:
            fig.savefig(handle, format="svg", bbox_inches="tight")
        written.append(target)
    written.insert(0, save_figure(fig, path))
    return written


def group_label(row: dict) -> str:
    """Legend text of a group: ``key=value`` pairs, or ``all`` when nothing distinguishes groups."""
    return ", ".join(f"{k}={v}" for k, v in row.items()) or "all"


def curve_table(summary: pd.DataFrame, along: str, x: str, group_cols: list[str],
                metrics: list[str]) -> pd.DataFrame:
    """Means and 95% bands over replications of ``x`` and each metric, per (group, value of ``along``).

    Args:
        summary: ``summary.csv`` (one row per run).
        along: the swept column that varies along a curve.
        x: the x column (``along`` itself or a throughput column).
        group_cols: columns whose values distinguish curves (other swept columns, ``variant``).
        metrics: metric columns (e.g. ``ttft_s.p99``).

    Returns:
        Tidy rows: ``group``, the group columns, ``along`` value, ``x``, ``x_ci``, ``metric``, ``mean``,
        ``ci_low``, ``ci_high``, ``n``; ordered by group (first seen) then ``along``.
    """
    rows = []
    keys = group_cols + [along]
    for key, g in summary.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        groups = dict(zip(group_cols, key[:-1]))
        xm, xci, _ = mean_ci(g[x])
        for metric in metrics:
            if metric not in g.columns:
                continue
            m, ci, n = mean_ci(g[metric])
            half = 0.0 if math.isnan(ci) else ci
            rows.append({"group": group_label(groups), **groups, along: key[-1], "x": xm, "x_ci": xci,
                         "metric": metric, "mean": m, "ci_low": m - half, "ci_high": m + half, "n": n})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
    table["_g"] = table["group"].map(order)
    table = table.sort_values(["_g", "metric", along], kind="stable").drop(columns="_g").reset_index(drop=True)
    return table


def curve_styles(groups: list[str], colors: list[str]) -> dict[str, tuple[str, str]]:
    """Group -> (colour, marker) of its curves: colour ``i mod C``, marker ``i // C`` of :data:`CURVE_MARKERS`
    (``C`` colours): distinct pairs for up to ``C * len(CURVE_MARKERS)`` groups."""
    return {group: (colors[i % len(colors)], CURVE_MARKERS[(i // len(colors)) % len(CURVE_MARKERS)])
            for i, group in enumerate(groups)}


def plot_latency_curves(summary: pd.DataFrame, along: str, x: str, group_cols: list[str], out_png: Path,
                        slos: dict[str, float] | None = None, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """``latency_vs_throughput.png/.svg/.csv``: p50 (solid) and p99 (dashed) TTFT and TPOT (ms) against ``x``.

    Args:
        summary, along, x, group_cols: see :func:`curve_table`.
        out_png: the PNG path (the SVG and CSV take the same stem).
        slos: SLO name (``ttft_p99``...) -> target (s), drawn as dashed horizontal lines on the panel of
            its metric.
        labels: column -> axis label (with unit) for swept columns (see :func:`axis_labels`).

    Returns:
        The data table written as CSV.

    Raises:
        ValueError: ``x`` or ``along`` is not a column of ``summary``.
    """
    from servesim.plots.style import plain_log_ticks, pyplot

    for col in (x, along):
        if col not in summary.columns:
            raise ValueError(f"no column {col!r} in summary.csv")
    metrics = [f"{p}.{s}" for p, _ in PANELS for s in ("p50", "p99")]
    table = curve_table(summary, along, x, group_cols, metrics)
    plt = pyplot()
    from matplotlib.lines import Line2D

    groups = list(dict.fromkeys(table["group"])) if not table.empty else []
    # one legend below both panels: a line per curve (colour and marker: distinct for up to 80 curves),
    # then what solid and dashed mean; it grows downwards instead of covering the curves
    label_width = 0.7 + 0.06 * max([len(g) for g in groups] + [3])  # inches a legend column takes (7 pt)
    columns = max(1, min(4, len(groups), int(10.5 // label_width)))
    legend_rows = -(-(len(groups) + 2) // columns)
    legend_height = 0.2 + 0.17 * legend_rows  # inches
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3 + legend_height))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = curve_styles(groups, colors)
    bands = bool(len(table)) and table["n"].max() > 1
    for ax, (prefix, title) in zip(axes, PANELS):
        for group in groups:
            c, marker = styles[group]
            for stat, style in (("p50", "-"), ("p99", P99_DASHES)):
                d = table[(table["group"] == group) & (table["metric"] == f"{prefix}.{stat}")]
                if d.empty:
                    continue
                d = d.sort_values(along, key=lambda v: pd.to_numeric(v, errors="coerce"), kind="stable")
                xs = d["x"].to_numpy(dtype=float)
                ax.plot(xs, d["mean"] * 1e3, linestyle=style, marker=marker, ms=3.5, color=c)
                if d["n"].max() > 1:
                    ax.fill_between(xs, d["ci_low"] * 1e3, d["ci_high"] * 1e3, color=c, alpha=0.15, linewidth=0)
        slo_lines = False
        for name, target in (slos or {}).items():
            if name.startswith(prefix.split("_")[0] + "_"):
                ax.axhline(target * 1e3, color="black", linestyle=":", linewidth=1.2, label=f"SLO {name} {target:g} s")
                slo_lines = True
        ax.set_title(f"{title} p50 (solid) and p99 (dashed)" + ("; bands: 95% CI over replications" if bands else ""))
        ax.set_xlabel(THROUGHPUT_AXES.get(x) or (labels or {}).get(x, x))
        ax.set_ylabel(f"{title} (ms)")
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
        if slo_lines:
            ax.legend(fontsize=7)
    handles = [Line2D([], [], color=styles[g][0], marker=styles[g][1], ms=3.5, label=g) for g in groups]
    handles += [Line2D([], [], color="0.35", linestyle="-", label="p50"),
                Line2D([], [], color="0.35", linestyle=P99_DASHES, label="p99")]
    fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=7, frameon=False,
               handlelength=3.5)
    fig.tight_layout(rect=(0, legend_height / (4.3 + legend_height), 1, 1))
    out_png = Path(out_png)
    save_png_svg(fig, out_png)
    _write_csv(table, out_png.with_suffix(".csv"))
    return table


def crossover(xs, speedup) -> float | None:
    """Smallest x where the speedup falls from >= 1 to < 1, by linear interpolation; None if it never does.

    Args:
        xs: increasing x values (shape (m,)); speedup: the speedup at each (shape (m,), NaN skipped).
    """
    xs = np.asarray(xs, dtype=np.float64)
    sp = np.asarray(speedup, dtype=np.float64)
    ok = np.isfinite(xs) & np.isfinite(sp)
    xs, sp = xs[ok], sp[ok]
    for i in range(len(xs) - 1):
        a, b = sp[i], sp[i + 1]
        if a >= 1 > b:
            return float(xs[i] + (a - 1) * (xs[i + 1] - xs[i]) / (a - b))
    return None


def where_below_one(xs, speedup, along: str, digits: int = 3) -> tuple[str, float | None]:
    """Where a speedup curve lies below 1, in words, and the x it first crosses 1 at (None if it never does).

    ``"above {along} = X"`` (it starts at >= 1 and falls below at X, :func:`crossover`), ``"below {along} =
    X"`` (it starts below 1 and reaches 1 at X; ``"... and above ... = Y"`` if it falls again at Y),
    ``"everywhere in the range"`` (every point below 1), ``""`` (no point below 1). X by linear
    interpolation, shown to ``digits`` significant digits.
    """
    xs = np.asarray(xs, dtype=np.float64)
    sp = np.asarray(speedup, dtype=np.float64)
    ok = np.isfinite(xs) & np.isfinite(sp)
    xs, sp = xs[ok], sp[ok]
    if not len(sp) or (sp >= 1).all():
        return "", None
    if sp[0] >= 1:
        x_cross = crossover(xs, sp)
        return f"above {along} = {x_cross:.{digits}g}", x_cross
    if (sp < 1).all():
        return "everywhere in the range", None
    i = int(np.argmax(sp >= 1))  # the first point at >= 1, after points below
    x_up = float(xs[i - 1] + (1 - sp[i - 1]) * (xs[i] - xs[i - 1]) / (sp[i] - sp[i - 1]))
    text = f"below {along} = {x_up:.{digits}g}"
    x_down = crossover(xs[i:], sp[i:])
    return (text + (f" and above {along} = {x_down:.{digits}g}" if x_down is not None else "")), x_up


def speedup_verdict(where: str, speculative: bool, baseline: str = "baseline") -> str:
    """The words for one speedup curve, in the figure's legend and in ``servesim plot``'s output alike:
    ``where`` is :func:`where_below_one`'s text ("" when the curve never lies below 1); with
    ``speculative`` the ratio is speculative over plain decoding ("speculation hurts above rate = 12.5",
    "speculation never hurts in the range"), otherwise a variant's throughput over ``baseline``'s."""
    if speculative:
        return f"speculation hurts {where}" if where else "speculation never hurts in the range"
    return f"throughput below {baseline}'s {where}" if where else f"throughput never below {baseline}'s in the range"


def plot_speedup(speedup: pd.DataFrame, along: str, out_png: Path, label: str | None = None, *,
                 speculative: bool | None = None, baseline: str = "baseline") -> pd.DataFrame:
    """``speedup.png/.svg`` and ``speedup_curve.csv``: each variant's throughput over the baseline's.

    One line per group (the other swept columns and ``variant`` if present), y = 1 dashed, the crossover
    (:func:`crossover`) marked, or "never in the range" in the legend. With ``speculative`` (the sweep
    compares speculative variants with a plain baseline, :func:`servesim.sweep.tables.is_speculative_comparison`;
    by default: the table has ``spec_output_throughput``) the figure is the speculative speedup
    ("speculation hurts above X"); otherwise a ratio to ``baseline`` (the variant's name), worded so.

    Returns:
        The table written: ``group``, group columns, ``along``, ``speedup``, ``crossover`` (per group: the x
        where the speedup first crosses 1, :func:`where_below_one`; NaN if it never does).

    Raises:
        ValueError: ``along`` is not a numeric column of ``speedup``.
    """
    from servesim.plots.style import pyplot

    if along not in speedup.columns:
        raise ValueError(f"no column {along!r} in speedup.csv")
    data = speedup.copy()
    data[along] = pd.to_numeric(data[along], errors="coerce")
    if data[along].isna().all():
        raise ValueError(f"column {along!r} of speedup.csv is not numeric")
    if speculative is None:
        speculative = "spec_output_throughput" in speedup.columns
    skip = {along, "speedup"} | {c for c in data.columns if c.endswith("_output_throughput")}
    group_cols = [c for c in data.columns if c not in skip]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    rows = []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    grouped = list(data.groupby(group_cols, sort=False, dropna=False)) if group_cols else [((), data)]
    keys = [key if isinstance(key, tuple) else (key,) for key, _ in grouped]
    groups = [group_label(dict(zip(group_cols, key))) for key in keys]
    styles = curve_styles(groups, colors)
    for key, group, (_, g) in zip(keys, groups, grouped):
        g = g.sort_values(along)
        where, x_cross = where_below_one(g[along], g["speedup"], along)
        c, marker = styles[group]
        text = speedup_verdict(where, speculative, baseline)
        ax.plot(g[along], g["speedup"], marker=marker, linestyle="-", color=c,
                label=text if group == "all" else f"{group}: {text}")
        if x_cross is not None:
            ax.axvline(x_cross, color=c, linestyle=":", linewidth=1)
        for _, r in g.iterrows():
            rows.append({"group": group, **dict(zip(group_cols, key)), along: r[along], "speedup": r["speedup"],
                         "crossover": np.nan if x_cross is None else x_cross})
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.ticklabel_format(axis="y", useOffset=False)  # ratios near 1 read as such, not as "+1" and offsets
    xs = data[along].dropna()
    if len(xs) and xs.min() > 0 and xs.max() / xs.min() >= 16:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlabel(label or along)
    if speculative:
        ax.set_ylabel("speedup (output tokens/s, spec / plain)")
        ax.set_title("Speculative decoding speedup")
    else:
        ax.set_ylabel(f"output tokens/s, variant / {baseline}")
        ax.set_title(f"Output throughput relative to {baseline}")
    num_lines = sum(not line.get_label().startswith("_") for line in ax.get_lines())  # the curves
    if num_lines > 3:  # below the axes, growing downwards, instead of over the curves
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
        fig.set_figheight(4.3 + 0.17 * num_lines)
    else:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out_png = Path(out_png)
    save_png_svg(fig, out_png)
    table = pd.DataFrame(rows)
    _write_csv(table, out_png.with_name(out_png.stem + "_curve.csv"))
    return table


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    from servesim.sweep.tables import write_csv

    write_csv(frame, Path(path))
