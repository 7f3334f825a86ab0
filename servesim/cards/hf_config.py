"""Read a Hugging Face ``config.json`` as a model card.

Keys mapped (others are ignored): ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``,
``num_attention_heads``, ``num_key_value_heads`` (default: the attention heads), ``head_dim`` (default
hidden/heads), ``vocab_size``, ``tie_word_embeddings`` (default False), ``torch_dtype``/``dtype``,
``num_local_experts``/``n_routed_experts``/``num_experts``, ``num_experts_per_tok``/``experts_per_token``,
``moe_intermediate_size``, ``n_shared_experts``, ``first_k_dense_replace``, ``kv_lora_rank`` (its presence
means MLA), ``q_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``,
``max_position_embeddings``, ``sliding_window`` with ``layer_types``/``use_sliding_window``,
``attention_bias``, ``mlp_bias``, ``num_nextn_predict_layers`` (or ``mtp_num_hidden_layers``),
``quantization_config.quant_method`` (``fp8``; ``mxfp4`` for the experts). ``model_type`` qwen3/qwen3_moe sets ``qk_norm``; gpt_oss sets the
attention and MLP biases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesim.cards.model import ModelCard
from servesim.input_files import shown_found, validate
from servesim.errors import ConfigError

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def load_json(path: Path) -> Any:
    """Read a JSON file.

    Raises:
        ConfigError: missing, unreadable or invalid JSON (one line with the line and column).
    """
    from servesim.input_files import load_json

    return load_json(path)


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def hf_config_to_card_data(cfg: dict[str, Any], source: str, default_name: str) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` mapping to :class:`ModelCard` fields (see the module docstring).

    Args:
        cfg: the parsed config.json.
        source: what to name in errors (the file path).
        default_name: card name when the config has no ``_name_or_path``.

    Raises:
        ConfigError: a required key is missing, or the config uses something the card cannot describe
        (an unknown dtype or quantisation method, MoE layers interleaved with dense ones).
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object (a Hugging Face config.json; got {shown_found(cfg)})")
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                "max_position_embeddings"):
        if cfg.get(key) is None:
            if isinstance(cfg.get("text_config"), dict) and cfg["text_config"].get(key) is not None:
                # a multimodal model (Llama 4, Gemma 3, Mistral 3, ...): its language model's numbers sit
                # under text_config, beside a vision encoder whose weights the card would not count
                raise ConfigError(
                    f"{source}: {key}: required key is missing at the top level; this config keeps its language "
                    "model's numbers under text_config (a multimodal model), which servesim does not read: "
                    "write a model card YAML from text_config's numbers (they leave out the vision "
                    "encoder's weights)")
            raise ConfigError(f"{source}: {key}: required key is missing (Hugging Face config.json)")
    model_type = str(cfg.get("model_type", "")).lower()
    name_or_path = cfg.get("_name_or_path") or ""
    data: dict[str, Any] = {
        "name": name_or_path or default_name,
        "hf_repo": name_or_path if name_or_path.count("/") == 1 else None,
        "num_hidden_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": _first(cfg, "num_key_value_heads", "num_attention_heads"),
        "head_dim": cfg.get("head_dim"),
        "vocab_size": cfg["vocab_size"],
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "attention_bias": bool(cfg.get("attention_bias", model_type == "gpt_oss")),
        "mlp_bias": bool(cfg.get("mlp_bias", model_type == "gpt_oss")),
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "max_model_len": cfg["max_position_embeddings"],
        # DeepSeek's key; Qwen3.5/3.6 name their MTP layers mtp_num_hidden_layers
        "num_nextn_predict_layers": cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0,
        "source": source,
    }

    dtype = _first(cfg, "torch_dtype", "dtype") or "bfloat16"
    if dtype not in _TORCH_DTYPES:
        raise ConfigError(f"{source}: torch_dtype: expected bfloat16, float16 or float32 (got {dtype!r})")
    data["weight_dtype"] = _TORCH_DTYPES[dtype]
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if method == "fp8":
            data["weight_dtype"], data["embedding_dtype"] = "fp8", _TORCH_DTYPES[dtype]
        elif method == "mxfp4":
            data["expert_weight_dtype"] = "mxfp4"
        else:
            raise ConfigError(
                f"{source}: quantization_config.quant_method: expected fp8 or mxfp4 (got {method!r}); "
                "write a model card YAML with weight_dtype instead"
            )

    experts = _first(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    if experts:
        if (cfg.get("decoder_sparse_step") or 1) != 1 or cfg.get("mlp_only_layers") or (
            cfg.get("moe_layer_freq") or 1
        ) != 1:
            raise ConfigError(
                f"{source}: decoder_sparse_step: MoE layers interleaved with dense layers are not supported"
            )
        data["num_experts"] = experts
        data["num_experts_per_tok"] = _first(cfg, "num_experts_per_tok", "experts_per_token") or 0
        data["moe_intermediate_size"] = cfg.get("moe_intermediate_size")
        data["num_shared_experts"] = cfg.get("n_shared_experts") or 0
        data["first_k_dense_replace"] = cfg.get("first_k_dense_replace") or 0

    if cfg.get("kv_lora_rank") is not None:
        data["attention"] = "mla"
        data["head_dim"] = None
        for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            data[key] = cfg.get(key)

    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        n_sliding = sum(1 for t in layer_types if t == "sliding_attention")
    elif window is not None and cfg.get("use_sliding_window", True):
        n_sliding = cfg["num_hidden_layers"]
    else:
        n_sliding = 0
    if n_sliding:
        data["sliding_window"] = window
        data["sliding_window_layers"] = n_sliding
    return data


def load_hf_config(path: Path) -> ModelCard:
    """Load a Hugging Face ``config.json`` file (or a folder holding one) as a :class:`ModelCard`.

    The card's name is ``_name_or_path`` if present, else the folder name (or the file stem when the file
    is not called config.json).

    Raises:
        ConfigError: unreadable JSON, a missing or unsupported key (one line naming the file and key).
    """
    if path.is_dir():
        path = path / "config.json"
    default_name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    data = hf_config_to_card_data(load_json(path), str(path), default_name)
    return validate(ModelCard, data, str(path))
