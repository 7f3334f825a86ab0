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


from servesim.compiled import install_guard
from servesim.lazy_exports import lazy_exports

# a compiled module whose source was edited since the build runs from its source (servesim.compiled)
install_guard()

# Lazy re-exports keep `import servesim` cheap (the CLI's start-up time counts).
__getattr__, __dir__ = lazy_exports(__name__, {
    "simulate": "api", "Result": "api", "SimConfig": "config.models", "load_config": "config.models",
    "ServesimError": "errors",
})
