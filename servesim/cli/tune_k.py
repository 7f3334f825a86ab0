"""``servesim tune-k CONFIG.yaml --out DIR``: derive vLLM's ``num_speculative_tokens_per_batch_size``.

Options: ``--k-max K`` (largest k tried, tokens; default the config's ``num_speculative_tokens``),
``--batch-sizes 1,2,4,...`` (requests; default powers of two up to ``engine.max_num_seqs`` or 256),
``--slo METRIC_STAT=SECONDS`` (repeatable; the best k then maximises goodput), ``--replications N``
(default 1), ``--requests-per-client N`` (default 8), ``--boundary midpoint|next``, ``--jobs N`` (worker
processes), ``--set KEY=VALUE``. The method is that of :mod:`servesim.analysis.tune_k`.

Prints the best k per batch size and the ``--speculative-config`` JSON to paste into vLLM, and writes
``DIR/tune_k.json`` (that JSON and the tuning's summary), ``DIR/tune_k_grid.csv`` (every batch size x k:
replication means), ``DIR/tune_k_check.csv`` (tuned vs best fixed k vs no speculation per batch size) and
``DIR/tune_k.png`` with its data ``DIR/tune_k.csv`` (output throughput against batch size, three lines, and
the ratio to no speculation). Exit status 1 when no k meets the ``--slo`` targets at some batch size (said
in the last line; the files are written all the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from servesim.cli import COMMAND_OUTPUTS


#: Files ``servesim tune-k`` writes into ``--out``.
TUNE_K_OUTPUTS = COMMAND_OUTPUTS["tune-k"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tune-k`` options to ``parser``."""
    parser.add_argument("config", help="run config (YAML) with a speculative_config (method, acceptance)")
    parser.add_argument("--k-max", type=int, default=None, metavar="K",
                        help="largest k tried (default: the config's num_speculative_tokens)")
    parser.add_argument("--batch-sizes", default=None, metavar="B1,B2,...",
                        help="batch sizes (closed-loop clients) to tune at (default: powers of two up to "
                             "engine.max_num_seqs, or 256)")
    parser.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                        help="objective, e.g. tpot_p99=0.05 (repeatable): the best k maximises goodput, the "
                             "output throughput of points meeting every SLO")
    parser.add_argument("--replications", type=int, default=1, metavar="N", help="runs per point (default 1)")
    parser.add_argument("--requests-per-client", type=int, default=8, metavar="N",
                        help="closed-loop requests per client (default 8)")
    parser.add_argument("--boundary", choices=("midpoint", "next"), default="midpoint",
                        help="where a grid point's range starts: midpoint to the previous point (default) or "
                             "at the point itself")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value by dotted key (repeatable)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder (created)")
    parser.add_argument("--quiet", action="store_true", help="no per-run progress lines")


