"""Benchmark: wall time and peak memory of `servesim run --no-plot` on the full Azure conversation trace.

Runs the real command (start-up, loading, simulation, writing the files) as a child process, at the
trace's own rate and at 4x (timestamps divided by 4: big batches, a full KV cache, preemptions), and
optionally with speculative decoding (EAGLE, k = 3). For each variant it reports the median wall time of
several repeats and their range, simulated requests per wall second, the child's peak resident memory, and
the median divided by each of two references measured in the same run (``benchlib``: the wall time of a
fresh ``python -c "import numpy"`` and of a fixed pure-Python loop, each timed before and after the
variant's repeats), since absolute times on a shared machine drift by +-30% (issue 13, item 1). Targets
(issue 13): 0.6 s at 1x and 4x, 1.0 s with EAGLE k=3, 150 MB.

    python benchmarks/bench_azure.py [--repeats 5] [--spec] [--compile-bytecode] [--json FILE]

``--compile-bytecode`` first writes servesim's cached bytecode (``compileall``; an installed wheel has
it): with ``PYTHONDONTWRITEBYTECODE=1`` and an editable install, as on this project's machines, every run
otherwise compiles servesim's modules from source. The header says which case was measured.

A developer runs it before and after a change and compares the ratios. This is a benchmark, not a test:
it prints figures, it asserts nothing (CI does not time it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from benchlib import ROOT, References, compile_bytecode, machine, ratios, run_child, servesim_command, write_json

CONFIG = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"
REQUESTS = 19_366


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", action="store_true", help="also time EAGLE k=3 speculative decoding")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--compile-bytecode", action="store_true",
                        help="write servesim's cached bytecode first (as an installed wheel has it)")
    args = parser.parse_args()
    if args.compile_bytecode:
        compile_bytecode()
    variants = [(1.0, False), (4.0, False)] + ([(1.0, True), (4.0, True)] if args.spec else [])
    refs = References()
    figures: dict = {"benchmark": "bench_azure", "config": str(CONFIG.relative_to(ROOT)), "requests": REQUESTS,
                     "repeats": args.repeats, "machine": machine(), "runs": []}
    print(f"servesim run --no-plot, Azure conversation trace ({REQUESTS:,} requests), "
          f"{figures['machine']['cpus']} CPUs, load {figures['machine']['load_average_1min']:.2f}, servesim bytecode "
          + ("cached" if figures["machine"]["bytecode_cached"] else "not cached (every run compiles it)")
          + f", engine {figures['machine']['compiled_engine']}"
          + (", idle file cache paged out (DAMON)" if figures["machine"]["file_cache_pageout"] else ""))
    print(f"{'rate':>5} {'speculation':>12} {'wall s (median)':>16} {'range':>13} {'requests / wall s':>18} "
          f"{'peak MB':>8} {'/ import numpy':>15} {'/ loop':>7}")
    for rate, spec in variants:
        start = len(refs.loop_s)
        refs.measure()
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as out:
                runs.append(run_child(servesim_command(CONFIG, out, [f"workload.rate_scale={rate}"], spec)))
        refs.measure()  # the machine's speed right after this variant's runs
        walls = [r[0] for r in runs]
        wall, peak = statistics.median(walls), max(r[1] for r in runs)
        label = "EAGLE k=3" if spec else "off"
        row = {"rate_scale": rate, "speculation": label, "wall_s": wall, "walls_s": walls, "peak_rss_mb": peak,
               "requests_per_s": REQUESTS / wall, **ratios(wall, refs.around(start))}
        figures["runs"].append(row)
        print(f"{rate:>4g}x {label:>12} {wall:>16.3f} {min(walls):>6.2f}-{max(walls):<6.2f} {REQUESTS / wall:>18,.0f} "
              f"{peak:>8.0f} {row['per_import_numpy']:>15.2f} {row['per_loop']:>7.2f}")
    figures["references"] = refs.as_json()
    print(f"references over the benchmark: import numpy {min(refs.import_numpy_s):.3f}-{max(refs.import_numpy_s):.3f} s, "
          f"loop {min(refs.loop_s):.3f}-{max(refs.loop_s):.3f} s (each the median of 3, before and after each "
          "variant; a ratio divides the variant's median by the median of the references around it)")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
