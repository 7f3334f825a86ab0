"""From a validated config to a ready-to-run SimPy environment: cards, defaults, KV capacity, workload."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from servesim.config.models import SimConfig
from servesim.engine.arrival_source import ArrivalSource
from servesim.engine.core import Engine
from servesim.engine.kv_cache import FIT_DEPENDS_ON, kv_cache_blocks
from servesim.errors import SettingError
from servesim.roofline import PS_PER_S, SUBPS_PER_S, build_step_time_model


@contextmanager
def _setting(key: str) -> Iterator[None]:
    """Turn a ConfigError about the run config's ``key`` (its message starts with ``key``) into a SettingError,
    so that the config's file is named in front of it (errors that name a file of their own are kept)."""
    from servesim.errors import ConfigError

    try:
        yield
    except ConfigError as exc:
        if isinstance(exc, SettingError) or not str(exc).startswith((f"{key}: ", f"{key}.")):
            raise
        raise SettingError(str(exc)) from None


def resolve_cards(cfg: SimConfig, folder: Path):
    """Load the hardware and model cards named by ``cfg``, applying the roofline overrides.

    Raises:
        SettingError: an unknown card name. ConfigError: a card file that is missing or invalid.
    """
    from servesim.cards import load_hardware, load_model

    # an unknown name is a setting of the run config (an inline card was checked with the config, and a card
    # file's errors name that file)
    with _setting("hardware"):
        hardware = load_hardware(cfg.hardware, base_dir=folder, source="hardware")
    with _setting("model"):
        model = load_model(cfg.model, base_dir=folder, source="model")
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


VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
"""``--block-size`` choices of vLLM's engine arguments."""


def check_tensor_parallel(model, tensor_parallel_size: int, name: str = "tensor_parallel_size") -> None:
    """vLLM's split of a model's heads over a tensor-parallel group: the attention heads must divide by TP
    (``ModelConfig.verify_with_parallel_config``), and the KV heads and TP divide one another
    (``QKVParallelLinear``: split, or replicated once the GPUs outnumber them; not for MLA).

    Raises:
        SettingError: a head count that does not split, naming ``name`` (the setting or option).
    """
    heads = getattr(model, "num_attention_heads", None)
    tp = int(tensor_parallel_size)
    if heads and heads % tp:
        raise SettingError(
            f"{name}: total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})",
            depends_on=("model", "tensor_parallel_size"),
        )
    kv_heads = getattr(model, "num_key_value_heads", None) if getattr(model, "attention", None) != "mla" else None
    if kv_heads and (tp % kv_heads if tp >= kv_heads else kv_heads % tp):
        raise SettingError(
            f"{name}: the number of KV heads ({kv_heads}) and the tensor parallel size ({tp}) must divide one "
            "another (vLLM splits the KV heads across the GPUs, or replicates them once the GPUs outnumber them)",
            depends_on=("model", "tensor_parallel_size"),
        )


def check_vllm_limits(cfg: SimConfig, model, max_num_seqs: int, max_num_batched_tokens: int) -> None:
    """Reject settings vLLM itself would reject, with vLLM-like messages.

    Raises:
        SettingError: block size not among vLLM's choices, attention heads not divisible by the tensor
            parallel size, KV heads and tensor parallel size that do not divide one another (vLLM
            ``QKVParallelLinear``), or ``max_num_batched_tokens < max_num_seqs``.
    """
    e = cfg.engine
    if e.block_size not in VLLM_BLOCK_SIZES:
        raise SettingError(f"engine.block_size: expected one of {list(VLLM_BLOCK_SIZES)} as in vLLM (got {e.block_size})")
    check_tensor_parallel(model, cfg.tensor_parallel_size)
    if max_num_batched_tokens < max_num_seqs:
        raise SettingError(
            f"engine: max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({max_num_seqs})"
        )


ASYNC_SPECULATIVE_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
"""Speculative methods vLLM 0.32 runs with async scheduling (``VllmConfig``: the EAGLE family, MTP and draft
models; not n-gram on the CPU, Medusa or suffix decoding)."""


