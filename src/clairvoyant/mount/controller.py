"""MECHANISM: the mount process's staging, put together: its two threads and where what they hear goes.

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
tier has room (read-through caching in first-open order, no eviction), and where the opens follow
the listing's order or repeat an earlier pass's, the files that come next are staged ahead of the
opens (plan/readahead.py decides which, and which give way in a full tier).

This module holds the two threads and hands on what they hear; each part is a module of its own:

- the events thread (``_events``) reads the daemon's reports of first reads (u64 file numbers
  through a pipe; ``EVENT_LOCAL`` set: served from the tier) and gives each, with a sampler, to
  the plan's thread (mount/follow.py), without one to the read-through and read-ahead
  (mount/opens.py);
- the orders thread (``_watch``) looks at the orders directory every ``WATCH_EVERY``, parses what
  samplers published (each order numbered once, mount/numbering.py) and runs the newest epoch's
  plan (mount/walk.py) until newer orders come;
- the copies and evictions are mount/copies.py's, the counters and their publication
  mount/counters.py's; every decision is plan/'s (ahead.py, readahead.py).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

import numpy as np

from ..plan.ahead import StagedAhead
from .copies import Copies
from .counters import Counters
from .follow import Follower
from .numbering import OrderNumbers, plan_key
from .opens import Opens
from .orders import WATCH_EVERY, published, read_order
from .cluster.ahead import ClusterAhead
from .cluster.plan import ClusterWalk
from .walk import Parts, Walk, settle

log = logging.getLogger("clairvoyant")
EVENTS_GATHER = 0.002   # seconds the events thread lets reports gather before it reads them
EVENT_LOCAL = 1 << 63   # in the daemon's report of a first read: served from the tier (mountfs.c)
EVENT_ASK = 1 << 62     # the daemon asks for another node's file (--cluster: mount/cluster/node.py)


class Controller:
    """The staging of ``mount`` (a ``Mount`` started with staging): ``threads`` copies at once;
    ``poll``: seconds between the looks that nothing wakes."""

    def __init__(self, mount, threads: int = 16, poll: float = 0.1) -> None:
        self.m, self.tiers, self.source = mount, mount.tiers, mount.source
        self.manifest = mount.manifest
        self.sizes = np.asarray(self.manifest.sizes, dtype=np.int64)
        self._stop = threading.Event()
        self._poll = poll
        self._counters = Counters(mount.info["staging"])
        # the tiers count into the same set: an event of the shared tier code shows in --stats by the
        # name the Loader's stats() gives it
        self.tiers.counters = self._counters.space("tier")
        if mount.cluster is not None:
            self._counters.extra = lambda: {"cluster": mount.cluster.counters()}
        self._copies = Copies(mount, self._handoff_dir(), threads, self.sizes, self._counters, self._stop, poll)
        if mount.cluster is not None:   # a home stages its own files ahead through the same copies
            mount.cluster.attach(self._copies)
        self._sampler = threading.Event()   # a sampler published an order: no guessing from the opens
        self._opens = Opens(self._copies, self._counters, self._sampler, self._stop, give_way=self._give_way,
                            cluster=mount.cluster)
        # with a sampler: the daemon's first reads, for the plan's thread
        self._follower = Follower(self._copies, self._counters)
        self._orders = OrderNumbers(self.manifest)
        self._plan_key: tuple | None = None
        self._dir_seen, self._dir_looked = None, 0.0
        self._parts = Parts(self._copies, self._follower, self._counters, mount.orders_dir, self._changed,
                            self._current_key, self._stop, poll)
        self._threads = [threading.Thread(target=self._watch, name="clairvoyant-mount-orders", daemon=True),
                         threading.Thread(target=self._events, name="clairvoyant-mount-events", daemon=True)]
        for t in self._threads:
            t.start()

    def snapshot(self) -> dict:
        """The staging counters now (mount/counters.py), and the requests in flight the copies keep
        and why (``requests``: tune/inflight.py's choice)."""
        return dict(self._counters.snapshot(), requests=self._copies.inflight.describe())

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._copies.close()

    # -- seams (tests replace them) ----------------------------------------------------------------

    def _handoff_dir(self) -> str | None:
        """Where the daemon hands over what it read from the source (None: staging takes nothing
        from there, as the tests' control does)."""
        return self.m.handoff

    def _give_way(self, nbytes: int) -> int:
        """Read-ahead's eviction of the files opened last (mount/opens.py): the bytes freed."""
        return self._opens.give_way(nbytes)

    def _in_flight(self, i: int | None = None) -> bool:
        return self._copies.in_flight(i)

    def copying(self, i: int) -> bool:
        """Whether file ``i`` is being copied into the tier now (a cluster home waits for that copy
        rather than read the store a second time: mount/cluster/node.py)."""
        return self._copies.in_flight(i)

    def _evict(self, i: int) -> int:
        return self._copies.evict(i)

    def _settle(self, late: list[int], held: StagedAhead, gathered: set[int] = frozenset()) -> list[int]:
        """mount/walk.py's ``settle`` over this process's copies."""
        return settle(late, held, self._in_flight, self._evict, gathered)

    # -- the events thread: the daemon's reports of first reads ------------------------------------

    def _events(self) -> None:
        """Hear of first reads and hand each on (with a sampler to the plan's thread, else to the
        read-through and read-ahead). Never waits for the stager: a file read from the source while
        every staging slot is taken waits in the read-through's backlog."""
        fd = self.m.events_fd
        buf = b""
        opens, follower = self._opens, self._follower
        while not self._stop.is_set():
            opens.drain()
            r, _, _ = select.select([fd], [], [], WATCH_EVERY if opens.waiting else self._poll)
            if not r:
                continue
            if self.m.cluster is None:   # (a cluster's asks are waited on: taken at once)
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
            cluster = self.m.cluster
            for ev in events:
                if ev & EVENT_ASK:   # another node's file: fetched from its home for the daemon
                    if cluster is not None and (ev & ~EVENT_ASK) < len(self.manifest):
                        cluster.ask(ev & ~EVENT_ASK)
                    continue
                f = ev & ~EVENT_LOCAL
                if f >= len(self.manifest):
                    continue
                from_source = not ev & EVENT_LOCAL
                if self._sampler.is_set() and cluster is None:   # the plan's thread decides what a read changes
                    if not follower.heard(f, from_source) and from_source:   # far behind: let this one go
                        self._copies.discard(f)
                        self._counters.add(not_staged=1)
                    continue
                opens.opened(f, from_source)

    # -- the orders thread: what samplers published, planned -----------------------------------------

    def _current(self):
        """The newest epoch's published orders (rank -> PublishedOrder), or None."""
        orders = {}
        for rank, path in published(self.m.orders_dir).items():
            try:
                st = os.stat(path)
                ident = (st.st_ino, st.st_mtime_ns, st.st_size)   # replaced by rename: a new inode
                order = self._orders.parsed(path, ident)
                if order is None:   # parse a published order once, not every look
                    order = self._orders.remember(path, ident, read_order(path))
                orders[rank] = order
            except Exception:
                continue   # being replaced, or foreign: the next look sees it whole
        if not orders:
            return None
        epoch = max(o.epoch for o in orders.values())
        return {r: o for r, o in orders.items() if o.epoch == epoch}

    def _current_key(self) -> tuple | None:
        cur = self._current()
        return None if cur is None else plan_key(cur)

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
            self._counters.maybe_publish()
            if not self._changed():
                continue
            try:
                cur = self._current()
                if cur is None:
                    continue
                key = plan_key(cur)
                if key == self._plan_key:
                    continue
                self._plan_key = key
                self._run_plan(cur, key)
            except Exception as e:   # never take the mount down: staging is an optimisation
                log.warning("clairvoyant mount: staging ahead stopped: %s", e)
        self._counters.publish()

    def _run_plan(self, cur: dict, key: tuple) -> None:
        if not self._sampler.is_set():
            self._opens.stand_down()   # a sampler says what comes next: no more guessing from the opens
        numbers = [self._orders.of(cur[r]) for r in sorted(cur)]
        if self.m.cluster is not None:   # a cluster's node: the cluster plan, from every node's orders
            walk = ClusterWalk(self.m.cluster, cur, key, numbers, self._parts)
            try:
                planned = walk.make_plan()
            except Exception as e:   # (a peer's orders that plan to nothing sound): recency this epoch
                log.warning("clairvoyant mount: the cluster plan of epoch %d failed (%s: %s)", walk.epoch,
                            type(e).__name__, e)
                planned = False
            if planned:
                walk.run()
            elif walk.current and not self._stop.is_set():   # not every node's orders: recency, reads ahead
                why = (f"node(s) {sorted(walk.missing)} offered no orders of it in time (their samplers not "
                       "started yet, or on another epoch)" if walk.missing else walk.why)
                log.warning("clairvoyant mount: epoch %d runs without the cluster plan: %s; this node keeps its "
                            "files by recency this epoch", walk.epoch, why)
                self.m.cluster.withdraw(walk.epoch)   # a node that gathers later must not plan with this one
                self.m.cluster.follow_plan(None)
                walk = ClusterAhead(self.m.cluster, cur, key, numbers, self._parts)
                walk.run()
            if not walk.current:
                self._plan_key = None
            return
        walk = Walk(cur, key, numbers, self._parts)
        try:
            walk.run()
        finally:
            if not walk.current:
                self._plan_key = None   # newer orders: the next look plans them
