"""Turn a workload config into a :class:`Workload` (the only place the workload draws random numbers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import ConfigDict, RootModel

from servesim.input_files import load_yaml, validate
from servesim.workload.config import (
    ClosedLoopWorkloadConfig,
    GammaWorkloadConfig,
    MultiTurnWorkloadConfig,
    PoissonWorkloadConfig,
    TraceWorkloadConfig,
    WorkloadConfig,
    _SyntheticBase,
)
from servesim.errors import TraceError
from servesim.workload.lengths import resolve_path
from servesim.workload.memory_bound import check_synthetic_size
from servesim.workload.system_prompts import draw_system_prompts, prepend_system_prompts
from servesim.workload.trace import load_trace
from servesim.workload.workload import Workload


class WorkloadFile(RootModel[WorkloadConfig]):
    """A YAML file whose whole content is one workload config (e.g. ``workloads/*.yaml``)."""

    # built on first use: a run config's workload is validated by SimConfig, not by this model
    model_config = ConfigDict(defer_build=True)


def load_workload_config(path: str | Path) -> WorkloadConfig:
    """Read and validate a workload YAML file.

    Raises:
        ConfigError: the file is missing, not YAML, or invalid (one line naming the file and field).
    """
    return validate(WorkloadFile, load_yaml(path), str(path)).root


def load_workload(path: str | Path, rng: np.random.Generator) -> Workload:
    """Read a workload YAML file and build it (paths inside are relative to the file's folder).

    Raises:
        ConfigError: invalid file; TraceError: a trace it names is missing or malformed.
    """
    return build_workload(load_workload_config(path), rng, Path(path).parent)


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path | None = None) -> Workload:
    """Build the requests of a workload.

    Args:
        cfg: a validated workload config.
        rng: the caller's generator. Three child generators are spawned from it (arrivals, prompt
            lengths, output lengths), so changing one part of the config leaves the other draws unchanged;
            a trace replay draws nothing; ``system_prompts`` spawns one more child after those (so the
            other draws are unchanged by adding it); ``multi_turn`` spawns its own six.
        base_dir: folder that relative paths are resolved against (the config file's folder); None = cwd.

    Returns:
        The :class:`Workload`, arrays of shape ``(N,)``; ``arrival_s`` all NaN for ``closed_loop``.

    Raises:
        TraceError: a trace file (replayed or resampled) is missing or malformed, or a window is empty.
        SettingError: no arrival within a synthetic workload's ``duration_s``.
    """
    if isinstance(cfg, MultiTurnWorkloadConfig):
        from servesim.workload.multi_turn import build_multi_turn  # imported when used (start-up time)

        return build_multi_turn(cfg, rng, base_dir)
    workload = _build_requests(cfg, rng, base_dir)
    if cfg.system_prompts is not None:
        draw = draw_system_prompts(cfg.system_prompts, len(workload), rng.spawn(1)[0], base_dir)
        workload = prepend_system_prompts(workload, draw)
    return workload


def _build_requests(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path | None) -> Workload:
    if isinstance(cfg, TraceWorkloadConfig):
        path = resolve_path(cfg.path, base_dir)
        workload = load_trace(
            path,
            format=cfg.format,
            rate_scale=cfg.rate_scale,
            start_s=cfg.start_s,
            duration_s=cfg.duration_s,
            max_requests=cfg.max_requests,
            bucket_policy=cfg.bucket_policy,
            prefix_block_ids=cfg.hash_ids,
        )
        if cfg.hash_ids and workload.content is None:
            raise TraceError(f"{path}: hash_ids: true, but not every row of the file has hash_ids")
        return workload
    from servesim.workload.arrival_processes import gamma_arrivals, poisson_arrivals

    arrival_rng, prompt_rng, output_rng = rng.spawn(3)
    check_synthetic_size(cfg.num_requests, getattr(cfg, "rate", None), getattr(cfg, "duration_s", None),
                         "num_requests")
    if isinstance(cfg, ClosedLoopWorkloadConfig):
        n = cfg.num_requests
        arrival_s = np.full(n, np.nan)
        head = f"closed loop, {cfg.concurrency} clients, think time {cfg.think_time_s:g} s, {n} requests"
    elif isinstance(cfg, PoissonWorkloadConfig):
        arrival_s = poisson_arrivals(cfg.rate, arrival_rng, cfg.num_requests, cfg.duration_s)
        head = f"Poisson arrivals at {cfg.rate:g} req/s, {_count(len(arrival_s), cfg.duration_s)}"
    elif isinstance(cfg, GammaWorkloadConfig):
        arrival_s = gamma_arrivals(cfg.rate, cfg.cv, arrival_rng, cfg.num_requests, cfg.duration_s)
        head = f"gamma arrivals at {cfg.rate:g} req/s (gap cv {cfg.cv:g}), {_count(len(arrival_s), cfg.duration_s)}"
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"not a workload config: {cfg!r}")
    if not len(arrival_s):  # only a duration_s can leave no arrival: nothing would be simulated
        from servesim.errors import SettingError

        raise SettingError(f"workload.duration_s: no request arrives in {cfg.duration_s:g} s at {cfg.rate:g} req/s "
                           "(with this seed): lengthen duration_s or raise the rate")
    prompt, output, lengths_text = _draw_lengths(cfg, len(arrival_s), prompt_rng, output_rng, base_dir)
    closed = isinstance(cfg, ClosedLoopWorkloadConfig)
    return Workload(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        concurrency=cfg.concurrency if closed else None,
        think_time_s=cfg.think_time_s if closed else 0.0,
        description=f"{head}, {lengths_text}",
    )


def _count(n: int, duration_s: float | None) -> str:
    return f"{n} requests" if duration_s is None else f"{n} requests in {duration_s:g} s"


def _draw_lengths(
    cfg: _SyntheticBase,
    n: int,
    prompt_rng: np.random.Generator,
    output_rng: np.random.Generator,
    base_dir: Path | None,
) -> tuple[np.ndarray, np.ndarray, str]:
    if cfg.lengths is not None:
        pairs = cfg.lengths.build(base_dir)
        prompt, output = pairs.sample(prompt_rng, n)
        return prompt, output, f"lengths: {pairs.label}"
    assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
    pd = cfg.prompt_tokens.build(base_dir)
    od = cfg.output_tokens.build(base_dir)
    text = f"prompt {pd.describe()} tokens, output {od.describe()} tokens"
    return pd.sample(prompt_rng, n), od.sample(output_rng, n), text



