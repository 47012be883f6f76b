"""Where each sample of a set of tar shards lies, read once from the tar headers and persisted.

A shard is an uncompressed tar (ustar, GNU long names, PAX). Its members are
grouped into samples by the member path up to the first dot of its last
component; the part after that dot is the member's field. Reading a shard's
headers seeks over member data (only small ``cls`` and ``json`` members are
read). The result, :class:`ShardIndex` (every sample's key, shard, offset,
length, label and fields), is written under ``cache_home()/shards`` as a JSON
header and raw arrays (never pickled), with each shard's size and modification
time, so that a later run reads no headers; a changed shard is read again,
the others are not. ``source/shards.py`` is the source built on it.
"""


from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import SourceError, SourceNotFound
from ..nodeio.fileio import pid, write_all, write_atomically
from ..nodeio.paths import cache_home


# data members, in order of preference (lower case; a field ending in one of them, e.g.
# ``v2.jpg``, counts where no field is exactly one)
DATA_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm")
LABEL_FIELD, FIELDS_FIELD = "cls", "json"
_NO_CLS = np.iinfo(np.int64).min
_SMALL = 1 << 20               # cls/json members larger than this are not read into the index
_BLOCK = 512
_ZERO = bytes(_BLOCK)


class ShardError(SourceError):
    """A shard is not a readable tar, is truncated, or holds malformed samples."""


def split_member(name: str) -> tuple[str, str]:
    """``('class0/img001', 'jpg')`` for ``class0/img001.jpg``: the sample key runs to the first dot
    of the last path component, the field is the rest (lower case; '' when there is no dot)."""
    head, sep, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    return head + sep + stem, field.lower() if dot else ""


def _data_field(fields: Sequence[str], data_key: str | None) -> str | None:
    if data_key is not None:
        return data_key if data_key in fields else None
    for ext in DATA_EXTENSIONS:
        if ext in fields:
            return ext
    tail = sorted((DATA_EXTENSIONS.index(f.rsplit(".", 1)[-1]), f) for f in fields
                  if f.rsplit(".", 1)[-1] in DATA_EXTENSIONS)
    return tail[0][1] if tail else None


# -- the index: header scan, persisted form, lookups ------------------------------------------

_MAGIC = b"\x89CVYTAR\n"
_PREFIX = struct.Struct("<8sII")   # magic, version, header length
_VERSION, _ALIGN = 1, 64
_SECTIONS = {"shard": "<u4", "offset": "<i8", "length": "<i8", "cls": "<i8", "label": "<i8",
             "key_offsets": "<u8", "keys": "|u1", "json_offsets": "<u8", "json": "|u1"}


class _Reader:
    """Reads of one shard through a small window: a header read pulls 4 KiB, which mostly holds
    the small members after it (a cls, the next header) too, and no sample data beyond."""

    def __init__(self, fd: int) -> None:
        self.fd, self.at, self.buf = fd, 0, b""

    def get(self, pos: int, n: int) -> bytes:
        if not (self.at <= pos and pos + n <= self.at + len(self.buf)):
            self.buf, self.at = os.pread(self.fd, max(n, 4096), pos), pos
        return self.buf[pos - self.at:pos - self.at + n]


