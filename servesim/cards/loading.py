"""Find and load hardware and model cards by name, path, inline mapping, or as given.

Shipped cards live in ``<cards dir>/gpus/*.yaml`` and ``<cards dir>/models/*.yaml``, where the cards dir is
``$SERVESIM_CARDS_PATH`` when set (several folders separated by ``os.pathsep``, searched in order), else
``<repo root>/hardware`` (the repo root is the parent of the ``servesim`` package folder).

A card NAME matches a file stem or a card's ``name`` field, ignoring case and any character that is not a
letter or digit: ``h100-sxm``, ``H100 SXM`` and ``h100sxm`` are the same card. Parsed shipped cards are
cached (``functools.lru_cache``); :func:`clear_card_cache` forgets them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from servesim.cards.hardware import HardwareCard
from servesim.cards.model import ModelCard
from servesim.input_files import load_json, load_yaml, shown_found, validate
from servesim.errors import ConfigError
from servesim.shipped import shipped_dir

CardSpec = str | os.PathLike[str] | Mapping[str, Any]
Kind = Literal["gpus", "models"]
C = TypeVar("C", bound=BaseModel)

ENV_VAR = "SERVESIM_CARDS_PATH"
_YAML_SUFFIXES = (".yaml", ".yml")
_KIND_MODEL: dict[str, type[BaseModel]] = {"gpus": HardwareCard, "models": ModelCard}
_KIND_WORD = {"gpus": "hardware", "models": "model"}


def cards_dirs() -> tuple[Path, ...]:
    """Folders holding the shipped cards (each with ``gpus/`` and ``models/``), in search order."""
    env = os.environ.get(ENV_VAR)
    if env:
        return tuple(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    return (_repo_hardware_dir(),)


@lru_cache(maxsize=1)
def _repo_hardware_dir() -> Path:
    return shipped_dir("hardware")


def normalize_card_name(name: str) -> str:
    """Lower-case ``name`` and drop every character that is not a letter or digit ("H100 SXM" -> "h100sxm")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@lru_cache(maxsize=None)
def _card_files(kind: Kind, dirs: tuple[Path, ...]) -> dict[str, Path]:
    # normalized stem -> file, first folder wins.
    files: dict[str, Path] = {}
    for folder in dirs:
        sub = folder / kind
        if not sub.is_dir():
            continue
        for path in sorted(sub.iterdir()):
            if path.suffix.lower() in _YAML_SUFFIXES and path.is_file():
                files.setdefault(normalize_card_name(path.stem), path)
    return files


def shipped_card_file(kind: Kind, name: str) -> Path | None:
    """The file of the shipped card ``name`` (``kind`` ``"gpus"`` or ``"models"``, matched as a card name is
    when loading), or None when no shipped card has that name."""
    return _card_files(kind, cards_dirs()).get(normalize_card_name(name))


@lru_cache(maxsize=None)
def _parse_card_file(kind: Kind, path: Path) -> BaseModel:
    return _read_card(kind, _KIND_MODEL[kind], path)


def _read_card(kind: Kind, cls: type[C], path: Path) -> C:
    """Read and validate a card file (YAML, or JSON).

    Raises:
        ConfigError: unreadable or invalid file, a top level that is not a mapping (an empty file's missing
            fields would be listed), or a field that fails validation.
    """
    data = load_json(path) if path.suffix.lower() == ".json" else load_yaml(path)
    if not isinstance(data, dict):
        fields = ", ".join([name for name, f in cls.model_fields.items() if f.is_required()][:3])
        raise ConfigError(f"{path}: expected a mapping of {_KIND_WORD[kind]} card fields ({fields}, ...) at the top "
                          f"level (got {shown_found(data)})")
    return validate(cls, data, str(path))


def available_cards(kind: Kind) -> list[str]:
    """File stems of the shipped cards of ``kind`` (``"gpus"`` or ``"models"``), sorted."""
    return sorted(p.stem for p in _card_files(kind, cards_dirs()).values())


def available_hardware() -> list[str]:
    """File stems of the shipped hardware cards, sorted."""
    return available_cards("gpus")


def available_models() -> list[str]:
    """File stems of the shipped model cards, sorted."""
    return available_cards("models")


def clear_card_cache() -> None:
    """Forget the cached shipped-card index and parsed cards (e.g. after changing $SERVESIM_CARDS_PATH)."""
    _card_files.cache_clear()
    _parse_card_file.cache_clear()


