"""YAML loading and pydantic validation with one-line, user-facing errors.

Every config file in servesim (run configs, sweep files, hardware and model cards, acceptance profiles)
goes through :func:`load_yaml` and :func:`validate`, so that a user mistake always reads
``FILE: field.path: what was expected (got VALUE)`` and never shows a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, RootModel, ValidationError

from servesim.errors import ConfigError
from servesim.input_models import BOOL_FOR_NUMBER_ERRORS

M = TypeVar("M", bound=BaseModel)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping names the same key twice (``yaml.safe_load`` would silently keep the last one)."""


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a duplicate key (raises :class:`DuplicateKeyError`).

    A key written in a mapping may still override one merged into it with ``<<: *anchor`` (YAML's merge
    key): that is the merge key's purpose, not a duplicate; two merge keys in one mapping are a duplicate
    (``<<: [*a, *b]`` merges several). The pure-Python parser only: PyYAML's libyaml parser accepts some
    text this one refuses (a tab after ``key:`` in a flow mapping), so a file would load or fail depending
    on how PyYAML was built.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        if isinstance(node, yaml.MappingNode):
            # only the keys written in this mapping: a key may override one merged in with ``<<: *anchor``
            merges = 0
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    merges += 1
                    if merges > 1:
                        raise DuplicateKeyError(None, None, "duplicate merge key '<<' (merge several mappings "
                                                "with <<: [*a, *b])", key_node.start_mark)
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if duplicate:
                    raise DuplicateKeyError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def safe_load_strict(text: str) -> Any:
    """``yaml.safe_load`` that also refuses duplicate keys in a mapping.

    Raises:
        yaml.YAMLError: invalid YAML or a duplicate key (:class:`DuplicateKeyError`, with its mark).
    """
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file with a safe loader that also refuses duplicate keys.

    Raises:
        ConfigError: the file is missing, unreadable, not UTF-8, not valid YAML, or names a key twice in
            one mapping (the message gives the line).
    """
    p = Path(path)
    text = read_text(p)
    try:
        return safe_load_strict(text)
    except RecursionError:
        raise ConfigError(f"{p}: invalid YAML: collections nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = getattr(exc, "position", None)  # a ReaderError (a character YAML does not allow) has no mark
        if mark is not None:
            where = f" line {mark.line + 1}, column {mark.column + 1}:"
        elif isinstance(position, int):
            line_start = text.rfind("\n", 0, position) + 1
            where = f" line {text.count(chr(10), 0, position) + 1}, column {position - line_start + 1}:"
        else:
            where = ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}:{where} invalid YAML: {problem}") from None


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file (a leading byte-order mark, as Excel and Notepad write one, is dropped).

    Raises:
        ConfigError: the file is missing, unreadable or not UTF-8 text (one line naming it and, for bad
            bytes, the line and the byte offset).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8").removeprefix("\ufeff")
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8_message(p, exc)) from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read file ({exc.strerror})") from None


def not_utf8_message(path: str | Path, exc: UnicodeDecodeError) -> str:
    """One line saying that ``path`` is not UTF-8 text, with the line and column (bytes from the line's start,
    1-based) of the first bad byte and its value."""
    data = exc.object
    if not isinstance(data, (bytes, bytearray)):
        return f"{path}: not UTF-8 text; save the file as UTF-8"
    line = data[: exc.start].count(b"\n") + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return (f"{path}: line {line}, column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
            "save the file as UTF-8")


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text whose objects name each key once.

    Raises:
        json.JSONDecodeError: invalid JSON (the caller words it). ConfigError: a key given twice in one
            object (one line naming ``source`` and the key).
    """
    import json

    from servesim.json_objects import DuplicateJSONKey, loads_unique, shown_key

    try:
        return loads_unique(text)
    except DuplicateJSONKey as exc:
        raise ConfigError(f"{source}: {shown_key(exc.args[0])}: key given twice in one JSON object (expected "
                          "each key once; JSON readers keep the last value silently)") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise ConfigError(f"{source}: invalid JSON ({exc})") from None


