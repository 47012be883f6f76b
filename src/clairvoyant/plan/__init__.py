"""POLICY, pure: what is read, by whom and when. No I/O, no processes.

Every process computes the same plan from (manifest size, seed, epoch, topology),
so ranks agree on it without a coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .order import epoch_order
from .partition import cut_batches, num_batches, padding, position_after, rank_indices

__all__ = ["EpochPlan", "plan_epoch", "epoch_order", "rank_indices", "cut_batches", "num_batches", "padding",
           "position_after"]


@dataclass(frozen=True)
class EpochPlan:
    """The batches (arrays of manifest indices) one rank yields in one epoch, in order, from
    global position ``position`` of the epoch on (0: the whole epoch; see plan/partition.py)."""

    epoch: int
    rank: int
    world_size: int
    batches: tuple[np.ndarray, ...]
    position: int = 0

    def __len__(self) -> int:
        return len(self.batches)


def plan_epoch(num_samples: int, *, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
               batch_size: int, shuffle: bool = True, drop_last: bool = False, position: int = 0) -> EpochPlan:
    order = epoch_order(num_samples, seed, epoch, shuffle)
    mine = rank_indices(order, rank, world_size, position)
    return EpochPlan(epoch, rank, world_size, tuple(cut_batches(mine, batch_size, drop_last)), position)
