"""Expansion of a sweep into points, their stable ids, and their seeds.

A point is one combination of grid values, zip-group values and a variant. Its id and its seeds depend
only on its content (the variant's name and overrides and the swept values), never on its position in
the sweep, so adding, removing or reordering points leaves every other point's id, seeds and results
unchanged (and a resumed sweep finds its finished points).

Seeds: one root ``numpy.random.SeedSequence(entropy=seed)``; the child for (point, replication ``r``)
is ``SeedSequence(entropy=seed, spawn_key=(point.key_int, r))``, the same construction as
``SeedSequence.spawn`` with a content-derived first spawn key. The key depends on the swept values and
not on the variant: the variants of a point see the same requests and draws (common random numbers). The integer handed to ``simulate`` is 63
bits drawn from that child (:func:`task_seed`), so ``servesim run --seed S`` reproduces a row of
summary.csv.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servesim.config.overrides import set_dotted
from servesim.sweep.canonical import canonical_json
from servesim.sweep.spec import LoadedSweep

#: Variant name of every point of a sweep that declares no variants.
DEFAULT_VARIANT = "default"


@dataclass(frozen=True)
class Point:
    """One point of a sweep.

    Attributes:
        index: position in the expansion order (grid, last key fastest; then zip groups; then variants).
        variant: the variant's name (``"default"`` without variants).
        variant_overrides: the variant's dotted key -> value overrides (applied first).
        axes: swept dotted key -> value, in the sweep file's order (applied after the variant).
        point_id: 12 hex digits of the SHA-256 of the canonical JSON of (variant, overrides, axes).
        key_int: the point's spawn key: the first 64 bits of the SHA-256 of its swept values alone, so
            that all variants of a point use common random numbers.
    """

    index: int
    variant: str
    variant_overrides: dict[str, Any] = field(hash=False)
    axes: dict[str, Any] = field(hash=False)
    point_id: str
    key_int: int

    def overrides(self) -> dict[str, Any]:
        """All dotted overrides of this point, in the order they are applied (variant, then axes)."""
        merged = dict(self.variant_overrides)
        merged.update(self.axes)
        return merged


def point_identity(variant: str, variant_overrides: dict[str, Any], axes: dict[str, Any]) -> tuple[str, int]:
    """Return ``(point_id, key_int)`` for a point's content (see :class:`Point`).

    The id covers the variant and the swept values; the seed key covers the swept values only, so the
    variants of one point share their random numbers (same requests, same acceptance draws): a comparison
    between variants (``speedup.csv``) measures the variants, not the noise between two workloads.
    """
    text = canonical_json({"variant": variant, "variant_overrides": variant_overrides, "axes": axes})
    digest = hashlib.sha256(text.encode("ascii")).hexdigest()
    seed_digest = hashlib.sha256(canonical_json({"axes": axes}).encode("ascii")).hexdigest()
    return digest[:12], int(seed_digest[:16], 16)


def count_points(sweep: LoadedSweep) -> int:
    """Number of points of ``sweep`` (:func:`iter_points` yields this many), without expanding them:
    ``len(grid_1) * ... * len(zip_group_1) * ... * max(1, len(variants))``."""
    cfg = sweep.config
    count = max(1, len(cfg.variants))
    for values in cfg.grid.values():
        count *= len(values)
    for group in cfg.zip:
        count *= len(next(iter(group.values())))
    return count


def expand_points(sweep: LoadedSweep) -> list[Point]:
    """All points of ``sweep`` as a list (see :func:`iter_points`; for small sweeps and tests)."""
    return list(iter_points(sweep))


def iter_points(sweep: LoadedSweep) -> Iterator[Point]:
    """The points of ``sweep`` one at a time, in expansion order: grid (cartesian, last key varying
    fastest), then zip groups (one axis each), then variants (innermost). Memory does not grow with the
    number of points (:func:`count_points` of them)."""
    cfg = sweep.config
    axes: list[list[dict[str, Any]]] = []
    for key, values in cfg.grid.items():
        axes.append([{key: v} for v in values])
    for group in cfg.zip:
        length = len(next(iter(group.values())))
        axes.append([{key: values[i] for key, values in group.items()} for i in range(length)])
    variants = list(cfg.variants.items()) or [(DEFAULT_VARIANT, {})]
    index = 0
    for combo in itertools.product(*axes):
        values: dict[str, Any] = {}
        for part in combo:
            values.update(part)
        for name, overrides in variants:
            point_id, key_int = point_identity(name, overrides, values)
            yield Point(index, name, dict(overrides), dict(values), point_id, key_int)
            index += 1


def point_config(sweep: LoadedSweep, point: Point) -> dict[str, Any]:
    """The run config of ``point``: the base with the variant's overrides, then the swept values, set
    (a ``workload`` given as a workload file is read, as a run config's is).

    Raises:
        ConfigError: an override runs into a non-mapping value of the base, or a workload file cannot be
            read (names the sweep file).
    """
    from servesim.config.models import inline_workload_file

    config = sweep.base
    for key, value in point.overrides().items():
        config = set_dotted(config, key, value, source=sweep.source)
    # a swept (or variant's) workload file, relative to the base config's folder as the base's own is
    return inline_workload_file(config, sweep.base_dir, sweep.source)


def seed_sequence(root_seed: int, point: Point, replication: int) -> np.random.SeedSequence:
    """The child ``SeedSequence(entropy=root_seed, spawn_key=(point.key_int, replication))``."""
    return np.random.SeedSequence(entropy=root_seed, spawn_key=(point.key_int, replication))


def task_seed(root_seed: int, point: Point, replication: int) -> int:
    """The seed (a non-negative int below 2**63) passed to ``simulate`` for (point, replication)."""
    hi, lo = seed_sequence(root_seed, point, replication).generate_state(2, dtype=np.uint32)
    return ((int(hi) << 32) | int(lo)) >> 1


def config_digest(config: dict[str, Any]) -> str:
    """SHA-256 hex digest of a run config's canonical JSON (detects a changed base on resume)."""
    return hashlib.sha256(canonical_json(config).encode("ascii")).hexdigest()