def _find_shipped(kind: Kind, name: str, source: str | None) -> BaseModel:
    key = normalize_card_name(name)
    files = _card_files(kind, cards_dirs())
    if key and key in files:
        return _parse_card_file(kind, files[key])
    if key:
        for path in files.values():
            card = _parse_card_file(kind, path)
            if normalize_card_name(getattr(card, "name")) == key:
                return card
    where = f"{source}: " if source else ""
    names = ", ".join(sorted(p.stem for p in files.values())) or "none found"
    if not files and not os.environ.get(ENV_VAR):
        # a non-editable install (pip install .) has the package without the clone's hardware/ folder
        names += (" - the shipped cards live in the clone's hardware/ folder: install the clone editable "
                  f"(pip install -e .) or set ${ENV_VAR} to that folder")
    folders = os.pathsep.join(str(d / kind) for d in cards_dirs())
    raise ConfigError(
        f"{where}unknown {_KIND_WORD[kind]} card {name!r} (available in {folders}: {names}; "
        "or give a path to a YAML file)"
    )


def _looks_like_path(spec: str) -> bool:
    return spec.lower().endswith(_YAML_SUFFIXES + (".json",)) or "/" in spec or os.sep in spec


def _resolve(spec: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None) -> Path:
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def _load_path(kind: Kind, cls: type[C], path: Path, source: str | None = None,
               base_dir: str | os.PathLike[str] | None = None) -> C:
    if not path.exists():  # name the setting that gave the path, and where a relative one was looked for
        where = f"{source}: " if source else ""
        relative = f" (a relative path is read from {base_dir})" if base_dir is not None else ""
        raise ConfigError(f"{where}{_KIND_WORD[kind]} card file not found: {path}{relative}")
    if kind == "models" and (path.suffix.lower() == ".json" or path.is_dir()):
        from servesim.cards.hf_config import load_hf_config  # only a Hugging Face config.json needs it

        return load_hf_config(path)  # type: ignore[return-value]
    return _read_card(kind, cls, path)


def _load(
    kind: Kind,
    cls: type[C],
    spec: Any,
    base_dir: str | os.PathLike[str] | None,
    source: str | None,
) -> C:
    if isinstance(spec, cls):
        return spec
    if isinstance(spec, Mapping):
        return validate(cls, dict(spec), source or f"inline {_KIND_WORD[kind]} card")
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and _looks_like_path(spec.strip())):
        return _load_path(kind, cls, _resolve(spec.strip() if isinstance(spec, str) else spec, base_dir), source,
                          base_dir)
    if isinstance(spec, str):
        try:
            return _find_shipped(kind, spec.strip(), source)  # type: ignore[return-value]
        except ConfigError:
            # A bare word that is not a shipped card may still name a file or folder next to the config.
            path = _resolve(spec.strip(), base_dir)
            if spec.strip() and path.exists():
                return _load_path(kind, cls, path)
            raise
    where = f"{source}: " if source else ""
    raise ConfigError(
        f"{where}expected a {_KIND_WORD[kind]} card name, a path to a YAML file or a mapping "
        f"(got {type(spec).__name__})"
    )


def load_hardware(
    spec: HardwareCard | CardSpec, base_dir: str | os.PathLike[str] | None = None, *, source: str | None = None
) -> HardwareCard:
    """Load a hardware card.

    Args:
        spec: a shipped card's name (file stem or display name, any case: ``"h100-sxm"``, ``"H100 SXM"``);
            a path to a YAML (or JSON) file, absolute or relative to ``base_dir``; an inline mapping of the
            card's fields; or a :class:`HardwareCard`, returned as is.
        base_dir: folder that relative paths resolve against (the folder of the config naming the card);
            default the current directory.
        source: what to name in errors about ``spec`` itself (e.g. ``"run.yaml: hardware"``).

    Raises:
        ConfigError: unknown name (the message lists the available cards), missing or invalid file, or a
        card that fails validation (one line naming the file and field).
    """
    return _load("gpus", HardwareCard, spec, base_dir, source)


def load_model(
    spec: ModelCard | CardSpec, base_dir: str | os.PathLike[str] | None = None, *, source: str | None = None
) -> ModelCard:
    """Load a model card.

    Args:
        spec: a shipped card's name (file stem or display name, any case: ``"llama-3.1-8b"``,
            ``"Llama-3.1-8B"``); a path to a model-card YAML file, or to a Hugging Face ``config.json``
            (or a folder holding one; see :mod:`servesim.cards.hf_config`), absolute or relative to
            ``base_dir``; an inline mapping of the card's fields; or a :class:`ModelCard`, returned as is.
        base_dir: folder that relative paths resolve against; default the current directory.
        source: what to name in errors about ``spec`` itself (e.g. ``"run.yaml: model"``).

    Raises:
        ConfigError: unknown name (the message lists the available cards), missing or invalid file, or a
        card that fails validation (one line naming the file and field).
    """
    return _load("models", ModelCard, spec, base_dir, source)
