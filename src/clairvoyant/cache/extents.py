"""MECHANISM: where the local tier's entries live: large extent files, and one shared index.

One file per staged sample cost a create, a rename and later an unlink: on this
project's ext4 machines 300-900 us of kernel time per sample, more than the
decode. Entries are appended instead to extent files of up to 64 MiB, each at
a 4 KiB-aligned offset (so an evicted entry's blocks are freed exactly by
punching a hole, and the disk holds what one file per entry held), and found
through an index that every process of the node maps::

    index     header (4 KiB) | live entries per extent (u32, one per slot) | slots
    ext/<n>   extent n: entries (sample bytes + trailer, cache/entry.py) at aligned offsets

A slot (32 bytes: key digest, sequence, extent, offset, length, session stamp)
is an open-addressing hash table entry keyed by the first 8 bytes of sha1(key),
the manifest's digest. A slot once given to a digest stays that digest's, so
deletes need no tombstones. Writers change slots under one lock (a thread lock
and ``flock``); readers need none: the sequence is odd while a slot changes
(a seqlock), and a reader retries.

Crash consistency: an entry's bytes are written before its slot says it is
there, and a reader checks the entry's checksum anyway. A process killed
between the two leaves bytes no slot points to; a slot torn mid-update keeps
an odd sequence. The first process of the next session (``recover``) drops
such slots, recounts the live entries per extent, deletes empty extents and
returns what is present, from which the ledger is set.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import hashlib
import mmap
import os
import struct
import threading
import weakref
from typing import NamedTuple

import numpy as np

from ..nodeio.fdcache import FdCache

ALIGN = 4096
EXTENT_BYTES = 64 << 20
SEALED = 1 << 31                   # in an extent's live count: no process appends to it any more
_MAGIC = b"CVINDEX1"
_HEAD = struct.Struct("<8sIIQQ")   # magic, version, slot bits, next extent number, session counter
_HEADER_BYTES = 4096
_COUNTS = _HEADER_BYTES
_SLOT = struct.Struct("<QIIQII")   # digest, seq, extent, offset, length (0: absent), stamp
_SEQ = struct.Struct("<I")
_U32 = struct.Struct("<I")
_SEALED_U32 = (1 << 31).to_bytes(4, "little")
SLOT_DTYPE = np.dtype([("digest", "<u8"), ("seq", "<u4"), ("extent", "<u4"), ("offset", "<u8"),
                       ("length", "<u4"), ("stamp", "<u4")])
_MIN_BITS = 12
_FALLOC_PUNCH = 0x01 | 0x02        # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


class Loc(NamedTuple):
    """Where one entry is: its extent file, byte offset and length (sample bytes + trailer)."""

    path: str
    offset: int
    length: int


@functools.lru_cache(maxsize=1 << 13)
def key_digest(key: str) -> int:
    """The index's key for ``key``: the first 8 bytes of sha1 (the manifest's digest), never 0.
    Remembered for the last 8,192 keys: staging one sample asks for its digest about eight times
    (its lock byte, lookups, the publish)."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big") or 1


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def slot_bits_for(expected: int) -> int:
    """Slots for ``expected`` keys at a load of at most 5/8."""
    return max(_MIN_BITS, int(max(1, expected * 8 // 5)).bit_length())


def _file_bytes(bits: int) -> int:
    return _COUNTS + (4 + _SLOT.size) * (1 << bits)


def _allocate(fd: int, nbytes: int, path: str) -> None:
    """Give the file ``nbytes`` of real blocks (zeros)."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
            raise
        os.ftruncate(fd, nbytes)   # a file system without fallocate: sparse, as before
    if os.fstat(fd).st_size < nbytes:
        os.ftruncate(fd, nbytes)


class IndexFull(Exception):
    """No free slot for a new key (the manifest grew past what the index was sized for)."""


class Index:
    """The shared index of one local tier (see the module docstring)."""

    def __init__(self, path: str, expected: int = 0) -> None:
        self.path = path
        self._tlock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                head = os.pread(self._fd, _HEAD.size, 0)
                if len(head) < _HEAD.size or _HEAD.unpack(head)[0] != _MAGIC:
                    self._format(slot_bits_for(expected))
                self._map()   # under the lock: never a file another process is growing
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(self._fd)
            raise
        self._closer = weakref.finalize(self, _close_map, self, self._fd)

    def _format(self, bits: int) -> None:
        """Lay out an empty index of 2**bits slots, its blocks allocated now: a full device says so
        here (LocalStorageFull), never later as a fault on a mapped page."""
        os.ftruncate(self._fd, 0)
        _allocate(self._fd, _file_bytes(bits), self.path)
        os.pwrite(self._fd, _SEALED_U32 * (1 << bits), _COUNTS)   # every extent number free
        os.pwrite(self._fd, _HEAD.pack(_MAGIC, 1, bits, 0, 0), 0)

    def _map(self) -> None:
        self._mm = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
        bits = _HEAD.unpack_from(self._mm, 0)[2]
        if len(self._mm) < _file_bytes(bits):
            raise OSError(errno.EINVAL, f"the index {self.path} is truncated")
        self._layout(bits)

    def _layout(self, bits: int) -> None:
        self.slots = 1 << bits
        self._mask = self.slots - 1
        self.max_extents = self.slots   # an extent lives while one entry does: never more than slots
        self._slots_at = _COUNTS + 4 * self.slots

    def close(self) -> None:
        self._closer()

    # -- locking -------------------------------------------------------------------------------

    def _lock(self) -> None:
        self._tlock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._follow()
        except BaseException:
            self._tlock.release()
            raise

    def _follow(self) -> None:
        """Map the index again if another process grew it (a new session's first process, for a
        data set that grew) since this one mapped it. Call with the file lock held."""
        if _HEAD.unpack_from(self._mm, 0)[2] != self.slots.bit_length() - 1:
            old = self._mm
            self._map()
            try:
                old.close()
            except BufferError:   # a numpy view still uses it: it goes with the view
                pass

    def _unlock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._tlock.release()

    # -- the header ----------------------------------------------------------------------------

    @property
    def session(self) -> int:
        """The session counter (``recover`` advances it): entries stamped with it were written now."""
        return _HEAD.unpack_from(self._mm, 0)[4] & 0xFFFFFFFF

    def new_extent(self) -> int:
        """A fresh extent number whose count is zero and unsealed (its file is the caller's to create)."""
        self._lock()
        try:
            magic, version, bits, nxt, session = _HEAD.unpack_from(self._mm, 0)
            for step in range(self.max_extents):
                n = (nxt + step) % self.max_extents
                if _U32.unpack_from(self._mm, _COUNTS + 4 * n)[0] == SEALED:   # sealed and empty: free
                    _U32.pack_into(self._mm, _COUNTS + 4 * n, 0)
                    _HEAD.pack_into(self._mm, 0, magic, version, bits, n + 1, session)
                    return n
            raise OSError(errno.ENOSPC, "every extent number is in use")
        finally:
            self._unlock()

    def seal(self, extent: int) -> bool:
        """No more appends to ``extent``; True if it holds no live entry (its file may go)."""
        self._lock()
        try:
            v = _U32.unpack_from(self._mm, _COUNTS + 4 * extent)[0] | SEALED
            _U32.pack_into(self._mm, _COUNTS + 4 * extent, v)
            return v == SEALED
        finally:
            self._unlock()

    def live(self, extent: int) -> int:
        return _U32.unpack_from(self._mm, _COUNTS + 4 * extent)[0] & ~SEALED

    # -- slots ---------------------------------------------------------------------------------

    def _find(self, digest: int) -> int:
        """The slot of ``digest``, or -1-(the first free slot on its probe) if it has none."""
        mm, mask, i = self._mm, self._mask, digest & self._mask
        for _ in range(self.slots):
            d = struct.unpack_from("<Q", mm, self._slots_at + _SLOT.size * i)[0]
            if d == digest:
                return i
            if d == 0:
                return -1 - i
            i = (i + 1) & mask
        return -1 - self.slots

    def lookup(self, digest: int) -> tuple[int, int, int, int] | None:
        """``(extent, offset, length, stamp)`` of the present entry of ``digest``, or None."""
        if _HEAD.unpack_from(self._mm, 0)[2] != self.slots.bit_length() - 1:   # grown elsewhere
            self._lock()
            self._unlock()
        mm = self._mm
        for _ in range(1000):
            i = self._find(digest)
            if i < 0:
                return None
            at = self._slots_at + _SLOT.size * i
            d, seq, extent, offset, length, stamp = _SLOT.unpack_from(mm, at)
            if seq & 1 or _SEQ.unpack_from(mm, at + 8)[0] != seq:
                continue   # a writer is changing it: read again
            return (extent, offset, length, stamp) if length else None
        return None

    def _write(self, i: int, digest: int, extent: int, offset: int, length: int, stamp: int) -> None:
        at = self._slots_at + _SLOT.size * i
        seq = _SEQ.unpack_from(self._mm, at + 8)[0]
        odd = ((seq + 1) | 1) & 0xFFFFFFFF       # odd: changing (also after a writer killed mid-way)
        _SEQ.pack_into(self._mm, at + 8, odd)
        _SLOT.pack_into(self._mm, at, digest, odd, extent, offset, length, stamp)
        _SEQ.pack_into(self._mm, at + 8, (odd + 1) & 0xFFFFFFFF)   # even: settled

    def _count(self, extent: int, delta: int) -> int:
        at = _COUNTS + 4 * extent
        v = _U32.unpack_from(self._mm, at)[0]
        v = (v & SEALED) | max(0, (v & ~SEALED) + delta)
        _U32.pack_into(self._mm, at, v)
        return v

    def publish(self, digest: int, extent: int, offset: int, length: int) -> tuple[int, int, int] | None:
        """Record the entry of ``digest``; the entry it replaces (extent, offset, length), if any.
        Raises IndexFull when the key is new and no slot is free."""
        self._lock()
        try:
            return self._publish(digest, extent, offset, length)
        finally:
            self._unlock()

    def publish_many(self, entries: list[tuple[int, int, int, int]]) -> list:
        """``publish`` of each ``(digest, extent, offset, length)`` under one lock: per entry, what it
        replaced (or None), or the exception that kept it out (IndexFull: no free slot). It raises
        only before publishing anything (taking the lock)."""
        out: list = []
        self._lock()
        try:
            for digest, extent, offset, length in entries:
                try:
                    out.append(self._publish(digest, extent, offset, length))
                except Exception as e:
                    out.append(e)
            return out
        finally:
            self._unlock()

    def _publish(self, digest: int, extent: int, offset: int, length: int) -> tuple[int, int, int] | None:
        i = self._find(digest)
        old = None
        if i < 0:
            i = -1 - i
            if i >= self.slots:
                raise IndexFull(self.path)
        else:
            _, seq, e, o, n, _ = _SLOT.unpack_from(self._mm, self._slots_at + _SLOT.size * i)
            if n and not seq & 1:   # a slot torn by a kill: its fields are not trusted
                old = (e, o, n)
                self._count(e, -1)
        self._write(i, digest, extent, offset, length, self.session)
        self._count(extent, +1)
        return old

    def retract(self, digest: int, at: tuple[int, int] | None = None) -> tuple[int, int, int, bool] | None:
        """Mark the entry of ``digest`` absent: ``(extent, offset, length, extent now empty and
        sealed)``, or None if it was not there (or, with ``at``, no longer at that extent and
        offset: another process replaced it meanwhile)."""
        self._lock()
        try:
            i = self._find(digest)
            if i < 0:
                return None
            _, seq, e, o, n, _ = _SLOT.unpack_from(self._mm, self._slots_at + _SLOT.size * i)
            if seq & 1:   # torn by a kill: now absent, and nothing of it is trusted
                self._write(i, digest, 0, 0, 0, 0)
                return None
            if not n or (at is not None and (e, o) != at):
                return None
            self._write(i, digest, e, o, 0, 0)
            return e, o, n, self._count(e, -1) == SEALED
        finally:
            self._unlock()

    def restamp(self, digest: int, extent: int, offset: int) -> None:
        """The entry of ``digest`` (still at ``extent``/``offset``) was checked against the source:
        stamp it with this session."""
        self._lock()
        try:
            i = self._find(digest)
            if i >= 0:
                _, _, e, o, n, _ = _SLOT.unpack_from(self._mm, self._slots_at + _SLOT.size * i)
                if n and (e, o) == (extent, offset):
                    self._write(i, digest, e, o, n, self.session)
        finally:
            self._unlock()

    def table(self) -> np.ndarray:
        """A copy of every slot (SLOT_DTYPE)."""
        try:
            return np.frombuffer(self._mm, SLOT_DTYPE, self.slots, self._slots_at).copy()
        finally:
            self._unmap_pages()

    def _unmap_pages(self) -> None:
        """After a pass over every slot: take the index's pages out of this process's resident set.
        They stay in the page cache (a shared file mapping: dirty pages are kept and written back,
        nothing is lost); a later lookup maps back only the page it touches. At 1.28 M keys the
        index is 72 MB, which a rank would otherwise hold resident from its first pass on."""
        try:
            self._mm.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):   # no madvise here: the pages just stay
            pass

    def present(self) -> np.ndarray:
        t = self.table()
        return t[(t["length"] > 0) & (t["seq"] % 2 == 0)]

    # -- a new session -------------------------------------------------------------------------

    def recover(self, extent_size, expected: int = 0) -> np.ndarray:
        """For the first process of a session (no other process uses the tier): drop slots torn by
        a kill or pointing past their extent's end (``extent_size(n)``: its size, or -1 if gone),
        recount live entries, seal every extent, grow the table if ``expected`` keys need it, and
        advance the session. Returns the present slots."""
        self._lock()
        try:
            t = np.frombuffer(self._mm, SLOT_DTYPE, self.slots, self._slots_at).copy()
            used = t["digest"] != 0
            ok = used & (t["length"] > 0) & (t["seq"] % 2 == 0)
            size_of = np.full(self.max_extents, -1, dtype=np.int64)
            for e in np.unique(t["extent"][ok]).tolist():
                size_of[e] = extent_size(e)
            ok &= t["offset"].astype(np.int64) + t["length"] <= size_of[t["extent"]]
            keep = t[ok]
            magic, version, bits, nxt, session = _HEAD.unpack_from(self._mm, 0)
            want = slot_bits_for(max(expected, len(keep)))
            if want > bits:   # grow: every slot moves (rare: a data set that grew)
                self._mm.close()
                os.ftruncate(self._fd, 0)
                _allocate(self._fd, _file_bytes(want), self.path)
                self._mm = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
                bits = want
                self._layout(bits)
                slots = np.frombuffer(self._mm, SLOT_DTYPE, self.slots, self._slots_at)
                for row in keep:
                    i = int(row["digest"]) & self._mask
                    while slots[i]["digest"] != 0:
                        i = (i + 1) & self._mask
                    slots[i] = row
                slots["seq"] = 0
            else:             # in place: digests keep their slots
                slots = np.frombuffer(self._mm, SLOT_DTYPE, self.slots, self._slots_at)
                bad = np.flatnonzero(used & ~ok)
                slots["seq"] = 0
                slots["length"][bad] = 0
                slots["stamp"][bad] = 0
            del slots
            counts = np.frombuffer(self._mm, "<u4", self.max_extents, _COUNTS)
            counts[:] = SEALED
            if len(keep):
                live = np.bincount(keep["extent"].astype(np.int64), minlength=self.max_extents)[:self.max_extents]
                counts[:] = SEALED | live.astype(np.uint32)
            del counts
            _HEAD.pack_into(self._mm, 0, magic, version, bits, nxt, (session + 1) & 0xFFFFFFFF)
            self._unmap_pages()
            return keep
        finally:
            self._unlock()

    def clear(self) -> None:
        """Forget every entry (``clairvoyant cache clear``)."""
        self._lock()
        try:
            np.frombuffer(self._mm, np.uint8, self.slots * _SLOT.size, self._slots_at)[:] = 0
            np.frombuffer(self._mm, "<u4", self.max_extents, _COUNTS)[:] = SEALED
            self._unmap_pages()
        finally:
            self._unlock()


def _close_map(index: Index, fd: int) -> None:
    try:
        index._mm.close()
    except (BufferError, ValueError):
        pass
    os.close(fd)


# -- files --------------------------------------------------------------------------------------

_libc = None


def punch(fd: int, offset: int, length: int) -> bool:
    """Free the blocks of ``[offset, offset + length)`` (aligned), keeping the file's size. False
    where the file system cannot (the bytes then stay until the extent goes)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    return _libc.fallocate(fd, _FALLOC_PUNCH, offset, aligned(length)) == 0


_READERS = FdCache(limit=64, recheck=True)   # this process's extents, for reading


def read_at(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the extent at ``path`` (fewer at its end)."""
    with _READERS.using(path, path) as fd:
        return os.pread(fd, length, offset)


def read_entry(loc: Loc) -> bytes:
    """The whole entry at ``loc`` (FileNotFoundError if its extent is gone; short if truncated)."""
    with _READERS.using(loc.path, loc.path) as fd:
        out = os.pread(fd, loc.length, loc.offset)
        if len(out) < loc.length:   # a short read from a regular file: the end of the file
            out += os.pread(fd, loc.length - len(out), loc.offset + len(out))
    return out
