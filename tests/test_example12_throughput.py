"""Plain decoding throughput of the lesson's Example 12 from the simulator's own closed-loop runs."""

from __future__ import annotations

import pytest

from servesim import simulate


def closed_loop(batch: int, output_tokens: int = 600) -> dict:
    return {
        "hardware": "lesson-h100-sxm",
        "model": "lesson-8b-fp16",
        "roofline": {"mode": "ideal"},
        "workload": {
            "type": "closed_loop",
            "concurrency": batch,
            "num_requests": batch,
            "prompt_tokens": {"type": "fixed", "value": 1},
            "output_tokens": {"type": "fixed", "value": output_tokens},
        },
    }


@pytest.mark.parametrize("batch, tok_s", [(1, 209), (8, 1675), (32, 6700), (64, 13400), (128, 26800), (256, 53600)])
def test_example12_plain_throughput(batch, tok_s):
    summary = simulate(closed_loop(batch)).summary
    # every step emits one token per client and lasts 16e9/3.35e12 s (memory-bound up to 295 tokens)
    assert summary["output_throughput"] == pytest.approx(batch * 3.35e12 / 16e9, rel=1e-9)
    assert round(summary["output_throughput"]) == tok_s
