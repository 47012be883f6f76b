"""A source that is a directory tree on a (possibly shared) POSIX file system.

Its walk also yields every folder, empty ones included, with the mode and times of each entry:
the manifest records them (``manifest/tree.py``) for the mount to show and for the check of a persisted
manifest against the source, one ``stat`` per folder (``manifest/refresh.py``).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import Iterator, NamedTuple

from ..errors import EmptySourceError, SampleReadError, SourceError, SourceNotFound
from ..nodeio.fileio import read_file, read_with_mtime
from .base import Source


class Entry(NamedTuple):
    """One visible entry of a folder, as its ``stat`` shows it."""

    name: str
    is_dir: bool
    size: int        # 0 for a folder
    mode: int        # the permission bits (st_mode & 0o7777)
    mtime_ns: int
    atime_ns: int
    ctime_ns: int


def entry_of(name: str, st: os.stat_result) -> Entry:
    return Entry(name, stat.S_ISDIR(st.st_mode), 0 if stat.S_ISDIR(st.st_mode) else st.st_size,
                 stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns)


class PosixSource(Source):
    """Every regular, non-hidden file below ``root`` is a sample keyed by its relative path."""

    #: the manifest records this source's folders and checks them for changes at each start
    #: (a walk of the tree stands in for ``scan``); False for a subclass with a ``scan`` of its own
    #: unless it says otherwise (its samples may not be the walk's: a list file, a filter)
    walks_folders = True
    #: a key is the plain file ``root/key``, read with nothing charged or checked on the way: the
    #: native staging threads may read it themselves (stage/native.py); False for a subclass that
    #: reads, charges or checks otherwise, unless it says so
    native_reads = True

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "scan" in cls.__dict__ and "walks_folders" not in cls.__dict__:
            cls.walks_folders = False
        if "native_reads" not in cls.__dict__ and any(
                m in cls.__dict__ for m in ("read", "read_versioned", "_charge", "path_of")):
            cls.native_reads = False

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

    def listdir(self, rel: str) -> list[Entry]:
        """One directory listing: an :class:`Entry` for each visible folder and regular file.
        Subclasses override this to charge or count metadata operations."""
        out: list[Entry] = []
        path = os.path.join(self.root, rel) if rel else self.root
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.name.startswith("."):
                        continue
                    st = entry.stat()
                    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                        out.append(entry_of(entry.name, st))
        except PermissionError as e:
            raise SourceError(f"cannot list {path!r} of data source {self.root!r}: permission denied") from e
        return out

    def stat_folder(self, rel: str) -> Entry | None:
        """The folder ``rel`` (relative, "" the root) as it is now, or None if it is gone or no
        longer a folder: one ``stat``, the whole cost of checking a folder for changes."""
        try:
            st = os.stat(os.path.join(self.root, rel) if rel else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as e:
            raise SourceError(f"cannot look at folder {rel or '.'!r} of data source {self.root!r}: permission "
                              "denied; check its permissions") from e
        return entry_of(rel.rpartition("/")[2], st) if stat.S_ISDIR(st.st_mode) else None

    def walk_tree(self, rel: str = "", top: Entry | None = None) -> Iterator[tuple[str, Entry, int]]:
        """``(path, entry, listed_ns)`` for the folder ``rel`` (``top``: its entry, else one stat),
        then every folder and file below it, depth first in name order; ``listed_ns`` is when a
        folder was listed (0 for a file)."""
        if top is None:
            top = self.stat_folder(rel)
            if top is None:
                raise SourceNotFound(f"folder {rel or '.'!r} of data source {self.root!r} is gone: check the path")
        listed = time.time_ns()
        entries = sorted(self.listdir(rel))
        yield rel, top, listed
        for e in entries:
            key = f"{rel}/{e.name}" if rel else e.name
            if e.is_dir:
                yield from self.walk_tree(key, e)
            else:
                yield key, e, 0

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
        for e in sorted(self.listdir(rel)):
            key = f"{rel}/{e.name}" if rel else e.name
            if e.is_dir:
                yield from self._walk(key)
            else:
                yield key, e.size

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
