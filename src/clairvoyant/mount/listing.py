"""The listing the mount daemon answers metadata from: every file with its size, digest, mode and
times, and every folder with its mode and times, written once from the manifest (never from the
source). A directory source's manifest records its folders, empty ones included, and the
attributes (``tree.py``); one without them gives the folders its paths imply, files 0444 and
folders 0555, and the time the listing was written.

Little-endian, mapped by ``mountfs.c`` (``struct listing_head`` and the records after it)::

    head      64 bytes  magic "CVMNTLS1", version u32 (2), 0 u32, files, dirs, children, string bytes (u64)
    files     56 bytes each, sorted by path: size, key digest (the index's), path offset,
              mode u32, 0 u32, mtime, atime, ctime (i64 ns)
    dirs      56 bytes each, sorted by path ("" is the root): path offset, first child, children,
              mode u32, links u32 (2 + sub-folders), mtime, atime, ctime (i64 ns)
    children  16 bytes each, grouped by directory, sorted by name: name offset, file or dir << 1 | is_dir
    strings   NUL-terminated UTF-8 (paths relative, without a leading slash)

The manifest's keys are sorted by code point, which is the byte order of their UTF-8: the
daemon's binary search with ``strcmp`` finds them.
"""

from __future__ import annotations

import os
import struct
import threading
import time

import numpy as np

from ..errors import ConfigError
from ..nodeio.fileio import write_atomically

MAGIC, VERSION = b"CVMNTLS1", 2
HEAD = struct.Struct("<8sII4Q16x")
FILE_MODE, DIR_MODE = 0o444, 0o555   # where the manifest records no modes


def index_digests(manifest) -> np.ndarray:
    """The local tier's index key of every sample (the first 8 bytes of sha1(key); 0 stored as 1)."""
    d = np.asarray(manifest.keys.digests64(), dtype=np.uint64).copy()
    d[d == 0] = 1
    return d


def _relative(path: str, what: str) -> None:
    parts = path.split("/")
    if path.startswith("/") or "" in parts or "." in parts or ".." in parts:
        raise ConfigError(f"cannot mount a {what} {path!r} that is not a relative path: mount a directory source")


def build(keys: list[str], sizes, digests, tree=None) -> bytes:
    """The listing's bytes for files ``keys`` (sorted, relative POSIX paths); ``tree``: their modes
    and times and every folder's (``tree.Tree``), else defaults and the folders the paths imply."""
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

    def folder(d: str) -> None:
        """``d`` and the folders above it known, each new one linked into its parent."""
        new = []
        while d not in kids:
            up, _, name = d.rpartition("/")
            kids[d] = []
            new.append((up, name))
            d = up
        for up, name in new:
            kids[up].append((name, -1, True))

    for d in (tree.dirs if tree is not None else ()):   # the recorded folders, empty ones too
        if d:
            _relative(d, "folder")
            folder(d)
    for i, key in enumerate(keys):
        _relative(key, "sample whose key is")
        parent, _, name = key.rpartition("/")
        folder(parent)
        kids[parent].append((name, i, False))
    dirs = sorted(kids, key=lambda p: p.encode())
    dir_no = {p: j for j, p in enumerate(dirs)}
    frecs = np.zeros((n, 7), dtype="<u8")
    frecs[:, 0] = np.asarray(sizes, dtype=np.int64)
    frecs[:, 1] = np.asarray(digests, dtype=np.uint64)
    for i, key in enumerate(keys):
        frecs[i, 2] = intern(key)
    drecs = np.zeros((len(dirs), 7), dtype="<u8")
    crecs = []
    for j, p in enumerate(dirs):
        entries = sorted(kids[p], key=lambda e: e[0].encode())
        subdirs = sum(1 for e in entries if e[2])
        drecs[j, :4] = (intern(p), len(crecs), len(entries), DIR_MODE | (2 + subdirs) << 32)
        for name, i, is_dir in entries:
            full = f"{p}/{name}" if p else name
            crecs.append((intern(name), (dir_no[full] << 1 | 1) if is_dir else (i << 1)))
    _attributes(frecs, drecs, dirs, tree)
    carr = np.array(crecs, dtype="<u8").reshape(-1, 2)
    head = HEAD.pack(MAGIC, VERSION, 0, n, len(dirs), len(carr), len(strings))
    return b"".join([head, frecs.tobytes(), drecs.tobytes(), carr.tobytes(), bytes(strings)])


def _attributes(frecs: np.ndarray, drecs: np.ndarray, dirs: list[str], tree) -> None:
    """Modes and times into the records: the tree's, else defaults and now (a folder the tree
    lacks gets the defaults too)."""
    now = time.time_ns()
    frecs[:, 3] = FILE_MODE
    frecs[:, 4:7] = now
    drecs[:, 4:7] = now
    if tree is None:
        return
    frecs[:, 3] = np.asarray(tree.file_modes, dtype=np.uint64)
    frecs[:, 4:7] = np.asarray(tree.file_times, dtype=np.int64).view(np.uint64)
    at = {d: i for i, d in enumerate(tree.dirs)}
    links = drecs[:, 3] >> np.uint64(32)
    for j, d in enumerate(dirs):
        i = at.get(d)
        if i is not None:
            drecs[j, 3] = int(tree.dir_modes[i]) | int(links[j]) << 32
            drecs[j, 4:7] = np.asarray(tree.dir_times[i, :3], dtype=np.int64).view(np.uint64)


def write(path: str, manifest) -> None:
    """Write the listing of ``manifest`` to ``path`` atomically."""
    keys = [manifest.keys[i] for i in range(len(manifest))]
    if any(keys[i].encode() >= keys[i + 1].encode() for i in range(len(keys) - 1)):
        order = sorted(range(len(keys)), key=lambda i: keys[i].encode())
        raise ConfigError(f"the manifest's keys are not in byte order (first out of place: {keys[order[0]]!r}): "
                          "rebuild it with clairvoyant index --force")
    publish_bytes(path, build(keys, np.asarray(manifest.sizes), index_digests(manifest), manifest.tree))


def publish_bytes(path: str, blob: bytes) -> None:
    """``blob`` as the whole content of ``path``: written under a temporary name, then renamed."""
    def fill(fd: int) -> int:
        view, done = memoryview(blob), 0
        while done < len(view):
            done += os.write(fd, view[done:])
        return done

    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    write_atomically(path, tmp, fill, expected=len(blob))
