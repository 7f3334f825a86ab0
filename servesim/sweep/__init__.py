"""Sweeps: run a grid of configs (grid x zip groups x variants, replicated) resumably on any executor.

Public API::

    from servesim.sweep import load_sweep, expand_points, run_sweep
    result = run_sweep("experiments/x-sweep.yaml", "out/x", jobs=4)   # -> SweepResult

Names are imported lazily: the CLI looks this package up on every start, and pandas is slow to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Failure": "servesim.sweep.runner",
    "SweepResult": "servesim.sweep.runner",
    "run_sweep": "servesim.sweep.runner",
    "LoadedSweep": "servesim.sweep.spec",
    "SweepConfig": "servesim.sweep.spec",
    "load_sweep": "servesim.sweep.spec",
    "Point": "servesim.sweep.points",
    "count_points": "servesim.sweep.points",
    "expand_points": "servesim.sweep.points",
    "iter_points": "servesim.sweep.points",
    "point_config": "servesim.sweep.points",
    "seed_sequence": "servesim.sweep.points",
    "task_seed": "servesim.sweep.points",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
