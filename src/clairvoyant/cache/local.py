"""MECHANISM: one cache tier of one source in one directory (node-local SSD, or RAM in /dev/shm).

Layout under the tier's directory::

    v1/<source id>/data/<xx>/<sha1 of key>           entries: sample bytes + trailer (entry.py)
    v1/<source id>/tmp/<xx>/<pid>.<name>.<n>         writes in progress, and spare files for reuse
    v1/<source id>/locks                             byte-range locks, one byte per key hash
    v1/<source id>/usage                             the tier's byte ledger (ledger.py)
    v1/<source id>/<tier>.session.lock, ...          who uses the tiers now (session.py)

Several processes (the ranks of a node) share one tier: a byte-range lock on
the key's slot in ``locks`` makes sure a sample is copied once, and the ledger
keeps the bytes of all of them within the capacity. POSIX record locks vanish
with their process, so a killed rank never leaves a stale lock behind. The RAM tier keeps only its ledger and locks in such a directory
(``entries=False``): its bytes stay in the staging process's memory.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import shutil
import stat
import weakref

from ..errors import CacheError, LocalDirNotWritable
from . import crashpoints
from . import publish as _publish
from .entry import entry_size, seal
from .ledger import Ledger
from .publish import remove_orphans

LAYOUT = "v1"
MAX_SPARES = 4096   # evicted files kept for reuse per process
SHARDS = [f"{i:02x}" for i in range(256)]


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
    """Entries of one source in one tier directory, with their shared ledger."""

    def __init__(self, local_dir: str, source_uri: str, entries: bool = True) -> None:
        """``entries=False``: only the ledger and locks (the RAM window, whose bytes stay in memory)."""
        self.local_dir = prepare_root(local_dir)
        self.root = source_root(self.local_dir, source_uri)
        self.data_dir = os.path.join(self.root, "data")
        self.tmp_dir = os.path.join(self.root, "tmp")
        try:
            # 256 shards each for data and temporary files: concurrent creates and renames of many
            # staging threads would otherwise queue on one directory's lock
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            for d in (self.data_dir, self.tmp_dir) if entries else ():
                os.makedirs(d, mode=0o700, exist_ok=True)
                for shard in SHARDS:
                    os.makedirs(os.path.join(d, shard), exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.root, "locks"), os.O_RDWR | os.O_CREAT, 0o600)
            self.ledger = Ledger(os.path.join(self.root, "usage"))
        except OSError as e:
            raise LocalDirNotWritable(
                f"cannot set up the cache in {self.root!r}: {e.strerror or e}; pass another local_dir=") from e
        self._closer = weakref.finalize(self, os.close, self._lock_fd)  # closed with the store, at the latest
        # Evicted entries' files, emptied and kept under temporary names of this process, to be
        # rewritten by the next put: on a file system that pays per created or deleted inode (ext4
        # without a journal scans recently deleted inodes on every create) this saves both.
        self._spares: collections.deque[str] = collections.deque()
        self._spare_seq = itertools.count()
        self.orphans_removed = sum(remove_orphans(os.path.join(self.tmp_dir, s)) for s in SHARDS)

    def close(self) -> None:
        while self._spares:
            try:
                os.unlink(self._spares.pop())
            except FileNotFoundError:
                pass
        self._closer()
        self.ledger.close()
        self._lock_fd = -1

    def path_for(self, key: str) -> str:
        d = digest(key)
        return os.path.join(self.data_dir, d[:2], d)

    def _tmp_for(self, final: str) -> str:
        return os.path.join(self.tmp_dir, os.path.basename(final)[:2])

    def _offset(self, key: str) -> int:
        return int(digest(key)[:8], 16)

    def claim(self, key: str, size: int) -> bool:
        """True if the entry of ``key`` (a ``size``-byte sample) is here; else False, and the caller
        holds the node-wide lock of ``key`` until ``release(key)``."""
        return _publish.claim(self._lock_fd, self._offset(key), self.path_for(key), entry_size(size))

    def release(self, key: str) -> None:
        _publish.release(self._lock_fd, self._offset(key))

    def put(self, key: str, data: bytes, mtime_ns: int, capacity: int) -> str | None:
        """Publish ``data`` as the entry of ``key`` if the tier has room; its path, or None if the
        ledger has no room. Raises LocalStorageFull (nothing reserved, nothing left) if the device is full."""
        if not self.ledger.reserve(entry_size(len(data)), capacity):
            return None
        return self.put_reserved(key, data, mtime_ns)

    def put_reserved(self, key: str, data: bytes, mtime_ns: int) -> str:
        """Publish ``data`` as the entry of ``key``, its bytes already reserved in the ledger (given
        back if the publish fails: LocalStorageFull when the device is full)."""
        n = entry_size(len(data))
        crashpoints.reached("reserved")
        final = self.path_for(key)
        trailer = seal(data, mtime_ns)
        hook = (lambda: crashpoints.reached("tmp_written")) if crashpoints.ARMED else None
        try:
            spare = self._spares.popleft()
        except IndexError:
            spare = None
        try:
            _publish.publish_entry(final, self._tmp_for(final), data, trailer, hook, spare)
        except BaseException:
            self.ledger.give_back(n)
            if spare is not None:   # the publish removes it on its own failures; not on a fault before
                try:
                    os.unlink(spare)
                except FileNotFoundError:
                    pass
            raise
        crashpoints.reached("published")
        return final

    def delete(self, key: str) -> int:
        """Remove the entry of ``key``; the bytes it held (0 if it was not there)."""
        return self.delete_path(self.path_for(key))

    def delete_path(self, path: str) -> int:
        """Remove an entry; its file becomes a spare for the next put (emptied, under a temporary
        name of this process, so a crash leaves only an orphan for the next session to remove)."""
        spare = os.path.join(self.tmp_dir, os.path.basename(path)[:2],
                             f"{_publish.pid()}.spare.{next(self._spare_seq)}")
        try:
            n = os.stat(path).st_size
            os.rename(path, spare)
        except FileNotFoundError:
            return 0
        crashpoints.reached("unlinked")
        self.ledger.give_back(n)
        try:
            os.truncate(spare, 0)
        except OSError:
            os.unlink(spare)
            return n
        if len(self._spares) < MAX_SPARES:
            self._spares.append(spare)
        else:
            os.unlink(spare)
        return n

    def entries(self) -> dict[str, int]:
        """Every published entry: file name -> bytes on disk."""
        return scan_entries(self.data_dir)


def scan_entries(data_dir: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for shard in SHARDS:
        try:
            with os.scandir(os.path.join(data_dir, shard)) as it:
                for e in it:
                    try:
                        out[e.name] = e.stat().st_size
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            continue
    return out


def remove_tree(root: str) -> None:
    """Remove a whole tier directory of a source (the RAM tier when its last user leaves)."""
    try:
        shutil.rmtree(root)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CacheError(f"cannot remove {root}: {e.strerror or e}") from e
