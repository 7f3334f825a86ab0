"""pandas tables of one run (the Python API's ``result.requests`` / ``result.steps``).

pandas is imported inside :func:`to_dataframes` only: importing it costs ~0.8 s, which the command line
(``servesim run``) must not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.engine.output import EngineOutput
from servesim.metrics.outputs import request_columns, step_columns

if TYPE_CHECKING:
    import pandas as pd


def to_dataframes(out: EngineOutput) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(requests, steps)`` DataFrames with the columns of ``requests.csv`` and ``steps.csv``.

    Returns:
        requests: N rows, columns :data:`servesim.metrics.outputs.REQUEST_COLUMNS` (seconds, tokens;
        NaN where undefined, e.g. ``tpot_s`` of one-token requests).
        steps: R rows, columns :data:`servesim.metrics.outputs.STEP_COLUMNS` (every StepLog field).
    """
    import pandas as pd

    return pd.DataFrame(request_columns(out)), pd.DataFrame(step_columns(out))
