"""Helpers for engine tests: build an Engine directly from arrays, without config files."""

from __future__ import annotations

import numpy as np
import simpy

from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.roofline import PS_PER_S, SUBPS_PER_PS, StepTimeModel


def _max_roofline(weights_s: float, per_token_s: float, per_logit_s: float, overhead_s: float):
    """context_free_s of a StepTimeModel: overhead + max(weights, per_token T + per_logit n_logits) (s)."""
    def context_free_s(tokens, logits):
        return overhead_s + max(weights_s, per_token_s * tokens + per_logit_s * logits)
    return context_free_s


def flat_step_model(decode_s: float = 0.01, per_token_s: float = 0.0, kv_ps: int = 0, attn_ps: int = 0,
                    overhead_s: float = 0.0, request_ps: int = 0) -> StepTimeModel:
    """A step-time model with a constant weight-read time and optional per-token costs (s)."""
    return StepTimeModel(
        mode="calibrated",
        context_free_s=_max_roofline(decode_s, per_token_s, 0.0, overhead_s),
        weight_read_s=lambda tokens: decode_s,
        linear_s_per_token=per_token_s,
        lm_head_s_per_logit=0.0,
        kv_subps_per_token=kv_ps * SUBPS_PER_PS,
        attn_subps_per_pair=attn_ps * SUBPS_PER_PS,
        request_subps_per_request=request_ps * SUBPS_PER_PS,
    )


def realistic_step_model() -> StepTimeModel:
    """Llama-3.1-8B-on-H100-like coefficients (weights 6 ms, 23 us/token linear, KV 49 ns/token, 3 us per
    request)."""
    return StepTimeModel(
        mode="calibrated",
        context_free_s=_max_roofline(16e9 / 2.68e12, 16e9 / 692e12, 1e-6, 1.45e-3),
        weight_read_s=lambda tokens: 16e9 / 2.68e12,
        linear_s_per_token=16e9 / 692e12,
        lm_head_s_per_logit=1e-6,
        kv_subps_per_token=48_900 * SUBPS_PER_PS,
        attn_subps_per_pair=758 * SUBPS_PER_PS,
        request_subps_per_request=3_000_000 * SUBPS_PER_PS,
    )


def run_engine(prompt, output, arrival_s=None, *, concurrency=None, think_s=0.0, step_model=None,
               kv_blocks=100_000, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192,
               chunked=True, mode="run", max_time_s=None, async_scheduling=False,
               enable_prefix_caching=False, content=None, tracer=None) -> Engine:
    """Run an engine to completion and return it (records in ``engine.output()``)."""
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    if concurrency is None:
        times = np.rint(np.asarray(arrival_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tolist()
        source = ArrivalSource(times=times, num_requests=len(times))
    else:
        source = ArrivalSource(times=None, num_requests=len(prompt), concurrency=concurrency,
                               think_ps=round(think_s * PS_PER_S))
    engine = Engine(prompt_tokens=prompt, output_tokens=output, arrivals=source,
                    step_time=step_model or realistic_step_model(), kv_blocks_total=kv_blocks,
                    block_size=block_size, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=chunked,
                    mode=mode, max_time_s=max_time_s, async_scheduling=async_scheduling,
                    enable_prefix_caching=enable_prefix_caching, content=content)
    engine.tracer = tracer
    env = simpy.Environment()
    env.process(engine.process(env))
    env.run()
    return engine
