"""The seed lesson's Examples 3, 4 and 8, computed by servesim: closed forms and the engine's own runs.

Question: does servesim reproduce the lesson's numbers for expected tokens per target pass (Example 3),
the speedup and best draft length including the draft cost (Example 4), and the draft-head comparison
(Example 8)? The closed forms come from ``servesim.acceptance.formulas``; the "simulated" columns come
from closed-loop runs of the engine (batch 1, the lesson's ideal roofline) and vLLM's spec-decode counters.

    python experiments/seed/lesson_examples.py

Example 12 is a sweep: ``servesim sweep experiments/seed/example12.yaml --out out/example12``.
"""

from __future__ import annotations

from servesim import simulate
from servesim.acceptance.formulas import best_k, expected_tokens_per_pass, speedup


def engine_mean_length(acceptance, k: int, rounds: int = 100_000) -> float:
    """Mean acceptance length from the engine's counters over at least ``rounds`` verification rounds."""
    output = 2_000
    cfg = {
        "hardware": "lesson-h100-sxm",
        "model": "lesson-8b-fp16",
        "roofline": {"mode": "ideal"},
        "workload": {"type": "closed_loop", "concurrency": 8, "num_requests": 8 + rounds * (k + 1) // output,
                     "prompt_tokens": {"type": "fixed", "value": 16}, "output_tokens": {"type": "fixed", "value": output}},
        "speculative_config": {"method": "draft_model", "num_speculative_tokens": k, "draft_cost": 0.05,
                               "acceptance": acceptance},
    }
    return simulate(cfg).summary["spec_decode"]["mean_acceptance_length"]


def main() -> None:
    print("Example 3: expected tokens per target pass, (1 - a^(k+1)) / (1 - a)")
    ks = (1, 2, 4, 8, 16)
    print("alpha" + "".join(f"   k={k:<3d}" for k in ks) + "  k=inf")
    for a in (0.5, 0.6, 0.7, 0.8, 0.9):
        print(f"{a:5.1f}" + "".join(f"  {expected_tokens_per_pass(a, k):6.3f}" for k in ks) + f"  {1 / (1 - a):6.3f}")
    sim = engine_mean_length({"alpha": 0.8}, 4)
    print(f"engine, alpha=0.8 k=4, >= 100,000 rounds: {sim:.4f} tokens/pass, formula {expected_tokens_per_pass(0.8, 4):.4f}")

    print("\nExample 4: speedup = (1 - a^(k+1)) / ((1 - a)(1 + k c)), alpha=0.8, c=0.1")
    for k in (1, 2, 3, 4, 6, 8, 12):
        print(f"  k={k:<2d}  tokens/pass {expected_tokens_per_pass(0.8, k):.3f}  cost/round {1 + k * 0.1:.1f}  "
              f"speedup {speedup(0.8, k, 0.1):.3f}")
    print("best k and speedup:\n  c       alpha=0.6   alpha=0.7   alpha=0.8   alpha=0.9")
    for c in (0.02, 0.05, 0.1, 0.3, 1.0):
        cells = []
        for a in (0.6, 0.7, 0.8, 0.9):
            k, s = best_k(a, c)
            cells.append(f"k={k:<2d} {s:.2f}x")
        print(f"  {c:<4.2f}   " + "   ".join(cells))

    print("\nExample 8: draft heads (per-position rates -> mean acceptance length), engine vs formula")
    rows = [("separate draft model", "lesson-separate-draft-model", 4), ("independent heads", "lesson-independent-heads", 4),
            ("feature-level head", "lesson-feature-level-head", 4), ("MTP, 1 token (85%)", "lesson-mtp-85", 1),
            ("MTP, 1 token (90%)", "lesson-mtp-90", 1)]
    from servesim.speculation.profile import load_profile

    for label, name, k in rows:
        profile = load_profile(name)
        per_pos = " ".join(f"{p:.3f}" for p in profile.unconditional()[:k])
        print(f"  {label:<22} per-position: {per_pos:<24} mean acceptance length {profile.mean_acceptance_length(k):.3f}"
              f" (engine: {engine_mean_length(name, k, 50_000):.3f})")


if __name__ == "__main__":
    main()
