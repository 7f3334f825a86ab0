"""YAML files are read with libyaml's parser when PyYAML has it (``servesim.input_files.safe_load_strict``),
with the same data and, for a mistake, the same one-line message as the pure-Python parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesim import input_files
from servesim.errors import ConfigError
from servesim.input_files import StrictSafeLoader, load_yaml, safe_load_strict

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for folder in ("experiments", "hardware", "workloads", "benchmarks", "tests/data")
                 for p in (ROOT / folder).rglob("*.yaml"))


def test_every_shipped_yaml_reads_as_the_python_parser_reads_it():
    assert len(SHIPPED) > 50  # configs, cards, acceptance profiles, sweep files
    differ = [p.relative_to(ROOT) for p in SHIPPED
              if safe_load_strict(p.read_text(encoding="utf-8"))
              != yaml.load(p.read_text(encoding="utf-8"), Loader=StrictSafeLoader)]  # noqa: S506
    assert differ == []


# (text, the pure-Python parser's message as load_yaml words it); libyaml words most of these differently
MISTAKES = [
    ("a: b: c\n", "line 1, column 5: invalid YAML: mapping values are not allowed here"),
    ("a: [1,2\n", "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
    ("a:\n\t- 1\n", "line 2, column 1: invalid YAML: found character '\\t' that cannot start any token"),
    ("- a\nb: 1\n", "line 2, column 1: invalid YAML: expected <block end>, but found '?'"),
    ("a: *nope\n", "line 1, column 4: invalid YAML: found undefined alias 'nope'"),
    ("a: 1\nb: 2\na: 3\n", "line 3, column 1: invalid YAML: duplicate key 'a'"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_a_mistake_is_worded_by_the_python_parser(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_yaml(path)
    assert str(caught.value) == f"{path}: {message}"


def test_merge_keys_still_override_and_duplicates_inside_a_merge_are_refused():
    text = "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n"
    assert safe_load_strict(text) == {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        safe_load_strict("c:\n  <<: {x: 1}\n  x: 2\n  x: 3\n")


@pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML built without libyaml")
def test_valid_yaml_does_not_go_through_the_python_parser(monkeypatch):
    class Refuses(StrictSafeLoader):
        def __init__(self, stream):
            raise AssertionError("the pure-Python parser read valid YAML")

    monkeypatch.setattr(input_files, "StrictSafeLoader", Refuses)
    assert safe_load_strict("engine: {max_num_seqs: 128}\nseed: 0\n") == {"engine": {"max_num_seqs": 128}, "seed": 0}
    with pytest.raises(AssertionError, match="pure-Python parser"):
        safe_load_strict("a: b: c\n")  # a mistake is worded by it
