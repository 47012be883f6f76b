"""MECHANISM: stage files of a directory into the local tier on native threads (``_stager.c``).

Per file, Python reserves the entry's bytes in the ledger and its place in this process's extent
(``submit``), the C threads take the key's node-wide lock, read the file (or the bytes a reader's
open handed over) and write the entry there, and one collecting thread publishes whatever has
finished in one lock of the index and lets go of the keys' locks. The order is the Loader's
(reserve, write, publish; cache/local.py), so a kill at any point leaves what the session's
recovery already handles: bytes in an extent that no index slot names.

Where the extension is not built (or ``CLAIRVOYANT_NO_CEXT`` is set), ``available()`` is False
and callers stage through ``Tiers.stage`` in Python threads instead: the same effect, more CPU.
Each token (the caller's number for a file) must not be submitted again while it is in flight.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, NamedTuple

from .entry import entry_size
from .extents import Loc
from .local import LocalStore

try:
    if os.environ.get("CLAIRVOYANT_NO_CEXT"):
        raise ImportError("disabled by CLAIRVOYANT_NO_CEXT")
    from ._stager import Stager as _Engine
except ImportError:
    _Engine = None

log = logging.getLogger("clairvoyant")


def available() -> bool:
    """Whether the native stager is built here."""
    return _Engine is not None


class Done(NamedTuple):
    token: int
    key: str
    loc: Loc | None          # where the entry is, or None if it was not staged
    error: str | None        # why not (the source's errno text, a full index), or None
    handed_over: bool        # the bytes came from a reader's handoff, not from the source


class NativeStager:
    """Native threads staging the files of ``src_root`` (keys are paths relative to it) into
    ``store`` within ``capacity`` bytes; ``on_done`` hears of each file once, from the collecting
    thread."""

    def __init__(self, store: LocalStore, capacity: int, src_root: str, handoff: str | None, threads: int,
                 on_done: Callable[[Done], None]) -> None:
        if _Engine is None:
            raise RuntimeError("the native stager is not built here (clairvoyant.cache._stager)")
        self.store, self.capacity, self._on_done = store, int(capacity), on_done
        self._engine = _Engine(src_root, store.lock_fd, handoff, max(1, int(threads)))
        self._jobs: dict[int, tuple] = {}   # token -> (key, extent, offset, entry bytes)
        self._lock = threading.Lock()
        self._closing = self._engine_closed = False
        self._thread = threading.Thread(target=self._collect, name="clairvoyant-native-stage", daemon=True)
        self._thread.start()

    def submit(self, token: int, key: str, size: int) -> bool | None:
        """Stage ``key`` (``size`` bytes as listed): True when under way; False, with nothing
        reserved, if the tier has no room for it; None if ``token`` is under way already (its job
        will tell, once)."""
        n = entry_size(size)
        store = self.store
        with self._lock:   # claim the token first: two callers never both submit it
            if self._closing:
                raise RuntimeError("the stager is closed")
            if token in self._jobs:
                return None
            self._jobs[token] = None
        placed = False
        try:
            if not store.ledger.reserve(n, self.capacity):
                return False
            try:
                ext, offset = store.place(n)
            except BaseException:
                store.ledger.give_back(n)
                raise
            with self._lock:
                self._jobs[token] = (key, ext, offset, n)
            try:
                self._engine.submit(token, key, size, ext.fd, offset, store.lock_offset(key))
            except BaseException:
                store.abandon(ext, n)
                raise
            placed = True
            return True
        finally:
            if not placed:
                with self._lock:
                    self._jobs.pop(token, None)

    def _collect(self) -> None:
        while True:
            with self._lock:
                closed = self._engine_closed   # closed before this collect: it returns every job left
            done = self._engine.collect(0.1)
            if done:
                try:
                    self._finish(done)
                except Exception as e:   # never leave the collector: the jobs' owners would wait forever
                    log.warning("clairvoyant: publishing staged entries failed: %s", e)
            elif closed:
                break
        with self._lock:
            left, self._jobs = list(self._jobs.values()), {}
        for job in left:   # none should be left; were one, its place is given back
            if job is not None:
                self.store.abandon(job[1], job[3])

    def _finish(self, done: list[tuple[int, int, int, int, int]]) -> None:
        store = self.store
        with self._lock:
            jobs = [(self._jobs.pop(t), t, err, handed, locked) for t, err, _, handed, locked in done]
        written, results = [], []
        for (key, ext, offset, n), token, err, handed, locked in jobs:
            if err == 0:
                written.append((token, key, ext, offset, n, bool(handed)))
                continue
            store.abandon(ext, n)
            if locked:
                store.unlock(key)
            results.append(Done(token, key, None, os.strerror(err), bool(handed)))
        if written:
            try:
                locs = store.publish_placed([(key, ext, offset, n) for _, key, ext, offset, n, _ in written])
                why = "the tier's index has no free slot"
            except OSError as e:   # given back by publish_placed
                locs, why = [None] * len(written), f"cannot publish: {e}"
            for (token, key, _, _, _, handed), loc in zip(written, locs):
                store.unlock(key)   # published (or not): a reader waiting on the key goes on
                results.append(Done(token, key, loc, None if loc is not None else why, handed))
        for r in results:
            try:
                self._on_done(r)
            except Exception as e:
                log.warning("clairvoyant: after staging %s: %s", r.key, e)

    def close(self) -> None:
        """Stop: files not started are not staged (their reservations given back); the threads are
        joined. Idempotent."""
        with self._lock:
            self._closing = True
        self._engine.close()   # every job is now finished or cancelled, and comes back from collect
        with self._lock:
            self._engine_closed = True
        self._thread.join()
