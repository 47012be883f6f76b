"""POLICY, pure: what a mount keeps when no sampler publishes the order (the program shuffles).

With a clairvoyant sampler a node's mount knows every coming read of its node and runs the
Loader's node plan (farthest next use, ``plan/ahead.py`` over ``plan/residency.py``'s rule); a
cluster of mounts with samplers exchanges the nodes' orders and runs the Loader's cluster plan
(``plan/cluster.py``, mount/cluster/plan.py). A program that shuffles on its own tells
the mount nothing ahead: it sees each read as it comes, and that is all an unmodified program
allows. Two policies decide from the reads alone:

- ``ReadThrough`` (one node: the model of ``clairvoyant mount`` without a sampler in a shuffled
  order): a file read from the store is kept while the tier has room, and kept for good: in a
  shuffled order no file is likelier to come back than another, so nothing is gained by turning
  the tier over. (The mount also reads ahead, and lets the files opened last give way, where the
  opens follow the listing's or an earlier pass's order: mount/opens.py, plan/readahead.py.)
- ``HomesLRU`` (``clairvoyant mount --cluster`` without a sampler): every file has a **home** node
  (``hash_homes``: a hash of its number, the same on every node, balanced, with no exchange). A
  read of a file the home holds is served from there (the reader's own tier if it is the home, a
  peer's otherwise); a read of one it does not hold is read from the store **by the home**, on the
  reader's behalf, and kept there. So the store is read once per file while the homes have room,
  whichever node reads it. Each home keeps what has been read least recently *across the cluster*
  last: its own reads and its peers' count alike, and the least recent goes first when room is
  needed (an LRU, as Alluxio and JuiceFS run per node, here per home over the cluster's reads).

Both are online: ``read(node, f)`` is asked at each read and answers where it is served from and
what the home evicts. ``clairvoyant simulate`` runs them over the job's sequences
(``sim/policies.py``); the mount carries them out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, Sequence

import numpy as np

STORE = -1


def hash_homes(num_files: int, nodes: int, salt: int = 0) -> np.ndarray:
    """int32 per file: its home node, from a 64-bit mix of its number (splitmix64) and ``salt``:
    balanced, and the same wherever it is computed."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    with np.errstate(over="ignore"):
        z = np.arange(num_files, dtype=np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (salt + 1)) & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(nodes)).astype(np.int32)


class Served(NamedTuple):
    """One read's outcome: the node whose tier serves it (``STORE``: read from the store), whether
    a tier keeps it from this read on (an entry written), and the files evicted for it."""

    by: int
    kept: bool
    evicted: tuple[int, ...] = ()


class ReadThrough:
    """One node's tier without a sampler: keep what is read from the store while there is room."""

    def __init__(self, capacity: int, sizes: np.ndarray) -> None:
        self.capacity, self.sizes = int(capacity), np.asarray(sizes, np.int64)
        self.used = 0
        self.held: set[int] = set()

    def read(self, node: int, f: int) -> Served:
        if f in self.held:
            return Served(node, False)
        n = int(self.sizes[f])
        if self.used + n > self.capacity:
            return Served(STORE, False)
        self.held.add(f)
        self.used += n
        return Served(STORE, True)


class HomesLRU:
    """The cluster's tiers without a sampler: each file kept at its home, the least recently read
    across the cluster evicted first (module docstring). ``capacities``: bytes per node;
    ``sizes``: each file's entry bytes."""

    def __init__(self, homes: np.ndarray, capacities: Sequence[int], sizes: np.ndarray) -> None:
        self.homes = np.asarray(homes, np.int32)
        self.capacities = [int(c) for c in capacities]
        self.sizes = np.asarray(sizes, np.int64)
        if len(self.homes) != len(self.sizes):
            raise ValueError(f"{len(self.homes)} homes for {len(self.sizes)} files")
        if self.homes.size and not 0 <= int(self.homes.min()) <= int(self.homes.max()) < len(self.capacities):
            raise ValueError("a home names a node with no capacity given")
        self.held: list[OrderedDict[int, int]] = [OrderedDict() for _ in self.capacities]
        self.used = [0] * len(self.capacities)

    def read(self, node: int, f: int) -> Served:
        h = int(self.homes[f])
        held = self.held[h]
        if f in held:
            held.move_to_end(f)   # read now: the most recent, whoever read it
            return Served(h, False)
        n = int(self.sizes[f])
        if n > self.capacities[h]:
            return Served(STORE, False)
        out = []
        while self.used[h] + n > self.capacities[h]:
            g, m = held.popitem(last=False)
            self.used[h] -= m
            out.append(g)
        held[f] = n
        self.used[h] += n
        return Served(STORE, True, tuple(out))

    def holds(self, f: int) -> bool:
        return f in self.held[int(self.homes[f])]

    def forget(self, f: int) -> None:
        """``f`` is not in its home's tier after all (a keep that failed, an entry gone): no longer
        counted there."""
        h = int(self.homes[f])
        n = self.held[h].pop(f, None)
        if n is not None:
            self.used[h] -= n
