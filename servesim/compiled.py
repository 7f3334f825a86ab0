"""Which of servesim's modules run compiled (Cython), and the guard that keeps an edited one interpreted.

``setup.py`` compiles the engine's hot modules with Cython where it can and records each one's source
(SHA-256, size in bytes, modification time in ns) in the package's ``_compiled.json``. :func:`install_guard`
(run by ``import servesim``) puts a finder first on ``sys.meta_path`` that imports such a module from its
``.py`` source instead of its compiled copy when the source no longer has the recorded hash (edited since
the build) or when ``$SERVESIM_PURE_PYTHON`` is set to anything but ``0``. A source whose size and
modification time are the build's is taken as unchanged without reading it, as Python checks a ``.pyc``
by default (its source's mtime and size); any other is hashed. Compiled and interpreted modules give the
same results bit for bit (the build keeps Python's semantics; tests/test_compiled_engine.py compares them).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: Environment variable: set (not ``0``) to run every module interpreted.
PURE_PYTHON_VAR = "SERVESIM_PURE_PYTHON"
#: The build's record of compiled modules: module name -> its source when compiled, ``{"sha256": hex,
#: "size": bytes, "mtime_ns": ns}`` (an earlier build's record: the SHA-256 alone).
MANIFEST = Path(__file__).resolve().parent / "_compiled.json"
_PACKAGE_ROOT = MANIFEST.parent.parent


def pure_python_requested() -> bool:
    """Whether ``$SERVESIM_PURE_PYTHON`` asks for interpreted modules only."""
    return os.environ.get(PURE_PYTHON_VAR, "") not in ("", "0")


def built_modules() -> dict[str, dict | str]:
    """Module name -> the recorded source of each module the build compiled (see :data:`MANIFEST`); empty
    for a pure install."""
    try:
        return json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _source_path(name: str) -> Path:
    return _PACKAGE_ROOT.joinpath(*name.split(".")).with_suffix(".py")


class SourceWhenStale:
    """Meta-path finder: a built module whose source changed since the build (or every built module, with
    ``$SERVESIM_PURE_PYTHON``) is imported from its ``.py`` file; anything else is left to the usual finders
    (which prefer the compiled file). A plain class with ``find_spec``, the whole finder protocol
    (``importlib.abc.MetaPathFinder`` would import ``importlib.resources`` at every start)."""

    def __init__(self, recorded: dict[str, dict | str]) -> None:
        self.recorded = recorded

    def find_spec(self, fullname, path=None, target=None):
        expected = self.recorded.get(fullname)
        if expected is None:
            return None
        source = _source_path(fullname)
        try:
            stat = source.stat()
        except OSError:
            return None
        if not pure_python_requested() and not source_changed(source, stat, expected):
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(fullname, source)

    def invalidate_caches(self) -> None:
        """Nothing cached (``importlib.invalidate_caches`` calls it on every finder that has it)."""


def source_changed(source: Path, stat: os.stat_result, recorded: dict | str) -> bool:
    """Whether ``source`` (``stat``: its stat) differs from its recorded build: the same size and
    modification time count as unchanged, else the SHA-256 of its bytes decides (a file touched but not
    edited stays compiled)."""
    if isinstance(recorded, str):  # an earlier build's record: the hash alone
        recorded = {"sha256": recorded}
    if stat.st_size == recorded.get("size") and stat.st_mtime_ns == recorded.get("mtime_ns"):
        return False
    import hashlib

    return hashlib.sha256(source.read_bytes()).hexdigest() != recorded["sha256"]


def install_guard() -> None:
    """Put :class:`SourceWhenStale` first on ``sys.meta_path`` (once) if the build compiled anything."""
    recorded = built_modules()
    if recorded and not any(isinstance(finder, SourceWhenStale) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceWhenStale(recorded))


def compiled_modules() -> dict[str, bool]:
    """Each module the build compiled -> whether it runs compiled in this process (imports it)."""
    import importlib

    result = {}
    for name in built_modules():
        module = importlib.import_module(name)
        result[name] = not str(getattr(module, "__file__", "")).endswith(".py")
    return result
