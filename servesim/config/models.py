"""The run config a user writes (YAML or Python), as pydantic models.

A run config names the hardware, the model, the engine settings (vLLM's names, vLLM's defaults), the
step-time model, the workload and the SLOs. Example::

    hardware: h100-sxm               # a card in hardware/gpus/, a YAML path, or an inline mapping
    model: llama-3.1-8b              # a card in hardware/models/, a YAML path, a HF config.json, or inline
    tensor_parallel_size: 1
    engine: {max_num_seqs: 256}      # unset keys take vLLM's API-server defaults for that GPU
    workload: {type: trace, path: ../workloads/traces/AzureLLMInferenceTrace_conv.csv}
    slo: {ttft_s: 0.5, tpot_s: 0.05}
    seed: 0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from servesim.errors import ConfigError, named_by_set
from servesim.input_models import InputModel
from servesim.workload.config import WorkloadConfig


class _Strict(InputModel):
    model_config = ConfigDict(defer_build=True, extra="forbid")


class EngineConfig(_Strict):
    """vLLM engine settings, with vLLM's names and semantics.

    Attributes:
        max_num_seqs: most requests running at once; default: vLLM's API-server default for the GPU.
        max_num_batched_tokens: token budget per step; default: vLLM's API-server default for the GPU.
        block_size: tokens per KV-cache block (vLLM default 16).
        gpu_memory_utilization: share of each GPU's memory vLLM may use (vLLM 0.20+ default 0.92).
        enable_chunked_prefill: split long prompts over steps (vLLM V1 default on).
        enable_prefix_caching: vLLM's automatic prefix caching (reuse of cached KV blocks of shared
            prefixes, :mod:`servesim.engine.block_manager`). Default on, as vLLM 0.32 resolves it for a
            generative model (``EngineArgs``: ``model_config.is_prefix_caching_supported``), with speculative
            decoding too (README "Prefix caching").
        num_gpu_blocks_override: fix the KV-cache size in blocks instead of deriving it from memory; at
            least 2 (block 0 is vLLM's null block, never allocated).
        activation_reserve_bytes: per-GPU bytes kept for activations, sampler and CUDA graphs; default:
            derived from the model and the token budget (see :mod:`servesim.engine.kv_cache`).
        max_model_len: longest prompt + output a request may have (tokens); default: the model card's.
        async_scheduling: vLLM's ``--async-scheduling`` (the next step is scheduled while this one runs; see
            :meth:`servesim.engine.core.Engine.release_finishing`). Default: as vLLM 0.32 on GPUs, on,
            except with n-gram, Medusa or suffix speculation (and llama.cpp's rules), which vLLM runs
            synchronously.
    """

    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1)
    gpu_memory_utilization: float = Field(default=0.92, gt=0.0, le=1.0)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = Field(default=None, ge=2)
    activation_reserve_bytes: float | None = Field(default=None, ge=0.0)
    max_model_len: int | None = Field(default=None, ge=1)
    async_scheduling: bool | None = None


class RooflineConfig(_Strict):
    """Step-time model settings.

    Attributes:
        mode: ``calibrated`` (the card's efficiency factors and overhead, KV and attention terms) or
            ``ideal`` (the seed lesson's Example 12: efficiency 1, no overhead, no KV traffic).
        bandwidth_efficiency, compute_efficiency, step_overhead_s: override the hardware card's values.
    """

    mode: Literal["calibrated", "ideal"] = "calibrated"
    bandwidth_efficiency: float | None = Field(default=None, gt=0.0, le=1.0)
    compute_efficiency: float | None = Field(default=None, gt=0.0, le=1.0)
    step_overhead_s: float | None = Field(default=None, ge=0.0)


class SloConfig(_Strict):
    """Service-level objectives for goodput: a request is good if it meets every SLO given (s)."""

    ttft_s: float | None = Field(default=None, gt=0.0)
    tpot_s: float | None = Field(default=None, gt=0.0)


class MeasureWindow(_Strict):
    """A steady-state measurement window (``simulation.measure``), to compare with ``vllm bench`` numbers
    measured at a fixed batch without the warm-up and the final drain.

    The window starts at ``after_s`` (s) or at the finish of the ``after_completed``-th completed request,
    whichever is later (default 0), and ends at ``until_s`` or at the finish of the ``until_completed``-th
    completed request, whichever is earlier (default: the last finish). The summary's
    ``measurement_window`` reports over it: ``start_s``, ``end_s``, ``completed`` (requests finishing in
    it), ``request_throughput``, ``output_throughput`` and ``total_token_throughput`` (their requests and
    tokens per second of the window) and ``tpot_s`` of those requests. Counting whole requests by their
    finish time is unbiased in steady state (renewal-reward) and exact in the simulated clock.
    """

    after_s: float | None = Field(default=None, ge=0.0)
    until_s: float | None = Field(default=None, gt=0.0)
    after_completed: int | None = Field(default=None, ge=0)
    until_completed: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _non_empty(self) -> "MeasureWindow":
        """Refuse a window that is empty whatever the run does (ValueError: start not before end)."""
        if self.after_s is not None and self.until_s is not None and self.after_s >= self.until_s:
            raise ValueError(f"after_s ({self.after_s}) must be below until_s ({self.until_s})")
        if (self.after_completed is not None and self.until_completed is not None
                and self.after_completed >= self.until_completed):
            raise ValueError(f"after_completed ({self.after_completed}) must be below until_completed "
                             f"({self.until_completed})")
        return self


class SimulationConfig(_Strict):
    """How to simulate.

    Attributes:
        mode: ``run`` (advance runs of identical decode steps at once; default) or ``step`` (one engine
            step at a time; slower, same results bit for bit: the check that keeps ``run`` honest).
        max_time_s: stop at the first step boundary after this simulated time (s); unfinished requests
            are reported as such.
        measure: a steady-state measurement window (see :class:`MeasureWindow`); the whole-run metrics
            are reported unchanged beside it.
    """

    mode: Literal["run", "step"] = "run"
    max_time_s: float | None = Field(default=None, gt=0.0)
    measure: MeasureWindow | None = None


class PrefixAwareRouterConfig(_Strict):
    """``deployment.prefix_aware``: the prefix-aware router's scorers (llm-d's inference scheduler).

    Names follow llm-d's plugins (``prefix-cache-scorer``, ``queue-scorer``; ``blockSizeTokens``,
    ``maxPrefixBlocksToMatch``, ``lruCapacityPerServer`` of its approximate prefix-cache producer); the
    score and the sources of the defaults: :class:`servesim.engine.router.PrefixAwareRouting`.

    Attributes:
        prefix_cache_scorer_weight: weight of the prefix-cache score (matched / prompt blocks); llm-d 3.
        queue_scorer_weight: weight of the waiting-queue score; llm-d 2.
        active_request_scorer_weight: weight of the outstanding-requests score (in the place of llm-d's
            KV-cache-utilization scorer, weight 2).
        block_size_tokens: tokens per hashed block; default: ``engine.block_size``.
        max_prefix_blocks_to_match: most prompt blocks hashed per request; llm-d 256.
        lru_capacity_per_server: block hashes the router's index keeps per replica; default: the
            replica's KV-cache blocks (llm-d's ``autoTune``; its fixed default is 31,250).
    """

    prefix_cache_scorer_weight: float = Field(default=3.0, ge=0.0, allow_inf_nan=False)
    queue_scorer_weight: float = Field(default=2.0, ge=0.0, allow_inf_nan=False)
    active_request_scorer_weight: float = Field(default=2.0, ge=0.0, allow_inf_nan=False)
    block_size_tokens: int | None = Field(default=None, ge=1)
    max_prefix_blocks_to_match: int = Field(default=256, ge=1)
    lru_capacity_per_server: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _some_weight(self) -> "PrefixAwareRouterConfig":
        """Refuse all-zero weights (every replica would tie): ValueError."""
        if not (self.prefix_cache_scorer_weight or self.queue_scorer_weight or self.active_request_scorer_weight):
            raise ValueError("at least one scorer weight must be above 0")
        return self


class DeploymentConfig(_Strict):
    """Replicas of the same server behind a router.

    Attributes:
        replicas: identical engine replicas (each with ``tensor_parallel_size`` GPUs).
        router: ``round_robin``, ``least_outstanding`` (fewest unfinished requests), ``shortest_queue``
            (fewest waiting requests) or ``prefix_aware`` (cached prefix and load, as llm-d scores pods;
            settings in ``prefix_aware``); ties go to the lowest replica index.
        prefix_aware: the ``prefix_aware`` router's settings (:class:`PrefixAwareRouterConfig`); only with
            that router (defaults when omitted).
    """

    replicas: int = Field(default=1, ge=1)
    router: Literal["round_robin", "least_outstanding", "shortest_queue", "prefix_aware"] = "round_robin"
    prefix_aware: PrefixAwareRouterConfig | None = None

    @model_validator(mode="after")
    def _settings_for_router(self) -> "DeploymentConfig":
        """Fill in the prefix-aware defaults, and refuse its settings with another router: ValueError."""
        if self.router == "prefix_aware":
            if self.prefix_aware is None:
                self.prefix_aware = PrefixAwareRouterConfig()
        elif self.prefix_aware is not None:
            raise ValueError(f"prefix_aware settings are only read by router: prefix_aware (router is {self.router})")
        return self


class SimConfig(_Strict):
    """A whole run config: hardware, model, engine, step-time model, workload, SLOs, seed."""

    name: str | None = None
    hardware: str | dict[str, Any]
    model: str | dict[str, Any]
    tensor_parallel_size: int = Field(default=1, ge=1)
    engine: EngineConfig = EngineConfig()
    roofline: RooflineConfig = RooflineConfig()
    workload: WorkloadConfig
    slo: SloConfig | None = None
    seed: int = Field(default=0, ge=0)
    simulation: SimulationConfig = SimulationConfig()
    deployment: DeploymentConfig = DeploymentConfig()
    speculative_config: dict[str, Any] | None = None
    _source: str | None = PrivateAttr(default=None)

    @property
    def source(self) -> str | None:
        """The file this config was read from (:func:`load_config`, :func:`validate_config`), named in errors
        found when the run is wired (:class:`~servesim.errors.SettingError`); None for a config built in
        Python."""
        return self._source

    @field_validator("speculative_config", "hardware", "model")
    @classmethod
    def _check_mapping(cls, value: Any, info: ValidationInfo) -> Any:
        # speculative_config and an inline card are checked here, so that their errors name the config file and
        # the key (speculative_config.KEY, hardware.FIELD) as every other field's do; kept as the mappings that
        # the run's wiring builds its models from (names and paths resolved then, against the config's folder)
        if isinstance(value, dict):
            for model in cls.mapping_models(info.field_name):
                model.model_validate(value)
        return value

    @staticmethod
    def mapping_models(field: str) -> list[type]:
        """The models that the mapping given at ``field`` is checked against (``speculative_config``, an
        inline ``hardware`` or ``model`` card); also the keys an error's ``did you mean`` hint picks from."""
        if field == "speculative_config":
            from servesim.speculation.config import SpeculativeConfig

            return [SpeculativeConfig]
        if field == "hardware":
            from servesim.cards.hardware import HardwareCard

            return [HardwareCard]
        if field == "model":
            from servesim.cards.model import ModelCard

            return [ModelCard]
        return []


