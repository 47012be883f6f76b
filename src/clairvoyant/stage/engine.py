"""The staging engine: I/O threads that carry out the residency plan ahead of the readers.

Three kinds of work, taken in this order of priority (two C-level FIFO queues:
after-use and eviction work in one, checked before each staging item and woken
by a token in the other; staging in need order in the other):

1. after an access (its batch has been read by a worker): move a kept sample
   from the RAM window to the local tier, delete what is not kept; this frees
   room, so it goes first;
2. evictions the plan makes when an epoch starts;
3. staging, in the order the training loop will need the samples (the batch
   index is the deadline): a planned hit is checked in the local tier, a miss
   is read from the source once, into room reserved for it first (cache/tiers.py);
   where neither tier has room it is not read here, and its reader reads it.
   Where the plan reads the sample's range whole (plan/ranges.py), every sample
   of the range absent from the local tier is placed there from one read.

Reads from the source release the GIL, so threads, not processes, do this.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from typing import Callable

from ..cache.tiers import LOCAL, Placement, Tiers
from ..errors import ClairvoyantError, SampleReadError, SourceChanged
from ..manifest import Manifest
from ..plan.ranges import Ranges
from ..source import Source
from ..tune.inflight import Counts
from . import native
from .native import Item, NativeRoute

# on_done(batch, position in batch, Placement or the exception that stopped the staging, seconds
# the staging took, of which seconds spent asking a peer node)
OnDone = Callable[[int, int, "Placement | BaseException", float, float], None]
# peer_fetch(node, sample index, size): the sample's verified bytes from that node's tier, or None
PeerFetch = Callable[[int, int, int], "bytes | None"]


class RangeReader:
    """The ranges of a source (plan/ranges.py) as the stager reads them: the samples of each, and
    ``read(range, manifest indices)`` giving their bytes from one request and the source's
    modification time."""

    def __init__(self, ranges: Ranges, read: Callable[[list[str]], tuple[list[bytes], int]]) -> None:
        self.ranges, self.of = ranges, ranges.of
        self._order, self._cuts = ranges.members()
        self.read = read   # read(keys of samples of one range): their bytes, one request

    def members(self, r: int) -> list[int]:
        return self._order[self._cuts[r]:self._cuts[r + 1]].tolist()
_AFTER, _DROP = "after", "drop"
log = logging.getLogger("clairvoyant")
# threads that read ranges whole, apart from the staging threads: a whole read (a shard's
# megabytes) in a staging thread held up the samples queued behind it, and the first batch of a
# cold epoch on shards waited 0.33 s for 4 rounds of them (docs/benchmarks.md, issue 22)
RANGE_THREADS = 4
_WAKE = ("wake",)


class Stager:
    """Stages samples in need order with a number of threads that ``limit`` may change (up to
    ``most`` native threads; the starting number where None)."""

    def __init__(self, source: Source, tiers: Tiers, manifest: Manifest, *, threads: int,
                 on_done: OnDone, peer_wait: float = 0.0,
                 gate: Callable[[int, Callable[[], bool]], None] | None = None,
                 peer_fetch: PeerFetch | None = None, ranges: RangeReader | None = None,
                 due: Callable[[int], bool] | None = None, most: int | None = None) -> None:
        self._source, self._tiers, self._manifest = source, tiers, manifest
        self._on_done = on_done
        self._peer_wait = peer_wait   # how long a planned hit waits for another rank to keep it
        self._gate = gate             # gate(batch, stopped): waits while other ranks of the node are behind
        self._peer_fetch = peer_fetch  # the cluster cache: samples another node's tier serves
        self._ranges = ranges          # the source's ranges, where the plan reads some whole
        self._due = due or (lambda batch: True)   # due(batch): its readers are about to need it
        self._reading: dict[int, threading.Event] = {}   # range -> set once its whole read is done
        self._queue: queue.SimpleQueue = queue.SimpleQueue()     # staging, in need order
        self._urgent: queue.SimpleQueue = queue.SimpleQueue()    # after-use work and evictions
        self._stop = False
        self.fatal: BaseException | None = None  # an error that stopped a staging thread itself
        self._read = source.read_versioned
        # staging threads start as work waits for them (up to ``_target``): where the native threads
        # take every file, a few do the after-use work and the rest never start (each costs ~80 us
        # to start and to join on 2 cores, 64 of them 10 ms of a pass's start and end)
        self._threads: list[threading.Thread] = []   # every one started
        self._size_lock = threading.Lock()
        self._running = 0    # started and not retired
        self._idle = 0       # waiting on the staging queue (under ``_waiting_lock``)
        # planned misses and peer reads waiting in the queue: the requests waiting for a thread
        # (planned hits, which the queue also holds, ask nothing of the store)
        self._waiting, self._waiting_lock = 0, threading.Lock()
        # kept misses of a local POSIX source go to native threads where that applies (stage/native.py)
        self._native = (NativeRoute(tiers, manifest, source.root or "/", threads, self._deliver, self._put,
                                    self._failed, most=most, span=source.native_span)
                        if native.applies(source, tiers, gate is not None) else None)
        self._wholes: queue.SimpleQueue = queue.SimpleQueue()   # (sample, its own staging went well)
        # planned hits parked while their range is read whole, until it is or they are due (_park):
        # a heap of (batch, n, entry) and each range's entries; an entry is [item, taken]
        self._park_lock = threading.Lock()
        self._parked: list = []
        self._parked_of: dict[int, list[list]] = {}
        self._park_n = 0
        self._resumed: queue.SimpleQueue = queue.SimpleQueue()   # parked items to stage now, first
        self._range_threads = ([threading.Thread(target=self._run_wholes, name=f"clairvoyant-range-{i}",
                                                 daemon=True) for i in range(RANGE_THREADS)]
                               if ranges is not None else [])
        self._target = threads    # threads wanted (the tuner moves it); those above it retire
        self._started = False

    def start(self) -> None:
        with self._size_lock:
            self._started = True
            if self._target > 0:
                self._spawn_locked()   # one at once: the after-use work always has a thread
        for t in self._range_threads:
            t.start()

    def _spawn_locked(self) -> None:
        t = threading.Thread(target=self._run, name=f"clairvoyant-stager-{len(self._threads)}", daemon=True)
        self._threads.append(t)
        self._running += 1
        t.start()

    def _more(self) -> None:
        """More staging threads where more work waits than idle threads will take, up to the number
        wanted (``_target``; those above it retire after the item in hand: ``_retire``)."""
        if not self._started or self._queue.qsize() <= self._idle:
            return
        with self._size_lock:
            waiting = self._queue.qsize() - self._idle
            while not self._stop and waiting > 0 and self._running < self._target:
                self._spawn_locked()
                waiting -= 1

    def limit(self, n: int) -> None:
        """At most ``n`` requests in flight from now on (tune/inflight.py decides): up to ``n``
        staging threads, and ``n`` files carried at once by the native threads."""
        with self._size_lock:
            self._target = n
        self._more()
        if self._native is not None:
            self._native.limit(n)

    def load(self) -> Counts:
        """Requests done, the seconds they took and their bytes (cumulative), and the requests
        waiting now, of the staging threads and the native threads together (tune/inflight.py)."""
        done, busy, nbytes = self._tiers.counters.get("fetches", "fetch_seconds", "fetch_bytes")
        mine = Counts(int(done), float(busy), self._waiting, int(nbytes))
        if self._native is None:
            return mine
        n = self._native.load()
        return Counts(mine.done + n.done, mine.busy_s + n.busy_s, mine.waiting + n.waiting, mine.nbytes)

    def submit(self, batch_id: int, indices, hit, keep, peer=None, whole=None) -> None:
        """Stage a batch: per sample, hit (in the local tier), keep (there after its access), the
        node whose tier serves it (-1: none; ``peer`` None: no cluster cache) and whether its range
        is read whole here (``whole`` None: none is)."""
        items = [Item(batch_id, j, int(idx), bool(hit[j]), bool(keep[j]), -1 if peer is None else int(peer[j]),
                      whole is not None and bool(whole[j])) for j, idx in enumerate(indices)]
        for it in items:
            if it.whole and self._ranges is not None:   # its range's samples wait for this read, not their own
                self._reading.setdefault(int(self._ranges.of[it.sample]), threading.Event())
        if self._native is not None:   # kept misses from a local POSIX source: to the native threads
            native = [it.keep and not (it.hit or it.whole) and it.peer < 0 for it in items]
            back = {id(it) for it in self._native.submit([it for it, n in zip(items, native) if n])}   # not taken
            items = [it for it, n in zip(items, native) if not n or id(it) in back]
        for it in items:
            self._put(it)

    def _put(self, it: Item) -> None:
        if not it.hit:
            with self._waiting_lock:
                self._waiting += 1
        self._enqueue(it)

    def _enqueue(self, item) -> None:
        """Queue staging work (an item, or ``_WAKE`` for after-use work) and start a thread for it
        where none is idle."""
        self._queue.put(item)
        self._more()

    def _deliver(self, batch_id: int, j: int, placed: Placement, seconds: float) -> None:
        if not self._stop:
            self._on_done(batch_id, j, placed, seconds, 0.0)

    def _failed(self, e: BaseException) -> None:
        """An error that stopped the delivery of a native job's outcome: as a staging thread's own
        (the consumer raises it rather than wait for ever)."""
        if self.fatal is None:
            self.fatal = e

    def after_use(self, items: list[tuple[str, Placement, bool, bool]]) -> None:
        """``(key, placement, keep, corrupt)`` of samples whose access is done."""
        self._urgent.put((_AFTER, items))   # one batch's worth: one task, one ledger update per tier
        self._enqueue(_WAKE)   # a thread idle on the staging queue takes them

    def drop(self, keys) -> None:
        for key in keys:
            self._urgent.put((_DROP, key))
        self._enqueue(_WAKE)

    def close(self, timeout: float = 10.0) -> None:
        """Finish the after-use work queued so far, then stop; each thread ends the sample in hand."""
        with self._size_lock:
            self._stop = True
        if self._native is not None:
            self._native.close()
        for ev in list(self._reading.values()):   # whole reads dropped unstarted: nobody waits on them
            ev.set()
        for _ in self._threads:
            self._queue.put(None)
        for _ in self._range_threads:
            self._wholes.put(None)
        for t in self._threads + self._range_threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # never die silently: the consumer would wait for ever
            self.fatal = e

    def _urgent_work(self) -> None:
        tiers, urgent = self._tiers, self._urgent
        while True:
            try:
                kind, item = urgent.get_nowait()
            except queue.Empty:
                return
            if kind == _AFTER:
                tiers.after_use_many(item)
            else:
                tiers.drop(item)

    def _retire(self) -> bool:
        """Whether this thread goes now: more run than the tuner wants."""
        if self._running <= self._target:
            return False
        with self._size_lock:
            if self._running > self._target:
                self._running -= 1
                return True
        return False

    def _loop(self) -> None:
        while True:
            try:
                item = self._resumed.get_nowait()   # before what is queued: they are needed sooner
            except queue.Empty:
                with self._waiting_lock:
                    self._idle += 1
                try:
                    item = self._queue.get()
                finally:
                    with self._waiting_lock:
                        self._idle -= 1
                self._urgent_work()
                if item is _WAKE:
                    try:
                        item = self._resumed.get_nowait()
                    except queue.Empty:
                        pass
            if item is None:
                return
            if item is _WAKE or self._stop:
                if self._retire():
                    return
                continue   # staging work is dropped on close; after-use work above is finished
            batch_id, j, idx, hit, keep, peer, whole = item
            if not hit:
                with self._waiting_lock:
                    self._waiting -= 1
            if hit and peer < 0 and self._park(item):
                continue
            if self._gate is not None:
                self._gate(batch_id, lambda: self._stop)
            t0, asked = time.perf_counter(), [0.0]
            try:
                outcome: Placement | BaseException = (self._stage(idx, hit, keep, batch_id) if peer < 0
                                                       else self._from_peer(idx, peer, asked))
            except ClairvoyantError as e:  # delivered to the consumer, which raises it in the loop
                outcome = e
            except Exception as e:  # a source's own error: name the sample
                key = self._manifest.keys[idx]
                outcome = SampleReadError(f"cannot stage sample {key!r} from {self._source!r}: "
                                          f"{type(e).__name__}: {e}")
                outcome.__cause__ = e
            if not self._stop:
                self._on_done(batch_id, j, outcome, time.perf_counter() - t0, asked[0])
            if whole:   # the sample went on its own, not to wait for its range: now the rest of the range
                self._wholes.put((idx, isinstance(outcome, Placement)))
            if self._retire():   # the tuner asked for fewer threads: this one goes, its item done
                return

    def _park(self, item: Item) -> bool:
        """Set aside a planned hit whose range is being read whole and whose readers do not need it
        yet: no staging thread waits for it. It comes back (to ``_resumed``) when its range's read
        is done (it is then found in the tier) or when it falls due (``advance``: it is then read
        on its own), whichever is first. False: not parked, stage it now."""
        batch, idx = item.batch, item.sample
        if not self._reading or self._due(batch):
            return False
        r = int(self._ranges.of[idx])
        reading = self._reading.get(r)
        if reading is None or reading.is_set():
            return False
        with self._park_lock:
            if reading.is_set():   # (set before its entries are taken, under this lock)
                return False
            entry = [item, False]
            self._parked_of.setdefault(r, []).append(entry)
            self._park_n += 1
            heapq.heappush(self._parked, (batch, self._park_n, entry))
        return True

    def _unpark(self, entries: list[list]) -> None:
        """Stage parked entries now (under ``_park_lock``; each is taken once)."""
        for entry in entries:
            if not entry[1]:
                entry[1] = True
                self._resumed.put(entry[0])
                self._enqueue(_WAKE)   # a thread idle on the staging queue takes it

    def advance(self) -> None:
        """The readers have moved on: parked samples that are due now are staged on their own."""
        if not self._parked:
            return
        with self._park_lock:
            due = []
            while self._parked and self._due(self._parked[0][0]):
                due.append(heapq.heappop(self._parked)[2])
            self._unpark(due)

    def _run_wholes(self) -> None:
        """A range thread: whole reads, in the order their first samples were staged."""
        try:
            while True:
                got = self._wholes.get()
                if got is None:
                    return
                self._whole(*got)
        except BaseException as e:  # never die silently: samples would wait on their range
            self.fatal = e

    def _whole(self, idx: int, ok: bool = True) -> None:
        """Read ``idx``'s range whole and place its absent samples in the local tier (after idx itself
        was staged on its own, so that its batch never waits for the whole range; ``ok`` False: it
        failed, and the range is not read either). An error is logged: each sample of the range
        not placed is read on its own when its turn comes, and names itself if it fails then."""
        ranges = self._ranges
        r = int(ranges.of[idx]) if ranges is not None else -1
        try:
            if ranges is None or not ok or self._stop:
                return
            members = ranges.members(r)
            keys = [self._manifest.keys[i] for i in members]
            sizes = [int(self._manifest.sizes[i]) for i in members]
            def read(pos: list[int]) -> tuple[list[bytes], int]:
                datas, mtime_ns = ranges.read([keys[k] for k in pos])
                for k, data in zip(pos, datas):
                    _check_size(keys[k], len(data), sizes[k])
                return datas, mtime_ns
            self._tiers.stage_range(keys, sizes, read)
        except Exception as e:
            log.warning("clairvoyant: reading range %d (sample %r's) whole failed (%s: %s); its samples are read "
                        "one by one", r, self._manifest.keys[idx], type(e).__name__, e)
        finally:
            done = self._reading.pop(r, None)
            if done is not None:
                done.set()
            with self._park_lock:   # its parked samples are in the tier now (or read on their own)
                self._unpark(self._parked_of.pop(r, []))

    def _stage(self, idx: int, hit: bool, keep: bool, batch: int = -1) -> Placement:
        key, size = self._manifest.keys[idx], int(self._manifest.sizes[idx])
        tiers = self._tiers
        if hit:
            reading = self._reading.get(int(self._ranges.of[idx])) if self._reading else None
            if reading is not None and not reading.is_set() and tiers.find_local(key, size) is None:
                # its range's whole read is still under way (or not begun) and its readers need it
                # now (a sample not yet due was parked instead: _park): staged on its own, and the
                # range's read leaves it as it finds it
                tiers.counters.add("range_early")
                return self._stage(idx, False, keep)
            path = tiers.find_local(key, size, self._peer_wait)
            if path is None and self._native is not None:   # the native threads may be staging it now
                self._native.wait(idx)
                path = tiers.find_local(key, size)
            if path is not None:
                tiers.counters.add("local_hits")
                return Placement(LOCAL, path, False)
        fetch = lambda: self._fetch(key, size)   # noqa: E731
        if not (hit or keep):
            return tiers.stage(key, size, False, fetch)
        # the local tier is involved: hold the node-wide lock of the sample, so that of all the
        # processes of the node one reads it from the source and the others find it (a planned hit
        # being placed right now, by a read of its whole range, is found once its lock is free)
        locked = False
        for _ in range(2):
            locked = not tiers.claim(key, size)
            if locked:
                break
            path = tiers.find_local(key, size)   # there; unless stale (then removed: claim again)
            if path is not None:
                tiers.counters.add("local_hits")
                return Placement(LOCAL, path, False)
        if hit:
            tiers.counters.add("missed_hits")   # planned, but not there: fetch it
        try:
            return tiers.stage(key, size, keep, fetch)
        finally:
            if locked:
                tiers.release(key)

    def _from_peer(self, idx: int, node: int, asked: list[float]) -> Placement:
        """A sample another node's tier holds: its bytes into the RAM window, from that node; from
        the source if the peer misses, is late or is gone (never kept: its home node keeps it).
        ``asked[0]``: the seconds spent on the peer."""
        key, size = self._manifest.keys[idx], int(self._manifest.sizes[idx])
        tiers = self._tiers
        served: list[int] = []

        def fetch() -> tuple[bytes, int]:
            t0 = time.perf_counter()
            data = self._peer_fetch(node, idx, size) if self._peer_fetch is not None else None
            asked[0] += time.perf_counter() - t0
            if data is not None:
                served.append(node)
                tiers.counters.add("peer_hits")
                return data, 0
            tiers.counters.add("peer_misses")
            return self._fetch(key, size)
        placed = tiers.stage(key, size, False, fetch)
        return placed._replace(peer=node) if served else placed

    def _fetch(self, key: str, size: int) -> tuple[bytes, int]:
        t0 = time.perf_counter()
        data, mtime = self._read(key)
        self._tiers.counters.add_many(fetches=1, fetch_seconds=time.perf_counter() - t0, fetch_bytes=len(data))
        _check_size(key, len(data), size)
        return data, mtime


def _check_size(key: str, n: int, size: int) -> None:
    if n != size:
        raise SourceChanged(
            f"sample {key!r} is {n} bytes on the source but {size} in the manifest: the source "
            "changed since it was indexed; run `clairvoyant index --force` on it, or pass reindex=True")
