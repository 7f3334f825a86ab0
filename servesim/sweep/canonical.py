"""Canonical JSON of sweep values: equal content gives equal text (the input of point ids, seeds and input
hashes, and the comparison of a grid's values)."""

from __future__ import annotations

import json
from typing import Any


def _plain(value: Any) -> Any:
    # Canonical form for hashing: mapping keys as strings (YAML allows int keys), tuples as lists.
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """JSON text with sorted keys and no spaces: equal content gives equal text (the hash input)."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
