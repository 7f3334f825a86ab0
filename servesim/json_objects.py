"""JSON objects that name each key once: ``json.loads`` keeps the last of a repeated key silently, so every
JSON input servesim reads (Hugging Face ``config.json``, cards, traces, ``--speculative-config``, bench results,
acceptance logs) is parsed by :func:`loads_unique`, with :func:`unique_json_keys` as its
``object_pairs_hook``, as the YAML loader refuses a repeated key."""

from __future__ import annotations

import json
from typing import Any


class DuplicateJSONKey(ValueError):
    """A JSON object names a key twice (``json.loads`` would keep the last value silently); ``args[0]`` is
    the key."""


def shown_key(key: str) -> str:
    """``key`` as an error message shows it: as written when it is printable, else quoted with its escapes
    (a key holding a newline would split the one-line error)."""
    return key if key and key.isprintable() else repr(key)


def unique_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` that refuses a key given twice in one object, as the YAML
    loader does.

    Raises:
        DuplicateJSONKey: the key given twice.
    """
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateJSONKey(key)
            seen.add(key)
    return obj


class JSONTooDeep(ValueError):
    """JSON whose arrays and objects nest deeper than Python's recursion limit lets ``json.loads`` read."""


def loads_unique(text: str) -> Any:
    """``json.loads`` with :func:`unique_json_keys`, and nesting too deep to read as a ``ValueError``.

    Raises:
        json.JSONDecodeError: invalid JSON. DuplicateJSONKey: a key given twice in one object. JSONTooDeep:
            collections nested too deeply to read (``RecursionError`` in the parser). ValueError: an integer
            of more digits than ``int()`` converts (``sys.get_int_max_str_digits``).
    """
    try:
        return json.loads(text, object_pairs_hook=unique_json_keys)
    except RecursionError:
        raise JSONTooDeep("collections nested too deeply to read") from None


def loads_line(line: str, where: str) -> Any:
    """One line of a JSON-lines input, parsed by :func:`loads_unique`; its mistakes as one line naming
    ``where`` (the file and line: ``"PATH: line N"``).

    Raises:
        TraceError: a key given twice, invalid JSON (also nesting too deep to read or an integer of more
            digits than ``int()`` converts).
    """
    from servesim.errors import TraceError

    try:
        return loads_unique(line)
    except DuplicateJSONKey as exc:
        raise TraceError(f"{where}: key {exc.args[0]!r} given twice (expected each key once)") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: invalid JSON ({exc.msg})") from None
    except ValueError as exc:  # too deep, or an integer of more digits than int() converts
        raise TraceError(f"{where}: invalid JSON ({exc})") from None
