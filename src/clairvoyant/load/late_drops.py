"""POLICY, pure: when a home sample that a peer reads this epoch leaves this node's local tier (the
cluster cache's late drops, planned in plan/rank_plan.py and carried out by load/pipeline.py).

The plan lists ``(batch, sample)`` for each home sample whose last reader this epoch is a peer. It
goes once this rank is past that batch by :data:`LATE_LAG` batches; one that the epoch reads only
there (``late_on_serve``) goes as soon as the peer has been served it, so that the tier has the
room the plan counted on. Each goes once. The run holds the lock and deletes what this says.
"""

from __future__ import annotations

import collections
from typing import Iterable

# A home sample that a peer reads at batch k is deleted once this rank is past batch k + LATE_LAG
# (ranks run in step; the peer fetched it well before, as its staging runs ahead).
LATE_LAG = 4


class LateDrops:
    """One run's late drops: which are due at a batch, which go when served."""

    def __init__(self, late_drops: Iterable[tuple[int, int]], late_on_serve: Iterable[int]) -> None:
        self._late = collections.deque(late_drops)  # (batch, sample): home samples a peer has read
        self._on_serve = set(late_on_serve)         # of those, to delete as soon as they are served
        self._gone: set[int] = set()                # deleted on serve: skipped when their batch comes

    def __bool__(self) -> bool:
        """Some are still due at their batch."""
        return bool(self._late)

    def served(self, index: int) -> bool:
        """A peer has been served sample ``index``: True if it goes now (once)."""
        if index not in self._on_serve:
            return False
        self._on_serve.discard(index)
        self._gone.add(index)
        return True

    def due(self, upto: int) -> list[int]:
        """The samples due at batch ``upto`` or before and not gone yet; each is handed out once."""
        late, gone = self._late, []
        while late and late[0][0] <= upto:
            s = late.popleft()[1]
            if s in self._gone:
                continue
            self._on_serve.discard(s)
            gone.append(s)
        return gone
