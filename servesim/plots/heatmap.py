"""Heatmaps of one summary metric over two swept axes (mean over replications).

``--heatmap x=KEY,y=KEY,metric=COL``: KEY are swept columns of ``summary.csv``, COL a metric column
(``ttft_s.p99``, ``output_throughput``...). When other swept columns or variants vary too, one panel is
drawn per combination of them. Written as ``heatmap_<metric>.png/.svg`` with the table as CSV.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.errors import ConfigError

#: Characters of a panel title's line (a 5.2-inch panel at 9 pt) before it wraps.
PANEL_TITLE_CHARS = 45


def wrap_at_commas(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters at its ``", "`` separators (a part longer
    than ``width`` keeps a line of its own)."""
    lines: list[str] = []
    for part in text.split(", "):
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        else:
            lines.append(part)
    return ",\n".join(lines)


NOT_SWEPT = ("replication", "seed", "point_id")
"""summary.csv's bookkeeping columns that no heatmap has as an axis (the variants are swept: ``variant`` is one)."""

BOOKKEEPING = ("variant", *NOT_SWEPT)
"""summary.csv's bookkeeping columns, which no heatmap colours by."""


def parse_heatmap(text: str) -> dict[str, str]:
    """Parse ``x=KEY,y=KEY,metric=COL`` into ``{"x", "y", "metric"}``.

    Raises:
        ConfigError: a missing or unknown part, x and y the same column, or a bookkeeping column as x or y
            (one line).
    """
    parts = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise ConfigError(f"--heatmap: expected x=KEY,y=KEY,metric=COL (got {text!r})")
        parts[key.strip()] = value.strip()
    if set(parts) != {"x", "y", "metric"}:
        raise ConfigError(f"--heatmap: expected exactly x=, y= and metric= (got {text!r})")
    if parts["x"] == parts["y"]:
        raise ConfigError(f"--heatmap: x and y are the same column {parts['x']!r} (expected two swept columns)")
    for role in ("x", "y"):
        if parts[role] in NOT_SWEPT:
            raise ConfigError(f"--heatmap: {role}={parts[role]!r} is a bookkeeping column of summary.csv, not a "
                              "swept one (expected a swept column or variant)")
    return parts


def heatmap_columns(summary: pd.DataFrame, x: str, y: str, metric: str) -> None:
    """Check that ``summary.csv`` has the heatmap's columns (``servesim plot`` calls it before drawing).

    Raises:
        ConfigError: a missing column (one line; for the metric, the metric columns there are), or a metric
            that is not a numeric column.
    """
    for role, col in (("x", x), ("y", y)):
        if col not in summary.columns:
            raise ConfigError(f"--heatmap: {role}={col!r} is not a column of summary.csv")
    if metric not in summary.columns:
        known = [c for c in summary.columns if c not in (*BOOKKEEPING, x, y)]
        raise ConfigError(f"--heatmap: metric={metric!r} is not a column of summary.csv "
                          f"(e.g. {', '.join(known[:6])})")
    if metric in BOOKKEEPING or not pd.api.types.is_numeric_dtype(summary[metric]):
        # a text column has no mean to colour a cell with, a replication or seed number none that means anything
        numeric = [c for c in summary.columns if pd.api.types.is_numeric_dtype(summary[c])
                   and c not in (*BOOKKEEPING, x, y)]
        raise ConfigError(f"--heatmap: metric={metric!r} is not a metric of summary.csv (expected a numeric "
                          f"column, e.g. {', '.join(numeric[:6])})")


def heatmap_table(summary: pd.DataFrame, x: str, y: str, metric: str, panel_cols: list[str]) -> pd.DataFrame:
    """Mean of ``metric`` over replications per (panel, x, y): columns ``panel``, panel columns, x, y,
    ``mean``, ``n``.

    Raises:
        ConfigError: a column is missing from ``summary.csv``.
    """
    heatmap_columns(summary, x, y, metric)
    rows = []
    for key, g in summary.groupby(panel_cols + [x, y], sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        vals = pd.to_numeric(g[metric], errors="coerce").to_numpy(dtype=float)
        vals = vals[np.isfinite(vals)]
        panel = dict(zip(panel_cols, key[:-2]))
        rows.append({"panel": ", ".join(f"{k}={v}" for k, v in panel.items()) or "all", **panel,
                     x: key[-2], y: key[-1], "mean": float(vals.mean()) if vals.size else np.nan,
                     "n": int(vals.size)})
    return pd.DataFrame(rows)


def _sorted_levels(values) -> list:
    levels = list(dict.fromkeys(values))
    try:
        return sorted(levels, key=float)
    except (TypeError, ValueError):
        return levels


def plot_heatmap(summary: pd.DataFrame, x: str, y: str, metric: str, panel_cols: list[str],
                 out_dir: Path, labels: dict[str, str] | None = None) -> tuple[Path, pd.DataFrame]:
    """Draw the heatmap(s) of ``metric`` over ``x`` and ``y``; cells annotated with their value.

    Returns:
        (PNG path, table written as CSV beside it).
    """
    from servesim.plots.curves import _write_csv, save_png_svg
    from servesim.plots.style import pyplot

    table = heatmap_table(summary, x, y, metric, panel_cols)
    panels = list(dict.fromkeys(table["panel"]))
    plt = pyplot()
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows), squeeze=False, layout="constrained")
    xs, ys = _sorted_levels(table[x]), _sorted_levels(table[y])
    finite = table["mean"].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    # what a cell holds: the metric, averaged where a point ran more than once; above the panels when
    # there are several (each panel's title names its panel)
    heading = metric + (" (mean over replications)" if (table["n"] > 1).any() else "")
    if len(panels) > 1:
        fig.suptitle(heading, fontsize=10)
    image = None
    for ax, panel in zip(axes.ravel(), panels):
        d = table[table["panel"] == panel]
        grid = np.full((len(ys), len(xs)), np.nan)
        for _, r in d.iterrows():
            grid[ys.index(r[y]), xs.index(r[x])] = r["mean"]
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        for i in range(len(ys)):
            for j in range(len(xs)):
                if np.isfinite(grid[i, j]):
                    light = grid[i, j] > vmin + 0.6 * (vmax - vmin)  # viridis is light at the top
                    ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if light else "white")
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
        ax.set_yticks(range(len(ys)), [str(v) for v in ys])
        ax.set_xlabel((labels or {}).get(x, x))
        ax.set_ylabel((labels or {}).get(y, y))
        # a long panel name wraps at its ", " separators to the panel's width (it ran into the next title)
        title = panel if len(panels) > 1 else heading
        ax.set_title(wrap_at_commas(title, PANEL_TITLE_CHARS), fontsize=9)
        ax.grid(False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    if image is not None:
        unit = " (s)" if metric.split(".")[0].endswith("_s") else ""
        fig.colorbar(image, ax=axes.ravel().tolist(), label=f"{metric}{unit}")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", metric)
    path = Path(out_dir) / f"heatmap_{safe}.png"
    save_png_svg(fig, path)
    _write_csv(table, path.with_suffix(".csv"))
    return path, table
