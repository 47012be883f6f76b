"""The staging engine: I/O threads that copy upcoming samples from the source to local_dir.

Work arrives in batch units, in plan order, a bounded window ahead of the
readers. Batches are submitted in the order the training loop will need them
and the queue is first-in first-out, so the sample the loop is about to wait
for is always the next one taken. Reads from the source release the GIL, so
threads, not processes, do this; the queue is a C-level SimpleQueue and each
sample costs one callback, to keep the GIL hand-offs per sample few.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

from ..cache.local import LocalStore
from ..errors import ClairvoyantError, SampleReadError, SourceChanged
from ..manifest import Manifest
from ..source import Source
from ..fileio import write_all

HIT, COPIED = "hit", "copied"
# on_done(batch, index, outcome): outcome is HIT, COPIED or the exception that stopped the copy
OnDone = Callable[[int, int, "str | BaseException"], None]


class Stager:
    """Copies samples in need order with a fixed number of threads."""

    def __init__(self, source: Source, store: LocalStore, manifest: Manifest, *, threads: int,
                 on_done: OnDone, known: set[int]) -> None:
        self._source, self._store, self._manifest = source, store, manifest
        self._on_done, self._known = on_done, known
        self._queue: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._stop = False
        self.fatal: BaseException | None = None  # an error that stopped a staging thread itself
        self._threads = [threading.Thread(target=self._run, name=f"clairvoyant-stager-{i}", daemon=True)
                         for i in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, batch_id: int, indices) -> None:
        for idx in indices:
            self._queue.put((batch_id, int(idx)))

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking work; each thread finishes (and publishes or removes) the sample in hand."""
        self._stop = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # never die silently: the consumer would wait for ever
            self.fatal = e

    def _loop(self) -> None:
        while not self._stop:
            item = self._queue.get()
            if item is None or self._stop:
                return
            batch_id, idx = item
            try:
                outcome: str | BaseException = self._stage(idx)
            except ClairvoyantError as e:  # delivered to the consumer, which raises it in the loop
                outcome = e
            except Exception as e:  # a source's own error: name the sample
                key = self._manifest.keys[idx]
                outcome = SampleReadError(f"cannot stage sample {key!r} from {self._source!r}: "
                                          f"{type(e).__name__}: {e}")
                outcome.__cause__ = e
            if not self._stop:
                self._on_done(batch_id, idx, outcome)

    def _stage(self, idx: int) -> str:
        if idx in self._known:
            return HIT
        key, size = self._manifest.keys[idx], int(self._manifest.sizes[idx])
        store = self._store
        if store.claim(key, size):  # an earlier run, or another rank of this node, copied it
            self._known.add(idx)
            return HIT
        # we hold the node-wide lock of key now; every path below lets go of it
        path_for_copy = getattr(self._source, "path_for_copy", None)
        if path_for_copy is not None:  # a file: copied, published and unlocked in one call
            try:
                src = path_for_copy(key, size)
            except BaseException:
                store.release(key)
                raise
            try:
                n = store.put_file(key, src, size, unlock=True)
            except OSError as e:
                if e.filename != src or isinstance(e, ClairvoyantError):
                    raise
                raise self._source.read_error(key, src, e) from e
            _check_size(key, n, size)
        else:
            try:
                store.put_from(key, lambda fd: self._fill(key, size, fd))
            finally:
                store.release(key)
        self._known.add(idx)
        return COPIED

    def _fill(self, key: str, size: int, fd: int) -> int:
        data = self._source.read(key)
        _check_size(key, len(data), size)  # raised inside the publish: nothing is published
        write_all(fd, data)
        return len(data)


def _check_size(key: str, n: int, size: int) -> None:
    if n != size:
        raise SourceChanged(
            f"sample {key!r} is {n} bytes on the source but {size} in the manifest: the source "
            "changed since it was indexed; run `clairvoyant index --force` on it, or pass reindex=True")
