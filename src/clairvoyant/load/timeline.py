"""When each batch of a run was staged, handed to a reader and read: what a wait is split by.

The loop's wait for batch k is attributed to causes (tune/verdict.py's
``split_wait``) from three moments: its last sample staged, its dispatch to a
reader, and the reader's own read/decode/collate times; the staging part is
shared between the source and peer nodes by the seconds its samples spent on
each. The staging threads,
the dispatcher and the loop each mark their moment here; the record of a batch
goes once the loop has taken it.
"""

from __future__ import annotations

import time

from ..tune.verdict import split_wait


class BatchTimeline:
    def __init__(self) -> None:
        self._staged: dict[int, float] = {}
        self._dispatched: dict[int, float] = {}
        self._worker: dict[int, tuple[float, ...]] = {}
        self._fetch: dict[int, list[float]] = {}   # batch -> [staging seconds, of which asking peers]

    def staged(self, k: int) -> None:
        self._staged[k] = time.perf_counter()

    def fetched(self, k: int, seconds: float, peer_seconds: float) -> None:
        """A sample of batch ``k`` took ``seconds`` to stage, ``peer_seconds`` of them on a peer
        (called under the run's lock)."""
        f = self._fetch.setdefault(k, [0.0, 0.0])
        f[0] += seconds
        f[1] += peer_seconds

    def dispatched(self, k: int) -> None:
        self._dispatched[k] = time.perf_counter()

    def read(self, k: int, times: tuple[float, ...]) -> None:
        self._worker[k] = times

    def causes(self, k: int, t0: float, t1: float) -> dict[str, float]:
        """The loop's wait for batch ``k`` from ``t0`` to ``t1``, by cause."""
        f = self._fetch.get(k)
        peer = min(1.0, f[1] / f[0]) if f and f[0] > 0 else 0.0
        return split_wait(t0, t1, self._staged.get(k), self._dispatched.get(k), self._worker.get(k), peer)

    def forget(self, k: int) -> None:
        for d in (self._staged, self._dispatched, self._worker, self._fetch):
            d.pop(k, None)
