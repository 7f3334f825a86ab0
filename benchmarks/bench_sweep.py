"""Benchmark: wall time of a 200-point sweep of the Azure conversation config on the local pool.

Grid: 20 rate_scale values x 10 max_num_seqs values, each point the first 300 requests of the trace (a
short run), one replication; after a warm-up run in this process, run with 1 and with 2 worker processes (fresh output folders), and report
wall time, points per second and the speed-up of 2 workers.

    python benchmarks/bench_sweep.py [--requests 300] [--jobs 1 2]

This is a benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"
RATE_SCALES = [round(0.5 + 0.5 * i, 2) for i in range(20)]
MAX_NUM_SEQS = [16, 32, 48, 64, 96, 128, 192, 256, 512, 1024]


def sweep_spec(requests: int) -> dict:
    """The 200-point sweep (a SweepConfig mapping)."""
    return {
        "base": str(CONFIG),
        "grid": {"workload.rate_scale": RATE_SCALES, "engine.max_num_seqs": MAX_NUM_SEQS,
                 "workload.max_requests": [requests]},
        "replications": 1,
        "seed": 0,
    }


def main() -> None:
    from servesim.sweep import run_sweep
    from servesim.sweep.spec import SweepConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per point (default 300)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="worker counts to time")
    args = parser.parse_args()
    spec = SweepConfig.model_validate(sweep_spec(args.requests))
    points = len(RATE_SCALES) * len(MAX_NUM_SEQS)
    print(f"sweep of {points} points (Azure conversation, first {args.requests} requests each), "
          f"{os.cpu_count()} CPUs")
    print(f"{'workers':>7} {'wall s':>8} {'points / s':>11} {'speed-up':>9} {'failed':>7}")
    # Warm-up in this process (imports, trace parse cache), so that the first timing does not pay for it;
    # forked workers inherit the warm cache as well.
    warm = SweepConfig.model_validate({**sweep_spec(args.requests), "grid": {"workload.max_requests": [10]}})
    with tempfile.TemporaryDirectory() as out:
        run_sweep(warm, out, jobs=1, progress=False)
    base = None
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = run_sweep(spec, out, jobs=jobs, progress=False)
            wall = time.perf_counter() - t0
        base = base or wall
        print(f"{jobs:>7} {wall:>8.2f} {points / wall:>11.1f} {base / wall:>8.2f}x {len(result.failures):>7}")


if __name__ == "__main__":
    main()
