"""Sources made of files of one kind (HDF5, NumPy arrays, TFRecords): which files a path names,
and reading an exact byte range of one. Tar shards name theirs in shards.py (their index is keyed
on the list)."""

from __future__ import annotations

import glob as globmod
import os
from typing import Sequence

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceNotFound
from ..fdcache import FdCache


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
                  what: str) -> tuple[list[str], str]:
    """The files ``paths`` names (a file, a directory of files with ``suffixes``, a glob or a list),
    absolute and sorted, and the folder their names are relative to; ``what`` names the kind in errors."""
    if isinstance(paths, (str, os.PathLike)):
        spec = os.fspath(paths)
        if os.path.isdir(spec):
            root = os.path.abspath(spec)
            found = sorted(os.path.join(root, n) for n in os.listdir(root)
                           if n.endswith(suffixes) and not n.startswith(".") and os.path.isfile(os.path.join(root, n)))
            if not found:
                raise EmptySourceError(f"directory {root} holds no {what} files ({', '.join(suffixes)}): point at "
                                       "their directory")
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
    bad = [p for p in found if not p.endswith(suffixes)]
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
