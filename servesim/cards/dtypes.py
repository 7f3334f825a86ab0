"""Storage data types of weights and KV cache, and their bytes per element.

Bytes per element include the block scales of the micro-scaled formats, because a kernel reads them too:

- ``fp32`` 4, ``bf16``/``fp16`` 2, ``fp8``/``int8`` 1 byte. Per-tensor or per-channel scales are ignored
  (negligible). DeepSeek-V3's FP8 checkpoint adds one fp32 scale per 128x128 block, i.e. +0.02 %, ignored.
- ``int4``: 0.5 byte + one 16-bit scale per group of 128 weights (GPTQ/AWQ style) = 0.515625 byte;
  zero points are ignored.
- ``mxfp4``: OCP Microscaling (MX) v1.0: 32 FP4 (E2M1) elements share one 8-bit E8M0 scale,
  (32 x 0.5 + 1) / 32 = 0.53125 byte (gpt-oss's experts).
- ``nvfp4``: NVIDIA NVFP4: 16 FP4 elements share one FP8 (E4M3) scale, (16 x 0.5 + 1) / 16 = 0.5625 byte
  (the per-tensor fp32 scale is ignored).
"""

from __future__ import annotations

from typing import Literal, get_args

#: Storage type of weights. Names follow vLLM's ``--dtype`` / ``--quantization`` vocabulary where it has one.
WeightDtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4"]

#: Storage type of the KV cache (vLLM's ``--kv-cache-dtype``; ``auto`` = the model's activation dtype).
KVCacheDtype = Literal["auto", "fp32", "bf16", "fp16", "fp8"]

#: Bytes per stored element, block scales included (see the module docstring for each value's source).
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 2.0 / 128.0,
    "mxfp4": (32 * 0.5 + 1.0) / 32.0,
    "nvfp4": (16 * 0.5 + 1.0) / 16.0,
}

#: Floating-point types that a model computes in (activations); the others are storage-only formats.
FLOAT_ACTIVATION_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")

assert set(BYTES_PER_ELEMENT) == set(get_args(WeightDtype))


def bytes_per_element(dtype: str) -> float:
    """Bytes per stored element of ``dtype`` (block scales included), e.g. 2.0 for ``bf16``.

    Raises:
        KeyError: ``dtype`` is not one of :data:`WeightDtype` (``auto`` must be resolved first).
    """
    return BYTES_PER_ELEMENT[dtype]
