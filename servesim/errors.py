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


class TraceError(ServesimError):
    """A request trace cannot be read or has a malformed row (raised by :mod:`servesim.workload`)."""


class SettingError(ConfigError):
    """A run-config setting that passes validation but cannot run with the rest, found while the run is
    wired (a block size vLLM refuses, attention heads not divisible by the tensor parallel size, a request
    longer than ``max_model_len``).

    The message starts with the setting's dotted key (``engine.block_size: ...``);
    :func:`servesim.simulate` puts the config file's name in front when the config was read from one.
    """


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
        raise SettingError(f"{source}: {exc}") from None


@contextmanager
def naming_option_of(key: str, option: str | None, source: str | None) -> Iterator[None]:
    """Name the command-line ``option`` (e.g. ``--speculative-config``) instead of the config's file
    ``source`` in a :class:`SettingError` about ``key`` raised inside, when the option gave ``key``'s whole
    value (a mistake in it is not in the file).

    Nothing changes when ``option`` is None or for any other error.
    """
    try:
        yield
    except SettingError as exc:
        text = str(exc)
        prefix = f"{source}: " if source is not None else ""
        rest = text[len(prefix):] if text.startswith(prefix) else ""
        if option is None or not rest.startswith((f"{key}: ", f"{key}.")):
            raise
        raise SettingError(f"{option}: {rest}") from None
