"""Errors that servesim reports to users as one line, without a traceback."""

from __future__ import annotations


class ServesimError(Exception):
    """A user-facing error: bad config, bad trace row, impossible setting.

    The message is one line that names the file, the field or line, and what was expected.
    The command-line front end prints it as ``servesim: error: <message>`` and exits with status 2.
    """


class ConfigError(ServesimError):
    """A configuration file or value is invalid (raised by :mod:`servesim.config`)."""


class TraceError(ServesimError):
    """A request trace cannot be read or has a malformed row (raised by :mod:`servesim.workload`)."""