def resolve_async_scheduling(cfg: SimConfig, spec) -> bool:
    """``engine.async_scheduling``, or vLLM 0.32's default on GPUs when unset: on, unless the speculative
    method does not support it (then vLLM silently runs synchronously) or llama.cpp's draft budget rule is on.

    Raises:
        SettingError: async scheduling asked for with a speculative method vLLM does not support it with.
    """
    wanted = cfg.engine.async_scheduling
    supported = spec is None or (spec.method in ASYNC_SPECULATIVE_METHODS and not spec.draft_budget_limit)
    if wanted is None:
        return supported
    if wanted and not supported:
        raise SettingError(
            "engine.async_scheduling: currently, async scheduling is only supported with EAGLE/MTP/Draft Model "
            f"kind of speculative decoding (got method '{spec.method}')"
        )
    return bool(wanted)


@dataclass
class Prepared:
    """Everything one replica needs, derived from a config (cards, limits, KV capacity, workload)."""

    cfg: SimConfig
    hardware: object
    model: object
    step_time: object
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    workload: object
    info: dict
    spec: object = None
    async_scheduling: bool = False


def prepare(cfg: SimConfig, folder: Path, root: np.random.SeedSequence) -> Prepared:
    """Load the cards, apply vLLM's defaults, size the KV cache, build the workload.

    Raises:
        ConfigError: cards not found, the model does not fit, a request can never be served, a speculative
            config vLLM would reject for this target (MTP module count, draft_tensor_parallel_size).
    """
    from servesim.seeding import STREAM_WORKLOAD, child_seed
    from servesim.workload import build_workload

    hardware, model = resolve_cards(cfg, folder)
    tp = cfg.tensor_parallel_size
    seqs, budget = engine_limits(cfg, hardware)
    e = cfg.engine
    check_vllm_limits(cfg, model, seqs, budget)
    step_time = build_step_time_model(hardware, model, tp, cfg.roofline.mode,
                                      speculative=cfg.speculative_config is not None)
    spec = drafter = None
    if cfg.speculative_config is not None:
        from servesim.input_files import validate
        from servesim.speculation.config import SpeculativeConfig
        from servesim.speculation.costs import build_drafter

        # checked when the SimConfig was validated (its errors name the config file); a mapping changed since
        # is named as what it is
        spec = validate(SpeculativeConfig, cfg.speculative_config, "speculative_config")
        spec.check_target(model)
        draft_tp = spec.draft_tensor_parallel_size
        if draft_tp is not None and draft_tp not in (1, tp):  # vllm/config/speculative.py, _verify_and_get_draft_tp
            raise SettingError(
                f"speculative_config.draft_tensor_parallel_size: {draft_tp} cannot be other value than 1 or "
                f"target model tensor_parallel_size ({tp})"
            )
        if budget <= spec.max_num_new_slots_for_drafting:
            raise SettingError(
                f"engine.max_num_batched_tokens: VllmConfig does not have enough slots to schedule a token and support "
                f"the speculative decoding settings (max_num_batched_tokens={budget}, "
                f"max_num_new_slots_for_drafting={spec.max_num_new_slots_for_drafting})",
                depends_on=("speculative_config",),
            )
        with _setting("speculative_config"):  # a draft model or head card named or given inline
            drafter = build_drafter(spec, hardware, model, tp, cfg.roofline.mode, step_time, folder)
    pool = dict(
        tensor_parallel_size=tp,
        block_size=e.block_size,
        gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        activation_reserve=e.activation_reserve_bytes,
        extra_weight_bytes_per_gpu=drafter.weight_bytes_per_gpu if drafter else 0.0,
        extra_kv_bytes_per_token_per_gpu=drafter.kv_bytes_per_token_per_gpu if drafter else 0.0,
        extra_name=(f"the draft model {spec.model}" if spec is not None and spec.method == "draft_model"
                    else "the drafter"),
    )
    blocks = kv_cache_blocks(hardware, model, num_gpu_blocks_override=e.num_gpu_blocks_override, **pool)
    model_len = getattr(model, "max_model_len", None)
    if e.max_model_len is not None and model_len is not None and e.max_model_len > model_len:
        # vLLM's ModelConfig refuses a max_model_len beyond the model's (its derived max_model_len)
        raise SettingError(
            f"engine.max_model_len: {e.max_model_len} tokens exceeds the model's context, {model_len} tokens "
            f"(the card's max_model_len); vLLM refuses a longer one unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: give "
            f"at most {model_len}, or a model card whose max_model_len the model really supports"
        )
    context_len = e.max_model_len or model_len
    if context_len is not None:
        # vLLM's check_enough_kv_cache_memory (v1/core/kv_cache_utils.py), on the memory before any
        # num_gpu_blocks_override: one request at max_model_len must fit in the KV cache
        memory_blocks = blocks if e.num_gpu_blocks_override is None else kv_cache_blocks(hardware, model, **pool)
        needed_blocks = -(-context_len // e.block_size)
        if needed_blocks > memory_blocks:
            block_bytes = (model.kv_bytes_per_token_per_gpu(tp)
                           + (drafter.kv_bytes_per_token_per_gpu if drafter else 0.0)) * e.block_size
            raise SettingError(
                f"engine.max_model_len: to serve at least one request with the model's max seq len "
                f"({context_len}), {needed_blocks * block_bytes / 2**30:.2f} GiB KV cache is needed, which is larger "
                f"than the available KV cache memory ({memory_blocks * block_bytes / 2**30:.2f} GiB); based on the "
                f"available memory, the estimated maximum model length is {memory_blocks * e.block_size} (vLLM "
                f"refuses to start): raise engine.gpu_memory_utilization or lower engine.max_model_len",
                depends_on=("engine.max_model_len", *FIT_DEPENDS_ON),
            )
    longest = step_time.context_free_s(budget, min(seqs, budget))
    if not longest <= MAX_STEP_S:  # an inf or absurd step time (the int clock would overflow on it)
        raise SettingError(
            f"roofline: a step of max_num_batched_tokens={budget} tokens takes {longest:.3g} s with these step-time "
            f"settings (step_overhead_s and efficiencies of the hardware card or roofline); servesim's steps take "
            f"at most {MAX_STEP_S:.3g} s"
        )
    # the context terms of the longest step a run can take: every block of the cache attended, but no request
    # beyond max_model_len (at most max_num_seqs of them), and each scheduled token over at most that many keys
    kv_tokens = blocks * e.block_size
    keys_per_token = kv_tokens
    if context_len is not None:
        kv_tokens = min(kv_tokens, seqs * context_len)
        keys_per_token = min(keys_per_token, context_len)
    longest = step_time.step_subps(budget, min(seqs, budget), kv_tokens, budget * keys_per_token, seqs) / SUBPS_PER_S
    if drafter is not None:
        longest += drafter.step_subps(budget, min(seqs, budget), spec.num_speculative_tokens, kv_tokens) / SUBPS_PER_S
    if not longest <= MAX_STEP_S:
        raise SettingError(
            f"roofline: a step of max_num_batched_tokens={budget} tokens over {kv_tokens:,} tokens of context (the "
            f"KV cache's {blocks:,} blocks of {e.block_size} tokens, at most max_num_seqs x max_model_len) takes "
            f"{longest:.3g} s with these settings (the hardware card's memory_bytes and bandwidths, the "
            f"efficiencies of the card or roofline); servesim's steps take at most {MAX_STEP_S:.3g} s"
        )
    max_time = cfg.simulation.max_time_s
    if max_time is not None and not max_time <= MAX_SIMULATED_S:
        raise SettingError(f"simulation.max_time_s: expected at most {MAX_SIMULATED_S:.3g} s (~53 days), the "
                           f"engine's clock (got {max_time:.3g})")
    rng = np.random.default_rng(child_seed(root, STREAM_WORKLOAD))
    workload = build_workload(cfg.workload, rng, folder)
    max_len = e.max_model_len or model_len
    if max_len is not None and len(workload.prompt_tokens):
        lengths = workload.prompt_tokens + workload.output_tokens
        worst = int(lengths.max())
        if worst > max_len:
            count = int((lengths > max_len).sum())
            raise SettingError(
                f"workload: {count} request(s) need more than max_model_len={max_len} tokens (longest {worst}); "
                "vLLM would reject them: cap the lengths or raise engine.max_model_len",
                depends_on=("engine.max_model_len", "model"),
            )
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
        "async_scheduling": resolve_async_scheduling(cfg, spec),
        "enable_prefix_caching": bool(e.enable_prefix_caching),
        "roofline_mode": cfg.roofline.mode,
        "decode_step_s_batch1": step_time.base_s(1, 1, 1),
        "kv_s_per_token": step_time.kv_ps_per_token / PS_PER_S,
        # the largest relative rounding error of the integer step-time coefficients, the drafter's KV included
        "step_time_coefficient_rounding_error": max(
            step_time.coefficient_rounding_error,
            drafter.draft_model.coefficient_rounding_errors["kv"] if drafter and drafter.draft_model else 0.0),
    }
    spec_setup = None
    if spec is not None:
        spec_setup = _spec_setup(spec, drafter, workload, folder, root)
        spec_setup.prefill_lookahead = spec.num_prefill_lookahead_tokens(int(getattr(model, "num_nextn_predict_layers", 0) or 0))
        info["speculative_method"] = spec.method
        info["num_speculative_tokens"] = spec.num_speculative_tokens
        info["acceptance_profile"] = spec_setup.profile.name
        info["mean_acceptance_length_model"] = float(spec_setup.profile.mean_acceptance_length(spec.num_speculative_tokens))
        measured_for = getattr(spec_setup.profile, "method", None)
        if measured_for is not None and measured_for != spec.method:  # allowed (an approximation), but said
            info.setdefault("notes", []).append(
                f"speculative_config.acceptance: the profile {spec_setup.profile.name!r} was measured with method "
                f"{measured_for!r}; this run's method is {spec.method!r}")
    return Prepared(cfg, hardware, model, step_time, blocks, seqs, budget, workload, info, spec_setup,
                    info["async_scheduling"])


