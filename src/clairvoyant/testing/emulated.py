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

import fcntl
import hashlib
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Iterator

from ..errors import ConfigError
from ..paths import _user
from ..source.posix import PosixSource

# opens, reads, bytes, listings, inflight, peak inflight, next free time of the shared pipe
_STATE = struct.Struct("<qqqqqqd")
_CHUNK = 4 << 20


@dataclass(frozen=True)
class Counters:
    opens: int
    reads: int
    bytes: int
    listings: int
    peak_inflight: int


class EmulatedStore(PosixSource):
    """A directory that behaves like a busy shared file system. Accepted wherever a path is."""

    def __init__(self, path: str | os.PathLike[str], *, open_latency: float = 0.010, read_latency: float = 0.002,
                 bandwidth: float = 400e6, max_inflight: int = 64, state_dir: str | None = None) -> None:
        super().__init__(path)
        if open_latency < 0 or read_latency < 0:
            raise ConfigError("latencies must be >= 0 seconds")
        if bandwidth <= 0 or max_inflight < 1:
            raise ConfigError("bandwidth must be > 0 bytes/s and max_inflight >= 1")
        self.uri = "emulated+file://" + self.root
        self.open_latency, self.read_latency = float(open_latency), float(read_latency)
        self.bandwidth, self.max_inflight = float(bandwidth), int(max_inflight)
        base = state_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"clairvoyant-emulated-{_user()}")
        digest = hashlib.sha1(self.root.encode()).hexdigest()[:16]
        self.state_path = os.path.join(base, f"{digest}.state")
        self._pid = -1
        self._fd = -1
        self._mm: mmap.mmap | None = None

    def __repr__(self) -> str:
        return (f"EmulatedStore({self.root!r}, open_latency={self.open_latency}, read_latency={self.read_latency}, "
                f"bandwidth={self.bandwidth:.3g}, max_inflight={self.max_inflight})")

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d.update(_pid=-1, _fd=-1, _mm=None)
        return d

    # -- shared state ---------------------------------------------------------------------------

    def _state(self) -> mmap.mmap:
        if self._pid != os.getpid():  # each process opens its own description, so flock excludes
            os.makedirs(os.path.dirname(self.state_path), mode=0o700, exist_ok=True)
            fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(fd).st_size < _STATE.size:
                os.ftruncate(fd, 4096)
            self._fd, self._mm, self._pid = fd, mmap.mmap(fd, 4096), os.getpid()
        assert self._mm is not None
        return self._mm

    def _update(self, fn) -> object:
        mm = self._state()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            values = list(_STATE.unpack_from(mm, 0))
            result = fn(values)
            if result is not None:
                _STATE.pack_into(mm, 0, *values)
            return result
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def counters(self) -> Counters:
        v = _STATE.unpack_from(self._state(), 0)
        return Counters(opens=v[0], reads=v[1], bytes=v[2], listings=v[3], peak_inflight=v[5])

    def reset(self) -> None:
        """Zero the counters (and the in-flight count, which a killed reader may have left up)."""
        self._update(lambda v: v.__setitem__(slice(None), [0, 0, 0, 0, 0, 0, 0.0]) or True)

    def _request(self, opens: int, reads: int, nbytes: int, listings: int = 0) -> None:
        """Take a slot, pay latency and a share of the bandwidth, release the slot."""
        fixed = opens * self.open_latency + reads * self.read_latency

        def admit(v: list) -> float | None:
            if v[4] >= self.max_inflight:
                return None
            now = time.monotonic()
            v[0] += opens
            v[1] += reads
            v[2] += nbytes
            v[3] += listings
            v[4] += 1
            v[5] = max(v[5], v[4])
            start = max(now + fixed, v[6])
            end = start + nbytes / self.bandwidth
            if nbytes:
                v[6] = end
            return end if nbytes else now + fixed

        while True:
            end = self._update(admit)
            if end is not None:
                break
            time.sleep(0.0005)
        try:
            delay = end - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        finally:
            self._update(lambda v: v.__setitem__(4, max(0, v[4] - 1)) or True)

    # -- the source interface -------------------------------------------------------------------

    def listdir(self, rel: str) -> list[tuple[str, bool, int]]:
        entries = super().listdir(rel)
        self._request(opens=1, reads=0, nbytes=0, listings=1)
        return entries

    def read(self, key: str) -> bytes:
        data = super().read(key)
        self._request(opens=1, reads=max(1, -(-len(data) // _CHUNK)), nbytes=len(data))
        return data

    def scan(self) -> Iterator[tuple[str, int]]:
        return super().scan()
