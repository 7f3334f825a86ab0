"""Capacity with and without speculative decoding, for the Azure code and conversation traces on H100 and H200.

Question: how many requests per second can one GPU take within p99 TTFT <= 0.5 s and p99 TPOT <= 50 ms
(the first 3,000 requests of each trace, its rate scaled), with no speculation, EAGLE (k = 3), n-gram
(k = 3) and a tuned batch-size schedule (`servesim tune-k`'s table for EAGLE on Llama-3.1-8B / H100)?

    python experiments/capacity/speculation_capacity.py          # about 2 CPU-minutes

Prints a markdown table; each cell is one `servesim capacity` search (bisection to 5%, one replication:
speculative runs are seeded, so one replication is one sample of the acceptance draws).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = {
    "none": None,
    "EAGLE k=3": "{method: eagle, num_speculative_tokens: 3, acceptance: eagle-llama3.1-8b-sharegpt-k3}",
    "n-gram k=3": "{method: ngram, num_speculative_tokens: 3, acceptance: ngram-llama3.1-8b-sharegpt-k3}",
    "EAGLE tuned": "{method: eagle, num_speculative_tokens: 2, acceptance: eagle-llama3.1-8b-sharegpt-k5, "
                   "num_speculative_tokens_per_batch_size: [[1, 96, 2], [97, 256, 1]]}",
}
CONFIGS = {
    ("Azure conversation", "H100"): "azure-conv-llama8b-h100.yaml",
    ("Azure conversation", "H200"): "azure-conv-llama8b-h200.yaml",
    ("Azure code", "H100"): "azure-code-llama8b-h100.yaml",
    ("Azure code", "H200"): "azure-code-llama8b-h200.yaml",
}


def capacity(config: str, spec: str | None, out: Path) -> str:
    cmd = [sys.executable, "-c", "import sys; from servesim.cli import main; sys.exit(main())", "capacity",
           str(HERE / config), "--slo", "ttft_p99=0.5", "--slo", "tpot_p99=0.05", "--replications", "1",
           "--max-requests", "3000", "--quiet", "--out", str(out)]
    if spec is not None:
        cmd += ["--set", f"speculative_config={spec}"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(line for line in text.splitlines() if line.startswith("capacity:"))
    return line.split()[1]


def main() -> None:
    out_root = Path("out") / "capacity-speculation"
    print("| trace | GPU | " + " | ".join(VARIANTS) + " |")
    print("|---|---|" + "---:|" * len(VARIANTS))
    for (trace, gpu), config in CONFIGS.items():
        cells = [capacity(config, spec, out_root / f"{config[:-5]}-{i}") for i, spec in enumerate(VARIANTS.values())]
        print(f"| {trace} | {gpu} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
