"""The listing the mount daemon answers metadata from: every file, its size and digest, and the
directories derived from the paths, written once from the manifest (never from the source).

Little-endian, mapped by ``mountfs.c`` (``struct listing_head`` and the records after it)::

    head      64 bytes  magic "CVMNTLS1", version u32, 0 u32, files, dirs, children, string bytes (u64)
    files     24 bytes each, sorted by path: size, key digest (the index's), path offset
    dirs      24 bytes each, sorted by path ("" is the root): path offset, first child, children
    children  16 bytes each, grouped by directory, sorted by name: name offset, file or dir << 1 | is_dir
    strings   NUL-terminated UTF-8 (paths relative, without a leading slash)

The manifest's keys are sorted by code point, which is the byte order of their UTF-8: the
daemon's binary search with ``strcmp`` finds them.
"""

from __future__ import annotations

import os
import struct
import threading

import numpy as np

from ..errors import ConfigError
from ..fileio import write_atomically

MAGIC, VERSION = b"CVMNTLS1", 1
HEAD = struct.Struct("<8sII4Q16x")


def index_digests(manifest) -> np.ndarray:
    """The local tier's index key of every sample (the first 8 bytes of sha1(key); 0 stored as 1)."""
    d = np.asarray(manifest.keys.digests64(), dtype=np.uint64).copy()
    d[d == 0] = 1
    return d


def build(keys: list[str], sizes, digests) -> bytes:
    """The listing's bytes for files ``keys`` (sorted, relative POSIX paths)."""
    n = len(keys)
    strings = bytearray()
    offsets: dict[str, int] = {}

    def intern(s: str) -> int:
        at = offsets.get(s)
        if at is None:
            at = offsets[s] = len(strings)
            strings.extend(s.encode())
            strings.append(0)
        return at

    kids: dict[str, list[tuple[str, int, bool]]] = {"": []}
    new_dirs: list[tuple[str, str]] = []
    for i, key in enumerate(keys):
        if key.startswith("/") or "" in key.split("/") or ".." in key.split("/"):
            raise ConfigError(f"cannot mount a sample whose key {key!r} is not a relative path: mount a directory "
                              "source")
        parent, _, name = key.rpartition("/")
        d = parent
        while d not in kids:   # new directories, up to one already known: each linked into its parent
            up, _, dname = d.rpartition("/")
            kids[d] = []
            new_dirs.append((up, dname))
            d = up
        for up, dname in new_dirs:
            kids[up].append((dname, -1, True))
        new_dirs.clear()
        kids[parent].append((name, i, False))
    dirs = sorted(kids, key=lambda p: p.encode())
    dir_no = {p: j for j, p in enumerate(dirs)}
    frecs = np.zeros((n, 3), dtype="<u8")
    frecs[:, 0] = np.asarray(sizes, dtype=np.int64)
    frecs[:, 1] = np.asarray(digests, dtype=np.uint64)
    for i, key in enumerate(keys):
        frecs[i, 2] = intern(key)
    drecs = np.zeros((len(dirs), 3), dtype="<u8")
    crecs = []
    for j, p in enumerate(dirs):
        entries = sorted(kids[p], key=lambda e: e[0].encode())
        drecs[j] = (intern(p), len(crecs), len(entries))
        for name, i, is_dir in entries:
            full = f"{p}/{name}" if p else name
            crecs.append((intern(name), (dir_no[full] << 1 | 1) if is_dir else (i << 1)))
    carr = np.array(crecs, dtype="<u8").reshape(-1, 2)
    head = HEAD.pack(MAGIC, VERSION, 0, n, len(dirs), len(carr), len(strings))
    return b"".join([head, frecs.tobytes(), drecs.tobytes(), carr.tobytes(), bytes(strings)])


def write(path: str, manifest) -> None:
    """Write the listing of ``manifest`` to ``path`` atomically."""
    keys = [manifest.keys[i] for i in range(len(manifest))]
    if any(keys[i].encode() >= keys[i + 1].encode() for i in range(len(keys) - 1)):
        order = sorted(range(len(keys)), key=lambda i: keys[i].encode())
        raise ConfigError(f"the manifest's keys are not in byte order (first out of place: {keys[order[0]]!r}): "
                          "rebuild it with clairvoyant index --force")
    publish_bytes(path, build(keys, np.asarray(manifest.sizes), index_digests(manifest)))


def publish_bytes(path: str, blob: bytes) -> None:
    """``blob`` as the whole content of ``path``: written under a temporary name, then renamed."""
    def fill(fd: int) -> int:
        view, done = memoryview(blob), 0
        while done < len(view):
            done += os.write(fd, view[done:])
        return done

    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    write_atomically(path, tmp, fill, expected=len(blob))
