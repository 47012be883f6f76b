"""How an epoch's order is split over ranks and cut into batches, from any point of the epoch.

Ranks split the order as PyTorch's DistributedSampler does: the order is padded
by repeating its head until its length divides by the world size, and rank r
takes positions r, r + W, r + 2W, ...  Every sample is seen at least once per
epoch across ranks, the first ``pad`` samples twice, and every rank gets the
same number of samples and therefore of batches.

**The position** of an epoch is how many samples of its order the ranks have
consumed together. Because rank r's first k batches of B hold exactly the
padded positions below k*B*W, whatever has been consumed is always a prefix of
the order, so one number describes it for every rank at once. Resuming at
position p splits the rest of the order, ``order[p:]``, by the same rule over
the (possibly different) world size W' (elastic resume): padded to a multiple
of W' with samples already consumed (at most W' - 1, from the epoch's head, as
DistributedSampler pads every epoch), interleaved over the ranks, cut into
batches. At p = k*B*W with the same W this is exactly batches k, k+1, ... of
the uninterrupted epoch.
"""

from __future__ import annotations

import math

import numpy as np


def padding(num_samples: int, world_size: int) -> int:
    return math.ceil(num_samples / world_size) * world_size - num_samples


def padded_rest(order: np.ndarray, world_size: int, position: int = 0) -> np.ndarray:
    """``order[position:]`` padded to a multiple of ``world_size``: rank r's samples are every
    ``world_size``-th from r (``padded_rest(...).reshape(-1, world_size)[:, r]``)."""
    if not 0 <= position <= len(order):
        raise ValueError(f"position {position} is outside the epoch's {len(order)} samples")
    rest = order[position:]
    pad = padding(len(rest), world_size)
    if pad:   # repeat samples already consumed where there are any, else the epoch's head
        head = order[:position] if position else order
        rest = np.concatenate([rest, np.tile(head, math.ceil(pad / len(head)))[:pad]])
    return rest


def rank_rows(order: np.ndarray, world_size: int, position: int = 0) -> np.ndarray:
    """Every rank's samples of the epoch ``order`` from global ``position`` on, as one
    ``(world_size, samples per rank)`` view of the padded order: row r is ``rank_indices(..., r, ...)``."""
    return padded_rest(order, world_size, position).reshape(-1, world_size).T


def rank_indices(order: np.ndarray, rank: int, world_size: int, position: int = 0) -> np.ndarray:
    """Rank ``rank``'s samples of the epoch ``order`` from global ``position`` on."""
    return padded_rest(order, world_size, position)[rank::world_size]


def num_batches(samples_per_rank: int, batch_size: int, drop_last: bool) -> int:
    if drop_last:
        return samples_per_rank // batch_size
    return math.ceil(samples_per_rank / batch_size)


def batch_lengths(samples_per_rank: int, batch_size: int, drop_last: bool) -> np.ndarray:
    """int64 per batch of a rank of ``samples_per_rank``: the samples in it (``cut_batches``'s lengths)."""
    n = num_batches(samples_per_rank, batch_size, drop_last)
    out = np.full(n, batch_size, np.int64)
    if n:
        out[-1] = min(batch_size, samples_per_rank - (n - 1) * batch_size)
    return out


def cut_batches(indices: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    n = num_batches(len(indices), batch_size, drop_last)
    return [indices[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def position_after(num_samples: int, start: int, batches: int, batch_size: int, world_size: int,
                   total_batches: int) -> int:
    """The epoch's position once every rank has yielded ``batches`` of its ``total_batches`` from
    ``start``: a prefix of the order; the whole epoch once the last batch is out."""
    if batches >= total_batches:
        return num_samples
    return min(num_samples, start + batches * batch_size * world_size)
