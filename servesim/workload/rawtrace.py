"""What a trace parser returns: the file's rows as arrays, before any replay policy is applied."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.errors import TraceError


MAX_TOKEN_COUNT = 2**31 - 1
"""Most tokens a trace row's prompt or output may have (int32's largest): far above any model's context,
and low enough that a request's prompt + output tokens never overflow the int64 arrays they are kept in."""


def too_many_tokens(path: Path, line: int, column: str, count: int) -> TraceError:
    """The error for a token count above :data:`MAX_TOKEN_COUNT` (one line naming the file, line and column)."""
    return TraceError(f"{path}: line {line}: {column}: expected at most {MAX_TOKEN_COUNT} tokens (got {count})")


@dataclass(frozen=True)
class RawTrace:
    """The rows of a trace file, in file order (shape ``(N,)`` each).

    Attributes:
        path: the file as given (for messages).
        format: ``"azure"`` or ``"mooncake"``.
        time_s: float64, seconds since the first row (non-decreasing; 0 for the first row).
        prompt_tokens: int64, prompt lengths as written (tokens, >= 0).
        output_tokens: int64, output lengths as written (tokens, >= 0).
        prefix_block_ids: Mooncake ``hash_ids`` per row, or None (not asked for, or not in the file).
    """

    path: str
    format: str
    time_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_block_ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return int(self.time_s.shape[0])


def read_trace_text(path: Path) -> str:
    """Read a trace file as UTF-8 text (a leading byte-order mark is dropped).

    Raises:
        TraceError: the file is missing, unreadable, not UTF-8, or empty (one line naming the file).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder (expected a trace file)") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace file ({exc.strerror})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from servesim.input_files import not_utf8_message

        raise TraceError(not_utf8_message(path, exc)) from None
    return text
