"""Regression tests of issue 11 (robustness of the command line, config loading and outputs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from servesim.cli import main
from servesim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "hardware": "h100-sxm",
    "model": "llama-3.1-8b",
    "workload": {
        "type": "poisson",
        "rate": 5.0,
        "num_requests": 40,
        "prompt_tokens": {"type": "uniform", "low": 10, "high": 500},
        "output_tokens": {"type": "uniform", "low": 1, "high": 50},
    },
    "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- item 11: --speculative-config first, then --set in order -----------------------------------------

def test_speculative_config_json_then_set_in_order(tmp_path):
    from servesim.commands.run import parse_overrides
    from servesim.config.models import load_config

    cfg_path = write_yaml(tmp_path / "c.yaml", SMALL)
    pairs = parse_overrides(["speculative_config.num_speculative_tokens=5"],
                            '{"method": "ngram", "num_speculative_tokens": 3}')
    cfg, _ = load_config(cfg_path, pairs)
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 5}
    # later --set of the same key wins, even after a --set of a key inside it
    pairs = parse_overrides(["speculative_config={method: ngram, num_speculative_tokens: 2}",
                             "speculative_config.prompt_lookup_max=4",
                             "speculative_config={method: ngram, num_speculative_tokens: 7}"], None)
    cfg, _ = load_config(cfg_path, pairs)
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 7}


# --- item 15: the console table's columns never run together ------------------------------------------

def test_console_table_columns_stay_apart_at_long_latencies():
    from servesim.metrics.table import format_summary_table

    def stats(mean, p50, p99):
        return {"mean": mean, "p50": p50, "p99": p99}

    summary = {"ttft_s": stats(1234.5678, 1000.0, 98765.4321), "tpot_s": stats(0.009, 0.009, 0.014),
               "itl_s": stats(0.01, 0.008, 0.03), "e2e_s": stats(12345.6, 9999.99, 123456.7)}
    lines = format_summary_table(summary).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Latency (ms)"))
    for line in lines[head + 1:head + 5]:
        numbers = line[28:].split()
        assert len(numbers) == 3, line
        assert "  " in line[28:].strip(), line  # two spaces at least between neighbours
    e2e = lines[head + 4][28:].split()
    assert [float(x) for x in e2e] == [12345600.0, 9999990.0, 123456700.0]
    # the header's column names end where the numbers end
    assert len(lines[head]) == len(lines[head + 4])


# --- item 12: `servesim acceptance ... > profile.yaml` is a valid profile -----------------------------

@pytest.mark.parametrize("argv", [
    ["ngram", "--input", "workloads/examples/ngram-pairs.jsonl", "--n", "3", "--k", "4"],
    ["from-vllm-log", "--input", "workloads/examples/vllm-specdecode-eagle3-k3.log", "--method", "eagle3"],
])
def test_acceptance_stdout_is_a_valid_profile(tmp_path, capsys, argv):
    from servesim.speculation.profile import load_profile

    argv = [ROOT / a if a.startswith("workloads/") else a for a in argv]
    assert main(["acceptance", *map(str, argv)]) == 0
    captured = capsys.readouterr()
    path = tmp_path / "profile.yaml"
    path.write_text(captured.out)
    profile = load_profile(str(path))
    assert profile.num_positions >= 3
    assert "mean acceptance length" in captured.err  # the statistics are still shown, on stderr
