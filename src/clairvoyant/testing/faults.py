"""Fault injection: sources that fail on chosen samples, a local device that fills up."""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator

from ..cache import publish as publish_mod
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

    def path_for_copy(self, key: str, size: int) -> str:
        self._fail(key)
        return super().path_for_copy(key, size)

    def _fail(self, key: str) -> None:
        if key in self.bad_keys:
            raise SampleReadError(f"cannot read sample {key!r} at {self.path_of(key)}: permission denied "
                                  "(injected); check the file and its permissions")


@contextlib.contextmanager
def disk_full_after(nbytes: int) -> Iterator[None]:
    """Within the block, staging writes in this process fail with ENOSPC once ``nbytes``
    have been published, as a filling node-local device would."""
    original = publish_mod.publish
    written = [0]

    def fill_limited(final: str, tmp_dir: str, fill):
        def limited(fd: int) -> int:
            n = fill(fd)
            written[0] += n
            if written[0] > nbytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return n
        return original(final, tmp_dir, limited)

    def file_limited(final: str, tmp_dir: str, src: str, expected: int = -1, lock=(-1, 0)) -> int:
        written[0] += os.path.getsize(src)
        if written[0] > nbytes:
            if lock[0] >= 0:  # the contract: the lock goes, whatever happens
                publish_mod.release(*lock)
            raise publish_mod._local_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), final, tmp_dir)
        return original_file(final, tmp_dir, src, expected, lock)

    original_file = publish_mod.publish_file
    publish_mod.publish, publish_mod.publish_file = fill_limited, file_limited
    try:
        yield
    finally:
        publish_mod.publish, publish_mod.publish_file = original, original_file
