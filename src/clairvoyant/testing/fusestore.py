"""The emulated slow store as a real FUSE mount: reads go through the kernel.

:class:`EmulatedStore` charges its latencies inside the reading process, which
skips what a real parallel file system client costs: the system calls, the
FUSE round trip through the kernel to a daemon, and the page cache.
:class:`FuseStore` serves a directory through ``emufs`` (``emufs.c`` here, a
libfuse3 daemon built with the package), so that any program given its
``.path`` (clairvoyant's Loader, PyTorch's DataLoader, ``cat``) pays them.

The model is EmulatedStore's, per request the kernel sends to the daemon:

- at most ``max_inflight`` opens, reads and listings are in service at once;
- an open, and a directory listing, holds its slot for ``open_latency`` seconds;
- a read of n bytes holds its slot until ``max(start + read_latency, pipe free)
  + n / bandwidth``: one shared pipe, each read queued after the reads before it;
- getattr (stat) is free; it is counted, as ``getattrs``.

Every open starts with a cold page cache (the daemon never sets ``keep_cache``,
so the kernel drops a file's cached pages when it is opened again), like a
shared store far larger than the client's RAM; within one open the page cache
and readahead work as usual, so the kernel decides how many read requests a
file costs (usually one for a 30 KB image).

The counters live in a small file the daemon maps (a fixed little-endian
struct), which :meth:`FuseStore.counters` and :meth:`FuseStore.reset` map too:
no round trip to the daemon. Linux only; needs /dev/fuse, fusermount3 and FUSE 3's
shared library (Debian: fuse3), and clairvoyant built where libfuse3's headers were
(``scripts/install-sysdeps.sh``), as the daemon is built at install, never at run time.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import tempfile
import weakref

from ..errors import ConfigError, SourceError, SourceNotFound
from ..fuse.daemon import Daemon, check_mountpoint, mounted, start, teardown, wait_mounted
from .emulated import Counters

# magic, version, size; opens, reads, bytes, listings, getattrs, peak in flight, in flight now
_LAYOUT = struct.Struct("<8sII7Q")
_MAGIC, _VERSION = b"CVEMUFS\0", 1
_COUNTERS_AT, _N_RESET = 16, 6  # reset zeroes the first six counters, not "in flight now"
_MAX_INFLIGHT = 4096


_DAEMON = Daemon("emufs", os.path.dirname(os.path.abspath(__file__)))   # built from emufs.c by setup.py
_mounted = mounted


def fuse_available() -> tuple[bool, str]:
    """Whether a FuseStore can be mounted here; when not, the reason and what to install."""
    return _DAEMON.available()


def daemon_binary() -> str:
    """The emufs daemon's executable, installed with the package (SourceError saying how to get it
    where the package has none)."""
    return _DAEMON.binary()


class FuseStore:
    """``directory`` served read-only at ``.path`` through FUSE, as a busy shared file system.

    A context manager; ``close()`` unmounts, waits for the daemon and removes every temporary
    file (also done at garbage collection and at exit). ``mountpoint`` must be an empty
    directory; by default a temporary one is made, and removed at close.
    """

    def __init__(self, directory: str | os.PathLike[str], mountpoint: str | os.PathLike[str] | None = None, *,
                 open_latency: float = 0.010, read_latency: float = 0.002, bandwidth: float = 400e6,
                 max_inflight: int = 64, ready_timeout: float = 10.0) -> None:
        if not (open_latency >= 0 and read_latency >= 0):
            raise ConfigError(f"latencies must be >= 0 seconds, got open {open_latency}, read {read_latency}")
        if not bandwidth > 0:
            raise ConfigError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) \
                or not 1 <= max_inflight <= _MAX_INFLIGHT:
            raise ConfigError(f"max_inflight must be an integer in [1, {_MAX_INFLIGHT}], got {max_inflight!r}")
        self.source = os.path.realpath(os.fspath(directory))
        if not os.path.isdir(self.source):
            raise SourceNotFound(f"{self.source}: no such directory to serve through FUSE")
        ok, why = fuse_available()
        if not ok:
            raise SourceError(f"cannot mount {self.source} through FUSE: {why}")
        self.open_latency, self.read_latency = float(open_latency), float(read_latency)
        self.bandwidth, self.max_inflight = float(bandwidth), max_inflight
        if mountpoint is not None:
            mnt = check_mountpoint(mountpoint)
        binary = daemon_binary()
        work = tempfile.mkdtemp(prefix="clairvoyant-emufs-")
        own_mnt = mountpoint is None
        if own_mnt:
            mnt = os.path.join(work, "mnt")
            os.mkdir(mnt)
        self.path: str = mnt
        self._counters_path = os.path.join(work, "counters")
        log = os.path.join(work, "emufs.log")
        self._held: dict = {}
        self._last: Counters | None = None
        cmd = [binary, "-f", "--watch-parent", f"--open-latency={self.open_latency!r}",
               f"--read-latency={self.read_latency!r}", f"--bandwidth={self.bandwidth!r}",
               f"--max-inflight={max_inflight}", f"--counters={self._counters_path}", self.source, mnt]
        try:
            proc = start(cmd, log)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        self.pid = proc.pid
        self._finalizer = weakref.finalize(self, teardown, proc, mnt, work, own_mnt, self._held)
        try:
            wait_mounted(proc, self.path, log, ready_timeout, f"emufs serving {self.source}")
            self._held["mm"] = self._map_counters()
        except BaseException:
            self._finalizer()
            raise

    def _map_counters(self) -> mmap.mmap:
        with open(self._counters_path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), _LAYOUT.size)
        magic, version, size = _LAYOUT.unpack_from(mm, 0)[:3]
        if (magic, version, size) != (_MAGIC, _VERSION, _LAYOUT.size):
            mm.close()
            raise SourceError(f"{self._counters_path}: counters file of another emufs version (magic {magic!r}, "
                              f"version {version}, size {size}): the emufs daemon {daemon_binary()} is not of "
                              "this clairvoyant's version; install clairvoyant again")
        return mm

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def counters(self) -> Counters:
        """Operations served since the last reset (after close: the last figures)."""
        mm = self._held.get("mm")
        if mm is None:
            if self._last is None:
                raise SourceError(f"the FuseStore on {self.path} is closed and never counted")
            return self._last
        v = _LAYOUT.unpack_from(mm, 0)
        return Counters(opens=v[3], reads=v[4], bytes=v[5], listings=v[6], peak_inflight=v[8], getattrs=v[7])

    def reset(self) -> None:
        """Zero the counters; the peak in flight restarts from the requests admitted next.
        Call it while nothing reads: an increment racing with it may survive."""
        mm = self._held.get("mm")
        if mm is None:
            raise SourceError(f"the FuseStore on {self.path} is closed: open a new one")
        struct.pack_into(f"<{_N_RESET}Q", mm, _COUNTERS_AT, *([0] * _N_RESET))

    def close(self) -> None:
        """Unmount (``fusermount3 -u``; lazily if a file is still open), wait for the daemon (kill
        it if it lingers), remove the temporary mount point and the counters file. Idempotent."""
        if self._finalizer.alive:
            self._last = self.counters()
            self._finalizer()

    def __enter__(self) -> "FuseStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"mounted at {self.path!r}"
        return (f"FuseStore({self.source!r}, open_latency={self.open_latency}, read_latency={self.read_latency}, "
                f"bandwidth={self.bandwidth:.3g}, max_inflight={self.max_inflight}; {state})")


def drop_pages(paths) -> None:
    """Have the kernel drop the cached pages of each file in ``paths`` (as memory pressure would),
    so that their next reads reach the FUSE daemon that serves them: a daemon that needs no
    request per open (``clairvoyant mount``) is otherwise not asked at all for a cached file."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


__all__ = ["FuseStore", "fuse_available", "daemon_binary", "drop_pages"]
