"""From a validated config to a ready-to-run SimPy environment: cards, defaults, KV capacity, workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import simpy

from servesim.config.models import SimConfig
from servesim.engine.arrivals import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.kv_cache import kv_cache_blocks
from servesim.errors import ConfigError
from servesim.roofline import PS_PER_S, build_step_time_model


def resolve_cards(cfg: SimConfig, folder: Path):
    """Load the hardware and model cards named by ``cfg``, applying the roofline overrides."""
    from servesim.cards import load_hardware, load_model

    hardware = load_hardware(cfg.hardware, base_dir=folder)
    model = load_model(cfg.model, base_dir=folder)
    updates = {
        k: v
        for k, v in (
            ("bandwidth_efficiency", cfg.roofline.bandwidth_efficiency),
            ("compute_efficiency", cfg.roofline.compute_efficiency),
            ("step_overhead_s", cfg.roofline.step_overhead_s),
        )
        if v is not None
    }
    if updates:
        hardware = hardware.model_copy(update=updates)
    return hardware, model


def engine_limits(cfg: SimConfig, hardware) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens): the config's, else vLLM's API-server defaults for the GPU."""
    seqs = cfg.engine.max_num_seqs or int(hardware.default_max_num_seqs)
    tokens = cfg.engine.max_num_batched_tokens or int(hardware.default_max_num_batched_tokens)
    return seqs, tokens


def build_engine(cfg: SimConfig, folder: Path, root: np.random.SeedSequence):
    """Build the engine and its SimPy environment for one run.

    Returns:
        (engine, env, info) where ``info`` records the derived setup (KV blocks, defaults, coefficients).

    Raises:
        ConfigError: cards not found, the model does not fit, a request can never be served.
    """
    from servesim.api import STREAM_WORKLOAD, child_seed
    from servesim.workload import build_workload

    hardware, model = resolve_cards(cfg, folder)
    tp = cfg.tensor_parallel_size
    seqs, budget = engine_limits(cfg, hardware)
    e = cfg.engine
    blocks = kv_cache_blocks(
        hardware,
        model,
        tensor_parallel_size=tp,
        block_size=e.block_size,
        gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        activation_reserve=e.activation_reserve_bytes,
        num_gpu_blocks_override=e.num_gpu_blocks_override,
    )
    step_time = build_step_time_model(hardware, model, tp, cfg.roofline.mode)
    rng = np.random.default_rng(child_seed(root, STREAM_WORKLOAD))
    workload = build_workload(cfg.workload, rng, folder)
    max_len = e.max_model_len or getattr(model, "max_model_len", None)
    if max_len is not None and len(workload.prompt_tokens):
        lengths = workload.prompt_tokens + workload.output_tokens
        worst = int(lengths.max())
        if worst > max_len:
            count = int((lengths > max_len).sum())
            raise ConfigError(
                f"workload: {count} request(s) need more than max_model_len={max_len} tokens (longest {worst}); "
                "vLLM would reject them: cap the lengths or raise engine.max_model_len"
            )
    if workload.concurrency is None:
        times = np.rint(np.asarray(workload.arrival_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tolist()
        source = ArrivalSource(times=times, num_requests=len(times))
    else:
        source = ArrivalSource(
            times=None,
            num_requests=len(workload.prompt_tokens),
            concurrency=int(workload.concurrency),
            think_ps=round(float(workload.think_time_s) * PS_PER_S),
        )
    try:
        engine = Engine(
            prompt_tokens=workload.prompt_tokens,
            output_tokens=workload.output_tokens,
            arrivals=source,
            step_time=step_time,
            kv_blocks_total=blocks,
            block_size=e.block_size,
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=e.enable_chunked_prefill,
            mode=cfg.simulation.mode,
            max_time_s=cfg.simulation.max_time_s,
        )
    except ValueError as exc:
        raise ConfigError(f"engine: {exc}") from None
    env = simpy.Environment()
    env.process(engine.process(env))
    info = {
        "hardware": hardware.name,
        "model": model.name,
        "tensor_parallel_size": tp,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": budget,
        "kv_cache_blocks": blocks,
        "kv_cache_tokens": blocks * e.block_size,
        "block_size": e.block_size,
        "workload": workload.description,
        "roofline_mode": cfg.roofline.mode,
        "decode_step_s_batch1": step_time.base_s(1, 1),
        "kv_s_per_token": step_time.kv_ps_per_token / PS_PER_S,
    }
    return engine, env, info