def is_sweep_file(data: Any) -> bool:
    """Whether YAML data read as a run config is a sweep file: a ``base`` and none of a run config's
    ``hardware``, ``model`` and ``workload``."""
    return isinstance(data, dict) and "base" in data and not {"hardware", "model", "workload"} & set(data)


def load_config(
    path: str | Path, overrides: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    set_keys: Iterable[str] = (),
) -> tuple[SimConfig, Path]:
    """Read and validate a run config file.

    Args:
        path: the YAML file.
        overrides: dotted keys to set before validation, in order: a mapping
            (``{"engine.max_num_seqs": 64}``) or ``(key, value)`` pairs, as ``servesim run --set`` gives.
        set_keys: the keys among ``overrides`` that ``--set`` gave: a field that fails validation at or
            inside one of them (or, below the top level, above one) is named ``--set``, not the file (the
            mistake is not in it; :func:`servesim.errors.named_by_set`).

    Returns:
        (config, folder of the file): relative paths inside the config resolve against that folder.

    Raises:
        ConfigError: unreadable file, invalid YAML, or a field that fails validation (one line).
    """
    from servesim.input_files import load_yaml, shown_found
    from servesim.config.overrides import set_dotted

    p = Path(path)
    data = load_yaml(p)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of config keys at the top level (got {shown_found(data)})")
    if is_sweep_file(data):
        raise ConfigError(f"{p}: a sweep file (base, grid/zip/variants), not a run config: give it to "
                          "`servesim sweep`, or give this command its base run config")
    data = inline_workload_file(data, p.resolve().parent, str(p))
    pairs = overrides.items() if isinstance(overrides, Mapping) else (overrides or ())
    for key, value in pairs:
        data = set_dotted(data or {}, key, value, source="--set")  # a key that cannot be set is the option's
        # --set workload=FILE (relative to the config's folder), which later --set keys may refine
        data = inline_workload_file(data, p.resolve().parent, "--set")
    try:
        return validate_config(data, str(p)), p.resolve().parent
    except ConfigError as exc:
        raise named_by_set(exc, str(p), list(set_keys)) from None


