"""``servesim sweep SWEEP.yaml --out DIR [--jobs N] [--executor local|dask|dask://HOST:PORT] [--no-progress]``.

Runs a sweep resumably (rerun the same command after an interruption to finish it) and writes
``DIR/summary.csv`` (and ``DIR/speedup.csv`` with a ``baseline``). Exit status 1 when any run failed
(listed in ``DIR/failures.csv``). It prints the number of runs first, and refuses more than
:data:`MAX_RUNS_WITHOUT_YES` of them without ``--yes``; at the end it says how many stored runs it
reused (same resolved inputs) and what changed for those it ran again (or that they were unreadable).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Runs (points x replications) a sweep may have without ``--yes``.
MAX_RUNS_WITHOUT_YES = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sweep`` command's arguments to ``parser``."""
    parser.add_argument("sweep", metavar="SWEEP.yaml", help="sweep file (base config, grid, zip, variants)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (reused to resume)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1: serial)")
    parser.add_argument(
        "--executor",
        default="local",
        metavar="local|dask|dask://HOST:PORT",
        help="local process pool (default), a local Dask cluster, or an existing Dask scheduler",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--yes", action="store_true",
                        help=f"run a sweep of more than {MAX_RUNS_WITHOUT_YES:,} runs (points x replications)")


def run(args: argparse.Namespace) -> int:
    """Run the sweep described by ``args``; return 0, or 1 when any run failed.

    Raises:
        ConfigError: invalid sweep file, ``--jobs`` or ``--executor`` (printed as one line by the CLI).
    """
    from servesim.atomic import prepare_output_dir
    from servesim.sweep.executors import check_executor
    from servesim.sweep.runner import check_same_sweep, count_runs, run_sweep
    from servesim.sweep.spec import load_sweep

    loaded = load_sweep(args.sweep)
    # a bad --executor or --jobs, or a folder of another sweep, before the sweep's size is printed
    check_executor(args.executor, args.jobs)
    if Path(args.out).is_dir():
        check_same_sweep(Path(args.out), loaded)
    elif Path(args.out).exists():  # a file: refused before the sweep's size is printed, as a folder of another sweep
        prepare_output_dir(args.out)
    points, runs = count_runs(loaded)
    print(f"sweep: {points:,} point(s) x {loaded.config.replications} replication(s) = {runs:,} run(s)", flush=True)
    for line in loaded.config.replaced_variant_leaves():  # the rest of those variants applies
        print(f"note: {line}", flush=True)
    result = run_sweep(
        loaded,
        args.out,
        jobs=args.jobs,
        executor=args.executor,
        progress=False if args.no_progress else None,
        max_runs=None if args.yes else MAX_RUNS_WITHOUT_YES,
    )
    print(reuse_line(result))
    done = result.num_runs - len(result.failures)
    print(
        f"{done}/{result.num_runs} runs finished ({result.num_skipped} from earlier invocations); "
        f"wrote {result.out_dir / 'summary.csv'}"
        + (f" and {result.out_dir / 'speedup.csv'}" if result.speedup is not None else "")
    )
    if result.failures:
        first = result.failures[0]  # named by its variant and swept values; the point id is failures.csv's key
        point = f"point {first.swept}" if first.swept else "the base point"
        print(
            f"servesim: {len(result.failures)} run(s) failed; see {result.out_dir / 'failures.csv'} "
            f"(first: variant {first.variant!r}, {point} [{first.point_id}], replication {first.replication}: "
            f"{first.error})",
            file=sys.stderr,
        )
    return result.exit_status


def reuse_line(result) -> str:
    """One line: how many stored runs were reused, and how many were run again because what changed or because
    they were unreadable."""
    line = (f"reused {result.num_skipped} stored run(s) with unchanged inputs (run config, seed, cards, files, "
            "servesim version and source)")
    if result.num_stale:
        why = ", ".join(f"{what} ({n})" for what, n in sorted(result.stale.items(), key=lambda kv: -kv[1]))
        line += f"; ran {result.num_stale} stored run(s) again because their inputs changed: {why}"
    if result.unreadable:
        names = ", ".join(result.unreadable[:3]) + (" ..." if len(result.unreadable) > 3 else "")
        line += f"; {len(result.unreadable)} stored run(s) unreadable ({names}): ran them again"
    return line
