"""YAML reading (``servesim.input_files``): one parser everywhere (PyYAML's pure-Python one: libyaml
accepts text it refuses, such as a tab after ``key:`` in a flow mapping, so a file would load on one install
and fail on another), merge keys, and one-line messages for every mistake, with its line and column."""

from __future__ import annotations

import pytest
import yaml

from servesim.errors import ConfigError
from servesim.input_files import load_yaml, safe_load_strict

# (text, the message load_yaml gives)
MISTAKES = [
    ("a: b: c\n", "line 1, column 5: invalid YAML: mapping values are not allowed here"),
    ("a: [1,2\n", "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
    ("a:\n\t- 1\n", "line 2, column 1: invalid YAML: found character '\\t' that cannot start any token"),
    ("a: {b:\t1}\n", "line 1, column 7: invalid YAML: found character '\\t' that cannot start any token"),
    ("- a\nb: 1\n", "line 2, column 1: invalid YAML: expected <block end>, but found '?'"),
    ("a: *nope\n", "line 1, column 4: invalid YAML: found undefined alias 'nope'"),
    ("a: 1\nb: 2\na: 3\n", "line 3, column 1: invalid YAML: duplicate key 'a'"),
    ("c:\n  <<: {x: 1}\n  <<: {x: 2}\n",
     "line 3, column 3: invalid YAML: duplicate merge key '<<' (merge several mappings with <<: [*a, *b])"),
    ("a: 1\nb: x\x07y\n", "line 2, column 5: invalid YAML: unacceptable character #x0007: special characters "
                          "are not allowed"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "invalid YAML: collections nested too deeply to read"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_a_mistake_is_one_line_with_its_place(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_yaml(path)
    assert str(caught.value) == f"{path}: {message}"


def test_merge_keys_still_override_and_duplicates_inside_a_merge_are_refused():
    text = "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n"
    assert safe_load_strict(text) == {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}
    several = "a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: [*a, *b]\n  z: 3\n"
    assert safe_load_strict(several)["c"] == {"x": 1, "y": 2, "z": 3}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        safe_load_strict("c:\n  <<: {x: 1}\n  x: 2\n  x: 3\n")
