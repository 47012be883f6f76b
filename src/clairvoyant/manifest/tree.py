"""What a directory source's manifest records beyond its samples: every folder, empty ones
included, with its mode and times, and each file's mode and times.

The mount shows them (``mount/listing.py``); the check of a persisted manifest against the source
(``refresh.py``) compares each folder's mtime. They are optional sections of the binary manifest
(``manifest/fileformat.py``), written with it in one atomic rename; a manifest without them (an earlier
version's, a list file's, an object store's) loads as before::

    file_modes       <u4, one per key: the permission bits (st_mode & 0o7777)
    file_times       <i8, three per key: mtime, atime, ctime (ns)
    dir_key_offsets  <u4 or <u8, folders + 1, into dir_keys (as key_offsets into keys)
    dir_keys         UTF-8, each folder's path followed by a NUL byte, sorted ("" is the root)
    dir_modes        <u4, one per folder
    dir_times        <i8, four per folder: mtime, atime, ctime, and when it was listed (ns)
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..source.posix import Entry

MTIME, ATIME, CTIME, LISTED = 0, 1, 2, 3   # columns of the times
SECTIONS = {"file_modes": ("<u4",), "file_times": ("<i8",), "dir_key_offsets": ("<u4", "<u8"),
            "dir_keys": ("|u1",), "dir_modes": ("<u4",), "dir_times": ("<i8",)}
# values per key (files) or per folder (dirs) of each section; None: its own rule
PER = {"file_modes": ("files", 1), "file_times": ("files", 3), "dir_key_offsets": None, "dir_keys": None,
       "dir_modes": ("dirs", 1), "dir_times": ("dirs", 4)}


def _frozen(a, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(a, dtype=dtype).reshape(shape)
    if a.flags.writeable:
        a = a.copy()
        a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Tree:
    """Folders and file attributes of a directory source, aligned with a manifest's keys."""

    file_modes: np.ndarray   # uint32, one per key
    file_times: np.ndarray   # int64 (keys, 3): mtime, atime, ctime in ns
    dirs: tuple[str, ...]    # every folder, sorted; "" is the root
    dir_modes: np.ndarray    # uint32, one per folder
    dir_times: np.ndarray    # int64 (folders, 4): mtime, atime, ctime, listed, in ns

    def __post_init__(self) -> None:
        n, m = len(np.asarray(self.file_modes)), len(self.dirs)
        set_ = object.__setattr__
        set_(self, "dirs", tuple(self.dirs))
        set_(self, "file_modes", _frozen(self.file_modes, "<u4", (n,)))
        set_(self, "file_times", _frozen(self.file_times, "<i8", (n, 3)))
        set_(self, "dir_modes", _frozen(self.dir_modes, "<u4", (m,)))
        set_(self, "dir_times", _frozen(self.dir_times, "<i8", (m, 4)))
        if list(self.dirs) != sorted(set(self.dirs)):
            raise ValueError("a tree's folders must be sorted and distinct")

    def __len__(self) -> int:
        """Files."""
        return len(self.file_modes)

    def sections(self) -> dict[str, np.ndarray | bytes]:
        """The manifest sections (little-endian arrays, the folder names' blob)."""
        encoded = [d.encode() for d in self.dirs]
        off = np.zeros(len(encoded) + 1, dtype=np.uint64)
        if encoded:
            np.cumsum([len(e) + 1 for e in encoded], out=off[1:])
        blob = b"".join(e + b"\0" for e in encoded)
        return {"file_modes": np.ascontiguousarray(self.file_modes, dtype="<u4"),
                "file_times": np.ascontiguousarray(self.file_times, dtype="<i8"),
                "dir_key_offsets": off.astype("<u4" if len(blob) < 2 ** 32 else "<u8"),
                "dir_keys": np.frombuffer(blob, dtype="|u1"),
                "dir_modes": np.ascontiguousarray(self.dir_modes, dtype="<u4"),
                "dir_times": np.ascontiguousarray(self.dir_times, dtype="<i8")}

    @classmethod
    def from_sections(cls, arrays: dict[str, np.ndarray]) -> "Tree":
        """From the sections as read (sizes already checked); ValueError if they disagree."""
        off, blob = arrays["dir_key_offsets"], arrays["dir_keys"]
        if len(off) == 0 or int(off[0]) != 0 or int(off[-1]) != len(blob) or not bool(np.all(off[1:] > off[:-1])):
            raise ValueError("folder name offsets out of order")
        raw = blob.tobytes()
        if raw and raw[-1] != 0:
            raise ValueError("folder names not NUL-terminated")
        names = raw[:-1].decode().split("\0") if raw else []
        if len(names) != len(off) - 1:
            raise ValueError("a folder name holds a NUL byte")
        return cls(arrays["file_modes"], arrays["file_times"].reshape(-1, 3), tuple(names), arrays["dir_modes"],
                   arrays["dir_times"].reshape(-1, 4))


class Collector:
    """Columns of a walk (``PosixSource.walk_tree``'s items), turned into sorted keys, sizes and a
    :class:`Tree` at the end; ``array`` columns: no Python object per value."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.sizes, self.fmodes, self.ftimes = array("q"), array("I"), array("q")
        self.dirs: list[str] = []
        self.dmodes, self.dtimes = array("I"), array("q")

    def add(self, path: str, e: Entry, listed_ns: int = 0) -> None:
        if e.is_dir:
            self.dirs.append(path)
            self.dmodes.append(e.mode)
            self.dtimes.extend((e.mtime_ns, e.atime_ns, e.ctime_ns, listed_ns))
        else:
            self.keys.append(path)
            self.sizes.append(e.size)
            self.fmodes.append(e.mode)
            self.ftimes.extend((e.mtime_ns, e.atime_ns, e.ctime_ns))

    def extend(self, items: Iterable[tuple[str, Entry, int]]) -> "Collector":
        for path, e, listed in items:
            self.add(path, e, listed)
        return self

    def finish(self) -> tuple[list[str], np.ndarray, Tree]:
        """``(keys, sizes, tree)``, keys and folders sorted by code point (the manifest's order)."""
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        keys = [self.keys[i] for i in order]
        idx = np.asarray(order, dtype=np.int64)
        sizes = np.frombuffer(self.sizes, dtype=np.int64)[idx] if order else np.zeros(0, np.int64)
        fmodes = np.frombuffer(self.fmodes, dtype=np.uint32)[idx] if order else np.zeros(0, np.uint32)
        ftimes = np.frombuffer(self.ftimes, dtype=np.int64).reshape(-1, 3)[idx] if order else np.zeros((0, 3))
        dorder = sorted(range(len(self.dirs)), key=self.dirs.__getitem__)
        didx = np.asarray(dorder, dtype=np.int64)
        dmodes = np.frombuffer(self.dmodes, dtype=np.uint32)[didx] if dorder else np.zeros(0, np.uint32)
        dtimes = np.frombuffer(self.dtimes, dtype=np.int64).reshape(-1, 4)[didx] if dorder else np.zeros((0, 4))
        return keys, sizes, Tree(fmodes, ftimes, tuple(self.dirs[j] for j in dorder), dmodes, dtimes)
