"""Benchmark: how the cost of `servesim run --no-plot` grows with the number of requests (issue 13, item 2).

Runs the whole command as a child process on ``benchmarks/scale-poisson-azure-lengths.yaml`` (Llama-3.1-8B
on one H100, Poisson arrivals at 10 req/s, (prompt, output) pairs resampled from the Azure conversation
trace) with ``workload.num_requests`` = 10^4, 10^5 and 10^6, without and with EAGLE (k = 3), and reports per
size: the median wall time, peak resident memory, simulated requests per wall second, each time divided by
the same-run references (``benchlib``: a fresh ``python -c "import numpy"`` and a fixed pure-Python loop),
and per variant the growth exponents: the least-squares slope of log(wall) and of log(peak memory)
against log(requests) over all sizes, and the slope between the two largest sizes (start-up costs weigh
on the small sizes, so the last one is the asymptotic figure). Linear cost is an exponent of 1.

    python benchmarks/bench_scale.py [--sizes 10000 100000 1000000] [--repeats 3] [--large-repeats 1]
                                     [--no-spec] [--json FILE]
    python benchmarks/bench_scale.py --profile 100000 [--spec-profile]   # where the time and memory go

``--profile N`` runs one size in this process instead and prints the wall time and resident memory after
each phase (imports, config, workload and engine build, simulation, engine output, summary, writing the
files) and cProfile's top functions of the simulation. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

from benchlib import ROOT, EAGLE, References, machine, ratios, run_child, servesim_command, write_json

CONFIG = ROOT / "benchmarks" / "scale-poisson-azure-lengths.yaml"
SIZES = (10_000, 100_000, 1_000_000)
#: Sizes from which --large-repeats applies instead of --repeats.
LARGE = 1_000_000


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(ys) against log(xs) (None with fewer than two sizes)."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def bench(sizes: list[int], repeats: int, large_repeats: int, variants: list[bool]) -> dict:
    refs = References()
    figures: dict = {"benchmark": "bench_scale", "config": str(CONFIG.relative_to(ROOT)), "machine": machine(),
                     "runs": [], "growth": {}}
    print(f"servesim run --no-plot, {CONFIG.name}, {figures['machine']['cpus']} CPUs, "
          f"load {figures['machine']['load_average_1min']:.2f}, engine {figures['machine']['compiled_engine']}")
    print(f"{'requests':>9} {'speculation':>11} {'wall s':>8} {'range':>13} {'req / wall s':>12} {'peak MB':>8} "
          f"{'/ import numpy':>14} {'/ loop':>7}")
    for spec in variants:
        rows = []
        for n in sizes:
            start = len(refs.loop_s)
            refs.measure()
            runs = []
            for _ in range(large_repeats if n >= LARGE else repeats):
                with tempfile.TemporaryDirectory() as out:
                    runs.append(run_child(servesim_command(CONFIG, out, [f"workload.num_requests={n}"], spec)))
            refs.measure()
            walls = [r[0] for r in runs]
            wall, peak = statistics.median(walls), max(r[1] for r in runs)
            row = {"requests": n, "speculation": "eagle k=3" if spec else "off", "wall_s": wall, "walls_s": walls,
                   "peak_rss_mb": peak, "requests_per_s": n / wall, **ratios(wall, refs.around(start))}
            rows.append(row)
            print(f"{n:>9,} {row['speculation']:>11} {wall:>8.2f} {min(walls):>6.2f}-{max(walls):<6.2f} "
                  f"{n / wall:>12,.0f} {peak:>8.0f} {row['per_import_numpy']:>14.1f} {row['per_loop']:>7.1f}")
        figures["runs"] += rows
        xs = [r["requests"] for r in rows]
        growth = {"time_exponent": slope(xs, [r["wall_s"] for r in rows]),
                  "time_exponent_last_two": slope(xs[-2:], [r["wall_s"] for r in rows[-2:]]),
                  "memory_exponent": slope(xs, [r["peak_rss_mb"] for r in rows]),
                  "memory_exponent_last_two": slope(xs[-2:], [r["peak_rss_mb"] for r in rows[-2:]])}
        figures["growth"]["eagle k=3" if spec else "off"] = growth
        text = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in growth.items() if v is not None)
        print(f"  growth ({'EAGLE k=3' if spec else 'no speculation'}): {text}")
    figures["references"] = refs.as_json()
    print(f"references: import numpy {min(refs.import_numpy_s):.3f}-{max(refs.import_numpy_s):.3f} s, "
          f"loop {min(refs.loop_s):.3f}-{max(refs.loop_s):.3f} s")
    return figures


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 1e6


def profile(n: int, spec: bool, top: int = 25) -> None:
    """Phases of one run of ``n`` requests in this process (wall s, RSS MB after each), then cProfile's top."""
    import cProfile
    import io
    import pstats
    import resource

    marks = [("start", time.perf_counter(), _rss_mb())]

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter(), _rss_mb()))

    import json

    import numpy as np

    from servesim.config.models import load_config
    from servesim.metrics import summarize, write_outputs
    from servesim.wiring import build_engine
    mark("imports")
    overrides = [("workload.num_requests", n)] + ([("speculative_config", json.loads(EAGLE))] if spec else [])
    cfg, folder = load_config(CONFIG, overrides)
    mark("config")
    engine, env, _ = build_engine(cfg, folder, np.random.SeedSequence(cfg.seed))
    mark("workload + engine build")
    prof = cProfile.Profile()
    prof.enable()
    env.run()
    prof.disable()
    mark("simulation (env.run)")
    out = engine.output()
    mark("engine output()")
    summary = summarize(out, slo=cfg.slo.model_dump(exclude_none=True))
    mark("summarize")
    with tempfile.TemporaryDirectory() as folder_out:
        write_outputs(out, summary, folder_out)
        mark("write_outputs")
    print(f"{n:,} requests, {'EAGLE k=3' if spec else 'no speculation'}: {len(out.steps):,} steps.csv rows, "
          f"{int(out.steps.num_steps.sum()):,} engine steps")
    for (name, t, rss), (_, t0, _) in zip(marks[1:], marks[:-1]):
        print(f"  {name:<24} {t - t0:7.2f} s   RSS after {rss:7.0f} MB")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="numbers of requests")
    parser.add_argument("--repeats", type=int, default=3, help=f"runs per size below {LARGE:,} (median)")
    parser.add_argument("--large-repeats", type=int, default=1, help=f"runs per size from {LARGE:,} on")
    parser.add_argument("--no-spec", action="store_true", help="skip the EAGLE k=3 variant")
    parser.add_argument("--spec-only", action="store_true", help="only the EAGLE k=3 variant")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--profile", type=int, metavar="N", help="profile one run of N requests in this process")
    parser.add_argument("--spec-profile", action="store_true", help="with --profile: with EAGLE k=3")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile, args.spec_profile)
        return
    variants = [True] if args.spec_only else [False] + ([] if args.no_spec else [True])
    write_json(args.json, bench(sorted(args.sizes), args.repeats, args.large_repeats, variants))


if __name__ == "__main__":
    main()
