"""``servesim plot DIR``: figures of a sweep directory (``summary.csv``, ``sweep.json``, ``speedup.csv``).

Writes into DIR (or ``--out``), each figure as PNG and SVG with its data as CSV:

* ``latency_vs_throughput``: p50/p99 TTFT and TPOT against ``--x`` (``output_throughput`` by default,
  or ``request_throughput``, ``total_token_throughput``, or a swept column), one curve per combination of
  the other swept columns and variant, the points of a curve taken along ``--along`` (default: the first
  swept column), 95% bands over replications; ``--slo ttft_p99=0.5`` draws dashed targets.
* ``speedup`` (only with ``speedup.csv``): each variant's output throughput over the baseline's against
  ``--along``, crossover marked ("speculation hurts above ..." for a speculative-decoding comparison).
* ``heatmap_<metric>`` for each ``--heatmap x=KEY,y=KEY,metric=COL``.
* ``acceptance``: per-position acceptance bars (vLLM's unconditional rates) of each variant, when the
  sweep ran speculative decoding.

The figures an earlier plot left in the folder and this one does not draw (a speedup, acceptance or
heatmap figure) are removed, so that every figure there is this plot's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


#: Relative difference of output throughputs below which ``plot`` says the speedup figure shows no
#: difference of the variants' throughput (what open-loop arrivals below saturation give).
SAME_THROUGHPUT = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``plot`` options to ``parser``."""
    parser.add_argument("dir", type=Path, metavar="DIR", help="sweep output folder (summary.csv, sweep.json)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the figures (default: DIR)")
    parser.add_argument("--x", default="output_throughput",
                        help="x axis: output_throughput (default), request_throughput, total_token_throughput, "
                             "or a swept column")
    parser.add_argument("--along", default=None, help="swept column along each curve (default: the first one)")
    parser.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                        help="dashed SLO line, e.g. ttft_p99=0.5 (repeatable)")
    parser.add_argument("--heatmap", action="append", default=[], metavar="x=KEY,y=KEY,metric=COL",
                        help="heatmap of a metric over two swept columns (repeatable)")


@dataclass
class SweepTables:
    """What ``servesim plot`` reads of a sweep folder.

    Attributes:
        summary: ``summary.csv``, one row per run.
        columns: swept key -> its column name (``sweep.json``'s ``columns``).
        units: column -> unit of its values (``sweep.json``'s ``units``; None from a manifest without it).
        baseline: the variant compared with (``sweep.json``'s ``baseline``), or None.
        speedup: ``speedup.csv``, or None without one.
        workload_types: the points' workload types (``sweep.json``'s ``workload_types``: ``"None"`` for
            one that could not be told); None from a manifest without them.
    """

    summary: Any
    columns: dict[str, str]
    units: dict[str, str] | None
    baseline: str | None
    speedup: Any
    workload_types: list[str] | None = None


#: Workload types whose requests arrive at a set rate (open loop): below saturation the throughput is the
#: offered load whatever the variant. A closed loop's clients send again after each response.
OPEN_LOOP_WORKLOADS = frozenset({"trace", "poisson", "gamma", "multi_turn"})


def same_throughput_note(workload_types: list[str] | None) -> str:
    """The note ``servesim plot`` prints when every variant's output throughput agrees within
    :data:`SAME_THROUGHPUT`: why, where the sweep's workloads are all open loop (``workload_types``,
    sweep.json's), and in every case that the latencies are what to compare."""
    note = f"note: the output throughputs agree within {SAME_THROUGHPUT:.0%} everywhere"
    if workload_types and set(workload_types) <= OPEN_LOOP_WORKLOADS:
        note += (": with open-loop arrivals (a rate, a trace) below saturation the throughput is the offered "
                 "load whatever the variant")
    return note + "; compare their latencies (latency_vs_throughput.png: TTFT, TPOT)"


