"""MECHANISM: the mount process's staging counters and their publication.

What ``Mount.staging()`` returns and ``clairvoyant mount`` status reads from the mount's
``staging.json`` (its info's ``"staging"``): the plans run and the current one's epoch, ranks and
lengths, how far staging and the readers are along its sequence, and counts of what was staged,
found present, evicted, read through, kept after a late read, let go or failed. The mount's
threads (the orders watch that runs the plan, the events thread, the stager's collector) change
them under one lock; a snapshot is a copy, published at most every half second (and at the stop).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

from .listing import publish_bytes

PUBLISH_EVERY = 0.5   # seconds between publications, at least

# what the current plan is (set), then what the staging did (added to)
NAMES = ("plans", "epoch", "ranks", "sequence", "following", "frontier", "consumed",
         "staged", "staged_bytes", "present", "evicted", "read_through", "not_staged", "failed", "handed_over",
         "read_ahead", "ahead_no_room", "kept_reads", "evicted_unread", "not_home")


class Counters:
    """The staging counters of one mount process, published to ``path``."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._c = dict.fromkeys(NAMES, 0)
        self._c["epoch"] = -1
        self._last = 0.0
        self.extra: Callable[[], dict] | None = None   # more to publish beside the counters

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                self._c[name] += n

    def set(self, **values: int) -> None:
        with self._lock:
            self._c.update(values)

    def new_plan(self, epoch: int, ranks: int, sequence: int, following: int) -> None:
        """A plan starts: one more, its epoch, ranks and lengths; nothing of it staged or consumed."""
        with self._lock:
            self._c.update(plans=self._c["plans"] + 1, epoch=epoch, ranks=ranks, sequence=sequence,
                           following=following, frontier=0, consumed=0)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._c)

    def maybe_publish(self) -> None:
        """Publish if the last publication is ``PUBLISH_EVERY`` old (called from one thread)."""
        now = time.monotonic()
        if now - self._last > PUBLISH_EVERY:
            self._last = now
            self.publish()

    def publish(self) -> None:
        doc = self.snapshot()
        if self.extra is not None:   # the cluster's counters (mount/cluster.py), beside the staging's
            try:
                doc.update(self.extra())
            except Exception:
                pass
        try:
            publish_bytes(self._path, json.dumps(doc).encode())
        except OSError:
            pass
