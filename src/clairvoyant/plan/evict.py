"""POLICY: which samples a bounded cache keeps, from the known future (Belady's MIN).

Because the order of every epoch is known in advance, the cache can keep the
samples whose next use is soonest and evict the one needed farthest in the
future: the offline optimum for equal sizes. A prefetch is admitted only if it
evicts nothing needed sooner than itself. Pure: the cache mechanism (issue 3)
asks this policy what to keep; it never decides by itself.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

NEVER = np.iinfo(np.int64).max


def next_uses(sequence: Sequence[int] | np.ndarray) -> np.ndarray:
    """For every position i, the next position j > i that accesses the same sample, else NEVER."""
    seq = np.asarray(sequence, dtype=np.int64)
    out = np.full(len(seq), NEVER, dtype=np.int64)
    order = np.argsort(seq, kind="stable")          # positions grouped by sample, ascending within
    same = seq[order[1:]] == seq[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


class FarthestNextUse:
    """Residents within ``capacity`` bytes; evicts the one whose next use is farthest.

    ``key`` is the eviction rule, the one every heap of residents orders by (the mount's staging
    ahead, plan/ahead.py, holds one of these; testing/reference.py's plain simulator takes the key):
    the smaller key gives way first. ``_belady.c``'s ``farther`` is the same rule for the C plan.
    """

    @staticmethod
    def key(next_use: float, sample: int) -> tuple[float, int]:
        """Residents give way in the order of this key: the farthest next use first, then the
        smaller sample."""
        return (-next_use, sample)

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.used = 0
        self._next: dict[int, int] = {}       # sample -> next use (position in the access sequence)
        self._size: dict[int, int] = {}
        self._heap: list[tuple[tuple, int]] = []  # (key, sample); stale entries skipped lazily

    def __contains__(self, sample: int) -> bool:
        return sample in self._next

    def __len__(self) -> int:
        return len(self._next)

    def next_use(self, sample: int) -> int | None:
        """A resident's next use (a position), or None if it is not resident."""
        return self._next.get(sample)

    def residents(self) -> dict[int, int]:
        """Resident samples and their sizes."""
        return dict(self._size)

    def touch(self, sample: int, next_use: int) -> None:
        """A resident was used; ``next_use`` is when it is needed again (NEVER if not)."""
        self._next[sample] = next_use
        heapq.heappush(self._heap, (self.key(next_use, sample), sample))

    def _farthest(self, chosen: set[int] = frozenset()) -> tuple[int, int] | None:
        while self._heap:
            key, sample = self._heap[0]
            if sample in self._next and self.key(self._next[sample], sample) == key and sample not in chosen:
                return sample, self._next[sample]
            heapq.heappop(self._heap)  # stale: evicted, touched since, or a duplicate entry
        return None

    def pop_farthest(self, later_than: int) -> int | None:
        """Evict the resident whose next use is farthest if that use comes after ``later_than``
        (a position): the sample evicted, or None (nothing changes)."""
        top = self._farthest()
        if top is None or top[1] <= later_than:
            return None
        sample = top[0]
        heapq.heappop(self._heap)
        del self._next[sample]
        self.used -= self._size.pop(sample)
        return sample

    def admit(self, sample: int, size: int, next_use: int) -> list[int] | None:
        """Make room for ``sample`` if that evicts only samples needed later than it.

        Returns the evicted samples (possibly none), or None when admitting would
        evict something needed sooner (then nothing changes).
        """
        if sample in self._next:
            self.touch(sample, next_use)
            return []
        if size > self.capacity:
            return None
        victims, freed, held = [], 0, []
        while self.used - freed + size > self.capacity:
            top = self._farthest(set(victims))
            if top is None or top[1] <= next_use:
                for v, nu in held:  # put back what we took off the heap
                    heapq.heappush(self._heap, (self.key(nu, v), v))
                return None
            victim, nu = top
            heapq.heappop(self._heap)
            held.append((victim, nu))
            victims.append(victim)
            freed += self._size[victim]
        for v in victims:
            del self._next[v]
            self.used -= self._size.pop(v)
        self._next[sample], self._size[sample] = next_use, size
        self.used += size
        heapq.heappush(self._heap, (self.key(next_use, sample), sample))
        return victims
