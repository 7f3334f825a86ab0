"""``servesim capacity CONFIG.yaml --slo ttft_p99=0.5 [--slo ...] --out DIR``: highest rate meeting the SLOs.

Options: ``--goodput-share S`` (also require mean SLO attainment >= S), ``--replicas TARGET_RATE`` (instead:
the fewest replicas serving TARGET_RATE requests/s), ``--replications N`` (default 3; trace replays
without speculation are deterministic, so 1 suffices for them), ``--tolerance T`` (relative, default
0.05), ``--max-rate R`` (requests/s), ``--max-replicas N``, ``--max-requests N`` (cap a trace replay, or a
synthetic workload's ``num_requests``), ``--set KEY=VALUE``. The rule and the search are those of
:mod:`servesim.analysis.capacity`.

Writes ``DIR/capacity.csv`` (every evaluated point: rate, replicas, rate_scale, the replication means
of each SLO statistic in s, SLO attainment, goodput, throughputs, pass/fail, and each replication's
statistics), ``DIR/slo_attainment.csv`` and ``DIR/slo_attainment.png`` (the SLO statistics and the SLO
attainment against the rate, or the replica count, with the targets dashed and the capacity marked), and
prints a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servesim.cli import COMMAND_OUTPUTS


#: Files ``servesim capacity`` writes into ``--out``.
CAPACITY_OUTPUTS = COMMAND_OUTPUTS["capacity"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``capacity`` options to ``parser``."""
    from servesim.analysis.capacity import DEFAULT_MAX_REPLICAS

    parser.add_argument("config", help="run config (YAML) with an open-loop workload (trace, poisson, gamma)")
    parser.add_argument("--slo", action="append", default=[], required=True, metavar="METRIC_STAT=SECONDS",
                        help="objective, e.g. ttft_p99=0.5 or tpot_p99=0.05 (repeatable; metrics ttft, tpot, itl, "
                             "e2e, queue; stats mean, p50, p90, p95, p99)")
    parser.add_argument("--goodput-share", type=float, default=None, metavar="S",
                        help="also require the mean SLO attainment (share of good requests) >= S (default: not required)")
    parser.add_argument("--replicas", type=float, default=None, metavar="TARGET_RATE",
                        help="find the fewest replicas that serve TARGET_RATE requests/s within the SLOs")
    parser.add_argument("--replications", type=int, default=3, metavar="N", help="runs per point (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="relative tolerance of the rate (default 0.05)")
    parser.add_argument("--max-rate", type=float, default=None, metavar="R", help="highest rate tried (requests/s; default: no limit, at most 20 doublings of the "
                        "config's rate)")
    parser.add_argument("--max-replicas", type=int, default=None, metavar="N",
                        help=f"most replicas tried, with --replicas (default {DEFAULT_MAX_REPLICAS})")
    parser.add_argument("--max-requests", type=int, default=None, metavar="N",
                        help="cap the requests of each run (trace max_requests, or num_requests)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value by dotted key (repeatable)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder (created)")
    parser.add_argument("--quiet", action="store_true", help="no per-point progress lines")


def run(args: argparse.Namespace) -> int:
    """Run the search; returns 0 with an answer, 1 when no point passed (no rate, or no replica count, meets
    the SLOs: printed as such, and the tables and figure are written), as ``tune-k`` does.

    Raises:
        ConfigError: invalid config, SLO or option (one line).
    """
    from servesim.analysis.capacity import PER_REQUEST, CapacitySearch, capacity_frame, parse_slos
    from servesim.atomic import prepare_output_dir, replacing_outputs
    from servesim.cli.run import parse_overrides, set_keys
    from servesim.config.models import load_config
    from servesim.errors import ConfigError, naming_set_keys
    from servesim.sweep.tables import write_csv

    slos = parse_slos(args.slo)
    if args.goodput_share is not None and not any(s.metric in PER_REQUEST for s in slos):
        # the attainment counts the requests that meet every per-request objective: with none, it is the
        # completed share, which every passing point reaches (all its requests complete): the option never binds
        raise ConfigError(f"--goodput-share: the SLO attainment is the share of requests meeting the per-request "
                          f"objectives ({', '.join(PER_REQUEST)}), and no --slo gives one: add one, or leave "
                          "--goodput-share out")
    if args.replicas is not None and args.max_rate is not None:
        raise ConfigError("--max-rate: bounds the rate search; --replicas searches replica counts at a given rate "
                          "(give one of them)")
    if args.replicas is None and args.max_replicas is not None:
        raise ConfigError("--max-replicas: bounds the replica search of --replicas TARGET_RATE (give --replicas, "
                          "or leave --max-replicas out)")
    overrides = parse_overrides(args.overrides, None)
    if args.replicas is not None:  # the search sets these at every point: a --set of one would be lost silently
        searched = ("deployment.replicas", "workload.rate", "workload.rate_scale")
        given = _set_of(set_keys(args.overrides), searched)
        if given:
            raise ConfigError(f"--replicas: searches deployment.replicas at the target rate (the workload's rate, "
                              f"or a trace's rate_scale), which --set gives too ({given[0]}): give one of them")
        _note_replaced(args.overrides, searched, "--replicas")
    if args.max_requests is not None:
        if args.max_requests < 1:
            raise ConfigError(f"--max-requests: expected >= 1 (got {args.max_requests})")
        cfg0, _ = load_config(args.config, overrides, set_keys=set_keys(args.overrides))
        if cfg0.workload.type not in ("trace", "poisson", "gamma"):  # refused by the search itself, first
            raise ConfigError(f"{args.config}: workload.type: capacity search needs an open-loop workload (trace, "
                              f"poisson or gamma), not {cfg0.workload.type}")
        key = "workload.max_requests" if cfg0.workload.type == "trace" else "workload.num_requests"
        replaced = [(key, args.max_requests)]
        if cfg0.workload.type in ("poisson", "gamma"):
            replaced.append(("workload.duration_s", None))
        # a --set of one of these keys would be replaced silently (the later value wins)
        given = _set_of(set_keys(args.overrides), [name for name, _ in replaced])
        if given:
            raise ConfigError(f"--max-requests: replaces {given[0]}, which --set gives too (give one of them)")
        _note_replaced(args.overrides, [name for name, _ in replaced], "--max-requests")
        overrides.extend(replaced)
    cfg, folder = load_config(args.config, overrides, set_keys=set_keys(args.overrides))
    out = prepare_output_dir(args.out)  # before the search: an unwritable --out fails at once

    from servesim.metrics.table import fraction_text

    def progress(ev) -> None:
        if not args.quiet:
            vals = ", ".join(f"{k} {v:.4g} s" for k, v in ev.values.items())
            print(f"  rate {ev.rate:8.4g} req/s  replicas {ev.replicas:3d}  {vals}  attainment "
                  f"{fraction_text(ev.slo_attainment)}  {'pass' if ev.passed else 'FAIL'}", flush=True)

    with replacing_outputs(out, CAPACITY_OUTPUTS):  # failed or interrupted, searching or writing: no outputs left
        # a setting --set gave that is refused when a run is set up names --set, as `servesim run` does
        with naming_set_keys(set_keys(args.overrides), cfg.source):
            search = CapacitySearch(cfg, folder, slos, replications=args.replications,
                                    goodput_share=args.goodput_share, progress=progress)
            if args.replicas is not None:
                result = (search.min_replicas(args.replicas) if args.max_replicas is None
                          else search.min_replicas(args.replicas, max_replicas=args.max_replicas))
            else:
                result = search.max_rate(tolerance=args.tolerance, max_rate=args.max_rate)
        frame = capacity_frame(result)
        write_csv(frame, out / "capacity.csv")
        table = plot_slo_attainment(frame, result, out / "slo_attainment.png")
        write_csv(table, out / "slo_attainment.csv")
    print(format_result(result, search))
    print(f"wrote {out / 'capacity.csv'}, {out / 'slo_attainment.csv'}, {out / 'slo_attainment.png'}")
    return 0 if result.capacity is not None else 1


def _set_of(keys: list[str], names) -> list[str]:
    """The names among ``names`` (dotted keys) that ``keys`` set, themselves or below them."""
    return [name for key in keys for name in names if key == name or key.startswith(name + ".")]


def _note_replaced(assignments: list[str], names, option: str) -> None:
    """A note on stderr naming the keys of ``names`` that a whole mapping ``--set`` (``workload={...}``) holds
    and ``option`` replaces: such a mapping may need them to be valid, so it runs, but not silently."""
    from servesim.cli.run import mapping_set_keys

    inside = _set_of(mapping_set_keys(assignments), names)
    if inside:
        print(f"servesim: note: {option} replaces {', '.join(dict.fromkeys(inside))} of the mapping --set gives",
              file=sys.stderr, flush=True)


def format_result(result, search) -> str:
    """A short text table of the evaluated points and the answer (attainment never reads 1.000 or 0.000 unless
    exact: :func:`~servesim.metrics.table.fraction_text`)."""
    from servesim.metrics.table import fraction_text

    names = [s.name for s in result.slos]
    head = f"{'rate req/s':>11} {'replicas':>8} " + " ".join(f"{n + ' s':>12}" for n in names) + f" {'attain':>7} pass"
    lines = [head]
    for ev in sorted(result.evaluations, key=lambda e: (e.replicas, e.rate)):
        vals = " ".join(f"{ev.values[n]:12.4g}" for n in names)
        lines.append(f"{ev.rate:11.4g} {ev.replicas:8d} {vals} {fraction_text(ev.slo_attainment):>7} "
                     f"{'yes' if ev.passed else 'no'}")
    targets = ", ".join(f"{s.name} <= {s.target_s:g} s" for s in result.slos)
    share = f", attainment >= {result.goodput_share:g}" if result.goodput_share is not None else ""
    if result.mode == "rate":
        why = f"; the search stopped {result.stopped}" if result.stopped else ""
        if result.capacity is None:
            answer = f"meets the SLOs at no rate down to {result.lowest_rate:.4g} requests/s{why}"
        elif result.capped:
            answer = (f"meets the SLOs at every rate up to {result.capacity:.4g} requests/s (the highest rate "
                      f"tried{why}; raise --max-rate to look further)")
        else:
            answer = f"capacity: {result.capacity:.4g} requests/s"
            if search.axis.kind == "trace":
                answer += f" (rate_scale {result.capacity / search.axis.trace_rate:.4g} x trace mean " \
                          f"{search.axis.trace_rate:.4g} req/s)"
            answer += f" (within {100 * result.tolerance:g}%)"
    else:
        rate = result.evaluations[0].rate if result.evaluations else float("nan")
        most = max((ev.replicas for ev in result.evaluations), default=0)
        if result.capacity is not None:
            answer = f"fewest replicas for {rate:.4g} requests/s: {result.capacity}"
        elif result.stopped:
            answer = f"no replica count up to {most} serves {rate:.4g} requests/s; the search stopped {result.stopped}"
        else:
            answer = (f"no replica count up to {most} (the most tried; raise --max-replicas to look further) serves "
                      f"{rate:.4g} requests/s")
    lines.append(f"SLOs: {targets}{share}; {result.replications} replication(s) per point")
    lines.append(answer)
    burst = _burst_note(result)
    if burst:
        lines.append(burst)
    return "\n".join(lines)


#: A passing rate served at less than this share of itself is a burst drained after its arrivals, not a load
BURST_THROUGHPUT_SHARE = 0.5


def _burst_note(result) -> str | None:
    """A warning when the answer (a rate, or a replica count) rests on a run whose requests all arrive
    before the first ones finish.

    Served over ``duration = last finish - first arrival``, N requests at rate R with a drain D after the
    last arrival give ``N / (N / R + D)`` requests/s: below half of R when D exceeds the arrival window
    N / R, i.e. when the run measures how one burst of N requests drains, which passes at any rate."""
    if result.capacity is None:
        return None
    if result.mode == "rate":
        at = next((ev for ev in result.evaluations if ev.passed and ev.rate == result.capacity), None)
    else:  # the fewest replicas passing the target rate
        at = next((ev for ev in result.evaluations if ev.passed and ev.replicas == result.capacity), None)
    if at is None or at.request_throughput >= BURST_THROUGHPUT_SHARE * at.rate:
        return None
    return (f"note: at {at.rate:.4g} requests/s the run's {at.num_requests} requests arrive in "
            f"{at.num_requests / at.rate:.3g} s and are served at {at.request_throughput:.4g} requests/s: a burst "
            "drained after its arrivals, not a sustained load; give the workload more requests "
            "(workload.num_requests, a longer trace, or a larger --max-requests) before reading this as a capacity")


def plot_slo_attainment(frame, result, path: Path):
    """Draw ``slo_attainment.png`` (and return its data table, sorted by the x axis).

    Left: each SLO statistic (mean over replications, ms) against the rate (requests/s) or the replica
    count, its target dashed; right: mean SLO attainment (share of requests). The capacity is a vertical
    line; failing points are hollow markers.
    """
    from servesim.plots.curves import save_png_svg
    from servesim.plots.style import plain_log_ticks, pyplot

    x = "rate" if result.mode == "rate" else "replicas"
    cols = ["rate", "replicas", "rate_scale"] + [f"{s.name}_s" for s in result.slos] + ["slo_attainment", "passed"]
    table = frame[cols].sort_values([x, "rate"], kind="stable").drop_duplicates([x]).reset_index(drop=True)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xlabel = "arrival rate (requests/s)" if x == "rate" else "replicas"
    xs = table[x].to_numpy(dtype=float)
    passed = table["passed"].to_numpy(dtype=bool)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(result.slos):
        c = colors[i % len(colors)]
        ys = table[f"{s.name}_s"].to_numpy(dtype=float) * 1e3
        ax1.plot(xs, ys, "-", color=c, label=f"{s.name} (mean of replications)")
        ax1.plot(xs[passed], ys[passed], "o", color=c)
        ax1.plot(xs[~passed], ys[~passed], "o", mfc="none", color=c)
        ax1.axhline(s.target_s * 1e3, color=c, linestyle="--", linewidth=1, label=f"{s.name} target {s.target_s:g} s")
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    plain_log_ticks(ax1.yaxis)
    ax1.set_title("SLO statistics (filled: point passes)")
    ax2.plot(xs, table["slo_attainment"].to_numpy(dtype=float), "o-", color="tab:blue")
    if result.goodput_share is not None:
        ax2.axhline(result.goodput_share, color="tab:red", linestyle="--", linewidth=1,
                    label=f"required share {result.goodput_share:g}")
    ax2.set_xlabel(xlabel)
    ax2.set_ylabel("SLO attainment (share of requests)")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_title("SLO attainment")
    if result.capacity is not None:
        label = (f"capacity {result.capacity:.3g} req/s" if x == "rate" else f"fewest replicas: {result.capacity}")
        for ax in (ax1, ax2):
            ax.axvline(float(result.capacity), color="black", linestyle=":", linewidth=1.2, label=label)
    for ax in (ax1, ax2):  # below the panels: never over a curve
        if ax.get_legend_handles_labels()[0]:  # nothing to name when no share is required and nothing passed
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    save_png_svg(fig, path, svg=False)
    return table
