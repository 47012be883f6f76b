"""POLICY, pure: which resident to evict while staging ahead of readers in a known sequence.

The mount (mount/controller.py) stages the node's merged order ahead of the slowest rank's
progress. When the tier is full, the resident whose next use, counted from the consumption point
on, is farthest gives way, but only if that use comes after the file about to be staged;
otherwise staging waits for the readers. ``StagedAhead`` keeps the residents in a lazy max-heap by
that next use (plan/evict.py's ``FarthestNextUse``) and moves a resident's next use on when the
readers pass its current one, so choosing a victim costs log R rather than a scan of every
resident (R is in the millions for ImageNet on a large local disk).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .evict import FarthestNextUse
from .residency import first_positions, next_use_positions


class StagedAhead:
    """Residents of a tier over ``sequence`` (sample per position) staged ahead of consumption."""

    def __init__(self, sequence: np.ndarray, num_samples: int, residents: Iterable[int] = ()) -> None:
        self.sequence = np.ascontiguousarray(sequence, dtype=np.int64)
        self._next = next_use_positions(self.sequence, num_samples)   # NEVER where none follows
        first = first_positions(self.sequence, num_samples)
        self._held = FarthestNextUse(1 << 62)   # its capacity plays no part: the tier's ledger decides
        for s in residents:
            self._held.admit(int(s), 0, int(first[s]))
        self._seen = 0   # positions whose consumption is accounted for

    def __contains__(self, sample: int) -> bool:
        return sample in self._held

    def __len__(self) -> int:
        return len(self._held)

    def consumed(self, upto: int) -> None:
        """The readers have used every position before ``upto``: a resident used there is next
        needed at its following use."""
        seq, nxt = self.sequence, self._next
        for p in range(self._seen, min(int(upto), len(seq))):
            s = int(seq[p])
            if s in self._held:
                self._held.touch(s, int(nxt[p]))
        self._seen = max(self._seen, int(upto))

    def staged(self, sample: int, position: int) -> None:
        """``sample`` is being staged for its use at ``position``."""
        self._held.admit(int(sample), 0, int(position))

    def evict_for(self, position: int) -> int | None:
        """The resident to evict to make room for the file used at ``position`` (removed from the
        residents), or None when every resident is needed at or before it."""
        return self._held.pop_farthest(later_than=position)