def parse_batch_sizes(text: str | None) -> list[int] | None:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (None stays None).

    Raises:
        ConfigError: an item that is not a positive integer.
    """
    from servesim.errors import ConfigError

    if text is None:
        return None
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise ConfigError(f"--batch-sizes: expected comma-separated positive integers (got {text!r})")
        out.append(int(item))
    return out


#: The workload keys tune-k's closed loops keep (:func:`servesim.analysis.tune_k.closed_loop_config`): the
#: length distributions, or the trace whose (prompt, output) pairs they resample.
WORKLOAD_KEYS_USED = ("type", "prompt_tokens", "output_tokens", "lengths", "path", "format")


def _ignored(key: str) -> bool:
    parts = key.split(".")
    return parts[0] == "workload" and len(parts) > 1 and parts[1] not in WORKLOAD_KEYS_USED


def refuse_ignored_workload_keys(assignments: list[str]) -> None:
    """Refuse a ``--set workload.KEY`` that tune-k's closed loops would ignore (its rate, request count,
    arrival process...), which had run silently as if it were applied; a whole ``--set workload={...}``
    (which must hold such keys to be a valid workload) runs, with a note on stderr naming those it ignores.

    Raises:
        ConfigError: one line naming the key and what tune-k uses instead.
    """
    from servesim.cli.run import mapping_set_keys, set_keys
    from servesim.errors import ConfigError

    for key in set_keys(assignments):
        if _ignored(key):
            raise ConfigError(
                f"--set {key}: tune-k replaces the workload with closed loops (--batch-sizes clients, "
                "--requests-per-client requests each) and keeps only its "
                + ", ".join(WORKLOAD_KEYS_USED[1:]) + " (a trace's pairs): this key would have no effect")
    inside = [key for key in mapping_set_keys(assignments) if _ignored(key)]
    if inside:
        print(f"servesim: note: --set workload: tune-k replaces the workload with closed loops and ignores its "
              f"{', '.join(key.split('.', 1)[1] for key in inside)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Tune, print and write the outputs; returns 0, or 1 when no k meets the SLOs at some batch size (the
    outputs are written all the same).

    Raises:
        ConfigError: invalid config or option (one line).
    """
    from servesim.analysis.capacity import parse_slos
    from servesim.analysis.tune_k import tune_k
    from servesim.atomic import prepare_output_dir, replacing_outputs
    from servesim.cli.run import parse_overrides, set_keys
    from servesim.config.models import load_config
    from servesim.errors import naming_set_keys
    from servesim.sweep.executors import open_executor
    from servesim.sweep.store import atomic_write_text
    from servesim.sweep.tables import write_csv

    slos = parse_slos(args.slo)
    sizes = parse_batch_sizes(args.batch_sizes)
    refuse_ignored_workload_keys(args.overrides)
    cfg, folder = load_config(args.config, parse_overrides(args.overrides, None), set_keys=set_keys(args.overrides))
    out = prepare_output_dir(args.out)  # before the simulations: an unwritable --out fails at once

    def progress(row: dict) -> None:
        if not args.quiet:
            print(f"  batch {row['batch_size']:5d}  {row['variant']:>6}  rep {row['replication']}  "
                  f"{row['output_throughput']:10.1f} output tok/s", flush=True)

    with replacing_outputs(out, TUNE_K_OUTPUTS):  # failed or interrupted, simulating or writing: no outputs left
        # a setting --set gave that is refused when a run is set up names --set, as `servesim run` does
        with naming_set_keys(set_keys(args.overrides), cfg.source), open_executor(None, args.jobs) as executor:
            result = tune_k(cfg, folder, k_max=args.k_max, batch_sizes=sizes, slos=slos,
                            replications=args.replications, requests_per_client=args.requests_per_client,
                            boundary=args.boundary, executor=executor, progress=progress)
        atomic_write_text(out / "tune_k.json", json.dumps(result.to_json(), indent=2) + "\n")
        write_csv(result.grid, out / "tune_k_grid.csv")
        write_csv(result.check, out / "tune_k_check.csv")
        plot_check(result.check, out / "tune_k.png")
    print(format_result(result))
    print(f"wrote {out / 'tune_k.json'}, {out / 'tune_k_grid.csv'}, {out / 'tune_k_check.csv'}, "
          f"{out / 'tune_k.png'}, {out / 'tune_k.csv'}")
    if result.slo_unmet:  # the table is then no answer to the question asked: say so last, and exit 1
        slos = ", ".join(f"{s.name}={s.target_s:g}" for s in result.slos)
        print(f"servesim: no k meets the SLOs ({slos}) at batch size(s) {', '.join(map(str, result.slo_unmet))}: "
              "the table's k there is only the one closest to meeting them (smallest statistic / target)",
              file=sys.stderr)
        return 1
    return 0


