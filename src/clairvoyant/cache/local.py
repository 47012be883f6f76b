"""MECHANISM: one cache tier of one source in one directory (node-local SSD, or RAM in /dev/shm).

Layout under the tier's directory::

    v2/<source id>/index                             the shared index of entries (extents.py)
    v2/<source id>/ext/<n>                           extent files: entries (sample bytes + trailer)
    v2/<source id>/locks                             byte-range locks, one byte per key hash
    v2/<source id>/usage                             the tier's byte ledger (ledger.py)
    v2/<source id>/<tier>.session.lock, ...          who uses the tiers now (session.py)

Several processes (the ranks of a node) share one tier: a byte-range lock on
the key's slot in ``locks`` makes sure a sample is copied once, and the ledger
keeps the bytes of all of them within the capacity. POSIX record locks vanish
with their process, so a killed rank never leaves a stale lock behind. Each
process appends to an extent of its own; an evicted entry's blocks are freed
by punching a hole, and an extent whose entries are all gone is deleted. The
RAM tier keeps only its ledger and locks in such a directory
(``entries=False``): its bytes stay in the staging process's memory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import threading
import weakref

from ..errors import CacheError, LocalDirNotWritable
from . import crashpoints
from . import publish as _publish
from .codec import Codec, entry_parts
from .entry import entry_size, holds
from ..nodeio.fdcache import FdCache
from ..nodeio.fileio import discard
from .extents import EXTENT_BYTES, Index, Loc, aligned, key_digest, punch
from .ledger import Ledger

LAYOUT = "v2"
log = logging.getLogger("clairvoyant")


def prepare_root(local_dir: str) -> str:
    """Create ``local_dir`` with mode 0700 if needed and check that it is safe and writable."""
    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    try:
        os.makedirs(local_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise LocalDirNotWritable(
            f"cannot create local_dir {local_dir!r}: {e.strerror or e}; pass local_dir= on a writable node-local disk") from e
    st = os.stat(local_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise LocalDirNotWritable(f"local_dir {local_dir!r} is not a directory: pass a directory")
    if st.st_uid != os.getuid():
        raise LocalDirNotWritable(
            f"local_dir {local_dir!r} belongs to uid {st.st_uid}, not to you: pass your own local_dir=")
    if not os.access(local_dir, os.W_OK | os.X_OK):
        raise LocalDirNotWritable(
            f"local_dir {local_dir!r} is not writable: fix its permissions or pass another local_dir=")
    return local_dir


def digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


def source_root(local_dir: str, source_uri: str) -> str:
    return os.path.join(local_dir, LAYOUT, digest(source_uri)[:16])


class LocalStore:
    """Entries of one source in one tier directory, with their shared index and ledger."""

    def __init__(self, local_dir: str, source_uri: str, entries: bool = True, expected: int = 0) -> None:
        """``entries=False``: only the ledger and locks (the RAM window, whose bytes stay in memory).
        ``expected``: about how many samples the source has (sizes the index)."""
        self.codec: Codec | None = None   # compressed staging (cache/codec.py): set by the Loader
        self.local_dir = prepare_root(local_dir)
        self.root = source_root(self.local_dir, source_uri)
        self.ext_dir = os.path.join(self.root, "ext")
        self.index: Index | None = None
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            if entries:
                os.makedirs(self.ext_dir, mode=0o700, exist_ok=True)
                self.index = Index(os.path.join(self.root, "index"), expected)
            self._lock_fd = os.open(os.path.join(self.root, "locks"), os.O_RDWR | os.O_CREAT, 0o600)
            self.ledger = Ledger(os.path.join(self.root, "usage"))
        except OSError as e:
            raise LocalDirNotWritable(
                f"cannot set up the cache in {self.root!r}: {e.strerror or e}; pass another local_dir=") from e
        self._closer = weakref.finalize(self, os.close, self._lock_fd)  # closed with the store, at the latest
        self.expected = int(expected)
        self._files = FdCache(limit=32, opener=lambda p: os.open(p, os.O_RDWR | os.O_CLOEXEC),
                              recheck=True)   # extents this process punches holes in
        self._append = _Appender(self) if entries else None
        self._index_full_told = False
        self._threads = _KeyLocks()   # claims of this process's threads, one at a time per key

    def close(self) -> None:
        if self._append is not None:
            self._append.close()
        self._files.close()
        self._closer()
        self.ledger.close()
        if self.index is not None:
            self.index.close()
        self._lock_fd = -1

    @property
    def session(self) -> int:
        """Entries stamped with this were written in the present session."""
        return self.index.session

    def extent_path(self, n: int) -> str:
        return os.path.join(self.ext_dir, str(n))

    def lock_offset(self, key: str) -> int:
        """The byte of the locks file that is ``key``'s node-wide lock."""
        return key_digest(key) >> 32   # (cache/tier_format.h: key_lock_offset)

    def locate(self, key: str) -> tuple[Loc, int] | None:
        """Where the entry of ``key`` is and the session it was written or checked in, or None."""
        got = self.index.lookup(key_digest(key))
        if got is None:
            return None
        n, offset, length, stamp = got
        return Loc(self.extent_path(n), offset, length), stamp

    def find(self, key: str) -> Loc | None:
        """Where the entry of ``key`` is, or None."""
        got = self.locate(key)
        return None if got is None else got[0]

    def claim(self, key: str, size: int) -> bool:
        """True if the entry of ``key`` (a ``size``-byte sample) is here; else False, and the caller
        holds the node-wide lock of ``key`` until ``release(key)``. The lock excludes the threads of
        this process too (a POSIX record lock alone belongs to the whole process)."""
        off = self.lock_offset(key)
        self._threads.acquire(off)
        try:
            _publish.lock(self._lock_fd, off)
        except BaseException:
            self._threads.release(off)
            raise
        loc = self.find(key)
        present = loc is not None and (loc.length == entry_size(size) if self.codec is None else holds(loc, size))
        if present:
            self.release(key)
        return present

    def release(self, key: str) -> None:
        off = self.lock_offset(key)
        try:
            _publish.release(self._lock_fd, off)
        finally:
            self._threads.release(off)

    def put(self, key: str, data: bytes, mtime_ns: int, capacity: int) -> Loc | None:
        """Reserve room for ``data`` within ``capacity`` and ``write`` it as the entry of ``key``:
        where it is, or None if the ledger has no room (or the index no free slot). Raises
        LocalStorageFull (nothing reserved, nothing left) if the device is full."""
        if not self.ledger.reserve(entry_size(len(data)), capacity):
            return None
        return self.write([(key, data)], mtime_ns)[0]

    def write(self, items: list[tuple[str, bytes]], mtime_ns: int, reserved: list[int] | None = None,
              capacity: int = 0) -> list[Loc | None]:
        """THE way an entry is written (the native engine does the same steps in C): entries of
        ``(key, bytes)``, their bytes reserved in the ledger by the caller, written each at its
        ``place`` and published under one lock of the index (``publish_placed``). Returns where
        each is now, or None where the index had no free slot (its bytes given back). With a
        ``codec`` an entry may be stored compressed: what it did not take of its reservation goes
        back. ``reserved``: the bytes reserved per entry if not its whole entry (compressed staging
        reserves what the plan counts): an entry that takes more reserves the rest within
        ``capacity``, or is not written (None, its reservation given back). A write error gives
        every reservation back and raises (LocalStorageFull for a full device); nothing of them is
        published then."""
        placed: list[tuple[str, _Extent, int, int]] = []
        at: list[int] = []   # the item each placed entry is
        handled = 0          # items placed or given up, in order: the reservations of the rest are whole
        key = items[0][0] if items else ""
        crashpoints.reached("reserved")
        try:
            for j, (key, data) in enumerate(items):
                r = entry_size(len(data)) if reserved is None else int(reserved[j])
                payload, trailer = entry_parts(data, mtime_ns, self.codec)
                m = len(payload) + len(trailer)
                fits = self._fit(r, m, capacity)
                handled = j + 1   # (its reservation is now exactly m, or given back)
                if not fits:
                    continue
                try:
                    ext, offset = self._append.reserve(m)
                except BaseException:
                    self.ledger.give_back(m)
                    raise
                placed.append((key, ext, offset, m))
                at.append(j)
                _publish.write_at(ext.fd, payload, trailer, offset)
        except BaseException as e:
            for _, ext, offset, n in placed:
                self.abandon(ext, offset, n)   # (gives its reservation back)
            rest = sum(entry_size(len(d)) if reserved is None else int(reserved[j])
                       for j, (_, d) in enumerate(items) if j >= handled)
            if rest:
                self.ledger.give_back(rest)
            if isinstance(e, OSError):
                raise _publish.local_error(e, self.root, key) from e
            raise
        crashpoints.reached("tmp_written")
        out: list[Loc | None] = [None] * len(items)
        for j, loc in zip(at, self.publish_placed(placed)):
            out[j] = loc
        crashpoints.reached("published")
        return out

    def _fit(self, reserved: int, m: int, capacity: int) -> bool:
        """Make a reservation of ``reserved`` bytes one of exactly ``m``, the entry as written (less
        where it is stored compressed: the rest goes back; more where it compressed worse than
        reserved for: the rest reserved within ``capacity``). False, the reservation given back,
        where there is no room for the rest."""
        if m > reserved and not self.ledger.reserve(m - reserved, capacity):
            self.ledger.give_back(reserved)
            return False
        if m < reserved:
            self.ledger.give_back(reserved - m)
        return True

    def place(self, nbytes: int) -> tuple[_Extent, int]:
        """A place for an entry of ``nbytes`` (already reserved in the ledger) in this process's
        extent: ``(extent, offset)``. Its writer writes the entry at ``extent.fd``, ``offset``, then
        calls ``publish_placed`` (or ``abandon``), which lets the extent be sealed once full."""
        return self._append.reserve(nbytes)

    def abandon(self, ext: _Extent, offset: int, nbytes: int) -> None:
        """A place that will not be published: whatever was written there is punched out and its
        reservation given back."""
        if ext.fd >= 0:   # (where the file system cannot punch, the extent goes whole once empty)
            punch(ext.fd, offset, nbytes)
        self._append.done(ext)
        self.ledger.give_back(nbytes)

    def publish_placed(self, items: list[tuple[str, _Extent, int, int]]) -> list[Loc | None]:
        """Publish entries written at their places, ``(key, extent, offset, entry bytes)``, under one
        lock of the index: where each is now, or None where the index had no slot (its bytes given
        back). An entry it replaces is freed."""
        try:
            got = self.index.publish_many([(key_digest(k), e.n, o, n) for k, e, o, n in items])
        except BaseException:   # raised before anything was published (publish_many's contract)
            for _, ext, offset, n in items:
                self.abandon(ext, offset, n)
            raise
        out: list[Loc | None] = []
        for (_, ext, offset, n), old in zip(items, got):
            if isinstance(old, Exception):   # not published (no free slot)
                self.abandon(ext, offset, n)
                out.append(None)
                if not self._index_full_told:
                    self._index_full_told = True
                    log.warning("clairvoyant: the index of %s has no room for another sample (the source has "
                                "more samples than when the cache was set up); the rest is read from the source: "
                                "start a new job (the index grows when a session starts)", self.root)
                continue
            self._append.done(ext)
            if old is not None:
                self._free(*old, False)
                self.ledger.give_back(old[2])
            out.append(Loc(self.extent_path(ext.n), offset, n))
        return out

    @property
    def lock_fd(self) -> int:
        """The node-wide locks file (byte ``lock_offset(key)`` is the lock of ``key``)."""
        return self._lock_fd

    def unlock(self, key: str) -> None:
        """Let go of a key's node-wide lock taken by another hand of this process (the native
        stager's threads), without the in-process mutex ``claim`` takes."""
        _publish.release(self._lock_fd, self.lock_offset(key))

    def delete(self, key: str, loc: Loc | None = None) -> int:
        """Remove the entry of ``key`` (with ``loc``: only if it is still that one); the bytes it held
        (0 if it was not there)."""
        at = None if loc is None else (int(os.path.basename(loc.path)), loc.offset)
        got = self.index.retract(key_digest(key), at)
        if got is None:
            return 0
        crashpoints.reached("unlinked")
        n, offset, length, empty = got
        self._free(n, offset, length, empty)
        self.ledger.give_back(length)
        return length

    def restamp(self, key: str, loc: Loc) -> None:
        """The entry at ``loc`` was checked against the source: current for this session."""
        self.index.restamp(key_digest(key), int(os.path.basename(loc.path)), loc.offset)

    def _free(self, n: int, offset: int, length: int, empty: bool) -> None:
        path = self.extent_path(n)
        if empty:   # sealed, and its last entry gone: the whole file goes
            self._files.forget(path)
            discard(path)
            return
        try:
            with self._files.using(path, path) as fd:
                punch(fd, offset, length)
        except FileNotFoundError:
            pass

    def recover(self) -> dict[str, int]:
        """For the first process of a session: make the index agree with the extents on disk (what a
        kill left half done is dropped), delete extents no entry uses, set the ledger; the entries
        present (16 hex digits of the key's digest -> entry bytes)."""
        def size(n: int) -> int:
            try:
                return os.stat(self.extent_path(n)).st_size
            except FileNotFoundError:
                return -1
        keep = self.index.recover(size, self.expected)
        live = {str(e) for e in set(keep["extent"].tolist())}
        for name in os.listdir(self.ext_dir):
            if name not in live:
                discard(os.path.join(self.ext_dir, name))
        self.ledger.set(int(keep["length"].sum()))
        return {f"{int(d):016x}": int(n) for d, n in zip(keep["digest"].tolist(), keep["length"].tolist())}

    def entries(self) -> dict[str, int]:
        """Every present entry: 16 hex digits of its key's digest -> entry bytes."""
        t = self.index.present()
        return {f"{int(d):016x}": int(n) for d, n in zip(t["digest"].tolist(), t["length"].tolist())}


