"""Regenerate every number and figure of README.md and experiments/ that depends on step times.

    python experiments/regenerate.py            # everything (5.4 min on 2 idle cores, ~10 min busy)
    python experiments/regenerate.py --only main,validation

Runs the commands the READMEs quote, in order, from the repository root, with the installed servesim
(the same Python as this script). Each step's console output goes to ``out/regenerate/<step>.txt`` (the
numbers the READMEs quote), its figures to ``docs/figures/`` (the names the READMEs show), and at the end
a table of the steps and their wall times is printed and written to ``out/regenerate/timings.txt``. A
failing step stops the script with its name and exit status; earlier steps' outputs stay (each step
rewrites only its own folders). The numbers are deterministic (seeded); only the timings vary.

Steps (README section: command):

* ``main``: the main job (``servesim run experiments/azure-conv-llama8b-h100.yaml``), the same at 4x the
  rate, and with EAGLE k = 3;
* ``calibration``: the kernel-profile fit and the batch-1 overhead fit (``experiments/calibration/``);
* ``validation``: ``servesim validate --markdown`` (the Fidelity table and experiments/validation/README.md);
* ``hurts-8b``, ``hurts-70b``: the when-speculation-hurts sweeps and their speedup figures;
* ``seed``: ``experiments/seed/lesson_examples.py`` and the Example 12 sweeps;
* ``tune-k``: ``servesim tune-k`` as experiments/tune-k/README.md runs it;
* ``capacity``: the capacity searches of README.md and experiments/capacity/README.md, the speculation
  sweeps against the rate and on Mooncake, and ``speculation_capacity.py``;
* ``lesson-mechanics``: the runs and sweeps of experiments/lesson-mechanics/README.md (its figure goes to
  ``experiments/lesson-mechanics/figures/``);
* ``prefix-caching``: ``experiments/prefix-caching/make_figures.py`` (Mooncake with and without prefix
  caching, round-robin vs prefix-aware routing over 4 replicas, EAGLE with prefix caching; its figures go
  to ``experiments/prefix-caching/figures/``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out"
LOGS = OUT / "regenerate"
SERVESIM = [sys.executable, "-c", "import sys; from servesim.cli import main; sys.exit(main())"]
PY = [sys.executable]
EAGLE3 = "{method: eagle, num_speculative_tokens: 3, acceptance: eagle-llama3.1-8b-sharegpt-k3}"
NGRAM3 = "{method: ngram, num_speculative_tokens: 3, acceptance: ngram-llama3.1-8b-sharegpt-k3}"
CAPACITY = ["--slo", "ttft_p99=0.5", "--slo", "tpot_p99=0.05", "--replications", "1", "--max-requests", "3000"]

# step name -> list of (command, figure copies [(file under out/, destination relative to the repository)])
STEPS: dict[str, list[tuple[list[str], list[tuple[str, str]]]]] = {
    "main": [
        (SERVESIM + ["run", "experiments/azure-conv-llama8b-h100.yaml", "--out", "out/azure-conv"],
         [("azure-conv/latency.png", "docs/figures/azure-conv-latency.png")]),
        (SERVESIM + ["run", "experiments/azure-conv-llama8b-h100.yaml", "--out", "out/azure-conv-4x", "--no-plot",
                     "--set", "workload.rate_scale=4"], []),
        (SERVESIM + ["run", "experiments/azure-conv-llama8b-h100.yaml", "--out", "out/eagle", "--no-plot",
                     "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}'], []),
    ],
    "calibration": [
        (PY + ["experiments/calibration/fit_kernel_profiles.py"], []),
        (PY + ["experiments/calibration/fit_batch1_overheads.py"], []),
    ],
    "validation": [
        (SERVESIM + ["validate", "--markdown", "--out", "out/validation"], []),
    ],
    "hurts-8b": [
        (SERVESIM + ["sweep", "experiments/when-speculation-hurts.yaml", "--out", "out/when-hurts", "--jobs", "2"], []),
        (SERVESIM + ["plot", "out/when-hurts"], [("when-hurts/speedup.png", "docs/figures/when-speculation-hurts-8b.png")]),
    ],
    "hurts-70b": [
        (SERVESIM + ["sweep", "experiments/when-speculation-hurts-70b.yaml", "--out", "out/when-hurts-70b",
                     "--jobs", "2"], []),
        (SERVESIM + ["plot", "out/when-hurts-70b"], [("when-hurts-70b/speedup.png", "docs/figures/when-speculation-hurts-70b.png")]),
    ],
    "seed": [
        (PY + ["experiments/seed/lesson_examples.py"], []),
        (SERVESIM + ["sweep", "experiments/seed/example12.yaml", "--out", "out/example12", "--jobs", "2"], []),
        (SERVESIM + ["plot", "out/example12"], [("example12/speedup.png", "docs/figures/example12-speedup.png")]),
        (SERVESIM + ["sweep", "experiments/seed/example12-alpha.yaml", "--out", "out/example12-alpha", "--jobs", "2"], []),
    ],
    "tune-k": [
        (SERVESIM + ["tune-k", "experiments/tune-k/llama8b-h100-eagle.yaml", "--replications", "3",
                     "--requests-per-client", "16", "--jobs", "2", "--out", "out/tune-k"],
         [("tune-k/tune_k.png", "docs/figures/tune-k-llama8b-h100-eagle.png")]),
    ],
    "capacity": [
        (SERVESIM + ["capacity", "experiments/capacity/azure-conv-llama8b-h100.yaml", *CAPACITY,
                     "--out", "out/capacity/azure-conv-h100"],
         [("capacity/azure-conv-h100/slo_attainment.png", "docs/figures/capacity-azure-conv-h100.png")]),
        (SERVESIM + ["capacity", "experiments/capacity/azure-conv-llama8b-h200.yaml", *CAPACITY,
                     "--out", "out/capacity/azure-conv-h200"], []),
        (SERVESIM + ["capacity", "experiments/capacity/azure-code-llama8b-h100.yaml", *CAPACITY,
                     "--out", "out/capacity/azure-code-h100"], []),
        (SERVESIM + ["capacity", "experiments/capacity/azure-code-llama8b-h200.yaml", *CAPACITY,
                     "--out", "out/capacity/azure-code-h200"], []),
        (SERVESIM + ["capacity", "experiments/azure-conv-llama8b-h100.yaml", "--slo", "ttft_p99=0.5", "--slo",
                     "tpot_p99=0.05", "--replications", "1", "--out", "out/capacity/azure-conv-h100-full"], []),
        (SERVESIM + ["sweep", "experiments/capacity/mooncake-conv-load-sweep.yaml", "--out", "out/mooncake-load",
                     "--jobs", "2"], []),
        (SERVESIM + ["plot", "out/mooncake-load", "--x", "rate_scale", "--slo", "ttft_p99=2.0", "--slo",
                     "tpot_p99=0.05"], []),
        (SERVESIM + ["sweep", "experiments/capacity/speculation-vs-rate.yaml", "--out", "out/spec-vs-rate",
                     "--jobs", "2"], []),
        (SERVESIM + ["plot", "out/spec-vs-rate", "--x", "rate_scale", "--slo", "tpot_p99=0.05"],
         [("spec-vs-rate/latency_vs_throughput.png", "docs/figures/speculation-vs-rate.png")]),
        (SERVESIM + ["sweep", "experiments/capacity/mooncake-speculation.yaml", "--out", "out/mooncake-spec",
                     "--jobs", "2"], []),
        (PY + ["experiments/capacity/speculation_capacity.py"], []),
    ],
    "lesson-mechanics": [
        (SERVESIM + ["run", "experiments/lesson-mechanics/ex01-02-greedy-alpha.yaml", "--out", "out/lm-ex01",
                     "--no-plot"], []),
        (SERVESIM + ["run", "experiments/lesson-mechanics/ex01-02-greedy-alpha.yaml", "--out", "out/lm-ex01p",
                     "--no-plot", "--set", "speculative_config=null"], []),
        (PY + ["experiments/lesson-mechanics/ex05_10_temperature.py"], []),
        (SERVESIM + ["sweep", "experiments/lesson-mechanics/ex05-10-temperature.yaml", "--out", "out/lm-ex05"], []),
        (SERVESIM + ["run", "experiments/lesson-mechanics/ex06-ngram-from-pairs.yaml", "--out", "out/lm-ex06",
                     "--no-plot"], []),
        (SERVESIM + ["run", "experiments/lesson-mechanics/ex06-ngram-from-pairs.yaml", "--out", "out/lm-ex06p",
                     "--no-plot", "--set", "speculative_config=null"], []),
        (SERVESIM + ["sweep", "experiments/lesson-mechanics/ex09-tree-vs-chain.yaml", "--out", "out/lm-ex09"], []),
        (SERVESIM + ["plot", "out/lm-ex09"], [("lm-ex09/speedup.png", "experiments/lesson-mechanics/figures/ex09-speedup.png")]),
    ],
    "prefix-caching": [
        (PY + ["experiments/prefix-caching/make_figures.py", "--jobs", "2"], []),
    ],
}


def run_step(name: str) -> float:
    """Run one step's commands; returns its wall time (s). Exits the script if a command fails."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.txt"
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as fh:
        for cmd, copies in STEPS[name]:
            shown = " ".join(cmd[3:] if cmd[:3] == SERVESIM else ["python", *cmd[1:]])
            fh.write(f"$ {'servesim ' if cmd[:3] == SERVESIM else ''}{shown}\n")
            fh.flush()
            done = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                sys.exit(f"regenerate: step {name!r} failed (exit {done.returncode}) running: {shown}; see {log}")
            for src, dst in copies:
                source = OUT / src
                if not source.is_file():
                    sys.exit(f"regenerate: step {name!r}: expected figure {source} was not written")
                (ROOT / dst).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, ROOT / dst)
            fh.write("\n")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated steps (default: all of {', '.join(STEPS)})")
    args = parser.parse_args(argv)
    names = list(STEPS) if not args.only else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        parser.error(f"--only: unknown step(s) {', '.join(unknown)} (expected {', '.join(STEPS)})")
    lines, total = [], 0.0
    for name in names:
        print(f"regenerate: {name} ...", flush=True)
        took = run_step(name)
        total += took
        lines.append(f"{name:<12} {took:8.1f} s   out/regenerate/{name}.txt")
    lines.append(f"{'total':<12} {total:8.1f} s")
    text = "\n".join(lines)
    (LOGS / "timings.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
