"""Which of servesim's modules run compiled (Cython), and the guard that keeps an edited one interpreted.

``setup.py`` compiles the engine's hot modules with Cython where it can and records each one's source
hash (SHA-256) in the package's ``_compiled.json``. :func:`install_guard` (run by ``import servesim``) puts a
finder first on ``sys.meta_path`` that imports such a module from its ``.py`` source instead of its
compiled copy when the source no longer has the recorded hash (edited since the build) or when
``$SERVESIM_PURE_PYTHON`` is set to anything but ``0``. Compiled and interpreted modules give the same
results bit for bit (the build keeps Python's semantics; tests/test_compiled_engine.py compares them).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

#: Environment variable: set (not ``0``) to run every module interpreted.
PURE_PYTHON_VAR = "SERVESIM_PURE_PYTHON"
#: The build's record of compiled modules: module name -> SHA-256 of its source when compiled.
MANIFEST = Path(__file__).resolve().parent / "_compiled.json"
_PACKAGE_ROOT = MANIFEST.parent.parent


def pure_python_requested() -> bool:
    """Whether ``$SERVESIM_PURE_PYTHON`` asks for interpreted modules only."""
    return os.environ.get(PURE_PYTHON_VAR, "") not in ("", "0")


def built_modules() -> dict[str, str]:
    """Module name -> source SHA-256 (hex) of each module the build compiled; empty for a pure install."""
    try:
        return json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _source_path(name: str) -> Path:
    return _PACKAGE_ROOT.joinpath(*name.split(".")).with_suffix(".py")


class SourceWhenStale(importlib.abc.MetaPathFinder):
    """Meta-path finder: a built module whose source changed since the build (or every built module, with
    ``$SERVESIM_PURE_PYTHON``) is imported from its ``.py`` file; anything else is left to the usual finders
    (which prefer the compiled file)."""

    def __init__(self, recorded: dict[str, str]) -> None:
        self.recorded = recorded

    def find_spec(self, fullname, path=None, target=None):
        expected = self.recorded.get(fullname)
        if expected is None:
            return None
        source = _source_path(fullname)
        if not source.is_file():
            return None
        if not pure_python_requested():
            import hashlib

            if hashlib.sha256(source.read_bytes()).hexdigest() == expected:
                return None
        return importlib.util.spec_from_file_location(fullname, source)


def install_guard() -> None:
    """Put :class:`SourceWhenStale` first on ``sys.meta_path`` (once) if the build compiled anything."""
    recorded = built_modules()
    if recorded and not any(isinstance(finder, SourceWhenStale) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceWhenStale(recorded))


def compiled_modules() -> dict[str, bool]:
    """Each module the build compiled -> whether it runs compiled in this process (imports it)."""
    result = {}
    for name in built_modules():
        module = importlib.import_module(name)
        result[name] = not str(getattr(module, "__file__", "")).endswith(".py")
    return result
