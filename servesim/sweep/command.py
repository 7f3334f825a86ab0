"""``servesim sweep SWEEP.yaml --out DIR [--jobs N] [--executor local|dask|dask://HOST:PORT] [--no-progress]``.

Runs a sweep resumably (rerun the same command after an interruption to finish it) and writes
``DIR/summary.csv`` (and ``DIR/speedup.csv`` with a ``baseline``). Exit status 1 when any run failed
(listed in ``DIR/failures.csv``).
"""

from __future__ import annotations

import argparse
import sys


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


def run(args: argparse.Namespace) -> int:
    """Run the sweep described by ``args``; return 0, or 1 when any run failed.

    Raises:
        ConfigError: invalid sweep file, ``--jobs`` or ``--executor`` (printed as one line by the CLI).
    """
    from servesim.sweep.runner import run_sweep

    result = run_sweep(
        args.sweep,
        args.out,
        jobs=args.jobs,
        executor=args.executor,
        progress=False if args.no_progress else None,
    )
    done = result.num_runs - len(result.failures)
    print(
        f"{done}/{result.num_runs} runs finished ({result.num_skipped} from earlier invocations); "
        f"wrote {result.out_dir / 'summary.csv'}"
        + (f" and {result.out_dir / 'speedup.csv'}" if result.speedup is not None else "")
    )
    if result.failures:
        print(
            f"servesim: {len(result.failures)} run(s) failed; see {result.out_dir / 'failures.csv'} "
            f"(first: {result.failures[0].error})",
            file=sys.stderr,
        )
    return result.exit_status
