"""Benchmark: a 1,000-point sweep of a 3,000-request configuration on the local pool (issue 13, item 3).

Grid (10 x 10 x 5 x 2 = 1,000 points, one replication each) over the Azure conversation config cut to its
first 3,000 requests: ``workload.rate_scale`` 0.5-5, ``engine.max_num_seqs`` 16-1024,
``engine.max_num_batched_tokens`` 2,048-32,768 and ``engine.gpu_memory_utilization`` 0.8 / 0.9. It runs
:func:`servesim.sweep.run_sweep` with 2 worker processes (fresh output folder) exactly as ``servesim sweep
--jobs 2`` does (the up-front check of every point's config included), and reports:

* the sweep's wall time, points per second and points per second per worker;
* the time spent inside ``servesim.simulate`` in the workers (each call timed in the worker), and the
  sweep's own overhead = workers x wall - that sum (expansion, seeding, config checks, resume checks,
  input hashing, sending the tasks and the summaries between processes, writing every point's JSON and
  the tables, idle workers at the end), as a fraction of workers x wall, and the parent's CPU time (on a
  machine with as many cores as workers it takes its share of them);
* the same split for a second invocation on the finished folder (every run reused: resume checks only),
  and that its ``summary.csv`` is byte-identical to the first invocation's;
* the same-run references (``benchlib``) and the wall time's ratio to each.

Targets (issue 13): at most 5 minutes, overhead under 5%.

    python benchmarks/bench_sweep.py [--points 1000] [--requests 3000] [--jobs 2] [--json FILE]

``--points N`` keeps the first N points of the grid (a quicker check). A benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, References, machine, ratios, write_json

CONFIG = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"
GRID = {
    "workload.rate_scale": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0],
    "engine.max_num_seqs": [16, 32, 48, 64, 96, 128, 192, 256, 512, 1024],
    "engine.max_num_batched_tokens": [2048, 4096, 8192, 16384, 32768],
    "engine.gpu_memory_utilization": [0.8, 0.9],
}
#: Environment variable naming the file each worker appends its simulate() times to.
TIMES_ENV = "SERVESIM_BENCH_SWEEP_TIMES"


def timed_simulate(config, *, seed, base_dir):
    """``servesim.simulate`` timed in the worker: appends ``seconds`` to the file named by :data:`TIMES_ENV`."""
    from servesim import simulate

    t0 = time.perf_counter()
    result = simulate(config, seed=seed, base_dir=base_dir)
    elapsed = time.perf_counter() - t0
    with open(os.environ[TIMES_ENV], "a", encoding="ascii") as handle:
        handle.write(f"{elapsed!r}\n")
    return result


def sweep_spec(requests: int, points: int) -> dict:
    """The sweep (a SweepConfig mapping), its grid cut to its first ``points`` points."""
    grid = {key: list(values) for key, values in GRID.items()}
    total = 1
    for values in grid.values():
        total *= len(values)
    for key in list(grid)[:-1]:  # drop values of the slowest axes first, keeping the grid a product
        while total // len(grid[key]) * (len(grid[key]) - 1) >= points and len(grid[key]) > 1:
            total = total // len(grid[key]) * (len(grid[key]) - 1)
            grid[key].pop()
    return {"base": str(CONFIG), "grid": {**grid, "workload.max_requests": [requests]}, "replications": 1, "seed": 0}


def _parent_cpu_s() -> float:
    """CPU seconds (user + system) of this process, the sweep's parent, so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def invocation(loaded, out: Path, jobs: int, times: Path) -> dict:
    """One sweep invocation timed as ``servesim sweep`` runs it; returns its figures."""
    from servesim.sweep import run_sweep
    from servesim.sweep.runner import _check_configs

    times.write_text("", encoding="ascii")
    cpu0 = _parent_cpu_s()
    t0 = time.perf_counter()
    _check_configs(loaded)  # what run_sweep does first for servesim's own simulate (skipped for a wrapper)
    checked = time.perf_counter() - t0
    result = run_sweep(loaded, out, jobs=jobs, progress=False, simulate=timed_simulate)
    wall = time.perf_counter() - t0
    parent_cpu = _parent_cpu_s() - cpu0
    inside = sum(float(line) for line in times.read_text(encoding="ascii").split())
    return {"wall_s": wall, "config_check_s": checked, "simulate_s": inside, "runs": result.num_run,
            "reused": result.num_skipped, "failed": len(result.failures), "parent_cpu_s": parent_cpu,
            "overhead_fraction": 1.0 - inside / (jobs * wall)}


def main() -> None:
    from servesim.sweep.spec import SweepConfig, resolve_sweep

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1000, help="points of the grid to run (default 1000)")
    parser.add_argument("--requests", type=int, default=3000, help="requests per point (default 3000)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    loaded = resolve_sweep(SweepConfig.model_validate(sweep_spec(args.requests, args.points)), Path.cwd(), "bench")
    from servesim.sweep.points import count_points

    points = count_points(loaded)
    refs = References()
    figures: dict = {"benchmark": "bench_sweep", "points": points, "requests_per_point": args.requests,
                     "jobs": args.jobs, "machine": machine()}
    print(f"sweep of {points:,} points (Azure conversation, first {args.requests:,} requests each), {args.jobs} "
          f"workers, {figures['machine']['cpus']} CPUs, load {figures['machine']['load_average_1min']:.2f}")
    refs.measure()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[TIMES_ENV] = str(Path(tmp) / "times.txt")
        out = Path(tmp) / "sweep"
        first = invocation(loaded, out, args.jobs, Path(tmp) / "times.txt")
        table = (out / "summary.csv").read_bytes()
        resumed = invocation(loaded, out, args.jobs, Path(tmp) / "times.txt")
        figures["summary_csv_identical_on_resume"] = (out / "summary.csv").read_bytes() == table
    refs.measure()
    first.update(points_per_s=points / first["wall_s"], points_per_s_per_worker=points / first["wall_s"] / args.jobs,
                 simulate_s_per_point=first["simulate_s"] / max(first["runs"], 1),
                 **ratios(first["wall_s"], refs.around(0)))
    figures.update(first=first, resumed=resumed, references=refs.as_json())
    print(f"first invocation: {first['wall_s']:.1f} s wall, {first['points_per_s']:.2f} points/s "
          f"({first['points_per_s_per_worker']:.2f} per worker), {first['failed']} failed; "
          f"simulate() {first['simulate_s']:.1f} s in the workers ({first['simulate_s_per_point'] * 1e3:.0f} ms per "
          f"point), config check {first['config_check_s']:.2f} s, parent CPU {first['parent_cpu_s']:.1f} s; overhead {100 * first['overhead_fraction']:.1f}% "
          f"of workers x wall; wall / import numpy {first['per_import_numpy']:.0f}, / loop {first['per_loop']:.0f}")
    print(f"resumed invocation (all {resumed['reused']} reused): {resumed['wall_s']:.2f} s wall "
          f"(config check {resumed['config_check_s']:.2f} s, parent CPU {resumed['parent_cpu_s']:.2f} s); summary.csv identical: "
          f"{figures['summary_csv_identical_on_resume']}")
    print(f"references: import numpy {min(refs.import_numpy_s):.3f}-{max(refs.import_numpy_s):.3f} s, "
          f"loop {min(refs.loop_s):.3f}-{max(refs.loop_s):.3f} s")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
