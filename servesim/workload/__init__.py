"""Workloads: trace loaders, arrival processes and token-length distributions -> :class:`Workload`.

Public API::

    Workload, TraceMeta                      runtime result (numpy arrays)
    WorkloadConfig                           pydantic union (type: trace | poisson | gamma | closed_loop
                                             | multi_turn), each with optional system_prompts
    SequenceContent                          what each request's tokens are: shared segments, block hashes
                                             (Workload.content; for the engine's prefix caching)
    Sessions                                 session and turn of each request (Workload.sessions)
    build_workload(cfg, rng, base_dir)       config -> Workload
    load_workload_config(path), load_workload(path, rng)
    load_trace(path, format, rate_scale, start_s, duration_s, max_requests, bucket_policy)
    read_trace(path, format)                 raw rows of a trace (cached)
    poisson_arrivals, gamma_arrivals         arrival times (s)
    LengthConfig and its members             fixed | uniform | lognormal | empirical, .build() -> sampler
"""

from __future__ import annotations

from servesim.lazy_exports import lazy_exports

# name -> submodule. The names load on first use (PEP 562), so that importing one submodule (the run
# config needs ``servesim.workload.config`` only) does not import the trace parsers and every generator.
_SOURCES: dict[str, str] = {
    **dict.fromkeys(("gamma_arrivals", "poisson_arrivals", "renewal_arrivals"), "arrival_processes"),
    **dict.fromkeys(("build_workload", "load_workload", "load_workload_config"), "build"),
    **dict.fromkeys(("ClosedLoopWorkloadConfig", "GammaWorkloadConfig", "MultiTurnWorkloadConfig",
                     "PoissonWorkloadConfig", "TraceWorkloadConfig", "WorkloadConfig"), "config"),
    **dict.fromkeys(("EmpiricalLength", "EmpiricalLengthConfig", "EmpiricalPairs", "EmpiricalPairsConfig",
                     "FixedLength", "FixedLengthConfig", "LengthConfig", "LengthDistribution", "LognormalLength",
                     "LognormalLengthConfig", "UniformLength", "UniformLengthConfig"), "lengths"),
    "SequenceContent": "content",
    "RawTrace": "rawtrace",
    **dict.fromkeys(("SystemPromptsConfig", "zipf_popularity"), "system_prompts"),
    **dict.fromkeys(("load_trace", "read_trace"), "trace"),
    **dict.fromkeys(("Sessions", "TraceMeta", "Workload"), "workload"),
}


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES)


__all__ = [
    "ClosedLoopWorkloadConfig",
    "EmpiricalLength",
    "EmpiricalLengthConfig",
    "EmpiricalPairs",
    "EmpiricalPairsConfig",
    "FixedLength",
    "FixedLengthConfig",
    "GammaWorkloadConfig",
    "LengthConfig",
    "LengthDistribution",
    "LognormalLength",
    "LognormalLengthConfig",
    "MultiTurnWorkloadConfig",
    "PoissonWorkloadConfig",
    "RawTrace",
    "SequenceContent",
    "Sessions",
    "SystemPromptsConfig",
    "TraceMeta",
    "TraceWorkloadConfig",
    "UniformLength",
    "UniformLengthConfig",
    "Workload",
    "WorkloadConfig",
    "build_workload",
    "gamma_arrivals",
    "load_trace",
    "load_workload",
    "load_workload_config",
    "poisson_arrivals",
    "read_trace",
    "renewal_arrivals",
    "zipf_popularity",
]
