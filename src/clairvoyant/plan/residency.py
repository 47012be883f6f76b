"""POLICY, pure: what the node's bounded local tier holds at every step, for one epoch.

The node's access sequence is the union of its ranks' orders, interleaved step
by step (step s: rank 0's batch s, rank 1's batch s, ...; plan/sequence.py),
the way ranks that train in lockstep consume it. Every rank of the node
computes the same sequence and runs the same farthest-next-use simulation over
it, so they agree on every decision without talking to each other.

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
from typing import Mapping

import numpy as np

from .evict import NEVER, FarthestNextUse, next_uses

try:
    if os.environ.get("CLAIRVOYANT_NO_CEXT"):
        raise ImportError("disabled by CLAIRVOYANT_NO_CEXT")
    from ._belady import group_accesses as _c_group_accesses
    from ._belady import group_by as _c_group_by
    from ._belady import next_uses as _c_next_uses
    from ._belady import plan_homes as _c_plan_homes
    from ._belady import simulate as _c_simulate
except ImportError:
    _c_simulate = _c_next_uses = _c_group_by = _c_group_accesses = _c_plan_homes = None
from .residents import Residents


@dataclass
class EpochResidency:
    hit: np.ndarray                     # bool per access of the epoch
    keep: np.ndarray                    # bool per access of the epoch
    drop_at_start: list[int]            # residents evicted before their first use this epoch
    residents_after: Residents = field(default_factory=Residents)  # sample -> size at the epoch's end

    @property
    def hits(self) -> int:
        return int(self.hit.sum())


def next_use_positions(sequence: np.ndarray, num_samples: int, use_c: bool = True) -> np.ndarray:
    """``plan/evict.py``'s ``next_uses`` (int64 per position, NEVER where none), in one pass in C."""
    seq = np.ascontiguousarray(sequence, dtype=np.int64)
    if use_c and _c_next_uses is not None:
        out = np.empty(len(seq), np.int64)
        _c_next_uses(seq, int(num_samples), out)
        return out
    return next_uses(seq)


def first_positions(sequence: np.ndarray, num_samples: int) -> np.ndarray:
    """int64 per sample: the first position of ``sequence`` that holds it, NEVER if none."""
    first = np.full(num_samples, NEVER, dtype=np.int64)
    first[sequence[::-1]] = np.arange(len(sequence) - 1, -1, -1, dtype=np.int64)   # the earliest wins
    return first


def group_positions(keys: np.ndarray, groups: int, use_c: bool = True, *,
                    place: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A stable grouping of positions by ``keys`` (int, in ``[0, groups)``): ``(order, cuts, place)``
    where ``order[cuts[g]:cuts[g + 1]]`` are group g's positions, ascending (int32 where they fit),
    and ``place[i]`` is position i's index within its group (``place=False``: None)."""
    keys = np.ascontiguousarray(keys, dtype=np.int32)
    cuts = np.zeros(groups + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=groups), out=cuts[1:])
    if use_c and _c_group_by is not None:
        order = np.empty(len(keys), np.int32 if len(keys) < 2**31 else np.int64)
        where = np.empty(len(keys), np.int64) if place else None
        _c_group_by(keys, int(groups), order, where)
        return order, cuts, where
    order = np.argsort(keys, kind="stable")
    where = None
    if place:
        where = np.empty(len(keys), np.int64)
        where[order] = np.arange(len(keys)) - np.repeat(cuts[:-1], np.diff(cuts))
    return order, cuts, where


def soonest_first(first: np.ndarray) -> np.ndarray:
    """The order in which residents enter the tier: by first use (``first``, distinct except
    NEVER, as positions of one sequence are), ties (NEVER) in their given order. A counting pass
    rather than a sort."""
    first = np.asarray(first, dtype=np.int64)
    finite = first != NEVER
    pos = first[finite]
    if not len(pos):
        return np.arange(len(first))
    slot = np.full(int(pos.max()) + 1, -1, np.int64)
    slot[pos] = np.flatnonzero(finite)
    used = slot[slot >= 0]
    if len(used) != len(pos):
        raise ValueError("two residents share a first use: first uses are positions of one sequence")
    return np.concatenate([used, np.flatnonzero(~finite)])


def simulate_epoch(sequence: np.ndarray, following: np.ndarray, sizes: np.ndarray, capacity: int,
                   residents: Mapping[int, int], *, use_c: bool = True,
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
    full = np.concatenate([seq, np.asarray(following, dtype=np.int64)])
    nxt = np.ascontiguousarray(next_use_positions(full, len(sizes), use_c)[:len(seq)])
    res = Residents.of(residents)
    first = first_positions(full, len(sizes))[res.samples] if len(res) else np.zeros(0, np.int64)
    return simulate_from(seq, nxt, sizes, capacity, res, first, use_c=use_c, admit=admit)


def simulate_from(seq: np.ndarray, nxt: np.ndarray, sizes: np.ndarray, capacity: int, residents: Residents,
                  first: np.ndarray, *, use_c: bool = True, admit: np.ndarray | None = None) -> EpochResidency:
    """``simulate_epoch`` with the next uses worked out: ``nxt`` per access of ``seq`` (a position
    in this epoch's accesses followed by the next epoch's, NEVER if none), ``first`` per resident
    (its first such position). Residents enter the tier soonest needed first, ties by sample."""
    seq = np.ascontiguousarray(seq, dtype=np.int64)
    nxt = np.ascontiguousarray(nxt, dtype=np.int64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    if admit is not None:
        admit = np.ascontiguousarray(admit, dtype=bool)
        if admit.shape != seq.shape:
            raise ValueError(f"admit holds {admit.shape} flags for {seq.shape} accesses: give one per access")
    by = soonest_first(first)   # residents.samples ascending: ties stay by sample
    rs = np.ascontiguousarray(residents.samples[by], dtype=np.int64)
    rf = np.ascontiguousarray(np.asarray(first, np.int64)[by])
    rz = np.ascontiguousarray(residents.sizes[by], dtype=np.int64)
    if use_c and _c_simulate is not None:
        hit = np.zeros(len(seq), dtype=np.uint8)
        keep = np.zeros(len(seq), dtype=np.uint8)
        extra = () if admit is None else (admit.view(np.uint8),)
        drop, after_s, after_z = _c_simulate(seq, nxt, sizes, int(capacity), rs, rf, rz, hit, keep, *extra)
        return EpochResidency(hit=hit.view(bool), keep=keep.view(bool), drop_at_start=drop,
                              residents_after=Residents(np.frombuffer(after_s, np.int64),
                                                        np.frombuffer(after_z, np.int64)))
    return _simulate_py(seq, nxt, sizes, capacity, rs, rz, rf, admit)


def _simulate_py(seq, nxt, sizes, capacity, rs, rz, rf, admit=None) -> EpochResidency:
    cache = FarthestNextUse(capacity)
    drop: list[int] = []
    for s, z, f in zip(rs.tolist(), rz.tolist(), rf.tolist()):
        if cache.admit(s, z, f) is None:
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
    return EpochResidency(hit=hit, keep=keep, drop_at_start=drop, residents_after=Residents.of(cache.residents()))
