"""The Python API: ``simulate(config) -> Result``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from servesim.config.models import SimConfig
from servesim.engine.output import EngineOutput
from servesim.seeding import STREAM_ACCEPTANCE, STREAM_FACTORS, STREAM_ROUTER, STREAM_WORKLOAD, child_seed  # noqa: F401 (re-exported)


@dataclass
class Result:
    """The outcome of one simulation.

    Attributes:
        config: the validated config that ran (with ``simulate``'s integer ``seed=``, that seed; a
            SeedSequence, as sweeps pass, leaves the config's).
        output: the engine's raw records (:class:`~servesim.engine.output.EngineOutput`, arrays in s).
        summary: JSON-serialisable metrics (see :func:`servesim.metrics.summarize`).
        info: derived facts about the setup (KV-cache blocks, step-time coefficients, defaults used).
    """

    config: SimConfig
    output: EngineOutput
    summary: dict
    info: dict = field(default_factory=dict)

    @cached_property
    def _frames(self):
        from servesim.metrics import to_dataframes

        return to_dataframes(self.output)

    @property
    def requests(self):
        """Per-request pandas DataFrame (one row per request, times in s)."""
        return self._frames[0]

    @property
    def steps(self):
        """Per-step pandas DataFrame (one row per engine step or run of identical decode steps)."""
        return self._frames[1]


def _as_config(config: Any, base_dir: str | Path | None) -> tuple[SimConfig, Path]:
    from servesim.config.models import load_config
    from servesim.errors import ConfigError
    from servesim.input_files import validate

    if base_dir is not None and not isinstance(base_dir, (str, os.PathLike)):
        raise ConfigError(f"base_dir: expected a folder path (got {type(base_dir).__name__})")
    if (isinstance(config, tuple) and len(config) == 2 and isinstance(config[0], SimConfig)
            and isinstance(config[1], (str, os.PathLike))):
        # load_config's (config, folder), passed whole
        config, base_dir = config[0], base_dir if base_dir is not None else config[1]
    if isinstance(config, SimConfig):
        return config, Path(base_dir or ".").resolve()
    if isinstance(config, (str, Path)):
        if isinstance(config, str) and "\n" in config and not os.path.lexists(config):
            raise ConfigError(f"config: a string is a YAML file's path, not YAML text (got "
                              f"{config.splitlines()[0][:40]!r} ...); pass a mapping, e.g. yaml.safe_load(text)")
        cfg, folder = load_config(config)
        return cfg, Path(base_dir).resolve() if base_dir else folder
    from servesim.config.models import inline_workload_file

    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a run config (a YAML path, a mapping or a SimConfig), got "
                          f"{type(config).__name__}")

    folder = Path(base_dir or ".").resolve()
    return validate(SimConfig, inline_workload_file(config, folder, "config"), "config"), folder


def simulate(config: Any, *, seed: int | np.random.SeedSequence | None = None, base_dir: str | Path | None = None,
             progress: bool = False) -> Result:
    """Simulate one server configuration.

    Args:
        config: a :class:`~servesim.config.models.SimConfig`, a mapping with the same keys, the path of a
            YAML run config, or :func:`~servesim.config.models.load_config`'s ``(config, folder)``.
        seed: overrides the config's ``seed``; a non-negative int or a ``numpy.random.SeedSequence`` (sweeps
            pass one spawned per point and replication). Same config and seed give identical results.
        base_dir: folder that relative paths in the config resolve against (default: the config file's
            folder, or the current directory for mappings).
        progress: show a bar of completed requests on stderr while simulating, when stderr is a terminal and
            the run lasts more than a second (:mod:`servesim.progress`; the results are the same).

    Returns:
        A :class:`Result` with ``summary`` (dict), ``requests`` and ``steps`` (pandas DataFrames).

    Raises:
        ServesimError: an invalid config (or no config, or a seed that is not a non-negative integer or a
            SeedSequence), an unreadable trace, or a setup that cannot run (one line; a setting that cannot
            run names the config's file when it was read from one).
    """
    from servesim.errors import ConfigError, naming_settings_of

    if config is None:
        raise ConfigError("config: expected a run config (a YAML path, a mapping or a SimConfig), got None")
    if isinstance(seed, float) and seed.is_integer():  # as a config's seed: 4.0 is 4
        seed = int(seed)
    if seed is not None and not isinstance(seed, np.random.SeedSequence) and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigError(f"seed: expected a non-negative integer or a numpy SeedSequence (got {seed!r})")
    cfg, folder = _as_config(config, base_dir)
    with naming_settings_of(cfg.source):
        return _simulate(cfg, folder, seed, progress)


def _simulate(cfg: SimConfig, folder: Path, seed: int | np.random.SeedSequence | None,
              progress: bool = False) -> Result:
    from servesim.collector import cycle_collector_paused
    from servesim.progress import run_to_end
    from servesim.wiring import build_engine

    if seed is None:
        root = np.random.SeedSequence(cfg.seed)
    elif isinstance(seed, np.random.SeedSequence):
        root = seed
    else:
        root = np.random.SeedSequence(int(seed))
    from servesim.metrics import summarize

    if cfg.deployment.replicas > 1:
        from servesim.deployment import build_deployment

        runner, env, info = build_deployment(cfg, folder, root)
        engines, total = runner.engines, runner.source.num_requests
    else:
        runner, env, info = build_engine(cfg, folder, root)
        engines, total = [runner], runner.num_requests
    with cycle_collector_paused():  # the run makes no reference cycles (servesim/collector.py)
        run_to_end(env, lambda: sum(engine.finished for engine in engines), total, progress)
    del engines
    out = runner.output()
    if cfg.deployment.replicas > 1:
        replica_outputs, router = runner.replica_outputs(), runner.router_summary()
    # the engines' simulation state (per-request lists, acceptance tables, logs) is not needed any more:
    # freed before the summary's temporaries (the run's peak memory otherwise)
    del runner, env
    slo = cfg.slo.model_dump(exclude_none=True) if cfg.slo is not None else None
    summary = summarize(out, slo=slo or None, measure=cfg.simulation.measure)
    if cfg.deployment.replicas > 1:
        per_replica = [summarize(o, slo=slo or None) for o in replica_outputs]
        summary["replicas"] = per_replica
        summary["router"] = router
        # the merged step log interleaves the replicas' rows: report KV-cache utilisation per replica
        util = [r["kv_cache_utilization"] for r in per_replica if r.get("kv_cache_utilization")]
        if util:
            summary["kv_cache_utilization"] = {
                "mean": float(np.mean([u["mean"] for u in util if u["mean"] is not None])),
                "max": float(max(u["max"] for u in util if u["max"] is not None)),
            }
    if seed is not None and not isinstance(seed, np.random.SeedSequence):
        cfg = cfg.model_copy(update={"seed": int(seed)})  # the config that ran: with the seed it ran with
    return Result(config=cfg, output=out, summary=summary, info=info)
