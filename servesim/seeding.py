"""Where a run's randomness comes from: one root ``numpy.random.SeedSequence``, one child stream per component.

``servesim.simulate`` makes the root ``SeedSequence(config.seed)`` (or takes the one a sweep passes);
every random component draws from its own child, ``SeedSequence(entropy=root.entropy,
spawn_key=root.spawn_key + (index,))``, with a fixed index per component, so that adding a component never
changes the streams of the others and the same config and seed give identical results.
"""

from __future__ import annotations

import numpy as np

# Child-stream indices of a run's root SeedSequence, one per random component (fixed forever, so that
# adding a component never changes the streams of the others).
STREAM_WORKLOAD = 0
STREAM_ACCEPTANCE = 1
STREAM_ROUTER = 2
STREAM_FACTORS = 3


def child_seed(root: np.random.SeedSequence, index: int) -> np.random.SeedSequence:
    """The ``index``-th child stream of ``root``, without mutating ``root`` (unlike ``spawn``)."""
    return np.random.SeedSequence(entropy=root.entropy, spawn_key=tuple(root.spawn_key) + (index,))
