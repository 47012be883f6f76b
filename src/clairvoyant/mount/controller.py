"""The mount process's staging: ahead in the order samplers publish, else what programs open.

With samplers (``clairvoyant.torch``, ``mount=``): the ranks' published orders of the newest epoch
are merged into the node's sequence as the Loader merges its ranks' batches (step by step, ranks
in order); the Loader's plan of that sequence (plan/ahead.py ``to_stage``) says which misses are
kept, and only those are staged, in order, ahead of the ranks' reported progress; a miss the plan
does not keep is read by its reader from the source, and one a reader read before its copy was
made is kept from the daemon's handoff if the plan keeps it. When the tier is full, the resident
whose next use in the sequence is farthest (never again counts as farthest) is evicted, but only
if that use comes after the file to stage; otherwise staging waits for the ranks to move on. A
use counts as past when the daemon reports the read (or long after its hand-out, for a read the
page cache served). The tier's ledger stays the hard bound: a file that does not fit is simply
not staged (its reader reads the source).

Without a sampler: each file a program opens from the source is staged after that open if the
tier has room (read-through caching in first-open order, no eviction): a second pass over a data
set that fits reads nothing from the source; one that does not fit keeps the first files opened.
And where the opens follow the listing's order (tar, md5sum, a sequential DataLoader over a sorted
folder) or repeat an earlier pass's order, the files that come next in that order are staged ahead
of the opens; in a full tier the files opened last give way (plan/readahead.py decides which).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
from collections import deque
from typing import Callable, NamedTuple

import numpy as np

from ..cache.entry import entry_size
from ..cache.node import residents
from ..cache.native_stage import Done
from ..cache.thread_stage import file_stager
from ..plan.ahead import EVICT, SKIP, WAIT, StagedAhead, next_step, to_stage, wanted
from ..plan.readahead import Readahead
from ..plan.sequence import interleave
from .listing import publish_bytes
from .orders import PROGRESS_EVERY, published, read_order, read_progress

log = logging.getLogger("clairvoyant")
WATCH_EVERY = 0.01   # seconds between looks at the orders directory's mtime
EVENTS_GATHER = 0.002   # seconds the events thread lets reports gather before it reads them
EVENT_LOCAL = 1 << 63   # in the daemon's report of a first read: served from the tier (mountfs.c)
BACKLOG = 4096   # files read from the source waiting for a staging slot, at most
CHUNK = 32   # files of the plan handed to the stager in one call, at most
MIN_LAG = 2 * PROGRESS_EVERY   # positions handed out before a use unseen by the daemon counts as past


class _Numbered(NamedTuple):
    """A published order's files as numbers: ``files`` in order, ``counts`` per index (as many as
    the manifest knows), for this epoch and the next (``next_*``)."""

    files: np.ndarray
    counts: np.ndarray
    next_files: np.ndarray
    next_counts: np.ndarray


def _plan_key(cur: dict) -> tuple:
    """What identifies a set of published orders: each rank's epoch and publication stamp."""
    return tuple(sorted((r, o.epoch, o.stamp) for r, o in cur.items()))


