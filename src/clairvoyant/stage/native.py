"""MECHANISM: the Loader's misses staged on native threads (cache/native_stage.py, ``_stager.c``).

Of the staging work the plan gives a rank, one kind is the bulk of a first epoch: a miss the
local tier keeps, read from a local POSIX source straight into the tier. The Python staging
threads do it at about 250 us of CPU per file (open, read, checksum, write and publish, each a
step through the interpreter); the native engine the mount uses does it at about 60 us (a C
thread per file reads and writes the entry; one Python thread publishes a batch under one lock
of the index). ``NativeRoute`` hands those misses to that engine and tells the Loader's run of
each outcome as the Python threads would. Anything it cannot stage (no room, the source
changed, an unreadable file, a full device) goes back to the Python threads, which stage it or
raise the typed error naming the sample: errors are worded in one place.

Where it applies is decided once, by ``applies``: the native engine is built, the source reads
a key as the plain file ``root/key`` (``native_reads``: not a charged or remote store) or as a
byte range of a local file (``native_spans``: a tar shard, kept open here while jobs read it),
misses to keep go straight to the local tier, and no node-wide deadline gate orders the ranks'
work. For a source of spans the route also places the absent samples of a range the plan reads
whole (``submit_range``): a job per sample, each a pread at its offset, the range's pages read
from the store once and the entries written and checksummed in C.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ..cache import native_stage
from ..cache.native_stage import Done, NativeStager, Span
from ..cache.tiers import LOCAL, Placement, Tiers
from ..manifest import Manifest

# deliver(batch, position in batch, placement, seconds); fallback(item): stage it in Python
Deliver = Callable[[int, int, Placement, float], None]
Item = tuple   # the Python stager's item: (batch, position, sample, hit, keep, peer, whole)


def applies(source, tiers: Tiers, gated: bool) -> bool:
    """Whether the Loader's kept misses from ``source`` go to the native engine (module docstring);
    ``CLAIRVOYANT_NATIVE_STAGE=0`` keeps them on the Python threads (for a comparison, or a fault
    of the native engine)."""
    return (native_stage.available() and os.environ.get("CLAIRVOYANT_NATIVE_STAGE", "1") != "0"
            and (source.native_reads or source.native_spans) and tiers.direct and not gated)


class NativeRoute:
    """Kept misses of a local POSIX source (or of a source of spans), staged by native threads
    into ``tiers.local``; for a source of spans, also the absent samples of ranges read whole."""

    def __init__(self, tiers: Tiers, manifest: Manifest, source, threads: int, deliver: Deliver,
                 fallback: Callable[[Item], None], fatal: Callable[[BaseException], None]) -> None:
        self._tiers, self._manifest = tiers, manifest
        self._deliver, self._fallback, self._fatal = deliver, fallback, fatal
        self._lock = threading.Lock()
        # token -> (item, or for a range's sample [its jobs under way, called once none is], when,
        # the sample)
        self._jobs: dict[int, tuple[Item | list, float, int]] = {}
        self._by_sample: dict[int, list] = {}  # sample -> [jobs under way, Event set when none is]
        self._token = 0
        self._closed = False
        #: the source's samples are spans of files opened here (``_files``), not files of a root
        self.spans = bool(source.native_spans) and not source.native_reads
        self._source = source
        self._files: dict[str, int] = {}   # path -> descriptor the C threads pread (spans)
        root = "/" if self.spans else source.root
        self._engine = NativeStager(tiers.local, tiers.local_capacity, root, None, threads, self._done)

    def submit(self, items: list[Item]) -> list[Item]:
        """Stage ``items`` (each a kept miss); returns those the engine did not take (no room: the
        Python threads place them, in the RAM window if need be)."""
        if not items:
            return []
        if self._tiers.owed_bytes:   # kept samples wait in the RAM window for room: they go first,
            return items             # and the Python threads reserve around them (Tiers.stage)
        outcomes = self._submit([it[2] for it in items], items)
        return [it for it, out in zip(items, outcomes) if out is not True]

    def submit_range(self, samples: list[int], done: Callable[[], None]) -> bool:
        """Place ``samples`` (absent samples of one range read whole) in the local tier; ``done()``
        once every one of them is told, placed or not (a sample not placed is read on its own when
        its turn comes). False, with nothing submitted and ``done`` never called: the Python
        threads read the range instead."""
        if not samples or not self.spans or self._tiers.owed_bytes:
            return False
        waiting = [len(samples), done]
        outcomes = self._submit(samples, [waiting] * len(samples))
        left = sum(out is not True for out in outcomes)
        if left == len(samples):
            return False
        self._tiers.counters.add("range_reads")
        if left:
            self._range_told(waiting, left)
        return True

    def _range_told(self, waiting: list, n: int = 1) -> None:
        with self._lock:
            waiting[0] -= n
            last = waiting[0] == 0
        if last:
            waiting[1]()

    def _submit(self, samples: list[int], owners: list) -> list:
        """Jobs for ``samples``, each told to its owner (an item, or a range's waiting list); the
        engine's outcome of each (True: under way)."""
        keys, sizes = self._manifest.keys, self._manifest.sizes
        spans = self._spans_of([keys[i] for i in samples]) if self.spans else None
        with self._lock:
            first = self._token
            self._token += len(samples)
            now = time.perf_counter()
            for k, (i, owner) in enumerate(zip(samples, owners)):
                self._jobs[first + k] = (owner, now, i)
                self._by_sample.setdefault(i, [0, threading.Event()])[0] += 1
        jobs = [(first + k, keys[i], int(sizes[i])) + ((spans[k],) if spans is not None else ())
                for k, i in enumerate(samples)]
        go = [k for k, j in enumerate(jobs) if spans is None or spans[k] is not None]
        outcomes: list = [False] * len(jobs)
        try:
            for k, out in zip(go, self._engine.submit_many([jobs[k] for k in go])):
                outcomes[k] = out
        except Exception:   # none of them went
            pass
        for k, out in enumerate(outcomes):
            if out is not True:
                self._forget(first + k)
        return outcomes

    def _spans_of(self, keys: list[str]) -> list[Span | None]:
        """Each key's span, its file opened once for the route's life (None: it cannot be opened
        here; the Python threads read it, and word the error)."""
        try:
            where = self._source.spans(keys)
        except Exception:
            return [None] * len(keys)
        out: list[Span | None] = []
        with self._lock:
            for path, offset, file_size in where:
                fd = self._files.get(path)
                if fd is None and not self._closed:
                    try:
                        fd = self._files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        fd = None
                out.append(None if fd is None else Span(fd, offset, file_size))
        return out

    def _forget(self, token: int) -> tuple | None:
        with self._lock:
            got = self._jobs.pop(token, None)
            if got is None:
                return None
            sample = got[2]
            e = self._by_sample[sample]
            e[0] -= 1
            if e[0] == 0:
                del self._by_sample[sample]
                e[1].set()
            return got

    def wait(self, sample: int) -> None:
        """Wait until no native job of ``sample`` is under way (a planned hit of a sample the engine
        is staging right now: its entry is about to be there). Every job is told, done or given up
        at the close, so this ends; it must, before the caller takes the key's lock: the C threads'
        lock is the process's, and would not keep this process's Python threads out."""
        with self._lock:
            e = self._by_sample.get(sample)
        if e is not None:
            while not e[1].wait(0.5) and not self._closed:
                pass

    def _done(self, d: Done) -> None:
        got = self._forget(d.token)
        if got is None:
            return
        owner, t0, _ = got
        if isinstance(owner, list):   # a sample of a range read whole: placed, or read later on its own
            if d.loc is not None:
                self._tiers.counters.add("range_placed")
            try:
                self._range_told(owner)
            except BaseException as e:
                self._fatal(e)
                raise
            return
        item = owner
        if self._closed:
            return
        try:
            if d.loc is not None:
                self._tiers.counters.add("staged_local")
                self._deliver(item[0], item[1], Placement(LOCAL, d.loc, True), time.perf_counter() - t0)
            else:   # staged meanwhile by another process (the Python way finds it), or failed
                self._fallback(item)
        except BaseException as e:   # never lost in the collector's log: the batch would wait for ever
            self._fatal(e)
            raise

    def close(self) -> None:
        """Stop: jobs not started are given up (their places given back); the files the C threads
        read are closed once they are done; idempotent."""
        self._closed = True
        self._engine.close()
        with self._lock:
            files, self._files = list(self._files.values()), {}
        for fd in files:
            os.close(fd)
