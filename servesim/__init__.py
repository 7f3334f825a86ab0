"""servesim: a discrete-event simulator of an LLM inference server.

It answers capacity-planning questions (what TTFT/TPOT/ITL will users see on this GPU with this traffic;
how many replicas meet an SLO; does speculative decoding help, and at which load does it hurt) from a YAML
config, in seconds, without a GPU. The main entry points::

    from servesim import simulate
    result = simulate("experiments/azure-conv-llama8b-h100.yaml")
    result.summary["ttft_s"]["p99"], result.requests, result.steps
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["simulate", "Result", "SimConfig", "load_config", "ServesimError", "__version__"]


def __getattr__(name: str):
    # Lazy re-exports keep `import servesim` cheap (the CLI's start-up time counts).
    if name in ("simulate", "Result"):
        from servesim import api as _m

        return getattr(_m, name)
    if name in ("SimConfig", "load_config"):
        from servesim.config import models

        return getattr(models, name)
    if name == "ServesimError":
        from servesim.errors import ServesimError

        return ServesimError
    raise AttributeError(f"module 'servesim' has no attribute {name!r}")
