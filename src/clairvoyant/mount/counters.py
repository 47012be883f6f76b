"""MECHANISM: the mount process's counters (tune/counters.py: the ``mount`` namespace, and the
``tier`` counters the mount moves, ``staged_local`` among them) and their publication.

What ``Mount.staging()`` returns and ``clairvoyant mount`` status reads from the mount's
``staging.json`` (its info's ``"staging"``): the plans run and the current one's epoch, ranks and
lengths, how far staging and the readers are along its sequence, and counts of what was staged,
found present, evicted, read through, kept after a late read, let go or failed, by the names the
Loader's ``stats()`` gives the same events. The mount's threads (the orders watch that runs the
plan, the events thread, the stager's collector) change them through the counter set's lock; a
snapshot is a copy, published at most every half second (and at the stop).
"""

from __future__ import annotations

import json
import time
from typing import Callable

from ..tune.counters import Counters as CounterSet, namespace
from .listing import publish_bytes

PUBLISH_EVERY = 0.5   # seconds between publications, at least

_MOUNT = frozenset(namespace("mount"))
_TIER = frozenset(namespace("tier"))


class Counters:
    """The counters of one mount process, published to ``path``; ``add`` and ``set`` take short
    names of the ``mount`` or the ``tier`` namespace."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._set = CounterSet(["mount", "tier"])
        self._set.set({"mount.epoch": -1})
        self._last = 0.0
        self.extra: Callable[[], dict] | None = None   # more to publish beside the counters

    @staticmethod
    def _full(name: str) -> str:
        if name in _MOUNT:
            return f"mount.{name}"
        if name in _TIER:
            return f"tier.{name}"
        raise KeyError(f"{name} is no counter of the mount or the tier (tune/counters.py NAMES)")

    def add(self, **deltas: int) -> None:
        self._set.update({self._full(k): v for k, v in deltas.items()})

    def set(self, **values: int) -> None:
        self._set.set({self._full(k): v for k, v in values.items()})

    def space(self, ns: str):
        """Namespace ``ns`` of this set by short names (the mount's tiers count into ``tier``)."""
        return self._set.space(ns)

    def new_plan(self, epoch: int, ranks: int, sequence: int, following: int) -> None:
        """A plan starts: one more, its epoch, ranks and lengths; nothing of it staged or consumed."""
        self._set.set({"mount.epoch": epoch, "mount.ranks": ranks, "mount.sequence": sequence,
                       "mount.following": following, "mount.frontier": 0, "mount.consumed": 0},
                      add={"mount.plans": 1})   # (one step: a snapshot never sees half a new plan)

    def snapshot(self) -> dict:
        """The mount's counters and the tier counters it moved, by their short names."""
        moved = {k: v for k, v in self._set.snapshot("tier").items() if v}
        return {**self._set.snapshot("mount"), **moved}

    def maybe_publish(self) -> None:
        """Publish if the last publication is ``PUBLISH_EVERY`` old (called from one thread)."""
        now = time.monotonic()
        if now - self._last > PUBLISH_EVERY:
            self._last = now
            self.publish()

    def publish(self) -> None:
        doc = self.snapshot()
        if self.extra is not None:   # the cluster's counters (mount/cluster/node.py), beside the staging's
            try:
                doc.update(self.extra())
            except Exception:
                pass
        try:
            publish_bytes(self._path, json.dumps(doc).encode())
        except OSError:
            pass
