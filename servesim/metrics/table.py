"""The short text table ``servesim run`` prints."""

from __future__ import annotations

#: Per-position acceptance rates the table shows (the first ones; summary.json holds all).
SHOWN_POSITIONS = 8

_LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))


def percent_text(share: float, max_decimals: int = 4) -> str:
    """``100 * share`` with one decimal, or more (up to ``max_decimals``) where one would round a share
    strictly between 0 and 1 to ``0.0`` or ``100.0``: 3 of 120,000 requests missing their SLO read
    ``99.997`` (99.9975 %), not ``100.0``; a share still closer to either end reads ``<0.0001`` or ``>99.9999``.

    Args:
        share: a fraction in [0, 1].
    """
    return _share_text(share, 100.0, 1, max_decimals)


def fraction_text(share: float, min_decimals: int = 3, max_decimals: int = 6) -> str:
    """``share`` with ``min_decimals`` decimals, or more (up to ``max_decimals``) where fewer would round a share
    strictly between 0 and 1 to ``0.000`` or ``1.000`` (the rule of :func:`percent_text`): 0.99975 reads
    ``0.9998``, 0.00025 ``0.0003``.

    Args:
        share: a fraction in [0, 1].
    """
    return _share_text(share, 1.0, min_decimals, max_decimals)


def _share_text(share: float, scale: float, min_decimals: int, max_decimals: int) -> str:
    value = scale * share
    for decimals in range(min_decimals, max_decimals + 1):
        text = f"{value:.{decimals}f}"
        if not 0.0 < share < 1.0 or 0.0 < float(text) < scale:
            return text
    step = 10.0 ** -max_decimals
    return f"<{step:.{max_decimals}f}" if share < 0.5 else f">{scale - step:.{max_decimals}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def format_summary_table(summary: dict) -> str:
    """Render a :func:`~servesim.metrics.summary.summarize` dict as a fixed-width text table.

    Shows requests completed, duration (s), request/output/total token throughput (per second),
    mean/p50/p99 of TTFT, TPOT, ITL and E2E in milliseconds (columns widen so that at least two
    spaces separate them at any latency), preemptions, goodput and SLO attainment
    when present, and the saturation flag. When some requests did not finish (a run cut off by
    ``simulation.max_time_s``), a line says that the latencies cover the completed requests only; requests
    that had not arrived by then are counted apart (the workload's total in parentheses).
    Missing or undefined values print as ``-``.

    Returns:
        The table, lines joined by ``\\n``, without a trailing newline.
    """
    completed, total = summary.get("completed", 0), summary.get("num_requests", 0)
    arrived = summary.get("arrived", total)  # fewer when simulation.max_time_s stopped the run first
    lines = [
        f"{'Requests completed':<28}{completed} / "
        + (f"{total}" if arrived == total else f"{arrived} arrived ({total} in the workload)"),
        f"{'Duration (s)':<28}{summary.get('duration_s', 0.0):.2f}",
        f"{'Request throughput (req/s)':<28}{summary.get('request_throughput', 0.0):.2f}",
        f"{'Output throughput (tok/s)':<28}{summary.get('output_throughput', 0.0):.1f}",
        f"{'Total throughput (tok/s)':<28}{summary.get('total_token_throughput', 0.0):.1f}",
    ]
    cells = [[_ms((summary.get(key) or {}).get(stat)) for stat in ("mean", "p50", "p99")]
             for _, key in _LATENCIES]
    # at least two spaces between columns, however long the numbers (1000 s = 1000000.00 ms)
    width = max([10] + [len(cell) + 2 for row in cells for cell in row])
    if completed < arrived:  # the statistics below leave out the requests that did not finish
        lines.append(f"Latencies cover the completed requests only ({arrived - completed} did not finish)")
    lines.append(f"{'Latency (ms)':<28}" + "".join(f"{name:>{width}}" for name in ("mean", "p50", "p99")))
    for (label, _), row in zip(_LATENCIES, cells):
        lines.append(f"{'  ' + label:<28}" + "".join(f"{cell:>{width}}" for cell in row))
    lines.append(f"{'Preemptions':<28}{summary.get('preemptions', 0)}")
    if "goodput" in summary:
        lines.append(f"{'Goodput (req/s)':<28}{summary['goodput']:.2f}")
        lines.append(f"{'SLO attainment':<28}{percent_text(summary.get('slo_attainment', 0.0))}%")
    # what the rule measures (servesim.metrics.saturation): a backlog that drains before the arrivals end,
    # with a high TTFT, reads "no"
    lines.append(f"{'Saturated (queue growing)':<28}{'yes' if summary.get('saturated') else 'no'}")
    spec = summary.get("spec_decode")
    if spec and spec.get("num_drafts"):
        per_position = spec.get("per_position_acceptance_rate") or []
        rates = ", ".join(f"{r:.3f}" for r in per_position[:SHOWN_POSITIONS])
        if len(per_position) > SHOWN_POSITIONS:  # n-gram drafts of 48 tokens: the rest are in summary.json
            rates += f", ... ({len(per_position)} positions in summary.json)"
        lines.append(f"{'Mean acceptance length':<28}{spec['mean_acceptance_length']:.2f}")
        lines.append(f"{'Draft acceptance rate':<28}{100 * spec['draft_acceptance_rate']:.1f}%")
        lines.append(f"{'Per-position acceptance':<28}{rates}")
    return "\n".join(lines)
