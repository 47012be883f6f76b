"""An emulated busy parallel file system over a local directory.

Every request pays a latency (per open, per read) and shares one bandwidth
with every other reader, and at most ``max_inflight`` requests are served at
once: all of it consistent across the processes that read the same store,
through a small shared state file guarded by ``flock``. Every operation is
counted, so "bytes read from shared storage" is measured, not estimated.

Serizawa & Tatebe's Lustre figures imply about 20 ms per image per reader
process; the defaults (10 ms per open, 2 ms per read, 400 MB/s, 64 in flight)
sit near that for ~30 KB images.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Iterator


from ..errors import ConfigError
from ..nodeio.forksafe import ForkSafeLock
from ..nodeio.fileio import pid
from ..nodeio.paths import _user
from ..source.posix import PosixSource

# opens, reads, bytes, listings, peak in flight, next free time of the shared pipe, stats; then
# one end time per request slot
_STATE = struct.Struct("<qqqqqdq")
_MAX_SLOTS = 1024
_SIZE = _STATE.size + 8 * _MAX_SLOTS
_CHUNK = 4 << 20


@dataclass(frozen=True)
class Counters:
    opens: int
    reads: int
    bytes: int
    listings: int
    peak_inflight: int
    getattrs: int = 0  # stat calls: of folders (a manifest's check, EmulatedStore), or any that reached
    #                    FuseStore's daemon (the kernel caches the rest)


class EmulatedStore(PosixSource):
    """A directory that behaves like a busy shared file system. Accepted wherever a path is."""

    walks_folders = True   # its scan is the directory's walk

    def __init__(self, path: str | os.PathLike[str], *, open_latency: float = 0.010, read_latency: float = 0.002,
                 bandwidth: float = 400e6, max_inflight: int = 64, state_dir: str | None = None) -> None:
        super().__init__(path)
        if open_latency < 0 or read_latency < 0:
            raise ConfigError("latencies must be >= 0 seconds")
        if bandwidth <= 0 or not 1 <= max_inflight <= _MAX_SLOTS:
            raise ConfigError(f"bandwidth must be > 0 bytes/s and max_inflight in [1, {_MAX_SLOTS}]")
        self.uri = "emulated+file://" + self.root
        self.open_latency, self.read_latency = float(open_latency), float(read_latency)
        self.bandwidth, self.max_inflight = float(bandwidth), int(max_inflight)
        base = state_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"clairvoyant-emulated-{_user()}")
        digest = hashlib.sha1(self.root.encode()).hexdigest()[:16]
        self.state_path = os.path.join(base, f"{digest}.v2.state")
        self._pid = -1
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._tlock = ForkSafeLock()

    def __repr__(self) -> str:
        return (f"EmulatedStore({self.root!r}, open_latency={self.open_latency}, read_latency={self.read_latency}, "
                f"bandwidth={self.bandwidth:.3g}, max_inflight={self.max_inflight})")

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d.update(_pid=-1, _fd=-1, _mm=None, _ends=None, _tlock=None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._tlock = ForkSafeLock()

    # -- shared state ---------------------------------------------------------------------------

    def _state(self) -> mmap.mmap:
        if self._pid != pid():  # each process opens its own description, so flock excludes
            os.makedirs(os.path.dirname(self.state_path), mode=0o700, exist_ok=True)
            fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            mm = mmap.mmap(fd, _SIZE)
            self._fd, self._mm, self._pid = fd, mm, pid()
            self._ends = memoryview(mm)[_STATE.size:_STATE.size + 8 * self.max_inflight].cast("d")
        assert self._mm is not None
        return self._mm

    @contextlib.contextmanager
    def _locked(self) -> Iterator[mmap.mmap]:
        """flock excludes other processes; the threads of this one share a file description,
        so a thread lock excludes them."""
        with self._tlock:
            mm = self._state()  # opened under the thread lock: two threads must not each open one
            fd = self._fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield mm
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def counters(self) -> Counters:
        with self._locked() as mm:
            v = _STATE.unpack_from(mm, 0)
        return Counters(opens=v[0], reads=v[1], bytes=v[2], listings=v[3], peak_inflight=v[4], getattrs=v[6])

    def reset(self) -> None:
        """Zero the counters and forget requests in flight."""
        with self._locked() as mm:
            mm[:] = bytes(_SIZE)

    def _request(self, opens: int, reads: int, nbytes: int, listings: int = 0, stats: int = 0) -> None:
        """Take one of ``max_inflight`` slots until this request's end time, then sleep until then.

        A slot is free once its end time has passed, so admission is one locked
        update and a killed reader cannot hold a slot for ever.
        """
        fixed = (opens + stats) * self.open_latency + reads * self.read_latency   # a stat: metadata, as an open
        while True:
            with self._locked() as mm:
                now = time.monotonic()
                ends = self._ends.tolist()  # plain floats: cheaper than NumPy ops on 64 values
                free = [i for i, e in enumerate(ends) if e <= now]
                n_busy = self.max_inflight - len(free)
                if free:
                    o, r, b, li, peak, next_free, st = _STATE.unpack_from(mm, 0)
                    end = now + fixed
                    if nbytes:
                        end = max(end, next_free) + nbytes / self.bandwidth
                        next_free = end
                    self._ends[free[0]] = end
                    _STATE.pack_into(mm, 0, o + opens, r + reads, b + nbytes, li + listings,
                                     max(peak, n_busy + 1), next_free, st + stats)
                    break
                wake = min(ends)
            time.sleep(max(wake - now, 0.0002))
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    # -- the source interface -------------------------------------------------------------------

    def listdir(self, rel: str) -> list[tuple[str, bool, int]]:
        entries = super().listdir(rel)
        self._request(opens=1, reads=0, nbytes=0, listings=1)
        return entries

    def _charge(self, nbytes: int) -> None:
        self._request(opens=1, reads=max(1, -(-nbytes // _CHUNK)), nbytes=nbytes)

    def _charge_meta(self) -> None:
        self._request(opens=1, reads=0, nbytes=0)

    def stat_folder(self, rel: str):
        """A folder's stat (a manifest's check at each start): one metadata request, counted in
        ``getattrs``, not in ``opens``."""
        entry = super().stat_folder(rel)
        self._request(opens=0, reads=0, nbytes=0, stats=1)
        return entry

    def scan(self) -> Iterator[tuple[str, int]]:
        return super().scan()
