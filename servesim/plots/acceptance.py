"""Per-position acceptance bars: vLLM's unconditional per-position acceptance rate of each variant."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

PREFIX = "spec_decode.per_position_acceptance_rate."


def acceptance_table(summary: pd.DataFrame, group_cols: list[str]) -> pd.DataFrame:
    """Mean per-position acceptance rate per group, over the group's points and replications.

    Args:
        summary: the sweep's summary.csv as a DataFrame.
        group_cols: columns whose combinations get one set of bars (e.g. ``["variant"]``).

    Returns:
        Columns: ``group``, the group columns, ``position`` (1 = first draft), ``acceptance_rate``
        (unconditional, as vLLM logs it), ``runs`` (rows averaged). Empty without speculative runs.
    """
    cols = sorted((c for c in summary.columns if c.startswith(PREFIX)), key=lambda c: int(c[len(PREFIX):]))
    if not cols:
        return pd.DataFrame(columns=["group", *group_cols, "position", "acceptance_rate", "runs"])
    rows = []
    grouped = summary.groupby(group_cols, sort=False, dropna=False) if group_cols else [((), summary)]
    for key, g in grouped:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{c}={v}" for c, v in zip(group_cols, key)) or "all"
        for col in cols:
            values = pd.to_numeric(g[col], errors="coerce").dropna()
            if len(values):
                rows.append({"group": label, **dict(zip(group_cols, key)), "position": int(col[len(PREFIX):]),
                             "acceptance_rate": float(values.mean()), "runs": int(len(values))})
    return pd.DataFrame(rows)


def plot_acceptance(table: pd.DataFrame, out_png: Path) -> None:
    """``acceptance.png/.svg`` (grouped bars, one colour per group) and ``acceptance.csv``."""
    from servesim.plots.curves import save_png_svg
    from servesim.plots.style import pyplot
    from servesim.sweep.tables import write_csv

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    groups = list(dict.fromkeys(table["group"]))
    width = 0.8 / max(len(groups), 1)
    for i, group in enumerate(groups):
        g = table[table["group"] == group]
        x = g["position"].to_numpy() + (i - (len(groups) - 1) / 2) * width
        label = re.sub(r"(^|, )(variant|speculative_config\.)=?", r"\1", group)  # the legend's short names
        ax.bar(x, g["acceptance_rate"], width=width, label=label)
    positions = np.sort(table["position"].unique())
    ax.set_xticks(positions)
    ax.set_xlabel("draft position")
    ax.set_ylabel("per-position acceptance rate (unconditional)")
    ax.set_ylim(0, 1)
    ax.set_title("Speculative decoding: acceptance by draft position")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out_png = Path(out_png)
    save_png_svg(fig, out_png)
    write_csv(table, out_png.with_suffix(".csv"))
