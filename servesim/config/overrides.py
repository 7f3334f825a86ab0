"""Dotted-key overrides of a parsed run config: ``engine.max_num_seqs=128``.

Used by ``servesim run --set KEY=VALUE`` and by sweep files (grid axes, zip groups, variants), so that
both read and apply an override the same way:

* a key is a dotted path of mapping keys (``engine.max_num_seqs``); each part is made of letters, digits,
  ``_`` and ``-``;
* a value is parsed with ``yaml.safe_load`` (``128`` is an int, ``0.5`` a float, ``true`` a bool,
  ``[1, 2]`` a list, ``{method: eagle, num_speculative_tokens: 3}`` or JSON a mapping, ``null`` None,
  anything else a string); a value naming a key twice, and an empty value, are refused;
* setting a key replaces what was there (a mapping value replaces the whole mapping, it is not merged);
  missing mappings on the way are created.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from servesim.input_files import safe_load_strict
from servesim.errors import ConfigError

_PART = re.compile(r"[A-Za-z0-9_\-]+")


def split_key(key: str, source: str = "override") -> list[str]:
    """Split a dotted key ``"a.b.c"`` into its parts ``["a", "b", "c"]``.

    Raises:
        ConfigError: the key is empty or a part is empty or holds characters other than letters,
            digits, ``_`` and ``-`` (one line naming ``source`` and the key).
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{source}: empty key (expected a dotted key such as engine.max_num_seqs)")
    parts = key.split(".")
    for part in parts:
        if not _PART.fullmatch(part):
            raise ConfigError(
                f"{source}: invalid key {key!r} (expected dotted parts of letters, digits, '_' or '-',"
                " such as engine.max_num_seqs)"
            )
    return parts


def _lookup_key(mapping: Mapping[Any, Any], part: str) -> Any:
    # A YAML mapping may have integer keys (e.g. num_speculative_tokens_per_batch_size: {1: 4, 64: 2});
    # a dotted part of digits addresses such a key when the string key is absent.
    if part not in mapping and part.isdigit() and int(part) in mapping:
        return int(part)
    return part


def set_dotted(data: Mapping[str, Any] | None, key: str, value: Any, *, source: str = "override") -> dict:
    """Return a deep copy of ``data`` with the dotted ``key`` set to ``value``.

    ``set_dotted({"engine": {"max_num_seqs": 256}}, "engine.max_num_seqs", 128)`` returns
    ``{"engine": {"max_num_seqs": 128}}``; mappings missing on the way are created. Neither ``data``
    nor ``value`` is modified, and the result shares no mutable object with them.

    Args:
        data: the parsed config (a mapping; ``None`` reads as ``{}``).
        key: dotted key, e.g. ``"workload.prompt_tokens.value"``.
        value: any YAML-representable value; it replaces what was at ``key``.
        source: what to name in an error message (e.g. ``--set`` or a sweep file path).

    Raises:
        ConfigError: the key is malformed, ``data`` is not a mapping, or a key on the way holds a value
            that is not a mapping (one line naming ``source``, the key and what was found).
    """
    parts = split_key(key, source)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: cannot set {key!r}: the config is a {type(data).__name__}, not a mapping")
    result = copy.deepcopy(dict(data))
    node: dict = result
    for depth, part in enumerate(parts[:-1]):
        name = _lookup_key(node, part)
        child = node.get(name)
        if child is None:
            child = {}
        elif not isinstance(child, Mapping):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"{source}: cannot set {key!r}: {where!r} holds {child!r} ({type(child).__name__}), not a mapping"
            )
        elif not isinstance(child, dict):
            child = dict(child)
        node[name] = child
        node = child
    node[_lookup_key(node, parts[-1])] = copy.deepcopy(value)
    return result


def parse_assignment(text: str, *, source: str = "--set") -> tuple[str, Any]:
    """Parse ``"KEY=VALUE"`` into ``(key, value)``, the value read by ``yaml.safe_load``.

    ``parse_assignment("engine.max_num_seqs=128")`` returns ``("engine.max_num_seqs", 128)``;
    ``"speculative_config={method: eagle, num_speculative_tokens: 3}"`` gives a mapping; ``"x=null"``
    gives ``None`` (an empty value ``"x="`` is refused: it is usually a shell variable that was not set).
    Only the first ``=`` splits, so values may contain ``=``. Spaces around the key are ignored.

    Raises:
        ConfigError: no ``=``, an empty or malformed key, an empty value, or a value that is not valid
            YAML or names a key twice (one line naming ``source`` and the assignment).
    """
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(f"{source}: expected KEY=VALUE such as engine.max_num_seqs=128 (got {text!r})")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{source}: missing key before '=' in {text!r} (expected KEY=VALUE)")
    split_key(key, source)
    if not raw.strip():
        raise ConfigError(f"{source}: {key}: empty value in {text!r} (expected KEY=VALUE; write {key}=null to unset)")
    try:
        value = safe_load_strict(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: {key}: value {raw!r} is not valid YAML ({problem})") from None
    return key, value


def apply_assignments(data: Mapping[str, Any] | None, assignments: Iterable[str], *, source: str = "--set") -> dict:
    """Apply ``KEY=VALUE`` strings in order (later ones win) and return the new config (a deep copy).

    Raises:
        ConfigError: as :func:`parse_assignment` and :func:`set_dotted`.
    """
    result = copy.deepcopy(dict(data or {}))
    for text in assignments:
        key, value = parse_assignment(text, source=source)
        result = set_dotted(result, key, value, source=source)
    return result
