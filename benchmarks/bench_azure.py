"""Benchmark: wall time and peak memory of `servesim run --no-plot` on the full Azure conversation trace.

Runs the real command (start-up, loading, simulation, writing the files) as a child process, at the
trace's own rate and at 4x (timestamps divided by 4: big batches, a full KV cache, preemptions), and
reports the median wall time of several repeats and their range, simulated requests per wall second, the
child's peak resident memory and the median divided by a 3-million-iteration Python loop timed before and
after the repeats (a ratio that varies less than the wall time on a shared machine). Optionally the same with speculative decoding (EAGLE, k = 3).

    python benchmarks/bench_azure.py [--repeats 5] [--spec]

This is a benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"
REQUESTS = 19_366
EAGLE = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"}'


def run_once(rate_scale: float, spec: bool) -> tuple[float, float]:
    """One child run; returns (wall seconds, peak RSS in MB)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", "import sys; from servesim.cli import main; sys.exit(main())",
               "run", str(CONFIG), "--out", out, "--no-plot", "--quiet", "--set", f"workload.rate_scale={rate_scale}"]
        if spec:
            cmd += ["--speculative-config", EAGLE]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"servesim run failed with status {proc.returncode}")
    return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def reference_loop_s() -> float:
    """Seconds this machine takes for a 3-million-iteration Python loop (to compare machines and moments)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(3_000_000):
        x += i
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", action="store_true", help="also time EAGLE k=3 speculative decoding")
    args = parser.parse_args()
    variants = [(1.0, False), (4.0, False)] + ([(1.0, True), (4.0, True)] if args.spec else [])
    references = [reference_loop_s()]
    print(f"servesim run --no-plot, Azure conversation trace ({REQUESTS:,} requests), {os.cpu_count()} CPUs, "
          f"reference 3M-iteration Python loop {references[0]:.2f} s")
    print(f"{'rate':>5} {'speculation':>12} {'wall s (median)':>16} {'range':>13} {'requests / wall s':>18} "
          f"{'peak MB':>8} {'wall / reference':>17}")
    for rate, spec in variants:
        runs = [run_once(rate, spec) for _ in range(args.repeats)]
        references.append(reference_loop_s())  # the machine's speed right after this variant's runs
        walls = [r[0] for r in runs]
        wall = statistics.median(walls)
        peak = max(r[1] for r in runs)
        label = "EAGLE k=3" if spec else "off"
        ratio = wall / statistics.median(references[-2:])
        print(f"{rate:>4g}x {label:>12} {wall:>16.3f} {min(walls):>6.2f}-{max(walls):<6.2f} {REQUESTS / wall:>18,.0f} "
              f"{peak:>8.0f} {ratio:>17.1f}")
    print(f"reference loop over the benchmark: {min(references):.2f}-{max(references):.2f} s; wall / reference "
          "divides each median by the mean of the reference just before and just after its runs")


if __name__ == "__main__":
    main()
