"""POLICY, pure: what the node's bounded local tier holds at every step, for one epoch.

The node's access sequence is the union of its ranks' orders, interleaved step
by step (step s: rank 0's batch s, rank 1's batch s, ...), the way ranks that
train in lockstep consume it. Every rank of the node computes the same
sequence and runs the same farthest-next-use simulation over it, so they agree
on every decision without talking to each other.

The simulation's result is stated as actions on the accesses themselves:

- ``hit[i]``: the sample is in the local tier when access ``i`` comes (read it there);
- ``keep[i]``: after access ``i`` it stays in the local tier until its next
  access (else it is deleted, or never written, once access ``i`` is done);
- ``drop_at_start``: residents from before the epoch that are evicted before
  their first use (deleted when the epoch starts).

An interval that Belady's MIN admits and then cuts before its next use gives no
hit; the mechanism simply never keeps it, which holds fewer bytes at every
moment and the same hits. So the tier's bytes never exceed what the simulation
holds, which never exceeds the capacity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .evict import NEVER, FarthestNextUse, next_uses

try:
    if os.environ.get("CLAIRVOYANT_NO_CEXT"):
        raise ImportError("disabled by CLAIRVOYANT_NO_CEXT")
    from ._belady import simulate as _c_simulate
except ImportError:
    _c_simulate = None
from .order import epoch_order
from .partition import cut_batches, rank_indices


def node_ranks(rank: int, world_size: int, local_world_size: int) -> range:
    """The global ranks on this rank's node, for launchers that place ranks in node blocks."""
    first = (rank // local_world_size) * local_world_size
    return range(first, min(first + local_world_size, world_size))


def node_sequence(num_samples: int, *, seed: int, epoch: int, world_size: int, ranks: range, batch_size: int,
                  shuffle: bool = True, drop_last: bool = False, position: int = 0) -> np.ndarray:
    """The samples the node's ranks read in one epoch, from the epoch's global ``position`` on
    (plan/partition.py), step by step."""
    order = epoch_order(num_samples, seed, epoch, shuffle)
    per_rank = [cut_batches(rank_indices(order, r, world_size, position), batch_size, drop_last) for r in ranks]
    steps = len(per_rank[0]) if per_rank else 0
    parts = [per_rank[i][s] for s in range(steps) for i in range(len(per_rank))]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


@dataclass
class EpochResidency:
    hit: np.ndarray                     # bool per access of the epoch
    keep: np.ndarray                    # bool per access of the epoch
    drop_at_start: list[int]            # residents evicted before their first use this epoch
    residents_after: dict[int, int] = field(default_factory=dict)  # sample -> size at the epoch's end

    @property
    def hits(self) -> int:
        return int(self.hit.sum())


def simulate_epoch(sequence: np.ndarray, following: np.ndarray, sizes: np.ndarray, capacity: int,
                   residents: dict[int, int], *, use_c: bool = True,
                   admit: np.ndarray | None = None) -> EpochResidency:
    """Farthest-next-use over ``sequence`` (this epoch), looking ahead into ``following`` (the
    next epoch) for next uses, starting with ``residents`` (sample -> bytes) in the tier.

    ``admit`` (bool per access, default all True) says where a miss may enter the tier: a miss
    at an access where it is False is not admitted (read elsewhere, kept nowhere); a hit there is
    kept or cut like any other. The cluster plan (plan/cluster.py) uses it for a home node that
    can keep only what it reads itself.

    The loop runs in C where the helper is built (ImageNet's 1.28 M accesses in well under a
    second, against about 10 s in Python), else in Python; both take the same decisions."""
    seq = np.ascontiguousarray(sequence, dtype=np.int64)
    if admit is not None:
        admit = np.ascontiguousarray(admit, dtype=bool)
        if admit.shape != seq.shape:
            raise ValueError(f"admit holds {admit.shape} flags for {seq.shape} accesses: give one per access")
    full = np.concatenate([seq, np.asarray(following, dtype=np.int64)])
    nxt = np.ascontiguousarray(next_uses(full)[:len(seq)])
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    first = np.full(len(sizes), NEVER, dtype=np.int64)
    first[full[::-1]] = np.arange(len(full) - 1, -1, -1, dtype=np.int64)   # the earliest position wins
    order = sorted(residents, key=lambda x: first[x])   # stable: soonest needed first
    if use_c and _c_simulate is not None:
        hit = np.zeros(len(seq), dtype=np.uint8)
        keep = np.zeros(len(seq), dtype=np.uint8)
        rs = np.asarray(order, dtype=np.int64)
        rz = np.asarray([residents[x] for x in order], dtype=np.int64)
        extra = () if admit is None else (admit.view(np.uint8),)
        drop, after_s, after_z = _c_simulate(seq, nxt, sizes, int(capacity), rs, first[rs] if len(rs) else rs,
                                             rz, hit, keep, *extra)
        return EpochResidency(hit=hit.view(bool), keep=keep.view(bool), drop_at_start=drop,
                              residents_after=dict(zip(after_s, after_z)))
    return _simulate_py(seq, nxt, sizes, capacity, residents, order, first, admit)


def _simulate_py(seq, nxt, sizes, capacity, residents, order, first, admit=None) -> EpochResidency:
    cache = FarthestNextUse(capacity)
    drop: list[int] = []
    for s in order:
        if cache.admit(s, residents[s], int(first[s])) is None:
            drop.append(s)   # no room even for the soonest-needed residents: the farthest go
    hit = np.zeros(len(seq), dtype=bool)
    keep = np.zeros(len(seq), dtype=bool)
    last: dict[int, int] = {}   # sample -> position of its latest access this epoch
    admit = None if admit is None else admit.tolist()
    for i, s in enumerate(seq.tolist()):
        nu = int(nxt[i])
        if s in cache:
            hit[i] = True
            cache.touch(s, nu)
            keep[i] = True
        else:
            if admit is not None and not admit[i]:
                continue   # a miss this tier may not keep
            victims = cache.admit(s, int(sizes[s]), nu)
            if victims is None:
                continue
            keep[i] = True
            for v in victims:
                j = last.get(v)
                if j is None:
                    drop.append(v)   # a resident from before the epoch, never used before eviction
                else:
                    keep[j] = False  # cut before its next use: never keep it at all
        last[s] = i
    return EpochResidency(hit=hit, keep=keep, drop_at_start=drop, residents_after=cache.residents())
