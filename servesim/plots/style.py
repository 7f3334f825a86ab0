"""Shared helpers for servesim's figures: headless matplotlib, one look, atomic PNG files.

matplotlib is imported inside :func:`pyplot` only (its import costs ~0.5 s), with the non-interactive
``Agg`` backend so plotting works without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.atomic import atomic_file

#: Colours of the p50 and p99 markers.
P50_COLOR = "tab:green"
P99_COLOR = "tab:red"


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend selected and servesim's rc settings applied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "figure.dpi": 100,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "font.size": 9,
        "axes.titlesize": 10,
    })
    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Save ``fig`` as PNG to ``path`` atomically (temporary file + :func:`os.replace`), then close it.

    Raises:
        OSError: the folder cannot be written.
    """
    path = Path(path)
    try:
        with atomic_file(path, "wb") as handle:
            fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path


def plain_number(value: float) -> str:
    """Tick text of a positive number without powers of ten: ``0.05``, ``3``, ``250``, ``10,000``."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.6g}"


def plain_log_ticks(axis: Any) -> None:
    """Label a log-scaled ``axis`` (``ax.xaxis`` or ``ax.yaxis``) with plain numbers (``20``, ``300``,
    ``10,000``) instead of matplotlib's ``2x10^1`` and ``10^4``, on major and (when few decades are shown)
    minor ticks. Call it after ``set_xscale("log")`` / ``set_yscale("log")``."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):  # noqa: ARG002 - matplotlib's signature
            return plain_number(x)

    axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
