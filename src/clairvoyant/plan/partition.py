"""How an epoch's order is split over ranks and cut into batches.

Ranks split the order as PyTorch's DistributedSampler does: the order is padded
by repeating its head until its length divides by the world size, and rank r
takes positions r, r + W, r + 2W, ...  Every sample is seen at least once per
epoch across ranks, the first ``pad`` samples twice, and every rank gets the
same number of samples and therefore of batches.
"""

from __future__ import annotations

import math

import numpy as np


def padding(num_samples: int, world_size: int) -> int:
    return math.ceil(num_samples / world_size) * world_size - num_samples


def rank_indices(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    pad = padding(len(order), world_size)
    if pad:
        reps = math.ceil(pad / len(order))
        order = np.concatenate([order, np.tile(order, reps)[:pad]])
    return order[rank::world_size]


def num_batches(samples_per_rank: int, batch_size: int, drop_last: bool) -> int:
    if drop_last:
        return samples_per_rank // batch_size
    return math.ceil(samples_per_rank / batch_size)


def cut_batches(indices: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    n = num_batches(len(indices), batch_size, drop_last)
    return [indices[i * batch_size:(i + 1) * batch_size] for i in range(n)]