ACCEPTANCE_DRAW_CHUNK = 1 << 16
"""Uniforms drawn at a time when the acceptance of every round is tabulated at load time (512 KiB of
float64, drawn into one reused buffer that stays in the CPU cache: twice as fast as 8 MiB chunks)."""


def _spec_setup(spec, drafter, workload, folder: Path, root: np.random.SeedSequence):
    """Acceptance profile, k schedule and pre-drawn uniforms of a speculative run."""
    from servesim.seeding import STREAM_ACCEPTANCE, STREAM_FACTORS, child_seed
    from servesim.engine.speculative_decoding import SpecSetup
    from servesim.speculation.config import DEFAULT_PROFILES
    from servesim.speculation.profile import load_profile
    from servesim.speculation.schedule import KSchedule

    with _setting("speculative_config.acceptance"):
        profile = spec.synthetic_profile() or load_profile(
            spec.acceptance if spec.acceptance is not None else DEFAULT_PROFILES[spec.method],
            base_dir=folder,
            source="speculative_config.acceptance",
        )
    from servesim.speculation.config import effective_profile

    profile = effective_profile(spec, profile)  # sampling temperature and verification rule
    tree_nodes = None
    if spec.draft_tree is not None:
        from servesim.speculation.tree import tree_acceptance

        depth = len(spec.draft_tree)
        tree = tree_acceptance(spec.draft_tree, chain_conditional=profile.conditional_extended(depth))
        profile = tree.to_profile(
            name=f"{profile.name or 'profile'} as tree {spec.draft_tree}",
            source=f"{profile.source}; tree acceptance 1 - (1 - a_d)^b_d (servesim.speculation.tree)",
            method=spec.method,
        )
        tree_nodes = tree.verify_width - 1
    total_rounds = int(np.asarray(workload.output_tokens, dtype=np.int64).sum())
    acceptance_rng = np.random.default_rng(child_seed(root, STREAM_ACCEPTANCE))
    n = len(workload.output_tokens)
    factors = None
    h = getattr(profile, "heterogeneity", None)
    if h is not None and h.enabled:
        factors = profile.request_factors(np.random.default_rng(child_seed(root, STREAM_FACTORS)), n)
    accept_table = uniforms = None
    decay = getattr(profile, "context_decay", None)
    if factors is None and (decay is None or not decay.enabled):
        # acceptance depends only on the draw: A(u) = #{i <= K : u < p_i} for every round at once, built
        # from the same stream of uniforms drawn in chunks (a Generator's doubles do not depend on how the
        # draws are split), so that no float64 per output token is held beside the table
        p = np.cumprod(profile.conditional_rates(spec.num_speculative_tokens))
        # one byte per output token where K + 1 fits int8 (K <= 126; vLLM allows up to 128)
        accept_dtype = np.int8 if spec.num_speculative_tokens < np.iinfo(np.int8).max else np.int16
        accept_table = np.zeros(total_rounds, dtype=accept_dtype)
        buffer = np.empty(min(ACCEPTANCE_DRAW_CHUNK, total_rounds))
        for start in range(0, total_rounds, ACCEPTANCE_DRAW_CHUNK):
            chunk = buffer[: min(ACCEPTANCE_DRAW_CHUNK, total_rounds - start)]
            acceptance_rng.random(out=chunk)
            table = accept_table[start: start + chunk.size]
            for p_i in p:
                table += chunk < p_i
            if spec.drafts_may_be_empty:
                table[profile.draft_is_empty(chunk)] = -1
    else:
        uniforms = acceptance_rng.random(total_rounds)
    return SpecSetup(
        accept_table=accept_table,
        tree_nodes=tree_nodes,
        draft_budget_limit=spec.draft_budget_limit,
        schedule=KSchedule(spec.num_speculative_tokens, spec.num_speculative_tokens_per_batch_size),
        lookahead=spec.lookahead_slots,
        draft_slots=spec.max_num_new_slots_for_drafting,
        disable_by_batch_size=spec.disable_by_batch_size,
        drafts_may_be_empty=spec.drafts_may_be_empty,
        drafter=drafter,
        profile=profile,
        uniforms=uniforms,
        factors=factors,
    )


