"""Atomic file writes (readers see the old file or the whole new one, never half of it) and output folders.

Files are created with the permissions a plain ``open()`` would give (``0o666`` less the process umask),
not the ``0o600`` of a temporary file, so that teammates and web servers can read the results.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb", *, fsync: bool = False, **open_kwargs: Any) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success replace ``path`` with it (:func:`os.replace`).

    The temporary file (``.<name>.*.tmp``) is removed if the block raises; ``path`` then keeps its
    previous content (or does not exist). The folder is created if missing. An :class:`OSError` that names
    no file (a write to a full disk) is given ``path`` as its ``filename``.

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
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0o600; open() would respect the umask
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write (a full disk) says which file it was writing
        raise


def current_umask() -> int:
    """The process's file-mode creation mask (read without changing it, where /proc allows)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (the only portable way to read it)
    os.umask(mask)
    return mask


def prepare_output_dir(path: str | Path, option: str = "--out") -> Path:
    """Create the output folder ``path`` (and its parents) and check that files can be written in it.

    Commands call this before any simulation, so that an unwritable ``--out`` fails at once, in one line.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ConfigError: ``path`` is empty (``--out ''`` would write into the current folder), is a file, is
            the filesystem's root or the home folder, cannot be created, or is not writable (one line naming ``option`` and the folder).
    """
    from servesim.errors import ConfigError

    if not str(path).strip():
        raise ConfigError(f"{option}: empty folder name (expected a folder path)")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option}: {out} is a file, not a folder")
    resolved = out.expanduser().resolve()
    shared = {Path(resolved.anchor): "the root folder", Path.home().resolve(): "the home folder"}.get(resolved)
    if shared is not None:  # results (and the removal of stale ones) belong in a folder of their own
        raise ConfigError(f"{option}: {out} is {shared}; give a folder of its own for the results (e.g. out/run)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".servesim-write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{option}: cannot write to {out} ({exc.strerror or exc})") from None
    return out


def check_output_file(path: str | Path, option: str = "--out", inputs: tuple = ()) -> Path:
    """Check, before any work and without creating anything, that the file ``path`` can be written: it is
    not a folder, and its nearest existing ancestor folder is a writable folder (the folders below it are
    created when the file is written).

    Args:
        inputs: ``(option, path)`` of the files the command reads (``("--data", "steps.csv")``): ``path`` may
            not be one of them (the write would replace the input).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ConfigError: ``path`` is one of the ``inputs``, is empty, a folder or another file that is not a
            regular one (a device such as ``/dev/full``, a pipe), or sits under a file or an unwritable folder
            (one line naming ``option`` and the path).
    """
    from servesim.errors import ConfigError

    if not str(path).strip():
        raise ConfigError(f"{option}: empty file name (expected a file path)")
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{option}: {out} is a folder (expected a file path)")
    for name, given in inputs:
        if given is not None and out.exists() and Path(given).exists() and os.path.samefile(out, given):
            raise ConfigError(f"{option}: {out} is the {name} file (an input of this command); give another "
                              "file path")
    if out.exists() and not out.is_file():  # the atomic rename would put a regular file in its place
        raise ConfigError(f"{option}: {out} is not a regular file (a device, pipe or socket, which the output "
                          "would replace); give a file path, or no --out to print it")
    ancestor = out.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{option}: cannot write {out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: cannot write {out}: the folder {ancestor} is not writable")
    return out


#: Largest existing ``--out`` file read to tell whether a servesim command wrote it (bytes).
_OWN_OUTPUT_MAX_BYTES = 1 << 26


def remove_earlier_output_file(path: str | Path, source_mark: str) -> None:
    """Delete the YAML file ``path`` if an earlier run of the command wrote it: a mapping whose ``source``
    string holds ``source_mark`` (what the command writes there, e.g. a calibrated card's ``calibrated by
    servesim calibrate``), with the temporary files a killed write of it left; before the command computes
    its new version, so that if it then fails or is interrupted no earlier result is left looking like its
    own. Any other file (the user's notes, a card of their own, an input) and its neighbours are left as
    they are. Call it after :func:`check_output_file`.

    Raises:
        ConfigError: the file is the command's but cannot be removed (one line naming it).
    """
    import yaml

    out = Path(path)
    try:
        if not out.is_file() or out.stat().st_size > _OWN_OUTPUT_MAX_BYTES:
            return
        data = yaml.safe_load(out.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):  # unreadable or not YAML: not ours
        return
    source = data.get("source") if isinstance(data, dict) else None
    if isinstance(source, str) and source_mark in source:
        remove_stale(out.parent, [out.name])


def remove_stale(folder: str | Path, names: list[str]) -> None:
    """Delete the files ``names`` in ``folder`` that a previous run wrote and this one does not replace, and
    the temporary files a killed write of one of them left (``.NAME.*.tmp``).

    Raises:
        ConfigError: a file exists but cannot be removed (one line naming it).
    """
    for name in names:
        _remove(Path(folder) / name)
        remove_temporary_files(folder, glob.escape(name))  # of a write that was killed


def remove_temporary_files(folder: str | Path, pattern: str) -> None:
    """Delete the temporary files that killed writes of the files ``pattern`` (a glob) in ``folder`` left
    (:func:`atomic_file`'s ``.NAME.*.tmp``; a kill that no handler sees leaves them).

    Raises:
        ConfigError: a file cannot be removed (one line naming it).
    """
    for stale in Path(folder).glob(f".{pattern}.*.tmp"):
        _remove(stale)


def _remove(path: Path) -> None:
    from servesim.errors import ConfigError

    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot remove the file of an earlier run ({exc.strerror})") from None


@contextmanager
def replacing_outputs(folder: str | Path, names: tuple[str, ...] | list[str], *, before: bool = True
                      ) -> Iterator[None]:
    """The block computes new versions of the outputs ``names`` in ``folder``. The earlier run's files are
    removed before it starts (``before``), so that none is left looking like the result of this command if
    it fails, is interrupted (Ctrl-C) or killed (SIGKILL, out of memory: nothing can clean up then); and
    again if the block raises (a file it wrote before failing). ``before=False`` keeps them while the block
    runs (a sweep, which keeps the figures of a table it writes again unchanged, removes them itself).

    Raises:
        whatever the block raises; ConfigError if a file cannot be removed.
    """
    from servesim.errors import OutputFolderRefused

    if before:
        remove_stale(folder, list(names))
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, OutputFolderRefused):  # a refused folder is another's: left as it is
            remove_stale(folder, list(names))
        raise


@contextmanager
def output_folder_lock(path: str | Path, option: str = "--out", on_refused: Callable[[], None] | None = None
                       ) -> Iterator[None]:
    """Hold an exclusive advisory lock on the output folder ``path`` while the block writes a command's
    results there, so that a second servesim command given the same folder is refused at once instead of
    interleaving its files with the first one's (a folder holding one run's ``requests.csv`` beside another
    run's ``summary.json``). The lock is ``flock`` on the folder itself: nothing is written into it, and the
    kernel releases it when the process ends, also when it is killed. The folder is created if missing (as
    the command would); a path that cannot be a folder, or a system without ``flock``, takes no lock and is
    left to the command to report.

    ``on_refused`` is called before the refusal is raised.

    Raises:
        OutputFolderRefused: another process holds the folder's lock (nothing in it is touched).
    """
    from servesim.errors import OutputFolderRefused

    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        fcntl = None
    fd = None
    if fcntl is not None and str(path).strip():
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # a file, a folder that cannot be created or read: the command says which
            fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_refused is not None:
                    on_refused()
                raise OutputFolderRefused(f"{option}: {path} is in use by another servesim command, still "
                                          "running; wait for it to finish or give another folder") from None
            except OSError:  # a filesystem without flock (some network mounts): no lock
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


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
