"""Tests of servesim.config.overrides: dotted keys and KEY=VALUE assignments."""

from __future__ import annotations

import pytest

from servesim.config.overrides import apply_assignments, parse_assignment, set_dotted, split_key
from servesim.errors import ConfigError, ServesimError

BASE = {"hardware": "h100-sxm", "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192}}


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def test_set_existing_nested_key_returns_copy_and_leaves_input_alone():
    out = set_dotted(BASE, "engine.max_num_seqs", 128)
    assert out == {"hardware": "h100-sxm", "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192}}
    assert BASE["engine"]["max_num_seqs"] == 256
    assert out["engine"] is not BASE["engine"]


def test_set_creates_missing_mappings():
    out = set_dotted(BASE, "speculative_config.num_speculative_tokens", 3)
    assert out["speculative_config"] == {"num_speculative_tokens": 3}
    assert set_dotted(None, "a.b.c", 1) == {"a": {"b": {"c": 1}}}


def test_set_top_level_and_mapping_value_replaces_whole_mapping():
    assert set_dotted(BASE, "hardware", "h200-sxm")["hardware"] == "h200-sxm"
    out = set_dotted(BASE, "engine", {"max_num_seqs": 8})
    assert out["engine"] == {"max_num_seqs": 8}


def test_set_value_is_copied():
    value = {"method": "eagle", "num_speculative_tokens": 3}
    out = set_dotted(BASE, "speculative_config", value)
    value["num_speculative_tokens"] = 5
    assert out["speculative_config"]["num_speculative_tokens"] == 3


def test_set_through_null_creates_mapping():
    assert set_dotted({"a": None}, "a.b", 2) == {"a": {"b": 2}}


def test_digit_part_addresses_existing_int_key():
    data = {"num_speculative_tokens_per_batch_size": {1: 4, 64: 2}}
    out = set_dotted(data, "num_speculative_tokens_per_batch_size.64", 1)
    assert out["num_speculative_tokens_per_batch_size"] == {1: 4, 64: 1}


def test_middle_key_holding_scalar_is_an_error_naming_the_key():
    with pytest.raises(ConfigError) as exc:
        set_dotted(BASE, "hardware.name", "x", source="sweep.yaml")
    text = one_line(exc)
    assert text.startswith("sweep.yaml:") and "'hardware'" in text and "not a mapping" in text


@pytest.mark.parametrize("key", ["", "a..b", ".a", "a.", "a b", "a.b=c"])
def test_malformed_keys_are_rejected(key):
    with pytest.raises(ConfigError) as exc:
        split_key(key, "--set")
    assert one_line(exc).startswith("--set:")


def test_non_mapping_config_is_rejected():
    with pytest.raises(ConfigError):
        set_dotted([1, 2], "a", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("engine.max_num_seqs=128", "engine.max_num_seqs", 128),
        ("workload.rate=0.5", "workload.rate", 0.5),
        ("engine.enable_chunked_prefill=false", "engine.enable_chunked_prefill", False),
        ("hardware=h200-sxm", "hardware", "h200-sxm"),
        ("x=[1, 2, 4]", "x", [1, 2, 4]),
        (
            'speculative_config={"method": "eagle", "num_speculative_tokens": 3}',
            "speculative_config",
            {"method": "eagle", "num_speculative_tokens": 3},
        ),
        ("speculative_config={method: ngram, prompt_lookup_max: 4}", "speculative_config",
         {"method": "ngram", "prompt_lookup_max": 4}),
        ("  engine.max_num_seqs =64", "engine.max_num_seqs", 64),
        ("note=a=b", "note", "a=b"),
        ("seed=null", "seed", None),
        ("name='128'", "name", "128"),
    ],
)
def test_parse_assignment_values_follow_yaml(text, key, value):
    assert parse_assignment(text) == (key, value)


@pytest.mark.parametrize("text", ["engine.max_num_seqs", "=3", "a..b=1", "x=[1, 2", "x={a: 1", "seed=", "seed=  ",
                                  "x={a: 1, a: 2}"])
def test_malformed_assignment_is_one_line_config_error(text):
    with pytest.raises(ConfigError) as exc:
        parse_assignment(text)
    assert one_line(exc).startswith("--set:")
    assert issubclass(ConfigError, ServesimError)


def test_apply_assignments_in_order_later_wins():
    out = apply_assignments(BASE, ["engine.max_num_seqs=64", "engine.max_num_seqs=32", "workload.rate=2"])
    assert out["engine"]["max_num_seqs"] == 32
    assert out["workload"] == {"rate": 2}
    assert BASE["engine"]["max_num_seqs"] == 256
