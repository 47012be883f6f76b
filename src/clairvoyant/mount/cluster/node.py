"""MECHANISM: the mounts of several nodes as one cache (``clairvoyant mount --cluster``).

Each node's mount runs a :class:`MountCluster` beside its controller. Every file has a home node;
only the home keeps it. Without samplers the homes are hashed (``plan.unplanned.hash_homes``:
computed alike on every node, nothing exchanged) and what is kept and what goes is
``plan.unplanned.HomesLRU``'s decision (the program shuffles on its own: the mount learns its reads
as they come). With samplers the nodes plan together (mount/cluster/plan.py): the homes are the
plan's, and the plan's part for this node (``follow_plan``: a ``Duty``) decides what a home keeps,
what it serves, and which asks go to the store at once. This module carries either out:

- **A read of another node's file.** The daemon (``mountfs.c``, ``--homes``) finds it absent from
  this node's tier and asks (an ``EVENT_ASK`` on its events pipe). :meth:`ask` fetches it from the
  home over the link, checksummed and within ``ask_timeout`` seconds, and leaves the bytes where the
  daemon waits for them (``<handoff>/<number>``: the bytes, then their mtime; written under a
  temporary name, then renamed), or ``<number>.miss`` when the home did not answer with them: the
  daemon then reads the store itself. A late or dead home costs one time-out (the link passes it
  over for a while after: ``cluster/peers.py``), never an error in the program.
- **A request at the home** (:meth:`serve`, in the link's serving threads): from the tier if it
  holds a sound entry; else the home reads the store on the reader's behalf, keeps the file within
  its capacity (evicting the least recently read across the cluster), and sends it.
- **A read of one's own file** (:meth:`read_own`): the home's own read counts as recent, and a file
  it read from the store is kept by the same rule (the controller stages it from the daemon's
  handoff, as without a cluster).
- **A home's own file ahead of its read** (:meth:`stage_own`, from the plan's walk or the fetch
  ahead): handed to the mount's one file engine through its copies (``attach``: stage/engines.py,
  the engine the Loader uses too), which reads it from the store into the tier; this module is
  told of the copy and counts it.

The nodes agree first that they number the same files alike (a file is asked for by its number).
The link between them is a ``ClusterLink`` (mount/cluster/links.py, where its kinds are).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from typing import Callable

import numpy as np

from ...cache.entry import CorruptEntry, entry_size, read_sample
from ...plan.unplanned import STORE, HomesLRU, hash_homes
from ...tune.counters import Counters
from .handoff import PeerFiles
from .links import ClusterLink
from .homes import HOMES_FILE, decode_homes, encode_homes, encoded_size, load_homes, save_homes, tell_daemon
from .orders import HOMES
from ...cluster.timeouts import ASK_TIMEOUT, CONTROL_WAIT

log = logging.getLogger("clairvoyant")
COPY_WAIT = 5.0       # seconds a home's answer waits for its own copy of the file to be published
CLOSE_WAIT = 10.0     # seconds close() waits for answers to peers under way (each a read of the store at most)


class MountCluster:
    """This node's part of a cluster of mounts (module docstring). ``mount``: the node's Mount
    (its manifest, tiers, source and handoff directory)."""

    def __init__(self, mount, link: ClusterLink, *, ask_timeout: float = ASK_TIMEOUT, threads: int = 8) -> None:
        self.mount, self.link = mount, link
        self.node, self.nodes = int(link.node), int(link.nodes)
        self._keys, self.sizes = mount.manifest.keys, np.asarray(mount.manifest.sizes, np.int64)
        self.hashed_homes = hash_homes(len(self._keys), self.nodes)
        self.homes = self.hashed_homes
        self.basis = -1   # the epoch the planned homes came from (mount/cluster/plan.py); -1: hashed
        kept = load_homes(self._homes_file(), len(self._keys), self.nodes)
        if kept is not None:   # planned by an earlier session of this job's mounts: its tier holds by them
            self.homes, self.basis = kept
            tell_daemon(mount, self.homes)
        # the homes planned with every node (kept beside the tier): those of now, unless a node is lost
        # (then its files are homed among the others until it is back: ``use_homes(whole=False)``)
        self.whole: tuple[np.ndarray, int] = (self.homes, self.basis)
        self.entry_sizes = self.sizes + entry_size(0)
        # with samplers: this node's part of the epoch's cluster plan (None: recency, as without one)
        self._duty = None
        self._read_seen: set[int] = set()   # own files the daemon read since the plan began
        self._offers: dict[int, bytes] = {}        # epoch -> this node's orders, for its peers
        self._residents: dict[int, tuple] = {}     # epoch -> (rank -> stamp, the residents offered)
        self.silent: set[int] = set()   # peers that offered no orders at the last epoch's gather
        self.node_ranks: dict[int, int] = {}   # node -> its ranks at the last gather of every node
        self._copies = None   # the mount's copies into its tier (``attach``): this home's files staged ahead
        self._ahead_own: set[int] = set()   # this home's files staged ahead, their copies not told yet
        self._lock = threading.Lock()    # the policy, the counters, the peer files
        self._serving = 0                # peers' requests being answered (close waits for them)
        self._served = threading.Condition(self._lock)
        self.ask_timeout = float(ask_timeout)
        # the daemon's asks (a read waits on each) apart from the work ahead, which never delays them
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="clairvoyant-ask")
        self._ahead_pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="clairvoyant-ahead")
        self._asked: set[int] = set()
        self._waited: set[int] = set()   # asked by the daemon while a fetch ahead of it was under way
        self.peer_files = PeerFiles(mount.handoff, lambda: self._c.add("peer_misses"))   # mount/cluster/handoff.py
        self._c = Counters(["cluster"]).space("cluster")   # tune/counters.py's cluster.*
        self._closed = False
        self._rechecking = False   # a probe of the nodes found lost is under way (``recheck_lost``)
        self._back: list[int] = []   # nodes found lost that answered it: taken back at the next plan
        self._adopt()   # the policy (the nodes agreed on the files before mounting: Mount)
        link.start(self.serve, self._state)

    def _adopt(self) -> None:
        """What the tier holds from an earlier session: this node's own files are counted by the
        policy (as read now, in no order), other homes' files are dropped: only homes keep."""
        self._policy, drop = self._recount()
        for g in drop:
            self.evict(g, count=False)
        if drop:
            log.info("clairvoyant: %d files of an earlier session left this node's tier (not its home's, "
                     "or no room)", len(drop))

    def _recount(self) -> tuple[HomesLRU, list[int]]:
        """A policy of the homes of now that counts this node's own files in its tier (as read now,
        in no order), and the files of the tier it does not keep (another home's, or no room)."""
        from ...cache.node import residents
        held = residents(self.mount.manifest, self.mount.tiers.local.entries(), self.entry_sizes)
        policy = HomesLRU(self.homes, [int(self.mount.capacity.nbytes)] * self.nodes, self.entry_sizes)
        drop: list[int] = []
        for f in sorted(held):
            got = policy.read(self.node, f) if self.owns(f) else None
            if got is None or not got.kept:   # another home's, or larger than the tier
                drop.append(f)
            if got is not None:
                drop += list(got.evicted)
        for g in drop:
            policy.forget(g)
        return policy, drop

    # -- this node reads another's file ---------------------------------------------------------

    def ask(self, f: int, ahead: bool = False) -> None:
        """The daemon asks for file ``f`` (another node's): fetched in the background (unless it is
        there already, fetched ahead). ``ahead``: no one waits for it yet (mount/cluster/ahead.py):
        a failed fetch leaves no miss mark, and the daemon's own ask tries again."""
        with self._lock:
            if self._closed:
                return
            duty = self._duty
            miss = not ahead and duty is not None and f in duty.store   # the plan: its home does not hold it
            if miss:
                self._c.add("plan_store")
            elif f in self._asked:   # fetched ahead right now: the daemon waits on that fetch
                if not ahead:
                    self._waited.add(f)
                return
            elif os.path.exists(os.path.join(self.mount.handoff, str(f))):
                if not ahead:
                    self._c.add("asked_ready")
                return
            else:
                self._asked.add(f)
        if miss:
            self.peer_files.miss(f)
            return
        try:   # (the daemon removed the mark of an earlier ask that missed before it asked)
            (self._ahead_pool if ahead else self._pool).submit(self._answer, f, ahead)
        except RuntimeError:   # closing
            with self._lock:
                self._asked.discard(f)
            if not ahead:
                self.peer_files.miss(f)

    def _answer(self, f: int, ahead: bool = False) -> None:
        got = False
        try:
            home, size = int(self.homes[f]), int(self.sizes[f])
            data = None
            if home != self.node:
                t0 = time.perf_counter()
                data = self.link.fetch(home, f, size, self.ask_timeout)
                self._c.add("peer_seconds", time.perf_counter() - t0)
            if data is not None:
                self.peer_files.leave(f, data, 0)
                got = True
                self._c.add_many(from_peers=1, bytes_from_peers=len(data))   # (read together)
        except Exception as e:   # the daemon reads the store: never an error in the program
            log.warning("clairvoyant: fetching %s from its home failed (%s: %s); the store serves it",
                        self._keys[f], type(e).__name__, e)
        finally:
            with self._lock:   # (a daemon's ask that came while this fetch ran ahead waits on it too)
                waited = not ahead or f in self._waited
                self._asked.discard(f)
                self._waited.discard(f)
            if not got and waited:
                self.peer_files.miss(f)   # the daemon reads the store now, not after its whole wait
            self.peer_files.forget_old()

    def ahead(self, f: int) -> bool:
        """File ``f`` comes up soon in this node's sequence (mount/cluster/ahead.py): one of its own
        absent from the tier is staged now (``stage_own``); another node's is fetched from its home
        into the handoff directory. False: no staging slot is free now (ask again later)."""
        if self.owns(f):
            return self.stage_own(f)
        self.ask(f, ahead=True)
        self._c.add("ahead")
        return True

    # -- this node is the home ------------------------------------------------------------------

    def owns(self, f: int) -> bool:
        return int(self.homes[f]) == self.node

    def serve(self, f: int) -> bytes | None:
        """A peer asks for file ``f`` of this home: from the tier, or read from the store now and
        kept by the policy. None: not this node's, or the store failed (the peer reads it), or
        closing (``close`` waits for the answers under way, so none touches a closed tier)."""
        with self._lock:
            if self._closed:
                return None
            self._serving += 1
        try:
            data = self._get(f)
            duty = self._duty
            if data is not None and duty is not None and f in duty.cut_on_serve:   # the epoch's only read
                duty.cut_on_serve.discard(f)
                self.evict(f)
            return data
        finally:
            with self._lock:
                self._serving -= 1
                self._served.notify_all()

    def _get(self, f: int) -> bytes | None:
        """``f``'s bytes at its home for a peer, from the tier or the store (counted
        ``served_from_tier`` or ``served_from_store``)."""
        if self._closed or not 0 <= f < len(self._keys):
            return None
        if not self.owns(f):   # held here from before the homes changed (a plan's first): from the tier only
            data = self._from_tier(self._keys[f], int(self.sizes[f]))
            if data is not None:
                self._c.add("served_not_home")
            return data
        key, size = self._keys[f], int(self.sizes[f])
        tiers = self.mount.tiers
        data = self._from_tier(key, size)
        if data is None and self._await_copy(f):
            data = self._from_tier(key, size)   # this home's own copy of it has just been published
        duty = self._duty
        if data is None and duty is not None and not duty.keep.get(f, False):
            self._c.add("served_absent")   # the plan does not keep it here: the peer reads the store itself
            return None
        if data is None:
            # hold the key's node-wide lock: the home's own staging of it (from its daemon's read)
            # and this read do not both read the store; whoever comes second finds it
            locked = not tiers.claim(key, size)
            data = None if locked else self._from_tier(key, size)
            if data is None:
                try:
                    return self._from_store(f, key, size)
                finally:
                    if locked:
                        tiers.release(key)
        self._decide(f, True)
        self._c.add("served_from_tier")
        return data

    def _await_copy(self, f: int) -> bool:
        """Wait (up to COPY_WAIT seconds) while this mount is copying ``f`` into its tier (after a
        read of it, or ahead of one); True if it was. The copy may run on the native threads, whose
        POSIX lock on the key belongs to this whole process and so does not keep this thread out:
        without the wait both would read the store."""
        ctl = self.mount.controller
        if ctl is None or not ctl.copying(f):
            return False
        deadline = time.monotonic() + COPY_WAIT
        while ctl.copying(f) and time.monotonic() < deadline and not self._closed:
            time.sleep(0.001)
        return True

    def _from_store(self, f: int, key: str, size: int) -> bytes | None:
        """``f`` read from the store by its home for a peer, kept if the policy says so."""
        tiers = self.mount.tiers
        data, mtime_ns = self.mount.source.read_versioned(key)
        if len(data) != size:
            return None
        if self._decide(f, False):
            loc = None
            try:
                if not self._closed:
                    loc = tiers.local.put(key, data, mtime_ns, tiers.local_capacity)
            except Exception as e:   # a full device: served all the same, not kept
                log.warning("clairvoyant: cannot keep %s in this home's tier (%s)", key, e)
            if loc is None:   # not kept after all: the policy must not count it
                with self._lock:
                    self._policy.forget(f)
        self._c.add("served_from_store")
        return data

    def read_own(self, f: int, from_store: bool) -> bool:
        """This node's own read of its file ``f``: recent now; True if a copy read from the store
        is to be kept (the caller stages it)."""
        if self._duty is not None:
            with self._lock:
                self._read_seen.add(f)
        return self._decide(f, not from_store)

    def was_read(self, f: int) -> bool:
        """Whether this node's daemon read its file ``f`` since the plan began."""
        with self._lock:
            return f in self._read_seen

    def _decide(self, f: int, present: bool) -> bool:
        """Ask the policy about a read of ``f`` at its home; carry out its evictions. With a plan,
        it decides: a copy read from the store is kept where the plan keeps it after this node's
        read, and evictions are the plan's (mount/cluster/plan.py)."""
        duty = self._duty
        if duty is not None:
            return not present and duty.keep.get(f, False)
        with self._lock:
            gone: list[int] = []
            if present and not self._policy.holds(f):   # in the tier, unknown to the policy (an earlier
                gone += self._policy.read(self.node, f).evicted   # session's): it counts from now on
            elif not present and self._policy.holds(f):
                # counted as held, but the tier lacks it: an entry found stale or corrupt (and
                # removed), a copy that failed, an eviction that crossed a keep. Forgotten first,
                # so that this read keeps it again; else every later read would go to the store
                self._policy.forget(f)
            got = self._policy.read(self.node, f)
        for g in (*gone, *got.evicted):
            self.evict(g)
        return got.by == STORE and got.kept

    def _from_tier(self, key: str, size: int) -> bytes | None:
        loc = self.mount.tiers.find_local(key, size)
        if loc is None:
            return None
        try:
            return read_sample(loc, size)
        except (FileNotFoundError, CorruptEntry):
            return None

    # -- with samplers: the cluster plan (mount/cluster/plan.py, mount/cluster/orders.py) -------

    def residents_for(self, epoch: int, stamps: dict[int, int], make: Callable[[], dict]) -> dict:
        """The residents this node offers with its orders of ``epoch`` (``stamps``: each rank's
        publication): made at the first offer of the epoch and kept, so that a second offer (more
        ranks published) plans from the same; made anew where a rank published the epoch again
        (a run resumed at it)."""
        with self._lock:
            got = self._residents.get(epoch)
            if got is not None and any(got[0].get(r, s) != s for r, s in stamps.items()):
                got = None
            if got is not None:
                got[0].update(stamps)
                return got[1]
        held = make()
        with self._lock:
            self._residents[epoch] = (dict(stamps), held)
            for e in [e for e in self._residents if e < epoch - 2]:
                del self._residents[e]
        return held

    def offer(self, orders) -> None:
        """This node's orders of an epoch, for its peers to gather (replacing an earlier offer)."""
        from .orders import encode
        blob = encode(orders)
        with self._lock:
            self._offers[orders.epoch] = blob
            for e in [e for e in self._offers if e < orders.epoch - 2]:
                del self._offers[e]

    def withdraw(self, epoch: int) -> None:
        """Offer no orders of ``epoch`` any more (this node runs it without the plan: a node that
        gathers them later must not plan with it)."""
        with self._lock:
            self._offers.pop(epoch, None)

    def _state(self, number: int) -> bytes | None:
        """A peer's request for a piece of this node's state: its offered orders or its homes
        (mount/cluster/orders.py)."""
        from .orders import length_answer
        with self._lock:
            homes, basis = self.homes, self.basis
            epoch, body = divmod(number - 1, 2)
            blob = self._offers.get(epoch)
        if number == HOMES:
            return None if basis < 0 else encode_homes(homes, basis, self.nodes)
        return blob if body else length_answer(blob)

    def whole_again(self) -> None:
        """A node was lost and every node is back (a launcher formed the cluster again, or a node
        found lost answers again: ``recheck_lost``): the homes planned with every node are taken
        again at once, before any plan (they are what the node back holds by, from its homes file),
        so that it is asked for its files even in an epoch the nodes run without a plan."""
        link = self.link
        back, self._back = self._back, []
        if back:   # (taken back here, between two plans: never in the middle of a gather)
            link.readmit(back)
            log.warning("clairvoyant: node %d: node(s) %s found lost answer again: planned with from this epoch",
                        self.node, back)
        if link.was_lost and not link.lost:
            link.was_lost = False
            homes, basis = self.whole
            if homes is not self.homes:
                tell_daemon(self.mount, homes)
            with self._lock:
                self.homes, self.basis = homes, basis
            log.warning("clairvoyant: node %d: every node is back: the homes of the whole cluster (%s) again",
                        self.node, "hashed" if basis < 0 else f"planned from epoch {basis}")

    def recheck_lost(self) -> None:
        """Ask the peers found lost (``link.lost``) again, in the background: one that answers a
        probe as serving was not gone (a node too loaded to answer in time, a stop and a resume) and
        is taken back (``link.readmit``) at the next plan's start (``whole_again``). A node truly
        gone costs one unanswered probe per epoch, on a thread of its own."""
        lost = sorted(self.link.lost)
        if not lost or self._rechecking:
            return
        self._rechecking = True

        def again() -> None:
            try:
                found = self.link.probe(lost)
                self._back = sorted(set(lost) - set(found.lost))
            except Exception as e:   # noqa: BLE001 - asked again at the next epoch
                log.debug("clairvoyant: asking the lost nodes again failed: %s", e)
            finally:
                self._rechecking = False
        try:
            self._ahead_pool.submit(again)
        except RuntimeError:   # closing
            self._rechecking = False

    def check_lost(self, peers: set[int]) -> None:
        """``peers`` offer no orders yet (a gather's ``on_absent``): those that do not answer two
        probes either are lost (a node gone, its launcher silent or slow to say so): this epoch's
        plan and the next are made without them."""
        if not peers:
            return
        found = self.link.probe(sorted(peers))
        if found.lost:
            self.link.mark_lost(found.lost)
        if found.silent:
            log.warning("clairvoyant: node %d: node(s) %s offer no orders and answer no probe: lost; the epochs "
                        "are planned without them", self.node, found.silent)
        if found.draining:
            log.warning("clairvoyant: node %d: node(s) %s drain (their node is being taken back): the epochs are "
                        "planned without them", self.node, found.draining)

    def fetch_control(self, peer: int, number: int, size: int) -> bytes | None:
        """A peer's answer to a request for a piece of its state (its orders, its homes), or None."""
        try:   # (a node's orders can be megabytes: more time than a file's ask)
            return self.link.fetch(peer, number, size, max(self.ask_timeout, CONTROL_WAIT), state=True)
        except Exception as e:   # a peer that is gone: not offered
            log.debug("clairvoyant: asking node %d for %d failed: %s", peer, number, e)
            return None

    def settle_homes(self, orders: list, compute: Callable[[], np.ndarray]) -> tuple[np.ndarray, int] | None:
        """The homes to plan with and the epoch they came from: those of the node that planned
        from the earliest epoch (the lowest node among equals: every node that gathered these
        orders picks the same), this node's own if they are the same, else asked of that node;
        computed now (``compute``) where no node has planned. None: a peer's could not be had.
        (Not used until ``use_homes``.)"""
        bases = [(o.basis, o.node, o.homes_digest) for o in orders if o.basis >= 0]
        first = min(bases, default=None)
        if first is not None and self.basis == first[0] and self.homes_digest() == first[2]:
            return self.homes, self.basis
        if first is not None:
            got = decode_homes(self.fetch_control(first[1], HOMES, encoded_size(len(self._keys))), len(self._keys),
                               self.nodes)
            if got is None or got[1] != first[0]:
                return None
            return got
        return np.asarray(compute(), np.int32), int(orders[0].epoch)

    def use_homes(self, homes: np.ndarray, basis: int, whole: bool = True) -> None:
        """Plan with ``homes`` from now on; the daemon asks by them too (its homes file, mapped).
        ``whole``: planned with every node: the job's homes (``self.whole``), which a mount started
        again later finds beside its tier (``HOMES_FILE``); else those of the nodes there while one
        is lost, until it is back (``whole_again``)."""
        homes = np.ascontiguousarray(homes, np.int32)
        if basis == self.basis and homes is self.homes:
            return
        tell_daemon(self.mount, homes)
        if whole:
            try:
                save_homes(self._homes_file(), homes, basis, self.nodes)
            except OSError as e:
                log.warning("clairvoyant: cannot keep the cluster's homes beside the tier (%s); a restarted mount "
                            "takes them from a peer", e)
        with self._lock:
            self.homes, self.basis = homes, int(basis)
            if whole:
                self.whole = (homes, int(basis))
            self._c.set_many(homes_from_epoch=int(basis))

    def homes_digest(self) -> int:
        """xxh3-64 of the homes this node plans with (offered with its orders: a few times an epoch)."""
        from .orders import homes_digest
        return homes_digest(self.homes)

    def _homes_file(self) -> str:
        return os.path.join(self.mount.tiers.local.root, HOMES_FILE)

    def follow_plan(self, duty) -> None:
        """This node's part of an epoch's plan from now on (``Duty``), or None: recency again
        (a policy made anew from the tier, with the homes of now)."""
        with self._lock:
            self._duty = duty
            self._read_seen = set()
            if duty is not None:
                self._c.add("plans")
                return
        policy, _ = self._recount()   # (what it would not keep stays, served to peers from the tier)
        with self._lock:
            self._policy = policy

    def between_plans(self) -> None:
        """While the next epoch's plan is made: the last plan's keeps stand, but an ask goes to the
        file's home (the last plan's reads from the store are not this epoch's)."""
        from ...plan.cluster_walk import Duty
        with self._lock:
            if self._duty is not None:
                self._duty = Duty(self._duty.keep, frozenset())

    def take_over(self, f: int, holder: int) -> None:
        """This home's file ``f``, read before the nodes planned together and kept by ``holder``
        (its hashed home then): fetched from there and kept here, as the plan counts it (on the
        ahead pool; nothing if it is here, or the holder does not answer with it: it is read from
        the store at its next read, as the plan then says)."""
        if holder == self.node or self.mount.tiers.find_local(self._keys[f], int(self.sizes[f])) is not None:
            return
        with self._lock:
            if self._closed or f in self._asked:
                return
            self._asked.add(f)
        try:
            self._ahead_pool.submit(self._take_over, f, holder)
        except RuntimeError:
            with self._lock:
                self._asked.discard(f)

    def _take_over(self, f: int, holder: int) -> None:
        try:
            key, size = self._keys[f], int(self.sizes[f])
            data = self.link.fetch(holder, f, size, self.ask_timeout)
            if data is not None and not self._closed:
                v = self.mount.source.version(key)   # (one metadata request: a restarted mount checks it)
                if v is None or v[0] != size:
                    return
                if self.mount.tiers.local.put(key, data, v[1], self.mount.tiers.local_capacity) is not None:
                    self._c.add("taken_over")
        except Exception as e:
            log.warning("clairvoyant: taking %s over from node %d failed (%s: %s); it is read when asked",
                        self._keys[f], holder, type(e).__name__, e)
        finally:
            with self._lock:
                self._asked.discard(f)

    def attach(self, copies) -> None:
        """The mount's copies into its tier (mount/copies.py): this home stages its own files ahead
        through them, the one file engine of the mount, and is told of each copy (``_told``)."""
        self._copies = copies
        copies.told = self._told

    def stage_own(self, f: int) -> bool:
        """Stage this home's file ``f`` ahead of its read: handed to the mount's file engine, which
        reads it from the store into the tier, if the policy keeps it (nothing if it is there or
        under way). Its entry counts in ``used`` from its submission (the engine reserves it).
        False: no staging slot is free now (the caller asks again later)."""
        key, size = self._keys[f], int(self.sizes[f])
        copies = self._copies
        if copies is None or not self.owns(f) or self.mount.tiers.find_local(key, size) is not None:
            return True
        with self._lock:
            if self._closed or f in self._ahead_own:
                return True
        if not copies.take_slot(wait=False):
            return False
        if not self._decide(f, False):   # the policy does not keep it (larger than the tier)
            copies.release()
            return True
        with self._lock:
            self._ahead_own.add(f)
        if copies.submit_files([f]):   # not on its way after all (no room, an error): not held
            with self._lock:
                self._ahead_own.discard(f)
                self._policy.forget(f)
        return True

    def _told(self, d) -> None:
        """The mount's file engine told of a copy (``native_files.Done``): one of this home's
        stagings ahead is counted, and forgotten by the policy if it failed."""
        with self._lock:
            if d.token not in self._ahead_own:
                return
            self._ahead_own.discard(d.token)
            if d.loc is None and not d.present:
                self._policy.forget(d.token)
        if d.loc is not None and not d.handed_over:
            self._c.add("ahead_from_store")
        elif d.present:
            self._c.add("ahead_from_tier")

    def evict(self, f: int, count: bool = True) -> int:
        """Delete this node's entry of ``f`` (the plan's cut, the policy's eviction; ``count``: in
        ``evicted``): the bytes freed."""
        try:
            freed = self.mount.tiers.drop(self._keys[f])
        except Exception as e:
            log.warning("clairvoyant: cannot drop %s: %s", self._keys[f], e)
            return 0
        if freed and count:
            self._c.add("evicted")
        return freed

    def used(self) -> int:
        """Bytes in this node's tier, those reserved for copies under way included."""
        return self.mount.tiers.local.ledger.read()[0]

    def count(self, **amounts: float) -> None:
        self._c.add_many(**amounts)

    # -- the rest ------------------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether a fetch (asked, or ahead) or a staging ahead is under way."""
        with self._lock:
            return bool(self._asked or self._ahead_own)

    def counters(self) -> dict:
        out = self._c.snapshot()
        out.update(node=self.node, nodes=self.nodes, link=self.link.counters())
        return out

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        with self._lock:
            self._closed = True
            if not self._served.wait_for(lambda: self._serving == 0, timeout):   # a store read for a peer
                log.warning("clairvoyant: %d answers to peers still under way after %.0f s; closing without "
                            "them", self._serving, timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ahead_pool.shutdown(wait=True, cancel_futures=True)
        self.link.close()
        self.peer_files.close()
