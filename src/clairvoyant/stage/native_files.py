"""MECHANISM: stage files of a directory into the local tier on native threads (``_stager.c``).

Per file, Python reserves the entry's bytes in the ledger and its place in this process's extent
(``submit``), the C threads take the key's node-wide lock, read the file (or the bytes a reader's
open handed over) and write the entry there, and one collecting thread publishes whatever has
finished in one lock of the index and lets go of the keys' locks. The order is the Loader's
(reserve, write, publish; cache/local.py), so a kill at any point leaves what the session's
recovery already handles: bytes in an extent that no index slot names.

Where the extension is not built (or ``CLAIRVOYANT_NO_CEXT`` is set), ``available()`` is False:
the mount takes the Python twin (stage/thread_files.py, stage/engines.py chooses), the Loader's
own staging threads stage its files. Each token (the caller's number for a file) must not be
submitted again while it is in flight.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from typing import Callable, NamedTuple, Union

from ..cache.entry import entry_size
from ..cache.extents import Loc, key_digest
from ..cache.local import LocalStore
from ..tune.inflight import Counts

try:
    if os.environ.get("CLAIRVOYANT_NO_CEXT"):
        raise ImportError("disabled by CLAIRVOYANT_NO_CEXT")
    from ..cache._stager import Stager as _Engine
except ImportError:
    _Engine = None

log = logging.getLogger("clairvoyant")


_ABSENT = object()


def _why(err: int) -> str:
    if err == errno.ESTALE:
        return "its size is no longer the listed one (the source changed: re-index it)"
    return os.strerror(err)


def available() -> bool:
    """Whether the native stager is built here."""
    return _Engine is not None


Capacity = Union[int, Callable[[], int]]


def capacity_of(capacity: Capacity) -> Callable[[], int]:
    """The room a stager reserves within, as a function (a fixed number, or the caller's own)."""
    if callable(capacity):
        return capacity
    fixed = int(capacity)
    return lambda: fixed


class Job(NamedTuple):
    """One file for the C threads (``_stager.c`` parses it as this tuple, in this order)."""

    token: int
    path: str            # relative to the source root
    size: int            # bytes, as listed
    out_fd: int          # the extent the entry goes into
    offset: int          # where in it
    lock_offset: int     # the key's node-wide lock byte (cache/tier_format.h)
    src_offset: int = -1   # where the bytes lie in the file at ``path`` (a tar shard's member); -1: all of it
    src_mtime: int = -1    # that file's mtime when it was indexed, checked before the read (-1: not)
    digest: int = 0        # the key's index digest: an entry there once the lock is held is not read again


class Done(NamedTuple):
    token: int
    key: str
    loc: Loc | None          # where the entry is, or None if it was not staged
    error: str | None        # why not (the source's errno text, a full index), or None
    handed_over: bool        # the bytes came from a reader's handoff, not from the source
    present: bool = False    # not staged because another process of the node had staged it meanwhile


class NativeStager:
    """Native threads staging the files of ``src_root`` (keys are paths relative to it) into
    ``store`` within ``capacity`` bytes (a number, or a function giving the room at each
    submission: the Loader's tier less what kept samples waiting in RAM are owed); ``on_done``
    hears of each file once, from the collecting thread; ``on_batch``, if given, after each batch
    of them."""

    def __init__(self, store: LocalStore, capacity: Capacity, src_root: str, handoff: str | None, threads: int,
                 on_done: Callable[[Done], None], on_batch: Callable[[], None] | None = None, *,
                 most: int | None = None, span: Callable[[str, int], tuple[str, int, int] | None] | None = None
                 ) -> None:
        if _Engine is None:
            raise RuntimeError("the native stager is not built here (clairvoyant.cache._stager)")
        self.store, self._on_done, self._on_batch = store, on_done, on_batch
        self.capacity = capacity_of(capacity)
        # where a key's bytes lie: (path under src_root, offset and mtime; -1: the whole file), or
        # None where they are not the listed size there (Source.native_span): such a file is refused
        self._span = span or (lambda key, size: (key, -1, -1))
        # ``most`` threads, of which ``threads`` carry a file at once until ``limit`` says otherwise
        self._engine = _Engine(src_root, store.lock_fd, handoff, max(1, int(most or threads)),
                               index=store.index.path, session=store.session)
        self._engine.limit(max(1, int(threads)))
        self._jobs: dict[int, tuple] = {}   # token -> (key, extent, offset, entry bytes)
        self._lock = threading.Lock()
        self._closing = self._engine_closed = False
        self._thread = threading.Thread(target=self._collect, name="clairvoyant-native-stage", daemon=True)
        self._thread.start()

    def submit(self, token: int, key: str, size: int) -> bool | None:
        """Stage ``key`` (``size`` bytes as listed): True when under way; False, with nothing
        reserved, if the tier has no room for it (or it is not where the manifest says: the
        caller's own way words it); None if ``token`` is under way already (its job will tell,
        once, after its entry is published)."""
        out = self.submit_many([(token, key, size)])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def submit_many(self, items: list[tuple[int, str, int]]) -> list[bool | None | Exception]:
        """``submit`` for several files, ``(token, key, size)`` each: one reservation in the ledger
        for all and one call into the engine (the plan's files go a slot-full at a time, not one GIL
        hand-off each). Each item's outcome is submit's; where the tier has no room for them all,
        each is submitted on its own (those that fit go), and an item whose own submit raised has
        its exception as its outcome (the others went on). An exception raised by this call itself
        means none of them was submitted."""
        out: list[bool | None | Exception] = [None] * len(items)
        where = [self._span(key, size) for _, key, size in items]
        with self._lock:
            if self._closing:
                raise RuntimeError("the stager is closed")
            mine = []
            for k, it in enumerate(items):
                if where[k] is None:   # not where the manifest says: refused, as submit refuses it
                    out[k] = False
                elif it[0] not in self._jobs:   # (a token twice in items: the second is under way)
                    self._jobs[it[0]] = None
                    mine.append(k)
        if not mine:
            return out
        store, sizes = self.store, [entry_size(items[k][2]) for k in mine]
        if not store.ledger.reserve(sum(sizes), self.capacity()):
            self._unclaim([items[k][0] for k in mine], [None] * len(mine))
            if len(mine) == 1:
                out[mine[0]] = False
                return out
            for k in mine:   # each on its own: those that fit go
                try:
                    out[k] = self.submit(*items[k])
                except Exception as e:   # this one did not go; those before it did
                    out[k] = e
            return out
        tokens, jobs = [items[k][0] for k in mine], []
        try:
            for k, n in zip(mine, sizes):
                ext, offset = store.place(n)
                jobs.append((items[k][1], ext, offset, n))
            with self._lock:
                swept = any(t not in self._jobs for t in tokens)   # closed meanwhile: the last sweep ran
                if not swept:
                    self._jobs.update(zip(tokens, jobs))
            if swept:
                raise RuntimeError("the stager is closed")
        except BaseException:   # nothing of ours was handed on: every place is this caller's to give back
            if len(jobs) < len(sizes):
                store.ledger.give_back(sum(sizes[len(jobs):]))
            self._unclaim(tokens, [None] * len(tokens))
            for job in jobs:
                store.abandon(job[1], job[2], job[3])
            raise
        try:
            self._engine.submit_many([Job(t, where[k][0], items[k][2], ext.fd, offset, store.lock_offset(key),
                                          *where[k][1:], key_digest(key))
                                      for t, k, (key, ext, offset, _) in zip(tokens, mine, jobs)])
        except BaseException:
            self._unclaim(tokens, jobs, give_back=True)
            raise
        for k in mine:
            out[k] = True
        return out

    def _unclaim(self, tokens: list[int], jobs: list, give_back: bool = False) -> None:
        """Forget tokens this caller claimed, each only if it still holds what this caller put there
        (``jobs[k]``: its placeholder None, or its job); with ``give_back``, the places of the jobs
        it forgot are given back."""
        gone = []
        with self._lock:
            for t, job in zip(tokens, jobs):
                cur = self._jobs.get(t, _ABSENT)
                if cur is job:   # (None: the placeholder this caller claimed)
                    del self._jobs[t]
                    gone.append(job)
        if give_back:
            for job in gone:
                if job is not None:
                    self.store.abandon(job[1], job[2], job[3])

    def limit(self, n: int) -> None:
        """Carry at most ``n`` files at once from now on (tune/inflight.py decides)."""
        self._engine.limit(max(1, int(n)))

    def load(self) -> Counts:
        """Files done, the seconds they took in all, files waiting now."""
        done, busy, _, waiting = self._engine.load()   # (and files carried now)
        return Counts(done, busy, waiting)

    def in_flight(self, token: int | None = None) -> bool:
        """Whether the job of ``token`` (None: any job) is under way (submitted, its outcome not yet
        told)."""
        with self._lock:
            return bool(self._jobs) if token is None else token in self._jobs

    def _collect(self) -> None:
        while True:
            with self._lock:
                closed = self._engine_closed   # closed before this collect: it returns every job left
            done = self._engine.collect(0.1)
            if done:
                try:
                    self._finish(done)   # finishes each job on its own; this guard is for the unforeseen
                except Exception as e:   # the collector must live on: the jobs' owners wait on it
                    log.warning("clairvoyant: finishing staged entries failed: %s", e)
            elif closed:
                break
        with self._lock:
            left, self._jobs = list(self._jobs.values()), {}
        for job in left:   # none should be left; were one, its place is given back
            if job is not None:
                self.store.abandon(job[1], job[2], job[3])

    def _finish(self, done: list[tuple[int, int, int, int, int]]) -> None:
        """Publish what was written (unless another process of the node published the same file
        while this one waited for its lock), give back the places of the rest, then, for each job
        whatever happened: let go of its lock, forget its token, tell its owner."""
        store = self.store
        with self._lock:
            jobs = [(t, self._jobs[t], err, bool(handed), bool(locked)) for t, err, _, handed, locked in done]
        outcome: dict[int, tuple] = {}   # token -> (loc, error, staged meanwhile by another process)
        written = []
        for token, (key, ext, offset, n), err, _, _ in jobs:
            present = err == errno.EEXIST or (err == 0 and self._published_meanwhile(key, n))
            if err == 0 and not present:
                written.append((token, key, ext, offset, n))
                continue
            outcome[token] = (None, "staged meanwhile by another process of the node" if present else _why(err),
                              present)
            try:
                store.abandon(ext, offset, n)
            except Exception as e:
                outcome[token] = (None, f"cannot give its place back: {e}", present)
        if written:
            try:
                locs = store.publish_placed([(key, ext, offset, n) for _, key, ext, offset, n in written])
                why = "the tier's index has no free slot"
            except Exception as e:   # nothing was published, and every place was given back
                locs, why = [None] * len(written), f"cannot publish: {e}"
            for (token, *_), loc in zip(written, locs):
                outcome[token] = (loc, None if loc is not None else why, False)
        for token, (key, *_), _, handed, locked in jobs:
            loc, why, present = outcome.get(token, (None, "not published", False))
            try:
                if locked:
                    store.unlock(key)   # published (or not): a reader waiting on the key goes on
            except Exception as e:
                log.warning("clairvoyant: cannot let go of the lock of %s: %s", key, e)
            finally:
                with self._lock:
                    self._jobs.pop(token, None)   # from here a new submit of it finds it published
                try:
                    self._on_done(Done(token, key, loc, why, handed, present))
                except Exception as e:
                    log.warning("clairvoyant: after staging %s: %s", key, e)
        if self._on_batch is not None:
            self._on_batch()

    def _published_meanwhile(self, key: str, nbytes: int) -> bool:
        """Whether the tier holds an entry of ``key`` written in this session already: another
        process of the node staged it while this job waited for the key's lock (with the lock held
        now, nothing can change that)."""
        try:
            got = self.store.locate(key)
        except Exception:   # the index cannot say: publish, which replaces (and frees) any such entry
            return False
        return got is not None and got[0].length == nbytes and got[1] == self.store.session

    def close(self) -> None:
        """Stop: files not started are not staged (their reservations given back); the threads are
        joined. Idempotent."""
        with self._lock:
            self._closing = True
        self._engine.close()   # every job is now finished or cancelled, and comes back from collect
        with self._lock:
            self._engine_closed = True
        self._thread.join()