def inline_workload_file(data: Any, folder: Path, source: str) -> Any:
    """A run config's mapping with ``workload: FILE`` (a workload file such as ``workloads/poisson-chat.yaml``)
    replaced by that file's mapping, its relative ``path`` keys made absolute against the workload file's own
    folder (paths inside a workload are relative to the file that holds them). Other configs unchanged.

    Args:
        data: the run config's mapping (or anything else, returned as it is).
        folder: the folder the workload file's path resolves against (the run config's).
        source: the run config, named in messages.

    Raises:
        ConfigError: the workload file cannot be read, is invalid YAML, is not a mapping, or is not a valid
            workload (the message names the workload file and its field).
    """
    if not isinstance(data, dict) or not isinstance(data.get("workload"), str):
        return data
    from servesim.input_files import load_yaml
    from servesim.workload.lengths import resolve_path

    path = resolve_path(data["workload"], folder).resolve()
    try:
        workload = load_yaml(path)
    except ConfigError as exc:
        raise ConfigError(f"{source}: workload: {exc}") from None
    if not isinstance(workload, dict):
        raise ConfigError(f"{source}: workload: {path} is not a workload (expected a mapping of workload keys)")
    from servesim.input_files import validate
    from servesim.workload.build import WorkloadFile

    validate(WorkloadFile, workload, str(path))  # a mistake in the workload file names that file

    def absolute(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: (str(resolve_path(value, path.parent)) if key == "path" and isinstance(value, str)
                          else absolute(value)) for key, value in node.items()}
        if isinstance(node, list):
            return [absolute(item) for item in node]
        return node

    return {**data, "workload": absolute(workload)}


def validate_config(data: Any, source: str) -> SimConfig:
    """Validate a run config's mapping, read from ``source`` (a file, or e.g. ``FILE: cases[0].config``).

    The config remembers ``source`` (:attr:`SimConfig.source`), so that a setting found impossible when the
    run is wired is named with it too.

    Raises:
        ConfigError: one line ``source: field.path: message``.
    """
    from servesim.input_files import validate

    cfg = validate(SimConfig, data, source)
    cfg._source = source
    return cfg
