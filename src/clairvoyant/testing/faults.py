"""Fault injection: sources that fail on chosen samples, a local device that fills up."""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator

from ..stage import native_files
from ..cache import publish as publish_mod
from ..cache.entry import TRAILER
from ..errors import SampleReadError
from ..source.posix import PosixSource


class FaultySource(PosixSource):
    """A directory source whose listed ``bad_keys`` cannot be read (as a permission error would)."""

    def __init__(self, root: str | os.PathLike[str], bad_keys: set[str] | frozenset[str]) -> None:
        super().__init__(root)
        self.uri = "faulty+file://" + self.root
        self.bad_keys = frozenset(bad_keys)

    def read(self, key: str) -> bytes:
        self._fail(key)
        return super().read(key)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        self._fail(key)
        return super().read_versioned(key)

    def _fail(self, key: str) -> None:
        if key in self.bad_keys:
            raise SampleReadError(f"cannot read sample {key!r} at {self.path_of(key)}: permission denied "
                                  "(injected); check the file and its permissions")


@contextlib.contextmanager
def disk_full_after(nbytes: int, root: str | None = None) -> Iterator[None]:
    """Within the block, cache writes in this process (under ``root``, if given) fail with ENOSPC
    once ``nbytes`` have been published, as a filling node-local device would."""
    original = publish_mod.write_at
    written = [0]

    def limited(fd: int, data: bytes, trailer: bytes, offset: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if root is None or path.startswith(root):
            written[0] += len(data)
            if written[0] > nbytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(fd, data, trailer, offset)

    # the native staging threads write in C: their jobs are failed with ENOSPC past the same mark,
    # as the device would fail their pwrite (stage/native_files.py then gives their places back)
    native_finish = native_files.NativeStager._finish

    def native_limited(self, done):
        out = []
        for token, err, *rest in done:
            job = self._jobs.get(token)
            if err == 0 and job is not None and (root is None or self.store.root.startswith(root)):
                written[0] += job[3] - TRAILER.size
                if written[0] > nbytes:
                    err = errno.ENOSPC
            out.append((token, err, *rest))
        return native_finish(self, out)

    publish_mod.write_at = limited
    native_files.NativeStager._finish = native_limited
    try:
        yield
    finally:
        publish_mod.write_at = original
        native_files.NativeStager._finish = native_finish
