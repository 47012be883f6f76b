"""Ranks of one process (threads) as a group, as cluster/group.py has one, for the tests of what
the ranks exchange (the job's secret, the formation of a cluster)."""

from __future__ import annotations

import threading
from typing import Any, Callable


class ThreadGroup:
    """``size`` ranks of one process gathering through a barrier; ``rank_view(r)`` is rank r's group."""

    name = "a test's threads"

    def __init__(self, size: int) -> None:
        self.size, self._slots, self._barrier = size, [b""] * size, threading.Barrier(size)
        self.closed: set[int] = set()

    def rank_view(self, rank: int):
        group = self

        class View:
            name, size = group.name, group.size

            def __init__(self) -> None:
                self.rank = rank

            def allgather(self, blob: bytes, what: str) -> list[bytes]:
                group._barrier.wait(10)
                group._slots[rank] = bytes(blob)
                group._barrier.wait(10)
                out = list(group._slots)
                group._barrier.wait(10)
                return out

            def close(self) -> None:
                group.closed.add(rank)
        return View()

    def run(self, fn: Callable[[Any], Any]) -> list:
        """``fn(group of rank r)`` on every rank, each in its thread: each rank's result or exception."""
        out: list = [None] * self.size

        def one(r: int) -> None:
            try:
                out[r] = fn(self.rank_view(r))
            except Exception as e:   # noqa: BLE001 - the test looks at it
                out[r] = e
        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out
