"""Seed lesson Examples 5/10 in the engine: EAGLE at batch 1 with temperature T = 0, 0.5, 1.0, ratio vs match.

Run:   .venv/bin/python experiments/lesson-mechanics/ex05_10_temperature.py
Applies servesim.speculation.config.effective_profile itself (what servesim/wiring.py does once wired) and
passes the converted profile as ``acceptance`` with ``temperature: 0``, so it gives the same numbers before
and after the wiring. Prints a Markdown table.
"""

from __future__ import annotations

from pathlib import Path

from servesim import simulate
from servesim.input_files import load_yaml
from servesim.speculation.config import SpeculativeConfig, effective_profile
from servesim.speculation.profile import load_profile

HERE = Path(__file__).resolve().parent
PROFILE = "eagle-llama3.1-8b-sharegpt-k3"


def main() -> None:
    base = load_yaml(HERE / "base-eagle-llama8b-h100.yaml")
    plain = simulate(base, base_dir=HERE).summary["output_throughput"]
    print("| T | rule | profile mean acceptance length | simulated mean acceptance length | tok/s | speedup |")
    print("|---|---|---|---|---|---|")
    for t in (0.0, 0.5, 1.0):
        for rule in ("ratio", "match"):
            spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, acceptance=PROFILE,
                                     temperature=t, verification_rule=rule)
            prof = effective_profile(spec, load_profile(PROFILE))
            cfg = {**base, "speculative_config": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": prof}}
            s = simulate(cfg, base_dir=HERE).summary
            print(f"| {t:g} | {rule} | {prof.mean_acceptance_length(3):.3f} | "
                  f"{s['spec_decode']['mean_acceptance_length']:.3f} | {s['output_throughput']:.0f} | "
                  f"{s['output_throughput'] / plain:.2f} |")


if __name__ == "__main__":
    main()
