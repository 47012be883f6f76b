"""The global order of an epoch: a pure function of (number of samples, seed, epoch)."""

from __future__ import annotations

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Every index in ``range(num_samples)`` exactly once, in the order of this epoch.

    The same (seed, epoch) gives the same order in every process and on every node.
    """
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(num_samples).astype(np.int64, copy=False)
