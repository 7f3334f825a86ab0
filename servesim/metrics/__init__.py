"""servesim.metrics: from the engine's logs to latency statistics, goodput, saturation and output files.

Data flow: :class:`~servesim.engine.output.EngineOutput` -> :func:`summarize` (a JSON-ready dict) ->
:func:`write_outputs` (``summary.json``, ``requests.csv``, ``steps.csv``) and
:func:`format_summary_table` (the text ``servesim run`` prints). :func:`to_dataframes` gives pandas
tables (pandas is imported only when it is called). Importing this package needs numpy only.
"""

from __future__ import annotations

from servesim.metrics.frames import to_dataframes
from servesim.metrics.latencies import request_latencies
from servesim.metrics.outputs import REQUEST_COLUMNS, STEP_COLUMNS, write_outputs
from servesim.metrics.percentiles import distribution_stats, percentiles, weighted_percentiles
from servesim.metrics.saturation import Saturation, detect_saturation
from servesim.metrics.steps import expand_step_durations, itl_samples
from servesim.metrics.summary import spec_decode_summary, summarize
from servesim.metrics.table import format_summary_table

__all__ = [
    "REQUEST_COLUMNS",
    "STEP_COLUMNS",
    "Saturation",
    "distribution_stats",
    "expand_step_durations",
    "format_summary_table",
    "itl_samples",
    "percentiles",
    "request_latencies",
    "detect_saturation",
    "spec_decode_summary",
    "summarize",
    "to_dataframes",
    "weighted_percentiles",
    "write_outputs",
]
