"""MECHANISM: the native file stager's twin on Python threads (stage/engines.py chooses; the
contract is written there).

It runs where the C extension is not built (or ``CLAIRVOYANT_NATIVE_STAGE=0``), or the tier
compresses what it keeps, so that the mount has one staging interface and no branch on which engine is there. Per file: its bytes
reserved in the ledger at submission, the key's node-wide lock held while the file is read (from
the daemon's handoff if a reader's open handed it over, else from the source) and its entry
written, then published.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..nodeio.fileio import discard, read_with_mtime
from ..cache.entry import entry_size
from ..cache.local import LocalStore
from ..tune.inflight import Counts
from .native_files import Capacity, Done, _why, capacity_of


class ThreadStager:
    """``NativeStager``'s contract on Python threads (module docstring)."""

    def __init__(self, store: LocalStore, capacity: Capacity, src_root: str, handoff: str | None, threads: int,
                 on_done: Callable[[Done], None], on_batch: Callable[[], None] | None = None, *,
                 most: int | None = None) -> None:
        self.store, self.capacity = store, capacity_of(capacity)
        self._root, self._handoff = src_root, handoff
        self._on_done, self._on_batch = on_done, on_batch
        self._lock = threading.Lock()   # all of the below (held across a reservation: ``capacity`` must not call back)
        self._jobs: set[int] = set()
        self._closing = False
        # ``_active`` files carried at once (``limit``; at most ``most`` threads), the rest waiting
        # in ``_pending`` for one to finish; the engine's counters
        self._pending: deque[tuple[int, str, int]] = deque()
        self._active, self._running, self._done, self._busy = max(1, int(threads)), 0, 0, 0.0
        self._pool = ThreadPoolExecutor(max(1, int(most or threads)), thread_name_prefix="clairvoyant-file-stage")

    def submit(self, token: int, key: str, size: int) -> bool | None:
        """As ``NativeStager.submit``: True under way, False no room (nothing reserved), None under
        way already."""
        n = entry_size(size)
        with self._lock:
            if self._closing:
                raise RuntimeError("the stager is closed")
            if token in self._jobs:
                return None
            if not self.store.ledger.reserve(n, self.capacity()):
                return False
            self._jobs.add(token)
        try:
            self._admit((token, key, size))
        except BaseException:
            with self._lock:
                self._jobs.discard(token)
            self.store.ledger.give_back(n)
            raise
        return True

    def submit_many(self, items: list[tuple[int, str, int]]) -> list[bool | None | Exception]:
        out: list[bool | None | Exception] = []
        for token, key, size in items:
            try:
                out.append(self.submit(token, key, size))
            except Exception as e:
                out.append(e)
        return out

    def in_flight(self, token: int | None = None) -> bool:
        with self._lock:
            return bool(self._jobs) if token is None else token in self._jobs

    def limit(self, n: int) -> None:
        """Carry at most ``n`` files at once from now on (tune/inflight.py decides)."""
        with self._lock:
            self._active = max(1, int(n))
        self._admit()

    def load(self) -> Counts:
        """Files done, the seconds they took in all, files waiting now."""
        with self._lock:
            return Counts(self._done, self._busy, len(self._pending))

    def _admit(self, job: tuple[int, str, int] | None = None) -> None:
        """Queue ``job`` (if any), then hand the pool what the limit lets go now."""
        go = []
        with self._lock:
            if job is not None:
                self._pending.append(job)
            while self._pending and (self._running < self._active or self._closing):
                go.append(self._pending.popleft())
                self._running += 1
        for job in go:
            self._pool.submit(self._run, *job)

    def _run(self, token: int, key: str, size: int) -> None:
        t0 = time.perf_counter()
        try:
            self._carry(token, key, size)
        finally:
            with self._lock:
                self._running -= 1
                self._done += 1
                self._busy += time.perf_counter() - t0
            self._admit()

    def _carry(self, token: int, key: str, size: int) -> None:
        store, n = self.store, entry_size(size)
        loc, why, handed, present, reserved = None, None, False, False, True
        try:
            if self._closing:
                why = "not started: the stager closed"
                return
            if store.claim(key, size):   # another process of the node staged it meanwhile
                present, why = True, "staged meanwhile by another process of the node"
                return
            try:
                got = self._handed_over(token, size)
                handed = got is not None
                data, mtime_ns = got if handed else self._read(key, size)
                reserved = False   # write owns the reservation from here (gives it back on failure)
                loc = store.write([(key, data)], mtime_ns)[0]
                if loc is None:
                    why = "the tier's index has no free slot"
            finally:
                store.release(key)
        except OSError as e:
            why = _why(e.errno) if e.errno else str(e)
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        finally:
            if reserved:
                store.ledger.give_back(n)
            if not handed and self._handoff is not None:   # a handoff never taken goes too
                discard(os.path.join(self._handoff, str(token)))
            with self._lock:
                self._jobs.discard(token)
            try:
                self._on_done(Done(token, key, loc, why, handed, present))
            finally:
                if self._on_batch is not None:
                    self._on_batch()

    def _handed_over(self, token: int, size: int) -> tuple[bytes, int] | None:
        """The bytes a reader's open read from the source and handed over (the bytes, then the
        mtime in ns), once; None if there are none, or not of the listed size."""
        if self._handoff is None:
            return None
        path = os.path.join(self._handoff, str(token))
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            return None
        finally:
            discard(path)
        if len(blob) != size + 8:
            return None
        return blob[:size], int.from_bytes(blob[size:], "little")

    def _read(self, key: str, size: int) -> tuple[bytes, int]:
        data, mtime_ns = read_with_mtime(os.path.join(self._root, key))
        if len(data) != size:   # changed since it was listed (the native stager's ESTALE)
            raise OSError(errno.ESTALE, _why(errno.ESTALE))
        return data, mtime_ns

    def close(self) -> None:
        """Stop: files not started are not staged (told as such, their reservations given back);
        the threads are joined. Idempotent."""
        with self._lock:
            self._closing = True
        self._admit()   # what waits goes to the pool now: each sees _closing, gives up and is told
        self._pool.shutdown(wait=True, cancel_futures=False)
