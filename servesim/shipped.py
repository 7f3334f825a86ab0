"""Where the data servesim ships lives: the hardware and model cards, the acceptance profiles and the
validation cases.

They are kept in the clone's own folders (:data:`SHIPPED_FOLDERS`, relative to the repository root), where
an editable install (``pip install -e .``) reads them; a wheel or a plain ``pip install .`` carries a copy
inside the package, ``servesim/_shipped/<folder>`` (``setup.py``'s ``build_py`` writes it), which is read
first when it exists.
"""

from __future__ import annotations

from pathlib import Path

#: The folders shipped with the package, relative to the repository root (setup.py copies them).
SHIPPED_FOLDERS = ("hardware", "workloads/acceptance", "experiments/validation")
#: The package's copy of :data:`SHIPPED_FOLDERS` in an installed wheel (absent in the source tree).
PACKAGE_COPY = "_shipped"

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(folder: str) -> Path:
    """The folder holding the shipped ``folder`` (one of :data:`SHIPPED_FOLDERS`): the installed package's
    copy if there is one, else the source tree's (the repository root is the package's parent). The path
    is returned whether or not it exists (callers say what is missing).

    Raises:
        ValueError: ``folder`` is not one of :data:`SHIPPED_FOLDERS`.
    """
    if folder not in SHIPPED_FOLDERS:
        raise ValueError(f"{folder!r} is not a shipped folder (expected one of {', '.join(SHIPPED_FOLDERS)})")
    copy = _PACKAGE / PACKAGE_COPY / folder
    if copy.is_dir():
        return copy
    return _PACKAGE.parent / folder
