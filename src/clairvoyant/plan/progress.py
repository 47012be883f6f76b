"""POLICY, pure: how far a node's readers are along an epoch, from each rank's last report (its
sampler's progress file, mount/orders.py). The one rule for every walker of the mount (the
staging walk, the cluster's plan and its fetching ahead): a rank reporting this epoch is where it
says, one reporting a later epoch has read all of this one, one reporting an earlier epoch (or
nothing yet) has read none of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

DONE = 1 << 62   # the position of a rank that has moved on to a later epoch


@dataclass(frozen=True)
class ReadersProgress:
    """The ranks' positions in the epoch (indices handed out, each rank in its own order)."""

    positions: tuple[int, ...]

    @classmethod
    def of(cls, reports: Sequence[tuple[int, int]], epoch: int) -> "ReadersProgress":
        """From each rank's last ``(epoch, position)`` report (``(-1, 0)``: none yet)."""
        return cls(tuple(at if e == epoch else (DONE if e > epoch else 0) for e, at in reports))

    @property
    def slowest(self) -> int:
        """Where the slowest rank is (0 with no ranks): what every rank has been handed."""
        return min(self.positions, default=0)

    @property
    def fastest(self) -> int:
        """Where the fastest rank still in this epoch is (``DONE`` once none is): a rank gone on to
        the next epoch reads that epoch's files, not this one's."""
        here = [p for p in self.positions if p != DONE]
        return max(here) if here else (DONE if self.positions else 0)

    @property
    def together(self) -> int:
        """All ranks' positions summed: how far the node is along its ranks' merged sequence."""
        return min(sum(self.positions), DONE)
