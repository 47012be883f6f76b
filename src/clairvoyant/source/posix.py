"""A source that is a directory tree on a (possibly shared) POSIX file system."""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterator

from ..errors import EmptySourceError, SampleReadError, SourceError, SourceNotFound
from ..fileio import read_file, read_with_mtime


class PosixSource:
    """Every regular, non-hidden file below ``root`` is a sample keyed by its relative path."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.uri = "file://" + self.root

    def __repr__(self) -> str:
        return f"PosixSource({self.root!r})"

    def check(self) -> None:
        """Raise a typed error if the root is missing or not a directory."""
        if not os.path.exists(self.root):
            raise SourceNotFound(
                f"data source {self.root!r} does not exist: check the path (is the file system mounted?)")
        if not os.path.isdir(self.root):
            raise SourceError(f"data source {self.root!r} is not a directory: pass the directory that holds the samples")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise SourceError(f"data source {self.root!r} cannot be listed (permission denied): check its permissions")

    def listdir(self, rel: str) -> list[tuple[str, bool, int]]:
        """One directory listing: ``(name, is_dir, size)`` for each visible entry.
        Subclasses override this to charge or count metadata operations."""
        out: list[tuple[str, bool, int]] = []
        path = os.path.join(self.root, rel) if rel else self.root
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.name.startswith("."):
                        continue
                    st = entry.stat()
                    if stat.S_ISDIR(st.st_mode):
                        out.append((entry.name, True, 0))
                    elif stat.S_ISREG(st.st_mode):
                        out.append((entry.name, False, st.st_size))
        except PermissionError as e:
            raise SourceError(f"cannot list {path!r} of data source {self.root!r}: permission denied") from e
        return out

    def scan(self) -> Iterator[tuple[str, int]]:
        """Walk in sorted order, so that keys come out the same on every node."""
        self.check()
        found = False
        for item in self._walk(""):
            found = True
            yield item
        if not found:
            raise EmptySourceError(
                f"data source {self.root!r} holds no files: point it at the directory that holds the samples")

    def _walk(self, rel: str) -> Iterator[tuple[str, int]]:
        for name, is_dir, size in sorted(self.listdir(rel)):
            key = f"{rel}/{name}" if rel else name
            if is_dir:
                yield from self._walk(key)
            else:
                yield key, size

    def path_of(self, key: str) -> str:
        return os.path.join(self.root, key)

    def read(self, key: str) -> bytes:
        path = self.path_of(key)
        try:
            data = read_file(path)
        except OSError as e:
            raise self.read_error(key, path, e) from e
        self._charge(len(data))
        return data

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        """The sample's bytes and the file's modification time (ns), from one open."""
        path = self.path_of(key)
        try:
            data, mtime_ns = read_with_mtime(path)
        except OSError as e:
            raise self.read_error(key, path, e) from e
        self._charge(len(data))
        return data, mtime_ns

    def version(self, key: str) -> tuple[int, int]:
        """``(size, modification time in ns)`` of sample ``key`` now: one metadata operation."""
        path = self.path_of(key)
        try:
            st = os.stat(path)
        except OSError as e:
            raise self.read_error(key, path, e) from e
        self._charge_meta()
        return st.st_size, st.st_mtime_ns

    def _charge(self, nbytes: int) -> None:
        """Called once per sample read with its size; emulated storage charges its costs here."""

    def _charge_meta(self) -> None:
        """Called once per metadata operation (stat); emulated storage charges it here."""

    def read_error(self, key: str, path: str, e: OSError) -> SampleReadError:
        """The typed error for an OSError met reading sample ``key`` at ``path``."""
        if isinstance(e, FileNotFoundError):
            return SampleReadError(
                f"sample {key!r} is gone from the source ({path}): the source changed since it was "
                "indexed; run `clairvoyant index --force` on it, or pass reindex=True")
        what = "permission denied" if e.errno == errno.EACCES else (e.strerror or str(e))
        return SampleReadError(f"cannot read sample {key!r} at {path}: {what}; check the file and its permissions")
