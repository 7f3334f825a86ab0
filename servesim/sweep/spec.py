"""Sweep files: what a user writes to vary a run config over a grid of settings.

A sweep file (YAML) reads::

    base: azure-conv-llama8b-h100.yaml      # run config, relative to the sweep file, or an inline mapping
    grid:                                   # cartesian product over dotted keys
      engine.max_num_seqs: [64, 256]
      workload.rate_scale: [1, 2, 4]
    zip:                                    # groups of equal-length lists varied together
      - {hardware: [h100-sxm, h200-sxm], engine.max_num_batched_tokens: [8192, 8192]}
    variants:                               # named sets of dotted overrides
      plain: {}
      eagle: {speculative_config: {method: eagle, num_speculative_tokens: 3}}
    baseline: plain                         # compare every other variant with this one (speedup.csv)
    columns: {engine.max_num_seqs: batch}   # rename swept keys in summary.csv and speedup.csv
    replications: 3
    seed: 0

Points are grid x zip groups x variants (see :mod:`servesim.sweep.points`); each is run
``replications`` times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from servesim.input_models import InputModel
from servesim.input_files import load_yaml, validate
from servesim.config.overrides import split_key
from servesim.errors import ConfigError
from servesim.sweep.canonical import canonical_json

#: Columns of summary.csv that the runner writes itself; a swept key may not take one of these names.
RESERVED_COLUMNS = ("variant", "replication", "seed", "point_id")


def _invalid(message: str) -> PydanticCustomError:
    # A validation error whose message pydantic shows as is (a ValueError would read "Value error, ...").
    return PydanticCustomError("sweep_file", "{detail}", {"detail": message})


def _repeated(rows: list[list[Any]]) -> list[Any] | None:
    """The first row of values that appears twice in ``rows`` (compared as the points' canonical JSON,
    :func:`servesim.sweep.canonical.canonical_json`, a whole float as its integer: ``4.0`` repeats ``4``),
    or None."""
    seen: set[str] = set()
    for row in rows:
        text = canonical_json(_whole_floats_as_ints(row))
        if text in seen:
            return row
        seen.add(text)
    return None


def _whole_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_whole_floats_as_ints(item) for item in value]
    return value


def _check_key(key: str) -> str:
    try:
        split_key(key, "key")
    except ConfigError as exc:
        raise _invalid(str(exc).removeprefix("key: ")) from None
    return key


def _swept_key_over(key: str, swept: list[str]) -> str | None:
    """The swept key that ``key`` equals or lies inside (its values replace it), or None."""
    return next((other for other in swept if key == other or key.startswith(other + ".")), None)


def _keys_set_by(overrides: dict[str, Any]) -> list[str]:
    """The dotted keys a variant's overrides set (:func:`_set_keys` of each)."""
    return [leaf for key, value in overrides.items() for leaf in _set_keys(key, value)]


def _set_keys(key: str, value: Any) -> list[str]:
    """The dotted keys a variant's ``key: value`` sets: the leaves of a non-empty mapping, else ``key``."""
    if not isinstance(value, dict) or not value:
        return [key]
    return [leaf for sub, inner in value.items() for leaf in _set_keys(f"{key}.{sub}", inner)]


