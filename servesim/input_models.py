"""The base of every pydantic model that servesim validates user input with.

Numbers must be finite (``allow_inf_nan=False``: ``.nan`` or ``.inf`` for a time, a rate or a size is a
mistake that would otherwise end in a traceback or a run without end), and must not be booleans; a
boolean must be ``true`` or ``false`` (pydantic's lax ``0``, ``1``, ``"off"``, ``"yes"`` are refused); a
whole number in exponent form (``num_requests: 1e4``, which YAML 1.1 reads as a string) is an integer.

pydantic's lax mode turns a boolean into a number (``True`` -> ``1``, ``1.0``), so a YAML ``true``, ``yes``
or ``on`` (or ``--set engine.max_num_seqs=true``) where an integer or a float is expected would run
silently with 1. :class:`InputModel` refuses that for every integer and float in a model's fields, however
deeply they sit (``int | None``, ``list[tuple[int, int, int]]``, ``dict[int, int]``, a discriminated union's
members), while everything else stays lax as before: strings for Literals, integers for floats,
``"128"`` for an integer. The refusal is a pydantic error of type :data:`BOOL_FOR_NUMBER_ERRORS`, which
:func:`servesim.input_files.format_validation_error` reports as ``FILE: field.path: expected an integer,
got a boolean``.

How: the model's core schema (built when pydantic builds the model, so ``defer_build`` keeps its effect)
gets a before-validator in front of every ``int``, ``float`` and ``bool`` schema in it.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

#: pydantic error types of a boolean given where a number was expected.
BOOL_FOR_NUMBER_ERRORS = ("bool_for_int", "bool_for_float")

# keys of a core schema whose values are data or serialisation, not validation schemas
_NOT_VALIDATION = frozenset({"metadata", "serialization", "default", "expected"})


#: A number written with an exponent (``1e4``, ``2.5E+3``): YAML 1.1, which PyYAML reads, takes ``1e4`` (no
#: dot) for a string, and pydantic's integer parsing refuses it.
_EXPONENT_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d+")


def number_value(value: Any) -> float | None:
    """``value`` as the number a float field reads it as, before validation: an int or float (not a bool),
    or a number in exponent form that YAML 1.1 left a string (``memory_bytes: 80e9``); else None."""
    if value.__class__ is bool:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value.__class__ is str and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


def _refuse_bool_for_int(value: Any) -> Any:
    if value.__class__ is bool:
        raise PydanticCustomError("bool_for_int", "expected an integer, got a boolean")
    if value.__class__ is str and _EXPONENT_NUMBER.fullmatch(value.strip()):
        number = float(value)  # a whole number in exponent form (num_requests: 1e4) is that integer
        if number.is_integer():
            return int(number)
    return value


def _refuse_bool_for_float(value: Any) -> Any:
    if value.__class__ is bool:
        raise PydanticCustomError("bool_for_float", "expected a number, got a boolean")
    return value


def _refuse_other_for_bool(value: Any) -> Any:
    if value.__class__ is bool:
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):  # numpy.bool_: a boolean, from pandas/numpy
        return bool(value)
    raise PydanticCustomError("other_for_bool", "expected true or false")


_GUARDS = {"int": _refuse_bool_for_int, "float": _refuse_bool_for_float, "bool": _refuse_other_for_bool}
_GUARD_FUNCTIONS = frozenset(_GUARDS.values())


def refuse_bools_for_numbers(schema: Any) -> Any:
    """A copy of the pydantic core ``schema`` in which every ``int`` and ``float`` schema refuses a bool.

    Idempotent: a schema that already has the guard (a nested model built before) is kept as it is.
    """
    if isinstance(schema, list):
        return [refuse_bools_for_numbers(item) for item in schema]
    if isinstance(schema, tuple):
        return tuple(refuse_bools_for_numbers(item) for item in schema)
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if kind == "function-before" and schema.get("function", {}).get("function") in _GUARD_FUNCTIONS:
        return schema
    copied = {key: value if key in _NOT_VALIDATION else refuse_bools_for_numbers(value)
              for key, value in schema.items()}
    if isinstance(kind, str) and kind in _GUARDS:
        return core_schema.no_info_before_validator_function(_GUARDS[kind], copied)
    return copied


class InputModel(BaseModel):
    """``pydantic.BaseModel`` whose numbers are finite, whose integer and float fields refuse booleans and
    whose boolean fields take only booleans.

    Subclasses set their own ``model_config`` (``extra="forbid"``, ``defer_build`` ...); pydantic merges it
    with this one.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler, /) -> CoreSchema:
        return refuse_bools_for_numbers(handler(source))
