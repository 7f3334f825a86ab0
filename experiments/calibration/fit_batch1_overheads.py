"""Fit the two end-to-end overheads to the batch-1 measurements of vLLM PR 16937 (Llama-3.1-8B, 1 x H100).

* ``step_overhead_s`` of ``hardware/gpus/h100-sxm.yaml``: bisection until the ``pr16937-plain`` case of
  ``experiments/validation/vllm-pr16937-llama8b-h100-bs1.yaml`` simulates 133 tok/s.
* ``draft_pass_overhead_s`` (speculative_config default): golden-section search minimising the squared
  relative errors of the three EAGLE-1 cases (K = 2, 4, 7) with that step overhead.

Everything else of the step time comes from the kernel-profile fit (``fit_kernel_profiles.py``). These
four cases are therefore fits, not predictions; every other validation case is a prediction. Run:

    python experiments/calibration/fit_batch1_overheads.py
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from servesim import simulate  # noqa: E402
from servesim.analysis.validation import load_case_file  # noqa: E402

CASES = ROOT / "experiments" / "validation" / "vllm-pr16937-llama8b-h100-bs1.yaml"


def _throughput(lc, step_overhead_s: float, draft_pass_overhead_s: float | None = None) -> float:
    cfg = copy.deepcopy(lc.case.config)
    cfg.setdefault("roofline", {})["step_overhead_s"] = step_overhead_s
    if draft_pass_overhead_s is not None:
        cfg["speculative_config"]["draft_pass_overhead_s"] = draft_pass_overhead_s
    return float(simulate(cfg, base_dir=lc.file.parent).summary["output_throughput"])


def main() -> None:
    cases = {lc.case.name: lc for lc in load_case_file(CASES)}
    plain = cases["pr16937-plain"]
    lo, hi = 0.0, 5e-3  # throughput falls as the overhead grows
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if _throughput(plain, mid) > plain.case.measured.value:
            lo = mid
        else:
            hi = mid
    overhead = float(f"{0.5 * (lo + hi):.3g}")
    print(f"step_overhead_s = {overhead:.3g} s (pr16937-plain: {_throughput(plain, overhead):.1f} tok/s "
          f"vs {plain.case.measured.value})")
    eagle = [cases[n] for n in ("pr16937-eagle-k2", "pr16937-eagle-k4", "pr16937-eagle-k7")]

    def loss(x: float) -> float:
        return sum((_throughput(lc, overhead, x) / lc.case.measured.value - 1) ** 2 for lc in eagle)

    a, b = 0.0, 2e-3
    g = (math.sqrt(5) - 1) / 2
    for _ in range(25):
        c, d = b - g * (b - a), a + g * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    per_pass = float(f"{0.5 * (a + b):.2g}")
    print(f"draft_pass_overhead_s = {per_pass:.2g} s:", ", ".join(
        f"{lc.case.name} {_throughput(lc, overhead, per_pass):.1f} vs {lc.case.measured.value}" for lc in eagle))


if __name__ == "__main__":
    main()
