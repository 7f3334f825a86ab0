"""YAML loading and pydantic validation with one-line, user-facing errors.

Every config file in servesim (run configs, sweep files, hardware and model cards, acceptance profiles)
goes through :func:`load_yaml` and :func:`validate`, so that a user mistake always reads
``FILE: field.path: what was expected (got VALUE)`` and never shows a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from servesim.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file with ``yaml.safe_load``.

    Raises:
        ConfigError: the file is missing, unreadable, or not valid YAML (the message gives the line).
    """
    p = Path(path)
    text = read_text(p)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}:{where}: invalid YAML: {problem}") from None


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file.

    Raises:
        ConfigError: the file is missing or unreadable (one line naming it).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read file ({exc.strerror})") from None


def load_json(path: str | Path) -> Any:
    """Read a JSON file.

    Raises:
        ConfigError: missing, unreadable or invalid JSON (one line with the line and column).
    """
    import json

    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """Turn a pydantic ``ValidationError`` into one line naming ``source`` and the first bad field."""
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err.get("loc", ()) if not _is_union_tag(part))
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):  # pydantic's prefix for our own validators' messages
        msg = msg[len("Value error, "):]
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "required key is missing"
    got = err.get("input")
    shown = ""
    if kind not in ("missing", "extra_forbidden") and not isinstance(got, (dict, list)):
        shown = f" (got {got!r})"
    more = len(exc.errors()) - 1
    tail = f" [and {more} more error{'s' if more > 1 else ''}]" if more > 0 else ""
    field = f" {loc}:" if loc else ""
    return f"{source}:{field} {msg}{shown}{tail}"


def _is_union_tag(part: Any) -> bool:
    # pydantic puts the tag of a discriminated union (or a function-validator name) into the location
    # path; such parts read like "function-after[...]" and mean nothing to a user.
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def validate(model: type[M], data: Any, source: str) -> M:
    """Validate ``data`` against the pydantic ``model``.

    Args:
        model: the pydantic model class.
        data: the parsed YAML/JSON/Python mapping.
        source: what to name in the error (a file path, or e.g. ``--speculative-config``).

    Raises:
        ConfigError: one line ``source: field.path: message (got value)``.
    """
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
