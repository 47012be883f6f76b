"""MECHANISM: the node's two cache tiers, RAM and local SSD, as the staging threads use them.

The residency plan (plan/residency.py) says, for each access, whether the
sample is in the local tier (a hit) and whether it stays there afterwards
(keep). This module carries it out:

- a planned hit is read from the local tier, after checking that the entry is
  there and still matches the source (entries older than this session are
  checked once against the source's size and modification time);
- a miss is read from the source once and put where its reader will find it:
  straight into the local tier when it is to be kept and the tier has room,
  else in the RAM tier (the window of samples needed soonest: the bytes stay in
  the staging process's memory and travel to the reader with their batch, no
  file), else nowhere (the reader reads the source itself: the tiers are full
  or the device is);
- after the access, a kept sample moves from RAM to the local tier, and what is
  not kept is deleted, which is the only way the local tier evicts.

Every placement reserves its bytes in the tier's ledger first (the RAM
tier's ledger is shared by the node's processes like the local one), so
neither tier ever holds more than its capacity, whatever the ranks do.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, NamedTuple

from ..errors import CacheError
from ..plan.compression import stored_size
from ..tune.counters import Counters
from .entry import entry_size, holds, read_trailer
from .extents import Loc
from .local import LocalStore, remove_tree
from .session import Session

log = logging.getLogger("clairvoyant")

LOCAL, RAM, SOURCE = "local", "ram", "source"


class Placement(NamedTuple):
    tier: str            # LOCAL, RAM or SOURCE (not cached: the reader reads the source)
    path: Loc | None     # where the local entry is (LOCAL)
    fetched: bool        # read from the source for this access
    data: bytes | None = None   # the sample's bytes (RAM): handed to the reader with its batch
    mtime_ns: int = 0           # the source file's modification time (RAM), for a later move down
    peer: int = -1              # the node whose tier the bytes came from (cluster cache), -1 if none


def _first_ram(store: LocalStore) -> dict[str, int]:
    store.ledger.set(0)   # the window's bytes live in processes' memory: a new session holds none yet
    return {}


def _last_ram(store: LocalStore) -> None:
    remove_tree(store.root)
    for d in (os.path.dirname(store.root), store.local_dir):   # v1/, then the per-user directory
        try:
            os.rmdir(d)
        except OSError:
            break   # not empty: another source's tier lives there


class Tiers:
    def __init__(self, local: LocalStore, open_ram: Callable[[], LocalStore], local_capacity: int,
                 ram_capacity: int, source, direct: bool = True) -> None:
        """``direct``: a miss to keep goes straight to the local tier (when the whole data set fits);
        else it waits in the RAM window and moves down after its access, when the plan counted it in."""
        self.compress_ratio = 1.0   # raw / stored, where the local tier compresses (cache/codec.py)
        self.local = local
        self.direct = direct
        self.local_capacity, self.ram_capacity = int(local_capacity), int(ram_capacity)
        self.source = source
        self.counters = Counters(["tier"]).space("tier")   # what the tiers did (tune/counters.py)
        self._local_session = Session(local.root, "local", lambda: local, LocalStore.recover)
        try:
            self._ram_session = Session(local.root, "ram", open_ram, _first_ram)
        except BaseException:
            self._local_session.leave()
            raise
        self.ram = self._ram_session.store
        self.inventory = dict(self._local_session.inventory)   # entry name -> bytes, when the session began
        self._warned: set[str] = set()
        # None where the source cannot tell a change: a staged copy of an earlier session is trusted
        self._version = source.version if source.versioned else None
        # kept samples whose move down from the RAM window waits for room (key, bytes, mtime), in
        # need order; their RAM bytes stay reserved until they move (see _move_down)
        self._owed: list[tuple[str, bytes, int]] = []
        self._owed_bytes = 0
        self._owed_lock = threading.Lock()

    @property
    def owed_bytes(self) -> int:
        """Bytes of kept samples waiting in the RAM window for room in the local tier (they go
        down first: staging reserves the local tier around them)."""
        return self._owed_bytes

    def close(self) -> None:
        self.settle(final=True)
        self._ram_session.leave(_last_ram)
        self._local_session.leave()

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message)

    # -- before the access ------------------------------------------------------------------

    def find_local(self, key: str, size: int, wait: float = 0.0) -> Loc | None:
        """Where the local entry of ``key`` is if it is there and current, else None (a stale one is
        removed). With ``wait``, an absent entry is waited for that long (another rank of the node is
        about to keep it after its own access)."""
        deadline = time.monotonic() + wait
        while True:
            got = self.local.locate(key)
            if got is not None:
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)
        loc, stamp = got
        if loc.length != entry_size(size) and (self.local.codec is None or not holds(loc, size)):
            return None   # (a compressed entry is looked for only where this tier compresses)
        if stamp == self.local.session or self._version is None:
            return loc   # written or checked in this session, from the source as it is now
        recorded = read_trailer(loc)
        if recorded is not None and recorded == tuple(self._version(key)):
            self.local.restamp(key, loc)   # checked: no need to ask the source again in this session
            return loc
        self.counters.add("stale")
        self.local.delete(key, loc)   # that entry only: another rank may have staged a fresh one since
        return None

    def claim(self, key: str, size: int) -> bool:
        return self.local.claim(key, size)

    def release(self, key: str) -> None:
        self.local.release(key)

    def stage(self, key: str, size: int, keep: bool, fetch: Callable[[], tuple[bytes, int]]) -> Placement:
        """Make room for a ``size``-byte sample, then read it from the source (``fetch``) into that room.

        Room is reserved before the read, so a sample is read from the source once: where neither
        tier has room, it is not read here at all and its reader reads it (a SOURCE placement that
        was not fetched). To keep: straight down first where the plan allows it; else the RAM
        window first, and down only if the window is full."""
        n = entry_size(size)
        nl = n if self.local.codec is None else self.stored_size(size)   # (compressed: what the plan counts)
        order = ((LOCAL, RAM) if self.direct else (RAM, LOCAL)) if keep else (RAM,)
        for tier in order:
            if tier == RAM:
                if self.ram.ledger.reserve(n, self.ram_capacity):
                    data, mtime_ns = self._fetch_into(self.ram.ledger, n, fetch)
                    self.counters.add("staged_ram")
                    return Placement(RAM, None, True, data, mtime_ns)
            elif self.local.ledger.reserve(nl, self.local_capacity - self._owed_bytes):   # owed moves first
                data, mtime_ns = self._fetch_into(self.local.ledger, nl, fetch)
                path = self._publish_local(key, data, mtime_ns, nl)
                if path is not None:
                    self.counters.add("staged_local")
                    return Placement(LOCAL, path, True)
                return self._in_hand(data, mtime_ns, n)   # the device is full: the bytes are read already
        self.counters.add("bypassed")
        return Placement(SOURCE, None, False)

    def stage_range(self, keys: list[str], sizes: list[int],
                    read: Callable[[list[int]], tuple[list[bytes], int]]) -> list[Loc | None] | None:
        """Place the samples of one range of the source (plan/ranges.py), read with one request,
        each as its own entry of the local tier: ``read(positions)`` gives the bytes of those of
        ``keys`` (each of its listed size, or an error) and the source's modification time. The
        bytes of the samples absent from the
        tier are reserved before the read; each is then published under its node-wide lock unless
        another thread or process placed it meanwhile (its reservation given back). Returns where
        each key's entry was placed (None: not placed now), or None where the tier has no room for
        the absent ones (nothing was read)."""
        store = self.local
        absent = [k for k in range(len(keys)) if store.find(keys[k]) is None]
        out: list[Loc | None] = [None] * len(keys)
        if not absent:
            return out
        need = [self.stored_size(sizes[k]) for k in absent]   # (compressing: what the plan counts)
        left = sum(need)
        if not store.ledger.reserve(left, self.local_capacity - self._owed_bytes):
            return None
        try:
            t0 = time.perf_counter()
            datas, mtime_ns = read(absent)   # (the caller's read checks each sample's size)
            self.counters.add_many(fetches=1, fetch_seconds=time.perf_counter() - t0)
            self.counters.add("range_reads")
            # each absent key's lock, in lock order (two range writers never wait on each other; a
            # key whose lock byte another key of the range shares is left to be read on its own);
            # a key placed meanwhile (on its own, or by another rank) is left as it is
            held, seen, todo = [], set(), []
            try:
                for j in sorted(range(len(absent)), key=lambda j: store.lock_offset(keys[absent[j]])):
                    k = absent[j]
                    off = store.lock_offset(keys[k])
                    if off in seen or store.claim(keys[k], sizes[k]):
                        store.ledger.give_back(need[j])
                        left -= need[j]
                        continue
                    seen.add(off)
                    held.append(k)
                    todo.append(j)
                todo.sort()
                if todo:
                    left -= sum(need[j] for j in todo)   # write owns them from here
                    try:
                        locs = store.write([(keys[absent[j]], datas[j]) for j in todo], mtime_ns,
                                                       [need[j] for j in todo],
                                                       self.local_capacity - self._owed_bytes)
                    except CacheError as e:   # the device is full (or failing): read the source instead
                        self._warn_once(store.root, f"clairvoyant: cannot write to {store.root} ({e}); samples "
                                        "that do not fit are read from the source until there is room again")
                        locs = []
                    for j, loc in zip(todo, locs):
                        out[absent[j]] = loc
                    self.counters.add("range_placed", sum(loc is not None for loc in locs))
            finally:
                for k in held:
                    store.release(keys[k])
            return out
        finally:
            if left:
                store.ledger.give_back(left)

    @staticmethod
    def _fetch_into(ledger, n: int, fetch: Callable[[], tuple[bytes, int]]) -> tuple[bytes, int]:
        try:
            return fetch()
        except BaseException:
            ledger.give_back(n)
            raise

    def _in_hand(self, data: bytes, mtime_ns: int, n: int) -> Placement:
        """Bytes read for the local tier that the device would not take: the RAM window if it has
        room, else they travel to the reader with the batch (one sample per staging thread at most),
        rather than being read twice."""
        if self.ram.ledger.reserve(n, self.ram_capacity):
            self.counters.add("staged_ram")
            return Placement(RAM, None, True, data, mtime_ns)
        self.counters.add("bypassed")
        return Placement(SOURCE, None, True, data, mtime_ns)

    def stored_size(self, size: int) -> int:
        """What the local tier reserves for a ``size``-byte sample: its entry, or where the tier
        compresses, the entry the plan counts at the measured ratio (plan/compression.py)."""
        if self.local.codec is None:
            return entry_size(size)
        return stored_size(size, self.compress_ratio, entry_size(0))

    def _publish_local(self, key: str, data: bytes, mtime_ns: int, reserved: int | None = None) -> Loc | None:
        """Publish reserved bytes in the local tier; None (reservation given back) if the device
        refuses them, or a compressed entry larger than ``reserved`` finds no room for the rest."""
        store = self.local
        try:
            loc = store.write([(key, data)], mtime_ns, None if reserved is None else [reserved],
                              self.local_capacity - self._owed_bytes)[0]
            if loc is None and store.codec is not None:   # compressed worse than the plan counted, no room left
                self.counters.add("compress_overflow")
            return loc
        except CacheError as e:   # the device is full (or failing): read the source instead
            self._warn_once(store.root, f"clairvoyant: cannot write to {store.root} ({e}); samples that do "
                            "not fit are read from the source until there is room again")
            return None

    # -- after the access -------------------------------------------------------------------

    def after_use_many(self, items: list[tuple[str, Placement, bool, bool]]) -> None:
        """``after_use`` for the samples of one batch: first what frees room (local entries not
        kept, RAM copies not kept), then the kept RAM copies move down, RAM bytes given back in one
        ledger update."""
        ram, moves = 0, []
        for key, placed, keep, corrupt in items:
            if placed.tier == RAM:
                if keep and placed.data is not None:
                    moves.append((key, placed.data, placed.mtime_ns))
                else:
                    ram += entry_size(len(placed.data or b""))
            else:
                self.after_use(key, placed, keep, corrupt)
        try:
            ram += self._move_down(moves)
        finally:   # (on an error, the copies not kept still go back)
            if ram:
                self.ram.ledger.give_back(ram)

    def after_use(self, key: str, placed: Placement, keep: bool, corrupt: bool) -> None:
        if placed.tier == LOCAL:
            if corrupt:
                self.counters.add("corrupt")
            if (not keep or corrupt) and self.local.delete(key):
                self.counters.add("evictions")
        elif placed.tier == RAM:
            if keep and placed.data is not None:
                self.after_use_many([(key, placed, keep, corrupt)])
            else:
                self.ram.ledger.give_back(entry_size(len(placed.data or b"")))

    def settle(self, final: bool = False) -> None:
        """Retry the moves down still owed (an epoch's end: ``final``, those with no room then are
        given up: the plan counted them in, so that is a plan broken by another process's entries)."""
        ram = self._move_down([], final)
        if ram:
            self.ram.ledger.give_back(ram)

    def _move_down(self, moves: list[tuple[str, bytes, int]], final: bool = False) -> int:
        """Move kept samples from the RAM window down to the local tier, those owed from earlier
        batches first. The plan counts a kept sample in from its access on, but staging ahead
        may have filled the room before the entries it evicts at that access were deleted; a move
        with no room yet is owed (its RAM bytes held), retried after the next batch's deletions,
        rather than lost (it would be read from the source again in the next epoch). Owed moves
        hold at most half the RAM window (the oldest are given up beyond that: the local tier is
        short for longer than staging ahead explains). Returns the RAM bytes to give back."""
        with self._owed_lock:
            earlier, self._owed = self._owed, []
        todo = earlier + moves
        if not todo:   # the usual batch: nothing kept, nothing owed (no ledger read)
            return 0
        # (RAM bytes are the samples' entries as they are; local room is what the tier reserves
        # for them, less where it compresses: stored_size)
        was = sum(self.stored_size(len(d)) for _, d, _ in earlier)
        freed, owed, done, ok = 0, [], 0, False
        try:
            free = self.local_capacity - self.local.ledger.read()[0]
            smallest = min((self.stored_size(len(d)) for _, d, _ in todo), default=0)
            if not final and free < smallest:   # nothing can move: no lock, no index lookup
                owed, done = list(todo), len(todo)
                self.counters.add("deferred", len(moves))
            for i, (key, data, mtime_ns) in enumerate(todo[done:], done):
                n = entry_size(len(data))
                if self.local.claim(key, len(data)):   # there already
                    freed += n
                    done = i + 1
                    continue
                try:
                    nl = self.stored_size(len(data))
                    if self.local.ledger.reserve(nl, self.local_capacity):
                        if self._publish_local(key, data, mtime_ns, nl) is not None:
                            self.counters.add("promotions")
                        freed += n   # moved, or the device refused it (warned): the window lets it go
                    elif final:
                        self.counters.add("not_kept")
                        freed += n
                    else:
                        if i >= len(earlier):
                            self.counters.add("deferred")
                        owed.append((key, data, mtime_ns))
                    done = i + 1   # (not on an error: then this one stays owed too)
                finally:
                    self.local.release(key)
            ok = True
        finally:   # (on an error, what was not looked at stays owed, and what was freed goes back here)
            owed += todo[done:]
            cap, held = self.ram_capacity // 2, 0
            for k in range(len(owed) - 1, -1, -1):   # the newest first: the oldest go beyond the cap
                held += entry_size(len(owed[k][1]))
                if held > cap:
                    given_up = owed[:k + 1]
                    owed = owed[k + 1:]
                    self.counters.add("not_kept", len(given_up))
                    freed += sum(entry_size(len(d)) for _, d, _ in given_up)
                    break
            with self._owed_lock:
                self._owed[:0] = owed
                self._owed_bytes += sum(self.stored_size(len(d)) for _, d, _ in owed) - was
            if not ok and freed:
                self.ram.ledger.give_back(freed)
        return freed

    def drop(self, key: str) -> int:
        """Evict a resident the plan will not use before it would have to go (the Loader's plan at an
        epoch's start, the mount's while it stages ahead): the bytes freed, 0 if it was not there."""
        freed = self.local.delete(key)
        if freed:
            self.counters.add("dropped")
        return freed

    def usage(self) -> dict:
        lu, lp = self.local.ledger.read()
        ru, rp = self.ram.ledger.read()
        return {"local": {"dir": self.local.root, "capacity": self.local_capacity, "used": lu, "peak": lp},
                "ram": {"dir": self.ram.root, "capacity": self.ram_capacity, "used": ru, "peak": rp}}