def read_sweep_dir(folder: Path) -> SweepTables:
    """The tables and manifest of a sweep folder.

    Raises:
        ConfigError: ``summary.csv`` or ``sweep.json`` missing or unreadable (one line naming the file; an
            interrupted sweep, with its ``sweep.json`` and no ``summary.csv``, with the command that resumes it).
    """
    import pandas as pd

    from servesim.errors import ConfigError

    summary_path, meta_path = folder / "summary.csv", folder / "sweep.json"
    if not folder.is_dir():  # was "DIR/summary.csv: cannot read ... (FileNotFoundError)" of a path that cannot be
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"{folder}: {what} (expected the output folder of `servesim sweep`)")
    if not summary_path.exists():
        from servesim.cli import COMMAND_OUTPUTS

        for command, outputs in COMMAND_OUTPUTS.items():  # another command's folder: say whose
            found = [name for name in outputs if (folder / name).is_file()]
            if command != "sweep" and found:
                raise ConfigError(f"{folder}: holds the results of `servesim {command}` ({', '.join(found)}), not "
                                  f"of a sweep: plot draws a `servesim sweep` folder (`servesim {command}` draws "
                                  "its own figures)")
        if meta_path.is_file():  # the sweep's manifest is written first, its summary last
            import shlex

            try:
                source = str(json.loads(meta_path.read_text(encoding="utf-8"))["source"])
            except (OSError, ValueError, KeyError, TypeError):
                source = "SWEEP.yaml"
            source = source if source.endswith((".yaml", ".yml")) else "SWEEP.yaml"  # "sweep": one made in Python
            raise ConfigError(f"{folder}: the sweep did not finish (no summary.csv): rerun `servesim sweep "
                              f"{shlex.quote(source)} --out {shlex.quote(str(folder))}` to resume")
        raise ConfigError(f"{folder}: no summary.csv (expected the output folder of `servesim sweep`; run one "
                          "first)")
    try:
        summary = pd.read_csv(summary_path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{summary_path}: cannot read the sweep summary ({exc.__class__.__name__}); "
                          "run `servesim sweep` first") from None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        columns = dict(meta["columns"])
        units = None if meta.get("units") is None else dict(meta["units"])
        baseline = None if meta.get("baseline") is None else str(meta["baseline"])
        workload_types = None if meta.get("workload_types") is None else [str(t) for t in meta["workload_types"]]
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        raise ConfigError(f"{meta_path}: cannot read the sweep manifest (expected JSON with 'columns')") from None
    speedup = None
    if (folder / "speedup.csv").exists():
        try:
            speedup = pd.read_csv(folder / "speedup.csv")
        except (OSError, ValueError):
            raise ConfigError(f"{folder / 'speedup.csv'}: cannot read the speedup table") from None
    return SweepTables(summary, columns, units, baseline, speedup, workload_types)


