"""Hardware and model cards: what a GPU can do and what a model costs.

- :class:`HardwareCard`: vendor dense peaks (bytes, bytes/s, FLOP/s) plus named calibration factors.
- :class:`ModelCard`: architecture numbers (or explicit totals) and the derived quantities the roofline
  needs: parameters, weight bytes, KV bytes per token (GQA, MLA, sliding window), FLOPs per token and per
  attention pair, MoE experts touched.
- :func:`load_hardware` / :func:`load_model`: by shipped name, path (YAML, or a Hugging Face config.json for
  models), inline mapping, or an existing card.
"""

from __future__ import annotations

from servesim.lazy_exports import lazy_exports

# name -> submodule. The names load on first use (PEP 562): a run needs the cards and their loader, not the
# Hugging Face config.json reader (start-up time of ``servesim run``).
_SOURCES: dict[str, str] = {
    **dict.fromkeys(("BYTES_PER_ELEMENT", "KVCacheDtype", "WeightDtype", "bytes_per_element"), "dtypes"),
    **dict.fromkeys(("HardwareCard", "vllm_default_scheduler_limits"), "hardware"),
    **dict.fromkeys(("hf_config_to_card_data", "load_hf_config"), "hf_config"),
    **dict.fromkeys(("available_hardware", "available_models", "cards_dirs", "clear_card_cache", "load_hardware",
                     "load_model"), "loading"),
    "ModelCard": "model",
    **dict.fromkeys(("ParamCounts", "count_params"), "params"),
}


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)


__all__ = [
    "BYTES_PER_ELEMENT",
    "HardwareCard",
    "KVCacheDtype",
    "ModelCard",
    "ParamCounts",
    "WeightDtype",
    "available_hardware",
    "available_models",
    "bytes_per_element",
    "cards_dirs",
    "clear_card_cache",
    "count_params",
    "hf_config_to_card_data",
    "load_hardware",
    "load_model",
    "load_hf_config",
    "vllm_default_scheduler_limits",
]