class SweepConfig(InputModel):
    """A sweep file, validated.

    Attributes:
        base: the run config: a path (relative to the sweep file's folder) or an inline mapping.
        grid: dotted key -> non-empty list of values; the points take the cartesian product.
        zip: groups, each a mapping dotted key -> list, all lists of a group of equal length; a group
            contributes one axis whose i-th value sets every key of the group to its i-th element.
        variants: name -> mapping of dotted key -> value, applied before the grid and zip values (so a
            grid key may refine a variant's setting). Without variants every point is variant
            ``"default"``.
        baseline: a variant name; every other variant is compared with it in speedup.csv.
        columns: swept key -> column name to use in summary.csv and speedup.csv.
        replications: runs per point (>= 1), each with its own seed.
        seed: root seed (>= 0) of the sweep's ``numpy.random.SeedSequence``.
    """

    model_config = ConfigDict(extra="forbid")

    base: str | dict[str, Any]
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    zip: list[dict[str, list[Any]]] = Field(default_factory=list)
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    baseline: str | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    replications: int = Field(1, ge=1)
    seed: int = Field(0, ge=0)

    @field_validator("base", mode="before")
    @classmethod
    def _base_path(cls, base: Any) -> Any:
        # an empty string is read as the sweep file's folder ("Is a directory"); a number, a list or no value
        # read "Input should be a valid string (got 5) [and 1 more error]", of a field that may be a mapping too
        if not isinstance(base, (str, dict)) or isinstance(base, str) and not base.strip():
            got = " (got a list)" if isinstance(base, list) else ""  # a scalar is shown after the message
            raise _invalid("expected the path of a run config file (relative to the sweep file) or an inline "
                           f"mapping of run settings{got}")
        return base

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            _check_key(key)
            if not values:
                raise _invalid(f"grid key {key!r} has an empty list of values")
            twice = _repeated([[value] for value in values])
            if twice is not None:
                raise _invalid(f"grid key {key!r} lists the value {twice[0]!r} twice (each point would run twice)")
        return grid

    @field_validator("zip", mode="before")
    @classmethod
    def _zip_is_a_list(cls, groups: Any) -> Any:
        if isinstance(groups, dict):  # one group written without its "- ": the likely mistake, said so
            raise _invalid("expected a list of groups, each a mapping of dotted keys to equal-length lists "
                           "(- {hardware: [h100-sxm, h200-sxm], engine.max_num_seqs: [64, 128]}), got a mapping")
        return groups

    @field_validator("zip")
    @classmethod
    def _zip_groups(cls, groups: list[dict[str, list[Any]]]) -> list[dict[str, list[Any]]]:
        for i, group in enumerate(groups):
            if not group:
                raise _invalid(f"zip group {i} is empty")
            lengths = {key: len(values) for key, values in group.items()}
            for key in group:
                _check_key(key)
            if len(set(lengths.values())) != 1:
                raise _invalid(f"zip group {i}: lists must have equal lengths (got {lengths})")
            if 0 in lengths.values():
                raise _invalid(f"zip group {i} has empty lists")
            twice = _repeated([list(values) for values in zip(*group.values())])
            if twice is not None:
                raise _invalid(f"zip group {i} lists the values {dict(zip(group, twice))} twice (each point "
                               "would run twice)")
        return groups

    @field_validator("variants")
    @classmethod
    def _variant_keys(cls, variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, overrides in variants.items():
            if not name:
                raise _invalid("a variant name is empty")
            for key in overrides:
                _check_key(key)
        return variants

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        keys = self.swept_keys()
        # every run's seed is the sweep's own (its root ``seed`` and the point's swept values): a run config's
        # seed set here would never reach a run (a variant's ran exactly as the others)
        setters = ["grid or zip key 'seed'"] * ("seed" in keys) + [
            f"variant {name!r}: 'seed'" for name, overrides in self.variants.items() if "seed" in overrides]
        if setters:
            raise _invalid(f"{setters[0]}: the sweep seeds every run itself (from its own seed and each point's "
                           "swept values), so a run config's seed set here is never used; give replications: N "
                           "for more draws, or the sweep's seed: for other ones")
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise _invalid(f"key {key!r} is swept twice (grid and zip, or two zip groups)")
            seen.add(key)
        for key in keys:
            for other in keys:
                if other != key and other.startswith(key + "."):
                    raise _invalid(f"swept key {other!r} lies inside swept key {key!r}")
        for name, overrides in self.variants.items():  # the swept values are set after a variant's
            for other in overrides:
                swept = _swept_key_over(other, keys)
                if swept is not None:
                    raise _invalid(f"variant {name!r}: {other!r} lies inside swept key {swept!r}, whose swept "
                                   "values replace it (the variant would change nothing)")
            # a key given as a mapping counts by its leaves (``engine: {max_num_seqs: 4}`` sets
            # ``engine.max_num_seqs``): refused when the swept values replace every one of them, as the dotted
            # form is; where only some are replaced (a whole speculative_config beside a swept
            # num_speculative_tokens) the sweep command says which (replaced_variant_leaves)
            leaves = _keys_set_by(overrides)
            if leaves and all(_swept_key_over(leaf, keys) is not None for leaf in leaves):
                swept = _swept_key_over(leaves[0], keys)
                every = ", as they replace every key the variant sets" if len(leaves) > 1 else ""
                raise _invalid(f"variant {name!r}: {leaves[0]!r} lies inside swept key {swept!r}, whose swept "
                               f"values replace it{every} (the variant would change nothing)")
        if self.baseline is not None:
            if self.baseline not in self.variants:
                raise _invalid(f"baseline {self.baseline!r} is not one of the variants {list(self.variants)}")
            if len(self.variants) < 2:
                raise _invalid("baseline needs at least one other variant to compare with")
        names = [self.columns.get(k, k) for k in keys]
        for key, name in self.columns.items():
            if key not in keys:
                raise _invalid(f"columns: {key!r} is not a swept key (swept: {keys})")
            if not name:
                raise _invalid(f"columns: empty column name for {key!r}")
        from servesim.metrics.summary import is_metric_column

        for name in names:
            if name in RESERVED_COLUMNS:
                raise _invalid(f"column {name!r} is reserved; rename the swept key with columns:")
            if is_metric_column(name):
                raise _invalid(f"columns: {name!r} would take the place of the metric column {name!r} of "
                               "summary.csv; choose another column name")
            if names.count(name) > 1:
                raise _invalid(f"column name {name!r} is used twice")
        return self

    def replaced_variant_leaves(self) -> list[str]:
        """One line per key a variant sets inside one of its mappings that a swept key replaces at every
        point (the rest of the variant applies), e.g. ``variant 'eagle': speculative_config.num_speculative_tokens
        is replaced by the swept values of speculative_config.num_speculative_tokens``."""
        keys = self.swept_keys()
        lines = []
        for name, overrides in self.variants.items():  # (a dotted key a swept key replaces is refused)
            for leaf in _keys_set_by(overrides):
                swept = _swept_key_over(leaf, keys)
                if swept is not None:
                    lines.append(f"variant {name!r}: {leaf} is replaced by the swept values of {swept}")
        return lines

    def swept_keys(self) -> list[str]:
        """Dotted keys of the grid, then of each zip group, in the order written."""
        keys = list(self.grid)
        for group in self.zip:
            keys.extend(group)
        return keys

    def column_names(self) -> dict[str, str]:
        """Swept key -> its column name in the CSV tables (the ``columns`` rename, else the key)."""
        return {key: self.columns.get(key, key) for key in self.swept_keys()}


#: Units of common swept keys, for the axis labels of a sweep's figures (``sweep.json``'s ``units``).
KEY_UNITS = {
    "workload.rate": "requests/s",
    "workload.rate_scale": "x the trace's rate",
    "workload.concurrency": "clients",
    "engine.max_num_seqs": "requests",
    "engine.max_num_batched_tokens": "tokens",
    "deployment.replicas": "replicas",
    "tensor_parallel_size": "GPUs",
    "speculative_config.num_speculative_tokens": "tokens",
}


class LoadedSweep:
    """A validated sweep with its base config read and its paths resolved.

    Attributes:
        config: the :class:`SweepConfig`.
        base: the run config (a mapping) that every point starts from.
        base_dir: folder that relative paths inside the run config resolve against (the base file's
            folder, or the sweep file's folder for an inline base).
        source: what to name in messages (the sweep file path, or ``"sweep"``).
    """

    def __init__(self, config: SweepConfig, base: dict[str, Any], base_dir: Path, source: str) -> None:
        self.config = config
        self.base = base
        self.base_dir = base_dir
        self.source = source

    def workload_types(self) -> set[str | None]:
        """The workload types of the sweep's points (``trace``, ``poisson``, ``closed_loop``, ...): the base's,
        a variant's and a swept ``workload`` or ``workload.type``'s; None for one that cannot be told."""
        from servesim.config.overrides import set_dotted

        cfg = self.config
        workloads = []
        for overrides in cfg.variants.values() or [{}]:
            config = self.base
            try:
                for key, value in overrides.items():
                    config = set_dotted(config, key, value, source=self.source)
            except ConfigError:  # (reported where the variant's points are built)
                config = {}
            workloads.append(config.get("workload"))
        for values in [cfg.grid, *cfg.zip]:
            workloads += values.get("workload", [])
            workloads += [{"type": value} for value in values.get("workload.type", [])]
        return {workload.get("type") if isinstance(workload, dict) else None for workload in workloads}

    def column_units(self) -> dict[str, str]:
        """Swept column name -> the unit of its values, for the keys whose unit is known (:data:`KEY_UNITS`).

        ``workload.rate`` is in sessions/s when every point's workload is ``multi_turn``
        (:meth:`workload_types`), in requests/s when none is, and left without a unit when the sweep mixes
        them.
        """
        cfg = self.config
        types = self.workload_types()
        units = {}
        for key, column in cfg.column_names().items():
            unit = KEY_UNITS.get(key)
            if key == "workload.rate" and "multi_turn" in types:
                unit = "sessions/s" if types == {"multi_turn"} else None
            if unit is not None:
                units[column] = unit
        return units


def resolve_sweep(config: SweepConfig, folder: str | Path, source: str) -> LoadedSweep:
    """Read the base run config of ``config``, relative paths resolving against ``folder``.

    Raises:
        ConfigError: the base file (or a workload file it names) is missing or invalid YAML, is a folder, a
            sweep file or not a mapping.
    """
    from servesim.config.models import inline_workload_file, is_sweep_file

    folder = Path(folder).resolve()
    if isinstance(config.base, str):
        base_path = (folder / config.base).resolve()
        if base_path.is_dir():
            raise ConfigError(f"{source}: base: {base_path} is a folder (expected a run config file)")
        base = load_yaml(base_path)
        if is_sweep_file(base):  # its missing hardware, model and workload would be listed as the mistake
            raise ConfigError(f"{base_path}: a sweep file (base, grid/zip/variants), not a run config: the base "
                              f"of {source} must be a run config (hardware, model, workload)")
        if not isinstance(base, dict):
            raise ConfigError(f"{base_path}: expected a mapping of run settings (base of {source})")
        return LoadedSweep(config, inline_workload_file(base, base_path.parent, str(base_path)), base_path.parent,
                           source)
    return LoadedSweep(config, inline_workload_file(dict(config.base), folder, source), folder, source)


def load_sweep(path: str | Path) -> LoadedSweep:
    """Load and validate a sweep file and its base run config.

    Raises:
        ConfigError: one line naming the file and the field (missing file, invalid YAML, unknown key,
            unequal zip lists, unknown baseline, ...).
    """
    path = Path(path)
    data = load_yaml(path)
    if isinstance(data, dict) and "base" not in data and {"hardware", "model", "workload"} <= set(data):
        raise ConfigError(f"{path}: a run config (hardware, model, workload), not a sweep file: give it to "
                          "`servesim run`, or name it as a sweep file's base")
    config = validate(SweepConfig, data, str(path))
    return resolve_sweep(config, path.parent, str(path))
