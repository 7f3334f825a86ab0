"""Package re-exports that load on first use (PEP 562), so that importing one submodule of a package does not
import all of them (start-up time of ``servesim run``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, sources: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, re-exporting names of its submodules.

    Args:
        package: the package's ``__name__`` (it must be in ``sys.modules``, as it is while its ``__init__``
            runs).
        sources: exported name -> submodule (relative to ``package``) that defines it.

    Returns:
        ``(__getattr__, __dir__)``: ``__getattr__(name)`` imports ``package.sources[name]`` on the first
        access, keeps the value in the package's namespace (later accesses cost nothing) and returns it; it
        raises AttributeError for a name not in ``sources``, as a module does.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        module = sources.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(sources))

    return __getattr__, __dir__