def format_result(result) -> str:
    """Text: best k per batch size, the check table, and the ``--speculative-config`` JSON."""
    obj = "goodput" if result.slos else "output throughput"
    lines = [f"best k per batch size (maximising {obj}; {result.replications} replication(s), "
             f"{result.requests_per_client} requests per client):"]
    lines.append(f"{'batch':>6} {'best k':>6} {'none tok/s':>11} {f'k={result.best_fixed_k} tok/s':>11} "
                 f"{'tuned tok/s':>11} {'tuned/fixed':>11} {'tuned/none':>10}")
    unmet = set(result.slo_unmet)
    for _, r in result.check.iterrows():
        batch = int(r["batch_size"])
        lines.append(f"{batch:6d} {result.best_k[batch]:6d} "
                     f"{r['none_output_throughput']:11.1f} {r['fixed_output_throughput']:11.1f} "
                     f"{r['tuned_output_throughput']:11.1f} {r['tuned_vs_fixed']:11.3f} {r['tuned_vs_none']:10.3f}"
                     + ("  no k meets the SLOs" if batch in unmet else ""))
    lines.append(f"best fixed k: {result.best_fixed_k}; table boundaries: {result.boundary}")
    if result.vllm_config is None:
        lines.append("speculation does not pay at any batch size tried: run vLLM without --speculative-config")
    else:
        lines.append("vLLM --speculative-config:")
        lines.append(json.dumps(result.vllm_config, separators=(", ", ": ")))
    return "\n".join(lines)


def plot_check(check, path: Path):
    """Draw ``tune_k.png`` and write its data ``tune_k.csv`` (tidy: batch_size, line, output_throughput,
    output_throughput_ci, ratio_to_none). Left: output throughput (tokens/s) against batch size (requests)
    for no speculation, the best fixed k and the tuned schedule; right: each divided by no speculation."""
    import numpy as np
    import pandas as pd
    from matplotlib.ticker import NullLocator

    from servesim.plots.curves import save_png_svg
    from servesim.plots.style import plain_log_ticks, pyplot
    from servesim.sweep.tables import write_csv

    k = int(check["best_fixed_k"].iloc[0])
    lines = (("none", "no speculation", "tab:gray", "s--"), ("fixed", f"best fixed k = {k}", "tab:blue", "o-"),
             ("tuned", "tuned per batch size", "tab:red", "^-"))
    rows = []
    xs = check["batch_size"].to_numpy(dtype=float)
    none = check["none_output_throughput"].to_numpy(dtype=float)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, color, style in lines:
        ys = check[f"{key}_output_throughput"].to_numpy(dtype=float)
        ci = check[f"{key}_output_throughput_ci"].to_numpy(dtype=float)
        ax1.plot(xs, ys, style, color=color, label=label, ms=4)
        if np.isfinite(ci).any():
            ax1.fill_between(xs, ys - np.nan_to_num(ci), ys + np.nan_to_num(ci), color=color, alpha=0.15, linewidth=0)
        ax2.plot(xs, ys / none, style, color=color, label=label, ms=4)
        for x, y, c, y0 in zip(xs, ys, ci, none):
            rows.append({"batch_size": int(x), "line": label, "output_throughput": y, "output_throughput_ci": c,
                         "ratio_to_none": y / y0})
    tuned_ratio = check["tuned_output_throughput"].to_numpy(dtype=float) / none
    for x, y, kk in zip(xs, tuned_ratio, check["tuned_k"]):
        ax2.annotate(f"k={int(kk)}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center",
                     fontsize=7, color="tab:red")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(int(x)) for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("batch size (closed-loop clients, requests)")
        ax.legend(fontsize=7)
    ax1.set_yscale("log")
    plain_log_ticks(ax1.yaxis)
    ax1.set_ylabel("output throughput (tokens/s)")
    ax1.set_title("Output throughput (bands: 95% CI over replications)")
    ax2.set_ylabel("output throughput / no speculation")
    ax2.set_title("Speedup over no speculation (tuned k marked)")
    fig.tight_layout()
    save_png_svg(fig, Path(path), svg=False)
    table = pd.DataFrame(rows)
    write_csv(table, Path(path).with_suffix(".csv"))
    return table