def load_json(path: str | Path) -> Any:
    """Read a JSON file whose objects name each key once.

    Raises:
        ConfigError: missing, unreadable or invalid JSON (one line with the line and column), or a key given
            twice in one object.
    """
    import json

    text = read_text(path)
    try:
        return parse_json(text, str(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None


def user_path(loc: tuple, data: Any = None, *, key_error: bool = True) -> str:
    """The dotted path a user can type with ``--set`` for a pydantic error location ``loc``.

    pydantic puts the tags of unions into the location (``workload.trace.rate_scale`` for the ``trace``
    member of the workload union, ``hardware.str`` for the ``str`` member of ``str | dict``). Walking the
    validated ``data`` drops them: a part is kept when it is a key (or list index) of the data at that
    level, or when it is the last part (a missing or unknown key); any other part is a tag and dropped,
    as are the parts below a scalar.

    Args:
        loc: pydantic's ``error["loc"]``.
        data: the input that was validated (a mapping); None keeps every part that is not a tag.
        key_error: the error is about the last part as a key (missing or unknown), so it is kept even
            though the data lacks it; otherwise (a model validator's error on a union member,
            ``workload.prompt_tokens.uniform``) a last part that is not in the data is a tag and dropped.
    """
    parts = [part for part in loc if not _is_union_tag(part)]
    if data is None:
        return ".".join(str(part) for part in parts)
    kept: list[str] = []
    node: Any = data
    for i, part in enumerate(parts):
        found, child = _child(node, part)
        if found:
            kept.append(str(part))
            node = child
            continue
        if not isinstance(node, (dict, list)):
            break  # a scalar has no keys: the remaining parts are union tags (``str``, ``int`` ...)
        if i + 1 < len(parts) or not key_error:
            continue  # not a key of the data and not the last part (or not a key error): a tag
        kept.append(str(part))  # the missing or unknown key itself
    return ".".join(kept)


def _child(node: Any, part: Any) -> tuple[bool, Any]:
    if isinstance(node, dict):
        for key in (part, str(part)) + ((int(part),) if isinstance(part, str) and part.isdigit() else ()):
            if key in node:
                return True, node[key]
        return False, None
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return True, node[part]
    return False, None


#: Longest repr of a wrong value an error message quotes (a CSV given as a YAML file is one long string).
SHOWN_VALUE_CHARS = 80


def shown_value(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`SHOWN_VALUE_CHARS` characters with the value's
    length (a whole trace file read as one YAML string was quoted back, 700 KB on one line)."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    size = f" of {len(value):,} characters" if isinstance(value, str) else ""
    return f"{text[:SHOWN_VALUE_CHARS - 3]}... (a {type(value).__name__}{size})"


def shown_found(value: Any) -> str:
    """What an error says was found where a mapping was expected: ``an empty file`` for None (a YAML file
    with nothing in it), ``a list`` (its items would be noise), else :func:`shown_value`."""
    if value is None:
        return "an empty file"
    return "a list" if isinstance(value, list) else shown_value(value)


def format_validation_error(exc: ValidationError, source: str, data: Any = None, key_prefix: str | None = None,
                            model: type[BaseModel] | None = None) -> str:
    """Turn a pydantic ``ValidationError`` into one line naming ``source`` and the first bad field.

    The field is written as a dotted key that ``--set`` accepts (see :func:`user_path`; pass the
    validated ``data`` for that), after ``key_prefix`` when the data sits at that key of a run config.
    An unknown key close to a key of ``model`` at its level (or to a required key reported missing beside
    it, as a misspelt required key is) is reported first, with ``(did you mean KEY?)``.
    """
    errors = exc.errors()
    # a boolean where a number was expected is the precise diagnosis, also when pydantic lists first what
    # another member of a union (``str | int``, a list or a mapping) expected
    err = next((e for e in errors if e.get("type") in BOOL_FOR_NUMBER_ERRORS), errors[0])
    suggestion = None
    for extra in (e for e in errors if e.get("type") == "extra_forbidden" and e.get("loc")):
        loc_extra = tuple(extra["loc"])
        missing = [str(e["loc"][-1]) for e in errors
                   if e.get("type") == "missing" and tuple(e.get("loc", ()))[:-1] == loc_extra[:-1]]
        suggestion = _close_key(loc_extra[-1], missing)
        if suggestion is not None:  # a misspelt required key: the typo is the diagnosis, not the missing key
            err = extra
            break
    kind = err.get("type", "")
    if kind == "extra_forbidden" and suggestion is None and model is not None:
        suggestion = _close_key(err["loc"][-1], _keys_at(model, tuple(err["loc"])[:-1]))
    loc = _user_field(err, data, key_prefix)
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):  # pydantic's prefix for our own validators' messages
        msg = msg[len("Value error, "):]
    got = err.get("input")
    shown = ""
    if kind == "extra_forbidden":
        msg = "unknown key" + (f" (did you mean {suggestion}?)" if suggestion is not None else "")
    elif kind == "missing":
        msg = "required key is missing"
    elif kind == "union_tag_not_found":  # a discriminated union's tag key (e.g. a workload's ``type``)
        tag = str(err.get("ctx", {}).get("discriminator", "type")).strip("'")
        loc = f"{loc}.{tag}" if loc else tag
        msg = "required key is missing"
    elif kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        tag = str(ctx.get("discriminator", "type")).strip("'")
        loc = f"{loc}.{tag}" if loc else tag
        msg = f"unknown {tag} {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        msg = "expected a mapping (key: value pairs)"
        # None at a key is the key written without a value (``engine:``), not an empty file
        shown = f" (got {'no value' if got is None and loc else shown_found(got)})"
    elif not isinstance(got, (dict, list)) and kind not in BOOL_FOR_NUMBER_ERRORS:
        shown = f" (got {shown_value(got)})"
    elif kind.endswith("_type"):  # a mapping or list where a value of another type was expected
        shown = " (got a mapping)" if isinstance(got, dict) else " (got a list)"
    more = len(errors) - 1
    others: list[str] = []  # the other errors' fields, so that one run tells every field to fix
    for other in errors:
        path = _user_field(other, data, key_prefix) if other is not err else ""
        if path and path != loc and path not in others:
            others.append(path)
    fields = f": {', '.join(others[:4])}{', ...' if len(others) > 4 else ''}" if others else ""
    tail = f" [and {more} more error{'s' if more > 1 else ''}{fields}]" if more > 0 else ""
    field = f" {loc}:" if loc else ""
    return f"{source}:{field} {msg}{shown}{tail}"


def _user_field(error: dict, data: Any, key_prefix: str | None) -> str:
    """A pydantic error's field as the user types it (:func:`user_path`), below ``key_prefix`` if given."""
    path = user_path(tuple(error.get("loc", ())), data, key_error=error.get("type") in ("missing", "extra_forbidden"))
    if not key_prefix:
        return path
    return f"{key_prefix}.{path}" if path else key_prefix


def _close_key(key: Any, known: Any) -> str | None:
    """The key of ``known`` that ``key`` most likely misspells (:func:`difflib.get_close_matches`), or None."""
    import difflib

    if not isinstance(key, str):
        return None
    matches = difflib.get_close_matches(key, sorted(set(known) - {key}), n=1, cutoff=0.75)
    return matches[0] if matches else None


def _keys_at(model: type[BaseModel], loc: tuple) -> set[str]:
    """The keys (field names and aliases) that the models at pydantic location ``loc`` under ``model`` take.

    A part of ``loc`` that is no field is a union tag: it keeps the models one of whose ``Literal`` fields
    (a discriminator) allows it, or all of them. Empty when the location cannot be followed.
    """
    models = [model]
    if issubclass(model, RootModel):  # a file whose whole content is one model (a workload file): its errors' loc
        models = _models_in(model.model_fields["root"].annotation)  # starts inside the root
    for part in loc:
        fields = [(m, m.model_fields.get(part) or next((f for f in m.model_fields.values() if f.alias == part), None))
                  for m in models]
        if any(f is not None for _, f in fields):
            # a mapping field checked by a validator against its own model names it (SimConfig.mapping_models)
            models = [sub for m, f in fields if f is not None
                      for sub in (_models_in(f.annotation) or getattr(m, "mapping_models", lambda _: [])(part))]
        else:
            tagged = [m for m in models if any(part in _literals(f.annotation) for f in m.model_fields.values())]
            models = tagged or models
        if not models:
            return set()
    return {key for m in models for name, f in m.model_fields.items() for key in (name, f.alias) if key}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through unions, ``Annotated``, lists and dict values)."""
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _literals(annotation: Any) -> tuple:
    """The values of a ``Literal[...]`` annotation (also inside ``Annotated``/``Optional``), else ()."""
    from typing import Literal, get_args, get_origin

    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return tuple(v for arg in get_args(annotation) for v in _literals(arg))


def _is_union_tag(part: Any) -> bool:
    # pydantic puts the tag of a discriminated union (or a function-validator name) into the location
    # path; such parts read like "function-after[...]" and mean nothing to a user.
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def validate(model: type[M], data: Any, source: str, *, key_prefix: str | None = None) -> M:
    """Validate ``data`` against the pydantic ``model``.

    Args:
        model: the pydantic model class.
        data: the parsed YAML/JSON/Python mapping.
        source: what to name in the error (a file path, or e.g. ``--speculative-config``).
        key_prefix: the dotted key of ``data`` inside a run config (e.g. ``speculative_config``), so that
            the field path in the message is a key ``--set`` accepts.

    Raises:
        ConfigError: one line ``source: field.path: message (got value)``.
    """
    if data is None:
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            format_validation_error(exc, source, data if isinstance(data, dict) else None, key_prefix, model)
        ) from None
