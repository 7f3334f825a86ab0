"""Atomic file writes: readers see the old file or the whole new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb", *, fsync: bool = False, **open_kwargs: Any) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success replace ``path`` with it (:func:`os.replace`).

    The temporary file (``.<name>.*.tmp``) is removed if the block raises; ``path`` then keeps its
    previous content (or does not exist). The folder is created if missing.

    Args:
        path: the file to write.
        mode: ``"wb"`` or ``"w"`` (text; pass ``encoding=`` and ``newline=`` in ``open_kwargs``).
        fsync: flush and fsync before the replace (durability across a crash, for resumable sweeps).

    Raises:
        OSError: the folder is not writable, the disk is full, ...
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text_output(path: str | Path, text: str) -> None:
    """Write a command's output file atomically (folders created).

    Raises:
        ConfigError: the file cannot be written (one line naming it).
    """
    from servesim.errors import ConfigError

    try:
        with atomic_file(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write file ({exc.strerror})") from None