MAX_SIMULATED_S = 2**62 / PS_PER_S
"""Longest simulated time span (s, about 53 days): the engine's clock is int64 picoseconds."""

MAX_ARRIVAL_SPAN_S = MAX_SIMULATED_S / 2
"""Longest span of arrivals (s, about 26 days): half the clock, so that the last arrival can still be served."""

MAX_STEP_S = 2**46 / PS_PER_S
"""Longest engine step (s, about 70 s): a step's duration is held in int64 units of 2^-16 ps
(:data:`servesim.roofline.SUBPS_BITS`) with room for a run's sums."""


def arrival_source(workload) -> ArrivalSource:
    """The engine's arrival source for a workload: open-loop times, or closed-loop clients.

    Raises:
        SettingError: the arrivals span more simulated time than the engine's clock holds.
    """
    if workload.concurrency is None:
        last = float(np.max(workload.arrival_s)) if len(workload.arrival_s) else 0.0
        if not last <= MAX_ARRIVAL_SPAN_S:
            raise SettingError(
                f"workload: the last request arrives at {last:.3g} s; servesim simulates at most "
                f"{MAX_ARRIVAL_SPAN_S:.3g} s (~26 days) of arrivals: raise the rate or rate_scale"
            )
        # int64 array: 8 bytes per request rather than an int object each (read a few times per request)
        times = array("q", np.rint(np.asarray(workload.arrival_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tobytes())
        return ArrivalSource(times=times, num_requests=len(times))
    if not workload.think_time_s <= MAX_ARRIVAL_SPAN_S:
        raise SettingError(
            f"workload.think_time_s: expected at most {MAX_ARRIVAL_SPAN_S:.3g} s (~26 days), the longest span of "
            f"arrivals servesim simulates (got {workload.think_time_s:.3g})"
        )
    return ArrivalSource(
        times=None,
        num_requests=len(workload.prompt_tokens),
        concurrency=int(workload.concurrency),
        think_ps=round(float(workload.think_time_s) * PS_PER_S),
    )


def make_engine(p: Prepared, source, prompt_tokens=None, output_tokens=None) -> Engine:
    """One replica's engine over ``source`` (requests ``0..N-1`` of the given token arrays).

    Raises:
        SettingError: a request can never be served with these settings.
    """
    e = p.cfg.engine
    try:
        return Engine(
            speculation=p.spec,
            prompt_tokens=p.workload.prompt_tokens if prompt_tokens is None else prompt_tokens,
            output_tokens=p.workload.output_tokens if output_tokens is None else output_tokens,
            arrivals=source,
            step_time=p.step_time,
            kv_blocks_total=p.kv_blocks,
            block_size=e.block_size,
            max_num_seqs=p.max_num_seqs,
            max_num_batched_tokens=p.max_num_batched_tokens,
            enable_chunked_prefill=e.enable_chunked_prefill,
            async_scheduling=p.async_scheduling,
            enable_prefix_caching=p.info["enable_prefix_caching"],
            content=p.workload.content if prompt_tokens is None else None,
            mode=p.cfg.simulation.mode,
            max_time_s=p.cfg.simulation.max_time_s,
            max_model_len=e.max_model_len or getattr(p.model, "max_model_len", None),
        )
    except ValueError as exc:
        raise SettingError(f"engine: {exc}") from None


def build_engine(cfg: SimConfig, folder: Path, root: np.random.SeedSequence):
    """Build one replica's engine and its SimPy environment for one run.

    Returns:
        (engine, env, info): ``engine.output()`` gives the records after ``env.run()``; ``info`` records
        the derived setup (KV blocks, defaults, coefficients).

    Raises:
        ConfigError: cards not found, the model does not fit, a request can never be served.
    """
    p = prepare(cfg, folder, root)
    engine = make_engine(p, arrival_source(p.workload))
    env = simpy.Environment()
    env.process(engine.process(env))
    return engine, env, p.info