def run(args: argparse.Namespace) -> int:
    """Draw the figures; returns 0.

    Raises:
        ConfigError: unreadable sweep folder, a bad ``--x``/``--along``/``--slo``/``--heatmap``.
    """
    from servesim.analysis.capacity import parse_slos
    from servesim.errors import ConfigError
    from servesim.plots.curves import (THROUGHPUT_AXES, axis_labels, plot_latency_curves, plot_speedup,
                                       speedup_verdict, where_below_one)
    from servesim.atomic import prepare_output_dir, remove_stale
    from servesim.plots.heatmap import heatmap_columns, parse_heatmap, plot_heatmap

    from servesim.sweep.tables import is_speculative_comparison

    tables = read_sweep_dir(args.dir)
    summary, speedup = tables.summary, tables.speedup
    columns = list(tables.columns.values())
    labels = axis_labels(tables.columns, tables.units)
    out = args.out or args.dir
    slos = {s.name: s.target_s for s in parse_slos(args.slo)}
    heatmaps = [parse_heatmap(h) for h in args.heatmap]
    if not columns:
        raise ConfigError(f"{args.dir / 'sweep.json'}: the sweep has no swept columns to plot against")
    along = args.along or (args.x if args.x in columns else columns[0])
    if along not in columns:
        raise ConfigError(f"--along: {along!r} is not a swept column (swept: {', '.join(columns)})")
    if args.x not in THROUGHPUT_AXES and args.x not in columns:
        raise ConfigError(f"--x: expected one of {', '.join(THROUGHPUT_AXES)} or a swept column (got {args.x!r})")
    if summary.empty:
        raise ConfigError(f"{args.dir / 'summary.csv'}: no finished runs to plot")
    if args.x in columns and not _numeric(summary, args.x):
        numeric = [c for c in columns if _numeric(summary, c)]
        raise ConfigError(f"--x: the swept column {args.x!r} holds text ({_first_text(summary, args.x)!r}, ...), "
                          "and the x axis needs numbers: give a throughput (" + ", ".join(THROUGHPUT_AXES)
                          + ") or a numeric swept column" + (f" ({', '.join(numeric)})" if numeric else ""))
    for h in heatmaps:  # every check before the first figure is written
        heatmap_columns(summary, h["x"], h["y"], h["metric"])
    if args.out is not None and Path(args.out).resolve() != Path(args.dir).resolve():
        from servesim.cli import check_no_other_results

        points = (Path(args.dir) / "points").resolve()
        if Path(args.out).resolve().is_relative_to(points):
            raise ConfigError(f"--out: {args.out} is inside the sweep's stored runs ({Path(args.dir) / 'points'}); "
                              "give another folder, or leave --out out to draw into the sweep's folder")
        check_no_other_results("plot", args.out)  # a run's or another sweep's folder: its files would mix
    out = prepare_output_dir(out)
    # one curve per combination of the other swept columns (single-valued ones say nothing: skip them)
    group_cols = [c for c in columns if c != along and summary[c].nunique(dropna=False) > 1]
    if summary["variant"].nunique() > 1:
        group_cols.append("variant")
    from servesim.sweep.runner import PLOT_FIGURE_FILES, plot_figures

    try:
        written = []
        path = out / "latency_vs_throughput.png"
        plot_latency_curves(summary, along, args.x, group_cols, path, slos, labels)
        written.append(path)
        if speedup is not None and not speedup.empty:
            # the speedup's x axis: --along, else the first swept column of speedup.csv, if it holds numbers
            candidates = [along] + [c for c in columns if c != along]
            sp_along = next((c for c in candidates if c in speedup.columns and _numeric(speedup, c)), None)
            if sp_along is None:
                print("no speedup figure: no swept column of speedup.csv holds numbers to draw it against")
            if sp_along is not None:
                path = Path(out) / "speedup.png"
                # plain_/spec_ columns: the sweep found a speculative comparison when it wrote the table
                speculative = ("spec_output_throughput" in speedup.columns
                               or is_speculative_comparison(summary, tables.baseline))
                baseline = tables.baseline or "baseline"
                table = plot_speedup(speedup, sp_along, path, labels.get(sp_along), speculative=speculative,
                                     baseline=baseline)
                written.append(path)
                for group, g in table.groupby("group", sort=False):
                    where, _ = where_below_one(g[sp_along], g["speedup"], sp_along, digits=4)
                    print(f"{group}: {speedup_verdict(where, speculative, baseline)}")
                ratios = table["speedup"].dropna()
                if len(ratios) and (ratios - 1).abs().max() < SAME_THROUGHPUT:
                    print(same_throughput_note(tables.workload_types))
        from servesim.plots.acceptance import acceptance_table, plot_acceptance

        # one set of bars per variant and per value of each swept speculative setting (profile, k, method):
        # the other swept columns (load, limits) leave the rates of a profile as they are, and are averaged
        accept_cols = [column for key, column in tables.columns.items()
                       if key.startswith("speculative_config") and summary[column].nunique(dropna=False) > 1]
        if summary["variant"].nunique() > 1:
            accept_cols.append("variant")
        accept = acceptance_table(summary, accept_cols)
        if not accept.empty:
            path = Path(out) / "acceptance.png"
            plot_acceptance(accept, path)
            written.append(path)
        for h in heatmaps:
            panel_cols = [c for c in columns if c not in (h["x"], h["y"])]
            if summary["variant"].nunique() > 1:
                panel_cols.append("variant")
            path, _ = plot_heatmap(summary, h["x"], h["y"], h["metric"], panel_cols, Path(out), labels)
            written.append(path)
        # figures an earlier plot of this folder drew and this one does not (the sweep changed, another sweep
        # drew them, other --heatmap): remove them
        remove_stale(out, [name for stem in ("speedup", "acceptance") if out / f"{stem}.png" not in written
                           for name in PLOT_FIGURE_FILES[stem]]
                     + [name for name in plot_figures(out) if name.startswith("heatmap_")
                        and out / f"{Path(name).stem}.png" not in written])
    except BaseException:
        # a failure or Ctrl-C while drawing (a full disk, a closed stdout): no figure of this folder is left,
        # neither this plot's first ones nor an earlier plot's, which would mix with them
        remove_stale(out, plot_figures(out))
        raise
    for p in written:  # the speedup curve's data is speedup_curve.csv: speedup.csv is the sweep's table
        print(f"wrote {p} (+ .svg, {'speedup_curve.csv' if p.name == 'speedup.png' else '.csv'})")
    return 0


def _numeric(frame, column: str) -> bool:
    """Whether every value given in ``frame[column]`` reads as a number (a figure's axis can show it)."""
    import pandas as pd

    values = frame[column].dropna()
    return bool(len(values)) and bool(pd.to_numeric(values, errors="coerce").notna().all())


def _first_text(frame, column: str) -> str:
    import pandas as pd

    values = frame[column].dropna()
    return str(values[pd.to_numeric(values, errors="coerce").isna()].iloc[0])
