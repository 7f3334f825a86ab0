"""What a sweep's stored run depends on, so that a resumed sweep reuses a run only when nothing changed.

A run's result is a function of more than its config mapping: the hardware and model cards the config
names (shipped or by path), every file it points to (a trace, an acceptance profile, a length
distribution's CSV), the run's seed (derived from the sweep's root ``seed``) and the simulator itself.
:class:`RunInputs` records all of them:

* ``config_sha256``: SHA-256 of the point's run config (canonical JSON);
* ``seed``: the integer seed handed to ``simulate``;
* ``servesim_version``: ``servesim.__version__`` and the SHA-256 of the package's own source files
  (:func:`servesim_source_digest`), so that a developer's edit of the simulator, which keeps the version
  number, does not leave results of the old code looking current;
* ``cards_sha256``: SHA-256 of the hardware and model cards as loaded (their validated contents, so an
  edited card file changes it whether it is named or given by path);
* ``files``: resolved path -> SHA-256 of the bytes of every existing file that a string in the config
  names (relative to the base config's folder, or a shipped acceptance profile's name), and of the shipped
  profile a speculative config without ``acceptance`` reads (its method's default).

A stored run is reused when its ``inputs_sha256`` equals the current one; otherwise
:meth:`RunInputs.differences` says what changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim.errors import ServesimError
from servesim.sweep.points import canonical_json, config_digest

_SOURCE_DIGEST: list[str] = []


def servesim_source_digest() -> str:
    """SHA-256 (hex) over the servesim package's ``.py`` files: their paths relative to the package and
    their bytes, in sorted order (computed once per process, a few milliseconds)."""
    if not _SOURCE_DIGEST:
        package = Path(__file__).resolve().parents[1]
        digest = hashlib.sha256()
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        _SOURCE_DIGEST.append(digest.hexdigest())
    return _SOURCE_DIGEST[0]


#: Strings longer than this are not treated as file names.
_MAX_PATH_CHARS = 4096


@dataclass(frozen=True)
class RunInputs:
    """The resolved inputs of one run (see the module docstring)."""

    config_sha256: str
    seed: int
    servesim_version: str
    cards_sha256: str
    files: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """A JSON mapping of the fields (stored with each run)."""
        return {"config_sha256": self.config_sha256, "seed": self.seed, "servesim_version": self.servesim_version,
                "cards_sha256": self.cards_sha256, "files": dict(self.files)}

    @property
    def digest(self) -> str:
        """SHA-256 hex digest of :meth:`as_json` (the resume key)."""
        return hashlib.sha256(canonical_json(self.as_json()).encode("ascii")).hexdigest()

    def differences(self, stored: Any) -> list[str]:
        """What differs from ``stored`` (the ``inputs`` mapping of a stored run), in words.

        A stored run without such a mapping (written by an older servesim) reads as
        ``["inputs not recorded"]``.
        """
        if not isinstance(stored, dict):
            return ["inputs not recorded"]
        changed = []
        if stored.get("config_sha256") != self.config_sha256:
            changed.append("run config")
        if stored.get("seed") != self.seed:
            changed.append("seed")
        if stored.get("servesim_version") != self.servesim_version:
            changed.append("servesim version or source")
        if stored.get("cards_sha256") != self.cards_sha256:
            changed.append("hardware/model card")
        old_files = stored.get("files") if isinstance(stored.get("files"), dict) else {}
        for path in sorted(set(old_files) | set(self.files)):
            if old_files.get(path) != self.files.get(path):
                changed.append(f"file {path}")
        return changed or ["inputs"]


class InputResolver:
    """Resolve :class:`RunInputs` for the runs of one sweep (caches cards and file hashes per invocation).

    Args:
        base_dir: the folder relative paths of the run configs resolve against.
    """

    def __init__(self, base_dir: str | Path) -> None:
        from servesim import __version__

        self.base_dir = Path(base_dir)
        self.version = f"{__version__}+source.{servesim_source_digest()[:16]}"
        self._cards: dict[str, str] = {}
        self._files: dict[str, tuple[str, str] | None] = {}

    def resolve(self, config: dict[str, Any], seed: int) -> RunInputs:
        """The inputs of the run of ``config`` (a run-config mapping) with ``seed``."""
        files: dict[str, str] = {}
        for text in _strings(config):
            found = self._file(text)
            if found is not None:
                files[found[0]] = found[1]
        default = _default_profile(config)
        if default is not None:  # the method's shipped profile, which no string of the config names
            found = self._file(default)
            if found is not None:
                files[found[0]] = found[1]
        return RunInputs(config_digest(config), int(seed), self.version, self._cards_digest(config), files)

    def _cards_digest(self, config: dict[str, Any]) -> str:
        specs = canonical_json({"hardware": config.get("hardware"), "model": config.get("model")})
        if specs not in self._cards:
            from servesim.cards.loading import load_hardware, load_model

            parts = {}
            for name, load in (("hardware", load_hardware), ("model", load_model)):
                try:
                    parts[name] = load(config.get(name), base_dir=self.base_dir).model_dump(mode="json")
                except (ServesimError, TypeError, ValueError) as exc:
                    parts[name] = f"cannot load: {exc}"  # the run itself will fail and say why
            self._cards[specs] = hashlib.sha256(canonical_json(parts).encode("ascii")).hexdigest()
        return self._cards[specs]

    def _file(self, text: str) -> tuple[str, str] | None:
        if text not in self._files:
            self._files[text] = _hash_named_file(text, self.base_dir)
        return self._files[text]


def _default_profile(config: dict[str, Any]) -> str | None:
    """The name of the shipped acceptance profile a speculative config without ``acceptance`` reads
    (``servesim.speculation.config.DEFAULT_PROFILES``, by method), or None."""
    spec = config.get("speculative_config")
    if not isinstance(spec, dict) or spec.get("acceptance") is not None:
        return None
    from servesim.speculation.config import DEFAULT_PROFILES

    method = spec.get("method")
    return DEFAULT_PROFILES.get(method) if isinstance(method, str) else None


def _strings(value: Any):
    """Every string inside a config mapping (values, not keys), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _hash_named_file(text: str, base_dir: Path) -> tuple[str, str] | None:
    """``(resolved path, SHA-256 of its bytes)`` of the file ``text`` names, or None if it names none."""
    if not text or len(text) > _MAX_PATH_CHARS or "\n" in text or "\0" in text:
        return None
    from servesim.speculation.profile import profiles_dir

    path = Path(text).expanduser()
    candidates = [path if path.is_absolute() else base_dir / path, profiles_dir() / f"{text}.yaml"]
    for candidate in candidates:
        try:
            if candidate.is_file():
                digest = hashlib.sha256(candidate.read_bytes()).hexdigest()
                return str(candidate.resolve()), digest
        except OSError:
            continue
    return None
