"""How many KV-cache blocks fit on the GPUs (vLLM's memory profiling, in closed form).

vLLM (``v1/worker/gpu_worker.py``) gives the KV cache what is left of ``gpu_memory_utilization x GPU
memory`` after the weights, the peak activations of a profiling forward pass at
``max_num_batched_tokens``, non-torch allocations and CUDA graphs. servesim estimates the last three as

    activation_reserve = T_max * (4 * hidden + 2 * intermediate / TP) * 2 B     (hidden states, MLP, bf16)
                       + max_num_seqs * vocab / TP * 4 B                        (fp32 logits of the sampler)
                       + 1 GiB                                                  (CUDA graphs, NCCL, cuBLAS)

per GPU, unless the config gives ``activation_reserve_bytes``. Then

    blocks = floor((util * memory - weights / TP - reserve) / (kv_bytes_per_token_per_gpu * block_size))

with ``kv_bytes_per_token_per_gpu`` as vLLM splits the KV heads (``kv_bytes_per_token / TP`` while TP divides
them, one head per GPU beyond; MLA's latent whole on every GPU: ``ModelCard.kv_bytes_per_token_per_gpu``).

``num_gpu_blocks_override`` bypasses all of this, as in vLLM.
"""

from __future__ import annotations

from servesim.errors import SettingError

GIB = 1024**3


def activation_reserve_bytes(model, tensor_parallel_size: int, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Per-GPU memory kept for activations, sampler logits and CUDA graphs (bytes); see the module docstring."""
    tp = tensor_parallel_size
    hidden = float(getattr(model, "hidden_size", 0) or 0)
    inter = float(getattr(model, "intermediate_size", 0) or 0)
    vocab = float(getattr(model, "vocab_size", 0) or 0)
    return max_num_batched_tokens * (4 * hidden + 2 * inter / tp) * 2 + max_num_seqs * vocab / tp * 4 + GIB


def kv_cache_blocks(
    hardware,
    model,
    *,
    tensor_parallel_size: int,
    block_size: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    activation_reserve: float | None = None,
    num_gpu_blocks_override: int | None = None,
    extra_weight_bytes_per_gpu: float = 0.0,
    extra_kv_bytes_per_token_per_gpu: float = 0.0,
    extra_name: str = "the drafter",
) -> int:
    """KV-cache capacity of one replica (blocks of ``block_size`` tokens).

    ``extra_*`` account for a speculative drafter (named ``extra_name`` in the error): its weights, and its
    KV cache, which vLLM keeps in the same block pool (a block then holds both models' KV for its
    ``block_size`` tokens).

    Raises:
        SettingError: the weights and activations leave no room for a block beside vLLM's null block (named
            ``tensor_parallel_size`` when the weights fill the whole card, ``engine.gpu_memory_utilization``
            when they fill the share of it vLLM may use, else ``engine.max_num_batched_tokens``: the activation
            reserve of the token budget takes the rest).
    """
    if num_gpu_blocks_override is not None:
        return int(num_gpu_blocks_override)
    tp = tensor_parallel_size
    reserve = (
        activation_reserve
        if activation_reserve is not None
        else activation_reserve_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    )
    usable = gpu_memory_utilization * float(hardware.memory_bytes)
    target_weights = float(model.weight_bytes) / tp
    weights = target_weights + extra_weight_bytes_per_gpu
    free = usable - weights - reserve
    per_block = (model.kv_bytes_per_token_per_gpu(tp) + extra_kv_bytes_per_token_per_gpu) * block_size
    blocks = int(free // per_block) if per_block > 0 else 0
    if blocks < 2:  # block 0 is vLLM's null block: one block holds no request's KV
        drafter = (f" + {extra_name}'s weights {_gigabytes(extra_weight_bytes_per_gpu)}"
                   if extra_weight_bytes_per_gpu > 0 else "")
        # the setting that tipped it: the weights fill the whole card (more GPUs), or the share of it vLLM may
        # use; else they leave room there and the token budget's activations take it
        if weights >= float(hardware.memory_bytes):
            key = "tensor_parallel_size"
        elif weights >= usable:
            key = "engine.gpu_memory_utilization"
        else:
            key = "engine.max_num_batched_tokens"
        raise SettingError(
            f"{key}: {model.name} does not fit on {tensor_parallel_size} x {hardware.name}: per GPU, "
            f"its weights {_gigabytes(target_weights)}{drafter} + the activation reserve {_gigabytes(reserve)} "
            f"(at max_num_batched_tokens={max_num_batched_tokens}) leave no KV-cache block in "
            f"gpu_memory_utilization {gpu_memory_utilization:g} x {_gigabytes(float(hardware.memory_bytes))} "
            "(raise tensor_parallel_size or engine.gpu_memory_utilization, or lower engine.max_num_batched_tokens)",
            # a drafter's weights and KV make the speculative config part of the mistake
            depends_on=FIT_DEPENDS_ON if extra_weight_bytes_per_gpu > 0 or extra_kv_bytes_per_token_per_gpu > 0
            else tuple(k for k in FIT_DEPENDS_ON if k != "speculative_config"),
        )
    return blocks


#: The run-config settings the fit check reads (dotted keys): a ``--set`` of any of them that makes the model
#: not fit is named with the file (:func:`servesim.errors.named_by_set`).
FIT_DEPENDS_ON = ("hardware", "model", "tensor_parallel_size", "engine.gpu_memory_utilization",
                  "engine.max_num_batched_tokens", "engine.max_num_seqs", "engine.block_size",
                  "engine.activation_reserve_bytes", "speculative_config")


def _gigabytes(num_bytes: float) -> str:
    """``num_bytes`` in GB for a message: one decimal, or three significant digits beyond a million GB."""
    gb = num_bytes / 1e9
    return f"{gb:.1f} GB" if abs(gb) < 1e6 else f"{gb:.3g} GB"
