"""Hardware and model cards: what a GPU can do and what a model costs.

- :class:`HardwareCard`: vendor dense peaks (bytes, bytes/s, FLOP/s) plus named calibration factors.
- :class:`ModelCard`: architecture numbers (or explicit totals) and the derived quantities the roofline
  needs: parameters, weight bytes, KV bytes per token (GQA, MLA, sliding window), FLOPs per token and per
  attention pair, MoE experts touched.
- :func:`load_hardware` / :func:`load_model`: by shipped name, path (YAML, or a Hugging Face config.json for
  models), inline mapping, or an existing card.
"""

from __future__ import annotations

from servesim.cards.dtypes import BYTES_PER_ELEMENT, KVCacheDtype, WeightDtype, bytes_per_element
from servesim.cards.hardware import HardwareCard, vllm_default_scheduler_limits
from servesim.cards.hf_config import hf_config_to_card_data, load_hf_config
from servesim.cards.loading import (
    available_hardware,
    available_models,
    cards_dirs,
    clear_card_cache,
    load_hardware,
    load_model,
)
from servesim.cards.model import ModelCard
from servesim.cards.params import ParamCounts, count_params

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