class Controller:
    def __init__(self, mount, threads: int = 16, poll: float = 0.1) -> None:
        self.m, self.tiers, self.source = mount, mount.tiers, mount.source
        self.manifest = mount.manifest
        self.sizes = np.asarray(self.manifest.sizes, dtype=np.int64)
        self._index: dict[str, int] | None = None
        self._stop = threading.Event()
        self._poll = poll
        # native threads copy the files where they are built, else Python's: one interface, chosen in
        # one place (cache/thread_stage.py)
        self._slots_back = 0   # slots of copies told done in the collector's current batch
        self._files = file_stager(self.tiers.local, self.tiers.local_capacity, mount.source.root,
                                  self._handoff_dir(), threads, self._copied, self._copies_told)
        self._inflight = threading.Semaphore(2 * max(1, int(threads)))
        self._lock = threading.Lock()
        self.stats = {"plans": 0, "epoch": -1, "ranks": 0, "sequence": 0, "following": 0, "frontier": 0,
                      "consumed": 0,
                      "staged": 0, "staged_bytes": 0, "present": 0, "evicted": 0, "read_through": 0,
                      "not_staged": 0, "failed": 0, "handed_over": 0, "read_ahead": 0, "ahead_no_room": 0,
                      "kept_reads": 0, "evicted_unread": 0}
        # read-ahead asks for at most half the files the tier holds at once: what a full tier gives
        # way to is what was read last, never what read-ahead still waits for
        fit = self.tiers.local_capacity // max(1, entry_size(int(self.sizes.mean())) if len(self.sizes) else 1)
        half = int(max(1, fit // 2))
        self._readahead = Readahead(len(self.manifest), max_window=min(64, half),
                                    max_outstanding=min(1024, half), busy=min(16, max(1, fit // 4)))
        self._sampler = threading.Event()   # a sampler published an order: no guessing from the opens
        self._giving_way = threading.Lock()   # held while read-ahead evicts; a plan starts after that
        self._plan_key: tuple | None = None
        self._dir_seen, self._dir_looked = None, 0.0
        # order file -> ((inode, mtime, size), its parsed order, its files as numbers (_numbered))
        self._parsed: dict[str, tuple] = {}
        # with a sampler: the daemon's first reads (file, from the source?) for the plan's thread,
        # the files staged ahead and not read yet, and how far the readers trail the handed-out position
        self._reads: deque[tuple[int, bool]] = deque()
        self._unread: set[int] = set()
        self._lag = MIN_LAG
        self._last_stats = 0.0
        self._threads = [threading.Thread(target=self._watch, name="clairvoyant-mount-orders", daemon=True),
                         threading.Thread(target=self._events, name="clairvoyant-mount-events", daemon=True)]
        for t in self._threads:
            t.start()

    # -- shared ----------------------------------------------------------------------------------

    def _add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.stats)

    def _key_index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {self.manifest.keys[i]: i for i in range(len(self.manifest))}
        return self._index

    def _handoff_dir(self) -> str | None:
        """Where the daemon hands over what it read from the source (None: staging takes nothing
        from there, as the tests' control does)."""
        return self.m.handoff

    def _discard(self, i: int) -> None:
        """A handed-over file this process did not cache (present already, or no room): let it go."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.m.handoff, str(i)))

    def _take_slot(self, wait: bool) -> bool:
        """One of the staging slots (in-flight copies); without ``wait``, only if one is free now."""
        if not wait:
            return self._inflight.acquire(blocking=False)
        while not self._inflight.acquire(timeout=self._poll):
            if self._stop.is_set():
                return False
        return True

    def _submit(self, i: int, wait: bool = True, slot: bool = False) -> bool:
        """Stage file ``i`` (True: handed to the stager); without ``wait``, only if a slot is free;
        ``slot``: the caller took one already."""
        if not (slot or self._take_slot(wait)):
            return False
        self._submit_files([i])
        return True

    def _in_flight(self, i: int | None = None) -> bool:
        """Whether a copy of file ``i`` (None: of any file) by this process is under way."""
        return self._files.in_flight(i)

    def _settle(self, late: list[int], held: StagedAhead, gathered: set[int] = frozenset()) -> list[int]:
        """Evict what was chosen for eviction while its copy was on the way, now that it is there;
        the files whose copy is still on the way (looked at before the eviction: a copy that lands
        in between is evicted, never forgotten). A file staged again meanwhile (or gathered to be)
        stays."""
        keep = []
        for v in late:
            if v in held or v in gathered:
                continue
            flying = self._in_flight(v)
            if not self._evict(v) and flying:
                keep.append(v)
        return keep

    def _submit_files(self, files: list[int]) -> None:
        """Stage ``files``, a slot taken for each, with one call into the stager; a file
        already in the tier, or with no room for it, gives its slot back at once."""
        items = []
        for i in files:
            key, size = self.manifest.keys[i], int(self.sizes[i])
            try:
                if self.tiers.find_local(key, size) is None:
                    items.append((i, key, size))
                    continue
                self._add("present")
            except Exception as e:
                self._failed(key, e)
            self._discard(i)
            self._inflight.release()
        if not items:
            return
        try:
            got = self._files.submit_many(items)
        except Exception as e:
            for i, key, _ in items:
                self._failed(key, e)
                self._discard(i)
            self._inflight.release(len(items))
            return
        back = 0
        for (i, key, _), g in zip(items, got):
            if g is True:
                continue   # _copied hears of it
            back += 1
            if isinstance(g, Exception):
                self._failed(key, g)
                self._discard(i)
            elif g is False:
                self._add("not_staged")
                self._discard(i)
            # None: its copy is under way; a handoff is that copy's to take
        if back:
            self._inflight.release(back)

    def _failed(self, key: str, e: object) -> None:
        self._add("failed")
        log.warning("clairvoyant mount: staging %s failed: %s", key, e)

    def _copied(self, d: Done) -> None:
        try:
            if d.loc is not None:
                with self._lock:
                    st = self.stats
                    st["staged"] += 1
                    st["staged_bytes"] += int(self.sizes[d.token])
                    st["handed_over"] += bool(d.handed_over)
            elif d.present:   # another process of the node staged it meanwhile
                self._add("present")
            elif not self._stop.is_set():   # at the stop, files not started are simply not staged
                self._failed(d.key, d.error)
        finally:
            if d.loc is None:   # the C thread removes a handoff it read; one it never got to goes here
                self._discard(d.token)
            with self._lock:   # (the Python engine tells from several threads)
                self._slots_back += 1   # given back with the batch's others: one wake of the plan's thread

    def _copies_told(self) -> None:
        with self._lock:
            n, self._slots_back = self._slots_back, 0
        if n:
            self._inflight.release(n)

    def _used(self) -> int:
        """Bytes in the local tier, counting those on their way there (reserved when submitted)."""
        return self.tiers.local.ledger.read()[0]

    def _maybe_publish_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats > 0.5:
            self._last_stats = now
            self._publish_stats()

    def _publish_stats(self) -> None:
        try:
            publish_bytes(self.m.info["staging"], json.dumps(self.snapshot()).encode())
        except OSError:
            pass

    # -- without a sampler: read-through in first-open order --------------------------------------

    def _events(self) -> None:
        """Hear of first reads; stage what came from the source (read-through) and read ahead.
        Never waits for the stager: a file read from the source while every staging slot is taken
        waits in a backlog (its handoff beside it) and is taken up as slots free."""
        fd = self.m.events_fd
        buf = b""
        backlog: deque[int] = deque()
        while not self._stop.is_set():
            while backlog and self._submit(backlog[0], wait=False):
                backlog.popleft()
                self._add("read_through")
            r, _, _ = select.select([fd], [], [], WATCH_EVERY if backlog else self._poll)
            if not r:
                continue
            time.sleep(EVENTS_GATHER)   # let the events of a few opens gather: one wake-up for them
            try:
                chunk = os.read(fd, 8 * 512)
            except OSError:
                return
            if not chunk:
                return   # the daemon is gone
            buf += chunk
            n = len(buf) // 8
            events = np.frombuffer(buf[:8 * n], dtype="<u8").tolist()
            buf = buf[8 * n:]
            for ev in events:
                f = ev & ~EVENT_LOCAL
                if f >= len(self.manifest):
                    continue
                if self._sampler.is_set():   # the plan's thread decides what a read changes
                    if len(self._reads) < BACKLOG:
                        self._reads.append((f, not ev & EVENT_LOCAL))
                    elif not ev & EVENT_LOCAL:   # far behind: let this one go
                        self._discard(f)
                        self._add("not_staged")
                    continue
                # without a sampler: what was read from the source is cached from its handoff
                if not ev & EVENT_LOCAL:
                    if not backlog and self._submit(f, wait=False):
                        self._add("read_through")
                    elif len(backlog) < BACKLOG:
                        backlog.append(f)
                    else:   # far behind: let this one go rather than keep its handoff beside the tier
                        self._discard(f)
                        self._add("not_staged")
                if not self._sampler.is_set():   # no sampler's order: guess the next files from the opens
                    self._read_ahead(f)

    def _read_ahead(self, f: int) -> None:
        ahead = self._readahead.opened(f)
        if not ahead:
            return
        room, n = self.tiers.local_capacity - self._used(), 0
        for g in ahead:
            if self._sampler.is_set():
                break
            if not self._take_slot(wait=False):   # never hold the events up: later opens ask again
                break
            need = entry_size(int(self.sizes[g]))
            if room < need:   # a slot is there: only now does anything give way
                room += self._give_way(need - room)
                if room < need:
                    self._inflight.release()
                    self._add("ahead_no_room")
                    break
            self._submit(g, slot=True)
            room -= need
            n += 1
        if n < len(ahead):
            self._readahead.not_staged(ahead[n:])   # asked again at a later open
        self._add("read_ahead", n)

    def _give_way(self, nbytes: int) -> int:
        """Evict files opened last (plan/readahead.py) until ``nbytes`` are free; the bytes freed."""
        freed = tries = 0
        with self._giving_way:   # a sampler's plan, once started, sees the tier as no eviction leaves it
            for v in self._readahead.give_way():
                if freed >= nbytes or tries >= 256 or self._sampler.is_set():
                    break
                tries += 1
                freed += self._evict(v)
        return freed

    # -- with samplers: ahead in the node's merged order -----------------------------------------

    def _current(self):
        """The newest epoch's published orders (rank -> PublishedOrder), or None."""
        orders = {}
        for rank, path in published(self.m.orders_dir).items():
            try:
                st = os.stat(path)
                ident = (st.st_ino, st.st_mtime_ns, st.st_size)   # replaced by rename: a new inode
                cached = self._parsed.get(path)
                if cached is None or cached[0] != ident:   # parse a published order once, not every look
                    order = read_order(path)
                    cached = self._parsed[path] = (ident, order, self._numbered(order))
                orders[rank] = cached[1]
            except Exception:
                continue   # being replaced, or foreign: the next look sees it whole
        if not orders:
            return None
        epoch = max(o.epoch for o in orders.values())
        return {r: o for r, o in orders.items() if o.epoch == epoch}

    def _changed(self) -> bool:
        """Whether the orders directory may hold something new: its mtime moved (a rename into it),
        or ``poll`` seconds passed (an mtime is as coarse as the kernel's tick: a rename within the
        tick of the last look is seen at the latest then)."""
        now = time.monotonic()
        try:
            st = os.stat(self.m.orders_dir)
            ident = (st.st_ino, st.st_mtime_ns)
        except OSError:
            ident = None
        if ident != self._dir_seen or now - self._dir_looked >= self._poll:
            self._dir_seen, self._dir_looked = ident, now
            return True
        return False

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY):   # a new epoch's order is seen within 10 ms
            self._maybe_publish_stats()
            if not self._changed():
                continue
            try:
                cur = self._current()
                if cur is None:
                    continue
                key = _plan_key(cur)
                if key == self._plan_key:
                    continue
                self._plan_key = key
                self._run_plan(cur, key)
            except Exception as e:   # never take the mount down: staging is an optimisation
                log.warning("clairvoyant mount: staging ahead stopped: %s", e)
        self._publish_stats()

    def _run_plan(self, cur: dict, key: tuple) -> None:
        if not self._sampler.is_set():
            with self._giving_way:   # no read-ahead eviction under way from here on
                self._sampler.set()   # a sampler says what comes next: no more guessing from the opens
            deadline = time.monotonic() + 2.0   # read-ahead's copies land before the tier is looked at
            while self._readahead.staged and self._in_flight() and time.monotonic() < deadline:
                self._stop.wait(WATCH_EVERY)
        ranks = sorted(cur)
        epoch = cur[ranks[0]].epoch
        nums = [self._numbers_of(cur[r]) for r in ranks]
        merged = interleave([n.files for n in nums], [n.counts for n in nums])   # like the Loader's
        seq, per_step = merged.samples, merged.step_ends.tolist()
        # the next epoch's order, where every rank sent one: its uses count as next uses, and once
        # this epoch is staged, staging goes on into it (within the capacity)
        after = (interleave([n.next_files for n in nums], [n.next_counts for n in nums]).samples
                 if all(cur[r].following for r in ranks) else np.zeros(0, np.int64))
        with self._lock:
            self.stats.update(plans=self.stats["plans"] + 1, epoch=epoch, ranks=len(ranks), sequence=len(seq),
                              following=len(after), frontier=0, consumed=0)
        capacity = self.tiers.local_capacity
        entry = self.sizes + entry_size(0)
        held_now = residents(self.manifest, self.tiers.local.entries(), entry)   # as the Loader finds them
        # the Loader's plan of this node's epoch: only the misses it keeps are staged ahead
        stage = to_stage(seq, after, entry, capacity, held_now)
        held = StagedAhead(np.concatenate([seq, after]), len(self.manifest), list(held_now), keep=stage)
        reach = [0]   # how far the fastest rank can have got (a read of a use beyond it is of an earlier one)

        def position(steps: int) -> int:
            return per_step[min(steps, len(per_step)) - 1] if steps > 0 else 0

        last = [-1.0, 0]   # when the progress files were read, and the position they gave

        def consumed() -> int:   # the files are read at most every WATCH_EVERY (they change every 32 indices)
            now = time.monotonic()
            if now - last[0] >= WATCH_EVERY:
                steps = [p if e == epoch else 0 for e, p in (read_progress(self.m.orders_dir, r) for r in ranks)]
                reach[0] = position(max(steps) + 2 * PROGRESS_EVERY)   # reads run up to a report ahead of it
                last[:] = [now, position(min(steps))]
            return last[1]

        chunk: list[tuple[int, int]] = []   # (position, file): a slot and room taken, not yet submitted
        gathered: set[int] = set()

        def flush() -> None:   # the chunk goes to the stager in one call, its slots with it
            if chunk:
                batch = chunk[:]
                chunk.clear()
                gathered.clear()
                self._submit_chunk(batch, held)

        def follow() -> int:   # the readers' progress and reads: the position handed out
            flush()   # what is gathered is in the plan's residents before any read is weighed
            handed = consumed()
            with self._lock:
                self.stats["consumed"] = handed
            self._follow(held, handed, reach[0], capacity)
            return handed

        try:
            self._plan_loop(seq.tolist(), stage, key, held, capacity, follow, chunk, gathered, flush)
            looked = 0.0
            while not self._stop.wait(WATCH_EVERY):   # staged to the end: keep following the readers
                if self._changed() and self._current_key() != key:
                    self._plan_key = None   # a new order: the watch thread plans it
                    return
                now = time.monotonic()
                if self._reads or now - looked >= self._poll:   # the progress files: read when it matters
                    looked = now
                    follow()
                self._maybe_publish_stats()
        except BaseException:
            if chunk:   # gathered, never handed on: their slots go back
                self._inflight.release(len(chunk))
            raise

    def _follow(self, held: StagedAhead, handed: int, reach: int, capacity: int) -> None:
        """Bring the plan up to the readers: the uses they were handed long enough ago count as
        past (``MIN_LAG``, or twice the longest a seen read trailed its hand-out), each read the
        daemon saw moves its file's next use on, and a file read from the source is kept if the
        plan would keep it (plan/ahead.py), else its handoff goes."""
        later: list[tuple[int, bool]] = []   # reads of the next epoch's uses: for the next plan
        since = max(0, handed - self._lag)
        while self._reads:
            f, from_source = self._reads.popleft()
            self._unread.discard(f)   # whichever use it served, a staged copy was read
            p = held.pending(f)
            if p is not None:
                if held.read(f, reach):
                    self._lag = max(self._lag, 2 * (handed - p))
                elif p >= held.span and handed >= held.span and len(later) < BACKLOG:
                    later.append((f, from_source))   # the readers began the next epoch before its order came
                    continue
                if from_source and not self._in_flight(f):   # a copy under way takes the handoff
                    self._discard(f)
                continue
            if not from_source:
                continue
            q = held.position_of(f, since)
            if (q is None or q >= held.span) and handed >= held.span and len(later) < BACKLOG:
                later.append((f, from_source))
                continue
            self._keep_read(held, f, since, capacity)
        self._reads.extendleft(reversed(later))
        held.consumed(since)

    def _keep_read(self, held: StagedAhead, f: int, since: int, capacity: int) -> None:
        nxt = held.keep_read(f, held.use_read(f, since))
        need = entry_size(int(self.sizes[f]))
        room = capacity - self._used()
        while nxt is not None and room < need:
            victim = held.evict_for(nxt)
            if victim is None:
                break
            room += self._evict(victim)
        if nxt is None or room < need or not self._take_slot(wait=True):   # (a slot frees within a copy)
            self._discard(f)
            self._add("not_staged")
            return
        self._add("kept_reads")
        self._submit_chunk([(nxt, f)], held, frontier=False)

    def _plan_loop(self, seq: list[int], stage: np.ndarray, key: tuple, held: StagedAhead, capacity: int,
                   follow: Callable[[], int], chunk: list[tuple[int, int]], gathered: set[int],
                   flush: Callable[[], None]) -> None:
        """Stage the positions of ``seq`` that ``stage`` marks, in order, within ``capacity``,
        evicting by farthest next use: files are gathered into ``chunk`` (a slot and room taken for
        each) and handed on by ``flush``. A position the readers were handed already is not staged:
        its reader takes the file from wherever it is now, and a copy started now would only take
        room from the files ahead."""
        late: list[int] = []   # chosen for eviction while their copy was on the way
        room = 0   # bytes known free in the tier beyond the chunk's
        handed = follow()
        for pos, i in enumerate(seq):
            if self._stop.is_set() or self._plan_key != key:
                flush()
                return
            if late:
                late = self._settle(late, held, gathered)
            if pos % PROGRESS_EVERY == 0:
                handed = follow()
            if not wanted(held, pos, i, bool(stage[pos]), handed, gathered):
                continue
            need = entry_size(int(self.sizes[i]))
            self._maybe_publish_stats()
            if need > room:   # what is gathered goes first; then the room and the readers are read
                flush()
                room = capacity - self._used()
                handed = follow()
            step = next_step(held, pos, i, True, handed, need, room, gathered)
            while step.kind in (EVICT, WAIT):   # carried out here; the decisions are plan/ahead.py's
                if step.kind == EVICT:
                    if not self._evict(step.victim):   # its copy is still on the way: it goes once there
                        late.append(step.victim)
                else:
                    late = self._settle(late, held)
                    if self._plan_key != key or self._stop.wait(self._poll):
                        return
                    self._plan_key = key if self._current_key() == key else None
                    if self._plan_key is None:
                        return
                if self._stop.is_set():
                    return
                handed = follow()
                room = capacity - self._used()
                step = next_step(held, pos, i, True, handed, need, room, gathered)
            if step.kind == SKIP:   # (also: the readers got there while it waited)
                continue
            if not self._take_slot(wait=False):   # the slots are taken: what is gathered goes first
                flush()
                if not self._take_slot(wait=True):
                    return
            chunk.append((pos, i))
            gathered.add(i)
            room -= need
            if len(chunk) >= CHUNK:
                flush()
        flush()
        deadline = time.monotonic() + 5.0
        while late and self._plan_key == key and time.monotonic() < deadline and not self._stop.wait(WATCH_EVERY):
            late = self._settle(late, held)   # the last copies land: what was chosen goes

    def _submit_chunk(self, chunk: list[tuple[int, int]], held: StagedAhead, frontier: bool = True) -> None:
        """Stage the chunk's files (a slot taken for each), then count them staged in the plan
        (``frontier``: they are the plan's walk, not files kept after a read)."""
        self._submit_files([i for _, i in chunk])
        for pos, i in chunk:
            held.staged(i, pos)
        if not frontier:
            return
        self._unread.update(i for _, i in chunk)
        with self._lock:
            self.stats["frontier"] = chunk[-1][0] + 1

    def _evict(self, i: int) -> int:
        """Delete the entry of file ``i`` if it is there: the bytes freed (0: not there, e.g. its copy
        is on the way)."""
        freed = self.tiers.drop(self.manifest.keys[i])   # (counted by the tier too)
        if freed:
            self._add("evicted")
            if i in self._unread:   # staged ahead and given way before anyone read it: wasted
                self._unread.discard(i)
                self._add("evicted_unread")
        return freed

    def _numbers_of(self, order) -> _Numbered:
        """``_numbered(order)``, as worked out when the order was parsed."""
        for _, parsed, numbers in self._parsed.values():
            if parsed is order:
                return numbers
        return self._numbered(order)

    def _numbered(self, order) -> _Numbered:
        """A published order's files as file numbers, for ``interleave``: for this epoch and the
        next, every file known to the manifest in order (int64) and how many of them each index
        has. Once per published order."""
        index = self._key_index()

        def numbered(groups: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
            found = np.fromiter((index.get(k, -1) for g in groups for k in g), np.int64)
            per = np.fromiter((len(g) for g in groups), np.int64, len(groups))
            known = found >= 0
            counts = np.bincount(np.repeat(np.arange(len(groups)), per)[known], minlength=len(groups))
            return found[known], counts.astype(np.int64)

        return _Numbered(*numbered(order.groups), *numbered(order.following))

    def _current_key(self):
        cur = self._current()
        return None if cur is None else _plan_key(cur)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._files.close()
