"""Errors that servesim reports to users as one line, without a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class ServesimError(Exception):
    """A user-facing error: bad config, bad trace row, impossible setting.

    The message is one line that names the file, the field or line, and what was expected.
    The command-line front end prints it as ``servesim: error: <message>`` and exits with status 2.
    """


class ConfigError(ServesimError):
    """A configuration file or value is invalid (raised by :mod:`servesim.config`)."""


class OutputFolderRefused(ConfigError):
    """An ``--out`` folder that holds another command's or another sweep's results, refused before anything
    is written or removed: whatever is in it stays as it was."""


class TraceError(ServesimError):
    """A request trace cannot be read or has a malformed row (raised by :mod:`servesim.workload`)."""


class SettingError(ConfigError):
    """A run-config setting that passes validation but cannot run with the rest, found while the run is
    wired (a block size vLLM refuses, attention heads not divisible by the tensor parallel size, a request
    longer than ``max_model_len``).

    The message starts with the setting's dotted key (``engine.block_size: ...``);
    :func:`servesim.simulate` puts the config file's name in front when the config was read from one.

    Args:
        message: the one-line message.
        depends_on: dotted keys of the other settings the check read (``model``, ``engine.gpu_memory_utilization``
            for "does not fit"), so that a mistake that ``--set`` made through one of them is said to come
            from the file with that ``--set`` (:func:`named_by_set`), not from the file alone.
    """

    def __init__(self, message: str = "", *, depends_on: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.depends_on = tuple(depends_on)


#: Keys that choose the kind of their section (pydantic discriminators of the run config).
KIND_KEYS = ("type", "method")
#: How a message about a key that a change of kind missed or left over starts (after ``field: ``).
KIND_MISMATCHES = ("required key is missing", "unknown key")


def _reworded(exc: ServesimError, text: str) -> ServesimError:
    """An error of ``exc``'s type with message ``text``, keeping a SettingError's ``depends_on``."""
    if isinstance(exc, SettingError):
        return type(exc)(text, depends_on=exc.depends_on)
    return type(exc)(text)


@contextmanager
def naming_settings_of(source: str | None) -> Iterator[None]:
    """Put ``source`` (the run config's file) in front of a :class:`SettingError` raised inside.

    Nothing changes when ``source`` is None (a config built in Python) or for any other error.
    """
    try:
        yield
    except SettingError as exc:
        if source is None:
            raise
        raise _reworded(exc, f"{source}: {exc}") from None


def named_by_set(exc: ServesimError, source: str | None, set_keys: list[str]) -> ServesimError:
    """``exc`` (``source: field: message``) as ``--set: field: message`` when ``field`` is a key ``--set``
    gave, lies inside one, or (below the top level) holds one (``--set engine.max_num_seqs.x=1`` made
    ``engine.max_num_seqs`` a mapping), or when a section's check names a key ``--set`` gave first
    (``workload: bucket_policy: ...``): the mistake is in the command line, not in the file. As ``source
    with --set KEY: field: message`` when ``field`` is a top-level section holding keys ``--set`` gave (its
    check may be about them or about the file's other keys), or when a SettingError's ``depends_on`` holds a key
    ``--set`` gave, lies inside one or holds one; else ``exc`` unchanged (same type)."""
    text = str(exc)
    prefix = f"{source}: " if source is not None else ""
    if not set_keys or not text.startswith(prefix):
        return exc
    rest = text[len(prefix):]
    parts = rest.split(": ")
    field = parts[0]
    if " " in field or ":" in field:  # no field named: an error of the whole config
        return exc
    # a section's check that names its key first (``workload: bucket_policy: ...``) is about that key
    inner = f"{field}.{parts[1]}" if len(parts) > 2 and parts[1] and " " not in parts[1] else None
    for key in set_keys:
        # a key inside the field only below the top level: an error of a whole section (engine: ...) may
        # come from the file's other keys
        if (field == key or field.startswith(key + ".") or ("." in field and key.startswith(field + "."))
                or inner is not None and (inner == key or inner.startswith(key + "."))):
            return _reworded(exc, f"--set: {rest}")
    # a check of a whole section (``engine: max_num_batched_tokens (8192) must be >= max_num_seqs (99999)``)
    # that holds a key --set gave: the file and the command line together made the mistake
    inside = [key for key in set_keys if key.startswith(field + ".")]
    # a key that chose the section's kind (``workload.type``, ``speculative_config.method``): the section's
    # other keys, read from the file, now miss or exceed another kind's
    if rest.split(": ", 1)[-1].startswith(KIND_MISMATCHES):
        inside += [key for key in set_keys if key not in inside and key.rsplit(".", 1)[-1] in KIND_KEYS
                   and field.startswith(key.rsplit(".", 1)[0] + ".")]
    # a check that read other settings too (a model that does not fit reads the model, the GPU's memory
    # fraction, the token budget...): a --set of one of them made the mistake with the file
    depends_on = getattr(exc, "depends_on", ())
    inside += [key for key in set_keys if key not in inside and any(
        key == dep or key.startswith(dep + ".") or dep.startswith(key + ".") for dep in depends_on)]
    if inside and source is not None:
        return _reworded(exc, f"{source} with --set {', '.join(inside)}: {rest}")
    return exc


@contextmanager
def naming_set_keys(set_keys: list[str], source: str | None) -> Iterator[None]:
    """Name ``--set`` instead of the config's file ``source`` in a :class:`SettingError` raised inside about
    a key ``--set`` gave (:func:`named_by_set`); nothing changes for any other error."""
    try:
        yield
    except SettingError as exc:
        renamed = named_by_set(exc, source, set_keys)
        if renamed is exc:
            raise
        raise renamed from None


@contextmanager
def naming_option_of(key: str, option: str | None, source: str | None) -> Iterator[None]:
    """Name the command-line ``option`` (e.g. ``--speculative-config``) instead of the config's file
    ``source`` in a :class:`SettingError` about ``key`` raised inside, when the option gave ``key``'s whole
    value (a mistake in it is not in the file); as ``source with option: ...`` when the check is about
    another setting but read ``key`` (its ``depends_on``: a target that fits alone and not beside the
    option's draft model), as :func:`named_by_set` does for ``--set``.

    Nothing changes when ``option`` is None or for any other error.
    """
    try:
        yield
    except SettingError as exc:
        text = str(exc)
        prefix = f"{source}: " if source is not None else ""
        rest = text[len(prefix):] if text.startswith(prefix) else ""
        if option is None or not rest:
            raise
        if rest.startswith((f"{key}: ", f"{key}.")):
            raise _reworded(exc, f"{option}: {rest}") from None
        if source is not None and any(dep == key or dep.startswith(key + ".") for dep in exc.depends_on):
            raise _reworded(exc, f"{source} with {option}: {rest}") from None
        raise
