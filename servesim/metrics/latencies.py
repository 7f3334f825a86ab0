"""Per-request latencies (TTFT, TPOT, E2E, queueing delay) from a :class:`RequestLog`.

Definitions (those of ``vllm bench serve``; all in seconds, one value per request):

* TTFT (time to first token) = ``first_token_s - arrival_s``.
* E2E (end-to-end latency) = ``finish_s - arrival_s``.
* TPOT (time per output token) = ``(E2E - TTFT) / (output_tokens - 1)``; undefined (NaN) when the request
  has a single output token, as ``vllm bench serve`` leaves such requests out of TPOT.
* queueing delay = ``first_scheduled_s - arrival_s``.

A quantity whose timestamps are missing (request never scheduled, no token yet, unfinished) is NaN.
"""

from __future__ import annotations

import numpy as np

from servesim.engine.output import RequestLog


def request_latencies(requests: RequestLog) -> dict[str, np.ndarray]:
    """Per-request latency arrays, each float64 of shape (N,), NaN where undefined (see module docstring).

    Returns:
        ``{"ttft_s", "tpot_s", "e2e_s", "queue_s"}`` (seconds) and ``"completed"`` (bool, shape (N,),
        True when ``finish_s`` is set).
    """
    arrival = np.asarray(requests.arrival_s, dtype=np.float64)
    ttft = np.asarray(requests.first_token_s, dtype=np.float64) - arrival
    e2e = np.asarray(requests.finish_s, dtype=np.float64) - arrival
    queue = np.asarray(requests.first_scheduled_s, dtype=np.float64) - arrival
    decode_tokens = np.asarray(requests.output_tokens, dtype=np.int64) - 1
    tpot = np.full(arrival.shape, np.nan)
    has_tpot = decode_tokens > 0
    tpot[has_tpot] = (e2e[has_tpot] - ttft[has_tpot]) / decode_tokens[has_tpot]
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "queue_s": queue,
        "completed": ~np.isnan(e2e),
    }