class _KeyLocks:
    """One mutex per key slot held by a thread of this process (made on demand, dropped when no
    thread holds or waits for it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, list] = {}   # slot -> [mutex, holders and waiters]

    def acquire(self, slot: int) -> None:
        with self._lock:
            e = self._held.get(slot)
            if e is None:
                e = self._held[slot] = [threading.Lock(), 0]
            e[1] += 1
        e[0].acquire()

    def release(self, slot: int) -> None:
        with self._lock:
            e = self._held[slot]
            e[1] -= 1
            if e[1] == 0:
                del self._held[slot]
        e[0].release()


class _Extent:
    __slots__ = ("n", "fd", "end", "users", "retired")

    def __init__(self, n: int, fd: int) -> None:
        self.n, self.fd, self.end, self.users, self.retired = n, fd, 0, 0, False


class _Appender:
    """This process's current extent: threads reserve a range under a lock and write it in
    parallel; a full extent is sealed once its last write has been published."""

    def __init__(self, store: LocalStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._cur: _Extent | None = None
        self._pid = os.getpid()

    def reserve(self, nbytes: int) -> tuple[_Extent, int]:
        """A range of ``nbytes`` in the current extent (a new one if it is full), to be written by
        the caller and then ``done``."""
        span = aligned(nbytes)
        with self._lock:
            if self._pid != os.getpid():   # a forked child appends to an extent of its own
                self._pid, self._cur = os.getpid(), None
            cur = self._cur
            if cur is None or (cur.end and cur.end + span > EXTENT_BYTES):
                cur = self._rotate()
            offset = cur.end
            cur.end += span
            cur.users += 1
        return cur, offset

    def _rotate(self) -> _Extent:
        store = self._store
        n = store.index.new_extent()
        fd = os.open(store.extent_path(n), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        old, self._cur = self._cur, _Extent(n, fd)
        if old is not None:
            old.retired = True
            self._retire(old)
        return self._cur

    def done(self, ext: _Extent) -> None:
        """A write into ``ext`` is published (or failed)."""
        with self._lock:
            ext.users -= 1
            self._retire(ext)

    def _retire(self, ext: _Extent) -> None:
        if ext.retired and ext.users == 0 and ext.fd >= 0:
            os.close(ext.fd)
            ext.fd = -1
            if self._store.index.seal(ext.n):   # nothing in it lives: it goes
                discard(self._store.extent_path(ext.n))

    def close(self) -> None:
        with self._lock:
            if self._cur is not None and self._pid == os.getpid():
                self._cur.retired = True
                self._retire(self._cur)
            self._cur = None


def remove_tree(root: str) -> None:
    """Remove a whole tier directory of a source (the RAM tier when its last user leaves)."""
    try:
        shutil.rmtree(root)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CacheError(f"cannot remove {root}: {e.strerror or e}") from e
