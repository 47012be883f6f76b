"""The staging engine: I/O threads that copy upcoming samples from the source to local_dir.

Work arrives in batch units, in plan order, a bounded window ahead of the
readers. The queue is ordered by need (batch index, then position), so the
sample the training loop is about to wait for is always at its front; when the
loop does wait, the missing samples are counted as on-demand fetches.
Reads from the source release the GIL, so threads, not processes, do this.
"""

from __future__ import annotations

import heapq
import threading
from typing import Callable

from ..cache.local import LocalStore
from ..errors import SourceChanged
from ..manifest import Manifest
from ..source import Source
from ..tune.stats import Stats

OnDone = Callable[[int, int, "BaseException | None"], None]


class Stager:
    """Copies samples in need order with a fixed number of threads."""

    def __init__(self, source: Source, store: LocalStore, manifest: Manifest, *, threads: int,
                 on_done: OnDone, stats: Stats, known: set[int]) -> None:
        self._source, self._store, self._manifest = source, store, manifest
        self._on_done, self._stats, self._known = on_done, stats, known
        self._heap: list[tuple[int, int, int]] = []
        self._cond = threading.Condition()
        self._stop = False
        self._seq = 0
        self._threads = [threading.Thread(target=self._run, name=f"clairvoyant-stager-{i}", daemon=True)
                         for i in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, batch_id: int, indices) -> None:
        with self._cond:
            for idx in indices:
                heapq.heappush(self._heap, (batch_id, self._seq, int(idx)))
                self._seq += 1
            self._cond.notify(len(indices))

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._heap.clear()
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stop:
                    self._cond.wait(0.5)
                if self._stop:
                    return
                batch_id, _, idx = heapq.heappop(self._heap)
            err: BaseException | None = None
            try:
                self._stage(idx)
            except Exception as e:  # delivered to the consumer, which raises it in the training loop
                err = e
            if not self._stop:
                self._on_done(batch_id, idx, err)

    def _stage(self, idx: int) -> None:
        key, size = self._manifest.keys[idx], int(self._manifest.sizes[idx])
        if idx in self._known or self._store.has(key, size):
            self._known.add(idx)
            self._stats.add(local_hits=1)
            return
        with self._store.lock(key):
            if self._store.has(key, size):  # another rank of this node copied it meanwhile
                self._known.add(idx)
                self._stats.add(local_hits=1)
                return
            data = self._source.read(key)
            if len(data) != size:
                raise SourceChanged(
                    f"sample {key!r} is {len(data)} bytes on the source but {size} in the manifest: the source "
                    "changed since it was indexed; run `clairvoyant index --force` on it, or pass reindex=True")
            self._store.put(key, data)
        self._known.add(idx)
        self._stats.add(source_files=1, source_bytes=len(data), staged_files=1)