def _number(field: bytes) -> int:
    """A header's numeric field: octal text, or base-256 where the first byte has its high bit."""
    if field[:1] and field[0] & 0x80:
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else n
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    """``length key=value\n`` records."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] not in (b"\0", b""):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode()] = value.decode()
        pos += length
    return out


class _NotTar(ValueError):
    pass


def _checksum_ok(h: bytes) -> bool:
    try:
        stored = _number(h[148:156])
    except ValueError:
        return False
    if stored == sum(h[:148]) + 256 + sum(h[156:]):
        return True
    return stored == 256 + sum(b - 256 if b > 127 else b for b in h[:148] + h[156:])   # signed, old tars


def _members(r: _Reader, size: int) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of each regular member, from its headers (POSIX ustar, PAX
    and GNU long names); raises _NotTar where the first block is no header, ValueError where the
    bytes are not a whole tar."""
    pos, long_name, pax = 0, None, {}
    while True:
        h = r.get(pos, _BLOCK)
        if len(h) < _BLOCK:
            if pos == 0:
                raise _NotTar(f"{size} bytes, shorter than a tar header")
            raise ValueError(f"no end-of-archive block: the file ends at {size}, inside or after the member "
                             f"header at {pos}")
        if h == _ZERO:
            return
        if not _checksum_ok(h):
            raise (_NotTar if pos == 0 else ValueError)(f"the block at offset {pos} is no tar header (bad checksum)")
        kind, n = h[156:157], _number(h[124:136])
        if "size" in pax:
            n = int(pax["size"])
        data = pos + _BLOCK
        if data + n > size:
            raise ValueError(f"the member at offset {pos} needs bytes up to {data + n}, the file has {size}")
        pos = data + -(-n // _BLOCK) * _BLOCK
        if kind == b"x":
            pax = _pax(r.get(data, n))
            continue
        if kind in (b"g", b"K"):   # PAX global header, GNU long link name
            continue
        if kind == b"L":
            long_name = r.get(data, n).split(b"\0", 1)[0].decode()
            continue
        if kind in (b"0", b"\0", b"7"):
            name = pax.get("path") or long_name
            if name is None:
                name = h[:100].split(b"\0", 1)[0].decode()
                prefix = h[345:500].split(b"\0", 1)[0]
                if h[257:263] == b"ustar\0" and prefix:
                    name = prefix.decode() + "/" + name
            yield name, data, n
        long_name, pax = None, {}


def _scan_shard(path: str, data_key: str | None) -> list[tuple[str, int, int, int, bytes]]:
    """``(key, offset, length, cls, json)`` of every sample of one shard, from its headers."""
    try:
        fd = _open_shard(path)
    except FileNotFoundError:
        raise SourceNotFound(f"shard {path} is gone: check the path, or list the shards again") from None
    except OSError as e:
        raise ShardError(f"cannot open shard {path}: {e.strerror or e}; check it and its permissions") from e
    samples: dict[str, dict[str, tuple[int, int, str]]] = {}
    small: dict[tuple[str, str], bytes] = {}
    try:
        size = os.fstat(fd).st_size
        r = _Reader(fd)
        try:
            for name, offset, n in _members(r, size):
                name = name[2:] if name.startswith("./") else name
                skey, field = split_member(name)
                if not field or skey.endswith("/") or not skey:
                    continue   # no sample of its own (no extension, or a dot-file)
                members = samples.setdefault(skey, {})
                if field in members:
                    raise ShardError(f"shard {path} holds {name!r} twice: a sample may have each field once; "
                                     "re-create the shard")
                members[field] = (offset, n, name)
                if field in (LABEL_FIELD, FIELDS_FIELD) and n <= _SMALL:
                    small[skey, field] = r.get(offset, n)
        except _NotTar as e:
            raise ShardError(f"shard {path} is not an uncompressed tar ({e}): shards must be plain .tar "
                             "files (a .tar.gz cannot be read by range); re-create it, e.g. with "
                             "`clairvoyant pack`") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ShardError(f"shard {path} ({size} bytes) is truncated or damaged ({e}): copy it again, or "
                             "re-create it with `clairvoyant pack`") from None
    finally:
        os.close(fd)
    rows = []
    for skey, members in samples.items():
        data = _data_field(list(members), data_key)
        if data is None:
            want = f"a {data_key!r} member" if data_key else f"one of {', '.join(DATA_EXTENSIONS)}"
            raise ShardError(f"sample {skey!r} of shard {path} has no data member (it has "
                             f"{', '.join(sorted(members))}; wanted {want}): pass data_key= the field that "
                             "holds its data, or remove the sample")
        offset, length, name = members[data]
        cls = _NO_CLS
        if (skey, LABEL_FIELD) in small:
            text = small[skey, LABEL_FIELD]
            try:
                cls = int(text.decode().strip())
            except (UnicodeDecodeError, ValueError):
                raise ShardError(f"sample {skey!r} of shard {path}: its cls member holds {text[:40]!r}, not "
                                 "an integer: fix the shard") from None
        rows.append((name, offset, length, cls, small.get((skey, FIELDS_FIELD), b"")))
    return rows


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class ShardIndex:
    """Every sample's key (sorted), shard, offset, length, label and fields, with each shard's
    ``(path, size, mtime_ns)`` at the time its headers were read.

    On disk: ``magic | version u32 | header length u32 | header JSON | pad to 64``, then the
    sections of :data:`_SECTIONS` as raw little-endian arrays at multiples of 64 (keys: UTF-8,
    each followed by a NUL byte; json: the json members' bytes, concatenated). Written atomically,
    mapped when read, never unpickled."""

    def __init__(self, shards: list[tuple[str, int, int]], arrays: dict[str, Any], classes: tuple[str, ...],
                 data_key: str | None, keys_at: tuple[Any, int] | None = None) -> None:
        self.shards, self.classes, self.data_key = shards, tuple(classes), data_key
        self.shard, self.offset, self.length = arrays["shard"], arrays["offset"], arrays["length"]
        self.cls, self.label = arrays["cls"], arrays["label"]
        # the keys' bytes as a buffer that slices to bytes (the mapped file, or bytes) and where they start
        self._kbuf, self._kbase = keys_at or (arrays["keys"].tobytes(), 0)
        self._koff = memoryview(np.ascontiguousarray(arrays["key_offsets"]))
        self._json, self._joff = arrays["json"], memoryview(np.ascontiguousarray(arrays["json_offsets"]))
        self._arrays = arrays
        self.count = len(self.shard)

    @property
    def stamp(self) -> str:
        return _stamp(self.shards, self.data_key)

    def key(self, i: int) -> str:
        b = self._kbase
        return self._kbuf[b + self._koff[i]:b + self._koff[i + 1] - 1].decode()

    def keys(self) -> Iterator[str]:
        for i in range(self.count):
            yield self.key(i)

    def find(self, key: str) -> int:
        """The row of ``key``, or -1 (a binary search over the sorted keys: no per-key dict)."""
        k, buf, b, off = key.encode(), self._kbuf, self._kbase, self._koff
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if buf[b + off[mid]:b + off[mid + 1] - 1] < k:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < self.count and buf[b + off[lo]:b + off[lo + 1] - 1] == k else -1

    def json_of(self, i: int) -> bytes:
        return bytes(self._json[self._joff[i]:self._joff[i + 1]])

    def has_json(self) -> bool:
        return len(self._json) > 0

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def build(cls, shards: list[tuple[str, int, int]], data_key: str | None,
              reuse: "ShardIndex | None" = None, threads: int = 16) -> "ShardIndex":
        """Read the headers of every shard, except those ``reuse`` holds unchanged, on ``threads``
        threads."""
        kept = {}
        if reuse is not None and reuse.data_key == data_key:
            old = {s: j for j, s in enumerate(reuse.shards)}
            kept = {sid: old[s] for sid, s in enumerate(shards) if s in old}
        rows: list[tuple[str, int, int, int, int, bytes]] = []
        for sid, j in kept.items():
            rows += [(reuse.key(i), sid, int(reuse.offset[i]), int(reuse.length[i]), int(reuse.cls[i]),
                      reuse.json_of(i)) for i in np.flatnonzero(reuse.shard == j).tolist()]
        todo = [sid for sid in range(len(shards)) if sid not in kept]
        # several shards at once: on a shared file system each header read waits for the network
        with ThreadPoolExecutor(min(threads, max(1, len(todo))), thread_name_prefix="clairvoyant-index") as pool:
            for sid, found in zip(todo, pool.map(lambda s: _scan_shard(shards[s][0], data_key), todo)):
                rows += [(k, sid, o, n, c, js) for k, o, n, c, js in found]
        rows.sort()
        owner: dict[str, int] = {}
        for key, sid, *_ in rows:
            skey = split_member(key)[0]
            prev = owner.setdefault(skey, sid)   # within a shard, _scan_shard made each sample once
            if prev != sid:
                raise ShardError(f"sample {skey!r} is in two shards, {shards[prev][0]} and {shards[sid][0]}: "
                                 "each sample must be in one shard; remove one copy or pass the shards "
                                 "of one data set only")
        return cls.from_rows(shards, rows, data_key)

    @classmethod
    def from_rows(cls, shards, rows, data_key) -> "ShardIndex":
        n = len(rows)
        keys = [r[0].encode() for r in rows]
        koff = np.zeros(n + 1, dtype="<u8")
        np.cumsum([len(k) + 1 for k in keys], out=koff[1:])
        js = [r[5] for r in rows]
        joff = np.zeros(n + 1, dtype="<u8")
        np.cumsum([len(j) for j in js], out=joff[1:])
        arrays = {
            "shard": np.array([r[1] for r in rows], dtype="<u4"),
            "offset": np.array([r[2] for r in rows], dtype="<i8"),
            "length": np.array([r[3] for r in rows], dtype="<i8"),
            "cls": np.array([r[4] for r in rows], dtype="<i8"),
            "key_offsets": koff, "keys": np.frombuffer(b"\0".join(keys) + b"\0" if keys else b"", dtype="|u1"),
            "json_offsets": joff, "json": np.frombuffer(b"".join(js), dtype="|u1"),
        }
        arrays["label"], classes = _labels([r[0] for r in rows], arrays["cls"])
        return cls(shards, arrays, classes, data_key)

    # -- persisting -------------------------------------------------------------------------

    def save(self, path: str) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        table, pos = {}, 0
        for name, dtype in _SECTIONS.items():
            nbytes = self._arrays[name].nbytes
            table[name] = {"offset": pos, "nbytes": nbytes, "dtype": dtype}
            pos = _align(pos + nbytes)
        header = json.dumps({"format": "clairvoyant-shard-index", "version": _VERSION, "count": self.count,
                             "shards": [list(s) for s in self.shards], "data_key": self.data_key,
                             "classes": list(self.classes), "sections": table}, separators=(",", ":")).encode()
        head = _PREFIX.pack(_MAGIC, _VERSION, len(header)) + header

        def fill(fd: int) -> int:
            n = write_all(fd, head + b"\0" * (_align(len(head)) - len(head)))
            for name in _SECTIONS:
                view = memoryview(np.ascontiguousarray(self._arrays[name])).cast("B")
                n += write_all(fd, bytes(view) + b"\0" * (_align(len(view)) - len(view)))
            return n

        write_atomically(path, os.path.join(directory, f".{os.path.basename(path)}.{pid()}.tmp"), fill)

    @classmethod
    def load(cls, path: str) -> "ShardIndex":
        """Raise ValueError (or OSError) where the file is not a whole index of this version."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            magic, version, hlen = _PREFIX.unpack(f.read(_PREFIX.size).ljust(_PREFIX.size, b"\0"))
            if magic != _MAGIC or version != _VERSION or _PREFIX.size + hlen > size:
                raise ValueError("not a shard index of this version")
            doc = json.loads(f.read(hlen))
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        base, n = _align(_PREFIX.size + hlen), int(doc["count"])
        arrays = {}
        for name, dtype in _SECTIONS.items():
            s = doc["sections"][name]
            start, nbytes, dt = base + int(s["offset"]), int(s["nbytes"]), np.dtype(dtype)
            if s["dtype"] != dtype or start + nbytes > size or nbytes % dt.itemsize:
                raise ValueError(f"section {name} does not fit")
            arrays[name] = np.frombuffer(mm, dtype=dt, count=nbytes // dt.itemsize, offset=start)
        for name in ("shard", "offset", "length", "cls", "label"):
            if len(arrays[name]) != n:
                raise ValueError(f"section {name} has {len(arrays[name])} values for {n} samples")
        for name, blob in (("key_offsets", "keys"), ("json_offsets", "json")):
            off = arrays[name]
            if len(off) != n + 1 or (n and (int(off[0]) != 0 or int(off[-1]) != len(arrays[blob])
                                            or bool(np.any(off[1:] < off[:-1])))):
                raise ValueError(f"section {name} is inconsistent")
        shards = [(str(p), int(s), int(m)) for p, s, m in doc["shards"]]
        if n and (int(arrays["shard"].max()) >= len(shards) or int(arrays["offset"].min()) < 0
                  or bool(np.any(arrays["offset"] + arrays["length"] >
                                 np.array([s[1] for s in shards], dtype=np.int64)[arrays["shard"]]))):
            raise ValueError("a range lies outside its shard")
        return cls(shards, arrays, tuple(doc["classes"]), doc["data_key"],
                   keys_at=(mm, base + int(doc["sections"]["keys"]["offset"])))


def _labels(keys: list[str], cls: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """cls labels where any sample has one (-1 where absent), else ImageFolder's, else -1; the
    classes of ImageFolder where they agree with the labels."""
    folder = classes = None
    if keys and all("/" in k for k in keys):
        top = [k.split("/", 1)[0] for k in keys]
        classes = tuple(sorted(set(top)))
        index = {c: i for i, c in enumerate(classes)}
        folder = np.fromiter((index[t] for t in top), dtype="<i8", count=len(keys))
    if bool(np.any(cls != _NO_CLS)):
        labels = np.where(cls == _NO_CLS, -1, cls).astype("<i8")
        return labels, classes if folder is not None and np.array_equal(folder, labels) else ()
    if folder is not None:
        return folder, classes
    return np.full(len(keys), -1, dtype="<i8"), ()


def _stamp(shards: list[tuple[str, int, int]], data_key: str | None) -> str:
    h = hashlib.sha1(json.dumps([data_key, shards]).encode())
    return h.hexdigest()[:20]


def index_path(paths: Sequence[str], data_key: str | None) -> str:
    """Where the index of these shards is kept: per user, named by the shards' paths (the sizes and
    modification times are checked against its header, so a changed shard replaces it)."""
    h = hashlib.sha1(json.dumps([data_key, list(paths)]).encode()).hexdigest()[:20]
    return os.path.join(cache_home(), "shards", f"{h}.index")


def _open_shard(path: str) -> int:
    return os.open(path, os.O_RDONLY)


