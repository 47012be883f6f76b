"""MECHANISM: what a cluster node leaves for its daemon in the handoff directory: another home's
bytes, or a mark that the home did not answer with them (mount/cluster/node.py).

The daemon (``mountfs.c``) waits for ``<handoff>/<number>`` (the bytes, then their mtime: written
under a temporary name, then renamed) or ``<number>.miss`` (it then reads the store itself). These
files are not counted in the tier's capacity, so they are bounded here: each goes after
``KEEP_PEER_FILES`` seconds (a later read of the file, or of later parts of it, finds it until
then), and the oldest bytes go first while they add up to more than ``cap`` (the newest stays).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable

from ...nodeio.fileio import discard
from ..listing import publish_bytes

# peers' bytes kept in the handoff directory, at most: they are not counted in the tier's capacity,
# and at thousands of peer reads a second 30 s of them would be gigabytes
PEER_FILES_BYTES = 256 << 20
KEEP_PEER_FILES = 30.0   # seconds a peer's bytes stay in the handoff directory (fetched ahead, or
                         # later parts of the file)


class PeerFiles:
    """Peers' bytes and miss marks in ``handoff`` (module docstring); ``on_miss``: told of each mark."""

    def __init__(self, handoff: str, on_miss: Callable[[], None]) -> None:
        self.handoff, self._on_miss = handoff, on_miss
        self.cap = PEER_FILES_BYTES
        self._lock = threading.Lock()
        self._files: collections.deque[tuple[float, str, int]] = collections.deque()   # (when, path, bytes)
        self._bytes = 0

    def leave(self, f: int, data: bytes, mtime_ns: int) -> None:
        """The bytes of ``f`` where the daemon waits for them (then renamed into place)."""
        final = os.path.join(self.handoff, str(f))
        publish_bytes(final, bytes(data) + int(mtime_ns).to_bytes(8, "little"))   # (a failed write leaves nothing)
        with self._lock:
            self._files.append((time.monotonic(), final, len(data)))
            self._bytes += len(data)
        self.forget_old()

    def miss(self, f: int) -> None:
        """Mark ``f`` as not coming from its home: the daemon reads the store at once."""
        path = os.path.join(self.handoff, f"{f}.miss")
        try:
            with open(path, "wb"):
                pass
        except OSError:
            return   # the daemon's wait ends on its own
        self._on_miss()
        with self._lock:
            self._files.append((time.monotonic(), path, 0))

    def forget_old(self) -> None:
        """Remove peers' bytes and miss marks older than KEEP_PEER_FILES seconds, and the oldest
        peers' bytes while they add up to more than ``cap`` (the newest stays)."""
        now, gone = time.monotonic(), []
        with self._lock:
            while self._files and (now - self._files[0][0] > KEEP_PEER_FILES
                                   or (self._bytes > self.cap and len(self._files) > 1)):
                _, path, n = self._files.popleft()
                self._bytes -= n
                gone.append(path)
        for path in gone:
            discard(path)

    def close(self) -> None:
        """Remove every one left."""
        with self._lock:
            gone, self._files, self._bytes = [p for _, p, _ in self._files], collections.deque(), 0
        for path in gone:
            discard(path)
