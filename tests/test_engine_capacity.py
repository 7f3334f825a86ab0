"""Requests near the KV capacity under speculation (issue 11, item 8): refused up front with one line when
their largest one-step need (verify width + lookahead) exceeds the cache, served to the end when it fits,
and a stall, were one still reachable, is a one-line user error naming the request and the settings."""

from __future__ import annotations

import numpy as np
import pytest

from servesim import simulate
from servesim.cli import main
from servesim.errors import ConfigError


def config(spec: dict, prompt: int, output: int, blocks: int, mode: str = "run") -> dict:
    """A run config of 6 equal requests on a KV cache of ``blocks`` usable 16-token blocks."""
    return {
        "hardware": "h100-sxm",
        "model": "llama-3.1-8b",
        # vLLM's num_gpu_blocks counts its null block: ``blocks`` usable blocks
        "engine": {"num_gpu_blocks_override": blocks + 1, "max_num_seqs": 8},
        "workload": {"type": "poisson", "rate": 5.0, "num_requests": 6,
                     "prompt_tokens": {"type": "fixed", "value": prompt},
                     "output_tokens": {"type": "fixed", "value": output}},
        "speculative_config": spec,
        "simulation": {"mode": mode},
    }


# (spec, prompt, output, blocks the peak needs). Peak one-step need = P + O - 1 + drafts + lookahead
# (16-token blocks), hand-worked:
CASES = [
    # n-gram, K = 4, no lookahead: 900 + 124 - 1 + 4 = 1027 slots = 65 blocks (P + O = 1024 = 64 blocks)
    ({"method": "ngram", "num_speculative_tokens": 4}, 900, 124, 65),
    # EAGLE, K = 3, 3 lookahead slots: 900 + 108 - 1 + 3 + 3 = 1013 slots = 64 blocks (P + O = 63 blocks)
    ({"method": "eagle", "num_speculative_tokens": 3}, 900, 108, 64),
    # EAGLE draft tree [2, 2]: 6 nodes verified, K = 2 lookahead: 900 + 120 - 1 + 6 + 2 = 1027 = 65 blocks
    ({"method": "eagle", "draft_tree": [2, 2]}, 900, 120, 65),
    # llama.cpp's draft budget (a draft never exceeds the remaining output - 1): the peak is P + O - 1, so
    # P + O = 1024 fits 64 blocks although K = 4
    ({"method": "ngram", "num_speculative_tokens": 4, "draft_budget_limit": True}, 900, 124, 64),
    # exactly on a block boundary: 900 + 121 - 1 + 4 = 1024 = 64 blocks
    ({"method": "ngram", "num_speculative_tokens": 4}, 900, 121, 64),
]


@pytest.mark.parametrize("spec, prompt, output, blocks", CASES)
def test_request_at_the_peak_is_served_in_both_modes(spec, prompt, output, blocks):
    for mode in ("run", "step"):
        result = simulate(config(spec, prompt, output, blocks, mode))
        r = result.output.requests
        assert np.all(r.generated_tokens == output) and not np.isnan(r.finish_s).any()
        assert (result.output.steps.kv_blocks_used <= blocks).all()


# one slot past a block boundary: 900 + 122 - 1 + 4 = 1025 slots = 65 blocks (a peak one slot lower would fit 64)
PAST_BOUNDARY = ({"method": "ngram", "num_speculative_tokens": 4}, 900, 122, 65)


@pytest.mark.parametrize("spec, prompt, output, blocks", CASES[:3] + [PAST_BOUNDARY])
def test_one_block_short_is_refused_before_the_run(spec, prompt, output, blocks):
    with pytest.raises(ConfigError) as err:
        simulate(config(spec, prompt, output, blocks - 1))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("engine: request 0 ")
    assert f"({blocks} blocks of 16 tokens)" in message and f"cache's {blocks - 1} blocks" in message
    assert "num_gpu_blocks_override" in message and "num_speculative_tokens" in message


def test_the_peak_counts_only_the_drafts_the_token_budget_can_verify():
    # a verify step schedules at most max_num_batched_tokens = 4 tokens: 1 + 3 drafts of K = 8, so the peak is
    # 900 + 122 - 1 + 3 = 1024 slots = 64 blocks, served in a cache of 64 (with all 8 drafts it would be 1029,
    # 65 blocks, and refused)
    cfg = config({"method": "ngram", "num_speculative_tokens": 8}, 900, 122, 64)
    cfg["engine"].update(max_num_batched_tokens=4, max_num_seqs=4)
    result = simulate(cfg)
    assert (result.output.requests.generated_tokens == 122).all()
    assert result.output.steps.kv_blocks_used.max() == 64


@pytest.mark.parametrize("spec, uncapped", [({"method": "eagle", "num_speculative_tokens": 5}, 1017),
                                             ({"method": "ngram", "num_speculative_tokens": 8}, 1015)])
def test_the_peak_is_capped_at_max_model_len_as_vllm_allocates_slots(spec, uncapped):
    # vLLM's allocate_slots needs slots for min(computed + new + lookahead, max_model_len) tokens: with
    # max_model_len = 1024, 1000 + 24 tokens can need 1024 slots at most (64 blocks) whatever the drafts
    # and lookahead (uncapped: 1000 + 24 - 1 + 5 + 5 = 1033 slots, 65 blocks), so 64 blocks serve them
    for mode in ("run", "step"):
        cfg = config(spec, 1000, 24, 64, mode)
        cfg["engine"]["max_model_len"] = 1024
        result = simulate(cfg)
        r = result.output.requests
        assert np.all(r.generated_tokens == 24) and not np.isnan(r.finish_s).any()
        assert result.output.steps.kv_blocks_used.max() == 64
    # where the cap does not bind (1000 + 8 tokens: a peak of 1008 - 1 + drafts + lookahead < 1024) the peak
    # is still checked: 64 blocks against a cache of 63, refused in one line
    cfg = config(spec, 1000, 8, 63)
    cfg["engine"]["max_model_len"] = 1024
    with pytest.raises(ConfigError, match=rf"can need {uncapped} KV slots \(64 blocks of 16 tokens\)"):
        simulate(cfg)


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    import yaml

    path = tmp_path / "near-capacity.yaml"
    path.write_text(yaml.safe_dump(config(CASES[0][0], 900, 124, 64)))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "request 0 (900 prompt + 124 output tokens)" in err


def test_a_stall_is_a_one_line_error_naming_the_request(monkeypatch):
    # Make the cache shrink under a running engine (the constructor's checks make a stall unreachable
    # otherwise): the stuck request and the settings to change are named, no traceback-only ValueError.
    from servesim.engine import speculative_decoding
    from servesim.engine.speculative_decoding import SpeculativeDecoding

    class ShrinkingAfterCheck(SpeculativeDecoding):  # a subclass: the compiled class cannot be patched
        def check_peak_fits(self):
            super().check_peak_fits()
            self.engine.total_blocks = self.engine.free_blocks = 64

    # (the engine imports the class from its module when it is built)
    monkeypatch.setattr(speculative_decoding, "SpeculativeDecoding", ShrinkingAfterCheck)
    for mode in ("run", "step"):
        with pytest.raises(ConfigError) as err:
            simulate(config(CASES[0][0], 900, 124, 65, mode))
        message = str(err.value)
        assert "\n" not in message and "engine: stalled at t=" in message
        assert "request 0 (900 prompt + " in message and "num_gpu_blocks_override" in message
