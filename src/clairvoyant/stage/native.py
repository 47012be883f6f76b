"""MECHANISM: the Loader's misses staged on native threads (stage/native_files.py, ``cache/_stager.c``).

Of the staging work the plan gives a rank, one kind is the bulk of a first epoch: a miss the
local tier keeps, read from a local POSIX source straight into the tier. The Python staging
threads do it at about 250 us of CPU per file (open, read, checksum, write and publish, each a
step through the interpreter); the native engine the mount uses does it at about 60 us (a C
thread per file reads and writes the entry; one Python thread publishes a batch under one lock
of the index). ``NativeRoute`` hands those misses to that engine and tells the Loader's run of
each outcome as the Python threads would. The engine reserves within the tier's room less what
kept samples waiting in the RAM window are owed (they go down first), as the Python threads do.
Anything it cannot stage (no room, the source
changed, an unreadable file, a full device) goes back to the Python threads, which stage it or
raise the typed error naming the sample: errors are worded in one place.

Where it applies is decided by stage/engines.py, the one choice of engine for both front doors
(``applies``): the native engine is built, the source reads a key as the plain file ``root/key``
(``native_reads``: not a charged or remote store), misses to keep go straight to the local tier,
no node-wide deadline gate orders the ranks' work, and the tier does not compress what it keeps.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple

from .engines import native_applies
from .native_files import Done, NativeStager
from ..cache.tiers import LOCAL, Placement, Tiers
from ..tune.inflight import Counts
from ..manifest import Manifest

# deliver(batch, position in batch, placement, seconds); fallback(item): stage it in Python
Deliver = Callable[[int, int, Placement, float], None]
class Item(NamedTuple):
    """One sample of a batch to stage (what ``Stager.submit`` queues)."""

    batch: int
    pos: int       # its position in the batch
    sample: int    # its index in the manifest
    hit: bool      # the plan finds it in the local tier
    keep: bool     # the plan keeps it there after its access
    peer: int      # the node whose tier serves it (-1: none)
    whole: bool    # its range is read whole here


def applies(source, tiers: Tiers, gated: bool) -> bool:
    """Whether the Loader's kept misses from ``source`` go to the native engine: stage/engines.py
    decides, for a source whose keys are plain files (``native_reads``) whose kept misses go
    straight down and no node-wide deadline gate orders the ranks' work."""
    return native_applies(tiers.local, source.native_reads and tiers.direct and not gated)


class NativeRoute:
    """Kept misses of a local POSIX source, staged by native threads into ``tiers.local``."""

    def __init__(self, tiers: Tiers, manifest: Manifest, root: str, threads: int, deliver: Deliver,
                 fallback: Callable[[Item], None], fatal: Callable[[BaseException], None], *,
                 most: int | None = None,
                 span: Callable[[str, int], tuple[str, int, int] | None] | None = None) -> None:
        self._tiers, self._manifest = tiers, manifest
        self._deliver, self._fallback, self._fatal = deliver, fallback, fatal
        self._lock = threading.Lock()
        self._jobs: dict[int, tuple[Item, float]] = {}   # token -> (item, when submitted)
        self._by_sample: dict[int, int] = {}   # sample -> its jobs under way
        self._none_left = threading.Condition(self._lock)   # a sample's last job ended (``wait``)
        self._token = 0
        self._closed = False
        # the room left beside kept samples waiting in the RAM window for it (they go first: the
        # Python threads reserve around them the same way, Tiers.stage)
        room = lambda: tiers.local_capacity - tiers.owed_bytes   # noqa: E731
        self._engine = NativeStager(tiers.local, room, root, None, threads, self._done, most=most, span=span)

    def submit(self, items: list[Item]) -> list[Item]:
        """Stage ``items`` (each a kept miss); returns those the engine did not take (no room: the
        Python threads place them, in the RAM window if need be)."""
        if not items:
            return []
        keys, sizes = self._manifest.keys, self._manifest.sizes
        with self._lock:
            first = self._token
            self._token += len(items)
            now = time.perf_counter()
            for k, it in enumerate(items):
                self._jobs[first + k] = (it, now)
                self._by_sample[it.sample] = self._by_sample.get(it.sample, 0) + 1
        jobs = [(first + k, keys[it.sample], int(sizes[it.sample])) for k, it in enumerate(items)]
        try:
            outcomes = self._engine.submit_many(jobs)
        except Exception:   # none of them went
            outcomes = [False] * len(items)
        back = []
        for (token, _, _), it, out in zip(jobs, items, outcomes):
            if out is not True:
                self._forget(token)
                back.append(it)
        return back

    def _forget(self, token: int) -> Item | None:
        with self._lock:
            got = self._jobs.pop(token, None)
            if got is not None:
                s = got[0].sample
                self._by_sample[s] -= 1
                if not self._by_sample[s]:
                    del self._by_sample[s]
                    self._none_left.notify_all()
            return got

    def wait(self, sample: int) -> None:
        """Wait until no native job of ``sample`` is under way (a planned hit of a sample the engine
        is staging right now: its entry is about to be there). Every job is told, done or given up
        at the close, so this ends; it must, before the caller takes the key's lock: the C threads'
        lock is the process's, and would not keep this process's Python threads out."""
        with self._lock:
            while sample in self._by_sample and not self._closed:
                self._none_left.wait(0.5)

    def _done(self, d: Done) -> None:
        got = self._forget(d.token)
        if got is None:
            return
        item, t0 = got
        if self._closed:
            return
        try:
            if d.loc is not None:
                self._tiers.counters.add("staged_local")
                self._deliver(item.batch, item.pos, Placement(LOCAL, d.loc, True), time.perf_counter() - t0)
            else:   # staged meanwhile by another process (the Python way finds it), or failed
                self._fallback(item)
        except BaseException as e:   # never lost in the collector's log: the batch would wait for ever
            self._fatal(e)
            raise

    def limit(self, n: int) -> None:
        self._engine.limit(n)

    def load(self) -> Counts:
        """The engine's files done, the seconds they took, files waiting now."""
        return self._engine.load()

    def close(self) -> None:
        """Stop: jobs not started are given up (their places given back); idempotent."""
        self._closed = True
        self._engine.close()
