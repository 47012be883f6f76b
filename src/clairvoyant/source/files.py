"""Sources made of files of one kind (HDF5, NumPy arrays, TFRecords): which files a path names,
whether a directory is one of `clairvoyant pack`'s (``pack_layout``), and reading an exact byte
range of one. Tar shards name theirs in shards.py (their index is keyed
on the list)."""

from __future__ import annotations

import glob as globmod
import hashlib
import json
import os
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceNotFound
from ..nodeio.forksafe import ForkSafeLock
from ..nodeio.fdcache import FdCache

STATE = ".clairvoyant-pack.json"   # the state file of a `clairvoyant pack` directory (pack/tar.py writes it)


def pack_layout(path: Any) -> str | None:
    """The layout of the pack in directory ``path`` ("tar", "npz", "hdf5" as its state file says),
    or None where it is no pack's directory."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        with open(os.path.join(os.fspath(path), STATE)) as f:
            layout = json.load(f).get("layout", "tar")
    except (OSError, ValueError, AttributeError):
        return None
    return layout if isinstance(layout, str) else None


def names_files(path: str, suffixes: tuple[str, ...]) -> bool:
    """A file (by its suffix) or a glob of them, or a directory whose visible entries are all such
    files."""
    if path.endswith(suffixes) and (os.path.isfile(path) or globmod.has_magic(path)):
        return True
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return False
    return bool(names) and all(n.endswith(suffixes) and os.path.isfile(os.path.join(path, n)) for n in names)


def resolve_files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], suffixes: tuple[str, ...],
                  what: str, *, any_suffix: bool = False, hint: str = "") -> tuple[list[str], str]:
    """The files ``paths`` names (a file, a directory of files with ``suffixes``, a glob or a list),
    absolute and sorted, and the folder their names are relative to; ``what`` names the kind in errors,
    ``hint`` ends the error for a directory without any. ``any_suffix``: a file, glob or list named
    explicitly may have another suffix (only a directory is filtered by ``suffixes``)."""
    if isinstance(paths, (str, os.PathLike)):
        spec = os.fspath(paths)
        if os.path.isdir(spec):
            root = os.path.abspath(spec)
            found = sorted(os.path.join(root, n) for n in os.listdir(root)
                           if n.endswith(suffixes) and not n.startswith(".") and os.path.isfile(os.path.join(root, n)))
            if not found:
                raise EmptySourceError(f"directory {root} holds no {what} files ({', '.join(suffixes)}): point at "
                                       f"their directory{hint}")
            return found, root
        if os.path.isfile(spec):
            found = [os.path.abspath(spec)]
        elif globmod.has_magic(spec):
            found = sorted(os.path.abspath(p) for p in globmod.glob(spec) if os.path.isfile(p))
            if not found:
                raise SourceNotFound(f"no {what} file matches {spec!r}: check the pattern")
        else:
            raise SourceNotFound(f"{spec!r} does not exist: check the path (is the file system mounted?)")
    else:
        found = sorted(os.path.abspath(os.fspath(p)) for p in paths)
        if not found:
            raise ConfigError(f"the list of {what} files is empty: give at least one path")
        if len(set(found)) != len(found):
            raise ConfigError(f"the list of {what} files names one twice: name each once")
    bad = [] if any_suffix else [p for p in found if not p.endswith(suffixes)]
    if bad:
        raise ConfigError(f"{bad[0]} is not a {what} file ({', '.join(suffixes)})")
    return found, os.path.commonpath([os.path.dirname(p) for p in found])


def pread_exact(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes at ``offset``, or fewer only where the file ends first (short reads retried)."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def read_span(fds: FdCache, slot: int, path: str, offset: int, n: int, what: str) -> bytes:
    """``n`` bytes at ``offset`` of ``path`` (its descriptor kept in ``fds`` under ``slot``); a
    SampleReadError naming ``what`` (a sample, or the samples of a range) and the file if it cannot
    be read or ends first."""
    try:
        fd = fds.acquire(slot, path)
    except OSError as e:
        raise unreadable(what, path, e) from e
    try:
        data = pread_exact(fd, n, offset)
    except OSError as e:
        raise unreadable(what, path, e) from e
    finally:
        fds.release(slot)
    if len(data) != n:
        raise SampleReadError(f"sample {what!r}: {path} ends before byte {offset + n}: it was cut or changed since "
                              "it was listed; copy it again, or pass reindex=True")
    return data


def unreadable(what: str, path: str, e: OSError) -> SampleReadError:
    """The typed error for an OSError met reading ``what`` from ``path``."""
    if isinstance(e, FileNotFoundError):
        return SampleReadError(f"sample {what!r}: {path} is gone: run `clairvoyant index --force`, or pass "
                               "reindex=True")
    return SampleReadError(f"cannot read sample {what!r} from {path}: {e.strerror or e}; check the file and its "
                           "permissions")


def one_file(where: list[tuple[int, int]], keys: Sequence[str]) -> tuple[list[tuple[int, int]], int]:
    """``(where, file)``: the samples of a range, each ``(file, place)``, all in one file (else a
    ValueError: a range never spans files)."""
    fi = where[0][0]
    if any(w[0] != fi for w in where):
        raise ValueError(f"read_range: {len(keys)} samples from more than one file ({keys[0]!r}...)")
    return where, fi


def listed_files(paths: list[str], *options: object) -> tuple[str, list[int]]:
    """A digest of the files as they are now (each path, size and modification time) and of the
    ``options`` that shape the listing (a dataset, the labels' name), for the source's uri: a file
    rewritten, or other options, make another uri, so a saved manifest of the old listing is never
    used for it; and each file's modification time (ns), the version its samples are staged with."""
    h, mtimes = hashlib.sha1(), []
    for p in paths:
        st = os.stat(p)
        mtimes.append(st.st_mtime_ns)
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    h.update(repr(options).encode())
    return h.hexdigest()[:16], mtimes


class Kept:
    """A few costly objects a process keeps (inflated ``.npz`` members, open HDF5 files): made on
    first use under one lock, the least recently used dropped (``drop``) once their ``weigh``
    adds up to more than ``most``, none carried across a fork (the child makes its own)."""

    def __init__(self, most: int, weigh: Callable[[Any], int] = lambda v: 1,
                 drop: Callable[[Any], None] = lambda v: None) -> None:
        self.most, self._weigh, self._drop = most, weigh, drop
        self._lock = ForkSafeLock()   # (a forked child's is free, whoever held it at the fork)
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._weight, self._pid = 0, os.getpid()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        with self._lock:
            if self._pid != os.getpid():   # a forked child: the parent's objects are not its own
                self._items, self._weight, self._pid = OrderedDict(), 0, os.getpid()
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                return value
            value = make()
            self._items[key] = value
            self._weight += self._weigh(value)
            while self._weight > self.most and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._weight -= self._weigh(old)
                self._drop(old)
            return value

    def clear(self) -> None:
        with self._lock:
            items, self._items, self._weight = list(self._items.values()), OrderedDict(), 0
        if self._pid == os.getpid():
            for v in items:
                self._drop(v)
