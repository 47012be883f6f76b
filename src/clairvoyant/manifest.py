"""The index of a source: every sample's key, size and label, listed once and persisted.

A later run over the same source loads the persisted manifest instead of
walking the (slow, shared) file system again. The file is written atomically
and never unpickled. Version 2 (the default) is binary: a small JSON header,
then raw little-endian arrays that a reader maps into memory as they are, so
loading parses nothing per sample and the ranks of a node share one copy in
the page cache::

    magic (8 bytes) | version u32 | header length u32 | header (JSON) | pad to 64
    sections, each at a multiple of 64 from the end of the header's padding:
      sizes         <i8, one per key
      labels        <i4 (or <i8), one per key
      key_offsets   <u4 (or <u8), count + 1: key i is keys[off[i] : off[i+1] - 1]
      keys          UTF-8, each key followed by a NUL byte, keys sorted
      digests       <u8, sorted: the first 8 bytes of sha1(key) (cache entries' names), big-endian
      digest_order  <u4 (or <u8): the manifest index of each sorted digest

The header holds uri, created, classes, count, the fingerprint and each
section's place. Version 1 (one JSON document) is still read.

A directory source's manifest also holds its folders (empty ones too) and each file's mode and
times, as optional sections (``tree.py``; the header's ``folders`` counts them): the mount shows
them, and :func:`obtain` checks the folders against the source at each start (``refresh.py``).
A manifest without them loads as before, and earlier versions read one with them (they skip
sections they do not know).

Labels follow torchvision's ImageFolder: when every key lies in a top-level
sub-directory, those directories are the classes, in sorted order; otherwise
every sample's label is -1. A listed source (a list file, a torchvision-style
dataset) gives its own labels and classes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import operator
import os
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np

from .cache.publish import tmp_name
from .errors import EmptySourceError, ManifestError
from .fileio import write_all, write_atomically
from .paths import cache_home
from .source import Source
from .tree import PER as _TREE_PER, SECTIONS as _TREE_SECTIONS, Collector, Tree

FORMAT = "clairvoyant-manifest"
VERSION = 2                    # what save() writes
MAGIC = b"\x89CVYMAN\n"        # not UTF-8 and not JSON: a v2 file is never mistaken for v1
_PREFIX = struct.Struct("<8sII")   # magic, version, header length
ALIGN = 64
_MAX_HEADER = 1 << 26
_CHUNK = 1 << 20               # samples per step of a whole-array check: bounded temporaries
log = logging.getLogger("clairvoyant")
# dtypes each section may have
_DTYPES = {"sizes": ("<i8",), "labels": ("<i4", "<i8"), "key_offsets": ("<u4", "<u8"), "keys": ("|u1",),
           "digests": ("<u8",), "digest_order": ("<u4", "<u8")}


class Keys(Sequence):
    """The manifest's keys, read-only and lazy: one UTF-8 blob (each key followed by a NUL byte)
    and the offset of each key in it (from ``base``). ``keys[i]`` decodes one key; nothing is
    decoded at load."""

    __slots__ = ("_blob", "_off", "_base", "_mv", "_n")

    def __init__(self, blob: bytes | mmap.mmap, offsets: np.ndarray, base: int = 0) -> None:
        self._blob, self._off, self._base = blob, np.ascontiguousarray(offsets), int(base)
        self._mv = memoryview(self._off)   # Python ints on indexing: a third of numpy's cost per key
        self._n = len(offsets) - 1

    @classmethod
    def from_strings(cls, keys: Iterable[str]) -> "Keys":
        encoded = [k.encode() for k in keys]
        off = np.zeros(len(encoded) + 1, dtype=np.uint64)
        np.cumsum(np.fromiter((len(e) + 1 for e in encoded), dtype=np.uint64, count=len(encoded)), out=off[1:])
        blob = b"\0".join(encoded) + b"\0" if encoded else b""
        return cls(blob, off)

    def __len__(self) -> int:
        return self._n

    def _span(self, i: int) -> tuple[int, int]:
        """Where key ``i`` lies in the blob (without its NUL byte)."""
        return self._base + self._mv[i], self._base + self._mv[i + 1] - 1

    def __getitem__(self, i):
        if type(i) is int and 0 <= i < self._n:   # the common case first
            return self._blob[self._base + self._mv[i]:self._base + self._mv[i + 1] - 1].decode()
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step == 1:
                return Keys(self._blob, self._off[start:max(start, stop) + 1], self._base)
            return [self[j] for j in range(start, stop, step)]
        i = operator.index(i)
        j = i + self._n if i < 0 else i
        if not 0 <= j < self._n:
            raise IndexError(f"key index {i} out of range for {self._n} keys")
        a, b = self._span(j)
        return self._blob[a:b].decode()

    def __iter__(self) -> Iterator[str]:
        n, step = len(self), 65536
        for start in range(0, n, step):
            off = (self._off[start:min(n, start + step) + 1] + np.uint64(self._base)).tolist()
            first = off[0]
            chunk = self._blob[first:off[-1]]
            parts = chunk[:-1].decode().split("\0")
            if len(parts) == len(off) - 1:   # no key holds a NUL itself: one split
                yield from parts
            else:
                for a, b in zip(off, off[1:]):
                    yield chunk[a - first:b - first - 1].decode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return len(self) == len(other) and self.nul_joined() == other.nul_joined()
        if isinstance(other, (tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(k) for k in self[:3])
        return f"Keys([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} keys)"

    def __reduce__(self):
        return Keys, (bytes(self.nul_joined()), self.offsets())

    def offsets(self) -> np.ndarray:
        """Where each key starts in :meth:`nul_joined` (count + 1, from 0)."""
        return (self._off - self._off[0]).astype(np.uint64, copy=False)

    def nul_joined(self) -> memoryview:
        """Every key followed by a NUL byte, in order: what the fingerprint hashes."""
        return memoryview(self._blob)[self._base + int(self._off[0]):self._base + int(self._off[-1])]

    def raw(self, i: int) -> bytes:
        """Key ``i`` encoded, not decoded."""
        a, b = self._span(i)
        return self._blob[a:b]

    def digests64(self) -> np.ndarray:
        """Per key, the first 8 bytes of sha1(key) (the cache's entry names) as big-endian uint64."""
        sha1, blob, n = hashlib.sha1, self._blob, len(self)
        out = np.empty(n, dtype=np.uint64)
        for start in range(0, n, _CHUNK):
            off = (self._off[start:min(n, start + _CHUNK) + 1] + np.uint64(self._base)).tolist()
            part = b"".join([sha1(blob[a:b - 1]).digest()[:8] for a, b in zip(off, off[1:])])
            out[start:start + len(off) - 1] = np.frombuffer(part, dtype=">u8")
        return out


@dataclass(frozen=True, eq=False)
class Manifest:
    """What a source holds, in a stable order (sorted keys). ``keys`` may be given as any sequence
    of strings; it is held as :class:`Keys`."""

    uri: str
    keys: Keys
    sizes: np.ndarray  # int64, one per key, read-only
    labels: np.ndarray  # int32 or int64, one per key, read-only; -1 where the layout gives no label
    classes: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)
    tree: Tree | None = None   # a directory source's folders and file attributes (tree.py)
    # fingerprint and digest index, once computed (or read from a v2 file)
    _derived: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        keys = self.keys if isinstance(self.keys, Keys) else Keys.from_strings(self.keys)
        set_ = object.__setattr__
        set_(self, "keys", keys)
        set_(self, "sizes", _frozen(self.sizes, (np.int64,)))
        set_(self, "labels", _frozen(self.labels, (np.int64, np.int32)))
        set_(self, "classes", tuple(self.classes))
        if not len(self.sizes) == len(self.labels) == len(keys):
            raise ValueError(f"{len(keys)} keys but {len(self.sizes)} sizes and {len(self.labels)} labels")
        if self.tree is not None and len(self.tree) != len(keys):
            raise ValueError(f"{len(keys)} keys but the tree has {len(self.tree)} files")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    @property
    def fingerprint(self) -> str:
        """Changes whenever a key, a size or a label changes: sha1 over each key followed by a NUL
        byte, then the sizes and the labels as <i8; its first 20 hex digits. Computed once (a v2
        file holds it)."""
        fp = self._derived.get("fingerprint")
        if fp is None:
            fp = self._derived["fingerprint"] = self.compute_fingerprint()
        return fp

    def compute_fingerprint(self) -> str:
        h = hashlib.sha1(self.keys.nul_joined())
        for a in range(0, max(len(self), 1), _CHUNK):
            h.update(np.ascontiguousarray(self.sizes[a:a + _CHUNK], dtype="<i8").tobytes())
        for a in range(0, max(len(self), 1), _CHUNK):
            h.update(np.ascontiguousarray(self.labels[a:a + _CHUNK], dtype="<i8").tobytes())
        return h.hexdigest()[:20]

    def digest_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(digests, order)``: the keys' 64-bit sha1 prefixes sorted, and the manifest index of
        each; read from a v2 file, else computed once (a sha1 per key)."""
        got = self._derived.get("digest_index")
        if got is None:
            d = self.keys.digests64()
            order = np.argsort(d, kind="stable")
            got = self._derived["digest_index"] = (d[order], order)
        return got

    def find_digests(self, digests: np.ndarray) -> np.ndarray:
        """For each 64-bit key digest (the local tier's index, cache/extents.py), the manifest index
        of that key, or -1 (absent, or shared by two keys of the manifest: then neither is trusted)."""
        out = np.full(len(digests), -1, dtype=np.int64)
        if not len(digests) or not len(self):
            return out
        sorted_d, order = self.digest_index()
        d = np.asarray(digests, dtype=np.uint64)
        d = np.where(d == 0, np.uint64(1), d)   # the index never stores 0 (extents.key_digest)
        ref = np.where(sorted_d == 0, np.uint64(1), sorted_d)
        lo = np.searchsorted(ref, d, side="left")
        hi = np.searchsorted(ref, d, side="right")
        one = hi - lo == 1
        out[one] = order[lo[one]]
        n = len(self)
        if one.any() and not ((out[one] >= 0) & (out[one] < n)).all():
            raise ManifestError(f"manifest of {self.uri}: digest index out of range for {n} keys: delete the "
                                "manifest, or rebuild it with `clairvoyant index --force`")
        return out

    @classmethod
    def from_entries(cls, uri: str, entries: Iterable[tuple[str, int]], labels: dict[str, int] | None = None,
                     classes: tuple[str, ...] = ()) -> "Manifest":
        """Keys sorted; labels given (a listed source), else from the top-level directories."""
        items = sorted(entries)
        keys = [k for k, _ in items]
        sizes = np.fromiter((s for _, s in items), dtype=np.int64, count=len(items))
        del items
        return cls.from_columns(uri, keys, sizes, labels, classes)

    @classmethod
    def from_columns(cls, uri: str, keys: list[str], sizes: np.ndarray, labels: dict[str, int] | None = None,
                     classes: tuple[str, ...] = (), tree: Tree | None = None) -> "Manifest":
        """``keys`` already sorted, ``sizes`` (and ``tree``'s files) in their order; labels as
        :meth:`from_entries` gives them."""
        if labels is not None:
            given = np.fromiter((labels[k] for k in keys), dtype=np.int64, count=len(keys))
            return cls(uri=uri, keys=keys, sizes=sizes, labels=given, classes=tuple(classes), tree=tree)
        if keys and all("/" in k for k in keys):
            top = [k.split("/", 1)[0] for k in keys]
            classes = tuple(sorted(set(top)))
            index = {c: i for i, c in enumerate(classes)}
            labels = np.fromiter((index[t] for t in top), dtype=np.int64, count=len(keys))
        else:
            classes = ()
            labels = np.full(len(keys), -1, dtype=np.int64)
        return cls(uri=uri, keys=keys, sizes=sizes, labels=labels, classes=classes, tree=tree)

    def to_json(self) -> dict:
        """The version-1 document (JSON)."""
        return {
            "format": FORMAT, "version": 1, "uri": self.uri, "created": self.created,
            "classes": list(self.classes),
            "samples": [[k, int(s), int(l)] for k, s, l in zip(self.keys, self.sizes, self.labels)],
        }

    @classmethod
    def from_json(cls, doc: object, *, origin: str = "<memory>") -> "Manifest":
        """A version-1 document."""
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a clairvoyant manifest")
            if doc.get("version") != 1:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            samples = doc["samples"]
            keys = [str(s[0]) for s in samples]
            sizes = np.array([int(s[1]) for s in samples], dtype=np.int64)
            labels = np.array([int(s[2]) for s in samples], dtype=np.int64)
            return cls(uri=str(doc["uri"]), keys=keys, sizes=sizes, labels=labels,
                       classes=tuple(doc.get("classes", ())), created=float(doc.get("created", 0.0)))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ManifestError(
                f"manifest {origin} is unreadable ({e}): delete it, or rebuild it with `clairvoyant index --force`") from e


def _frozen(a, dtypes: tuple) -> np.ndarray:
    """``a`` as a read-only array of one of ``dtypes`` (the first unless it already has one)."""
    a = np.asarray(a)
    if a.dtype not in [np.dtype(d) for d in dtypes] or a.ndim != 1:
        a = np.ascontiguousarray(a, dtype=dtypes[0]).reshape(-1)
    if a.flags.writeable:
        a = a.copy()
        a.setflags(write=False)
    return a


def default_manifest_path(uri: str) -> str:
    """Where the manifest of the source ``uri`` is kept unless told otherwise."""
    digest = hashlib.sha1(uri.encode()).hexdigest()[:20]
    return os.path.join(cache_home(), "manifests", f"{digest}.manifest")


def legacy_manifest_path(uri: str) -> str:
    """Where versions before the binary format kept it (JSON): still read, then upgraded."""
    return default_manifest_path(uri)[:-len(".manifest")] + ".json"


def existing(uri: str, path: str | None = None) -> str | None:
    """The file to read the manifest of ``uri`` from: ``path`` if given (and there), else the
    default, else the default of the JSON versions; None when there is none."""
    if path is not None:
        return path if os.path.exists(path) else None
    for p in (default_manifest_path(uri), legacy_manifest_path(uri)):
        if os.path.exists(p):
            return p
    return None


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _sections(m: Manifest) -> dict[str, np.ndarray | memoryview]:
    n = len(m)
    blob = m.keys.nul_joined()
    off_dtype = "<u4" if len(blob) < 2 ** 32 else "<u8"
    labels = m.labels
    lab_dtype = "<i4" if n == 0 or (int(labels.min()) >= -2 ** 31 and int(labels.max()) < 2 ** 31) else "<i8"
    digests, order = m.digest_index()
    return {
        "sizes": np.ascontiguousarray(m.sizes, dtype="<i8"),
        "labels": np.ascontiguousarray(labels, dtype=lab_dtype),
        "key_offsets": np.ascontiguousarray(m.keys.offsets(), dtype=off_dtype),
        "keys": blob,
        "digests": np.ascontiguousarray(digests, dtype="<u8"),
        "digest_order": np.ascontiguousarray(order, dtype="<u4" if n < 2 ** 32 else "<u8"),
        **(m.tree.sections() if m.tree is not None else {}),
    }


def _write_v2(m: Manifest, fd: int) -> int:
    secs = _sections(m)
    table, pos = {}, 0
    for name, a in secs.items():
        nbytes = a.nbytes
        dtype = "|u1" if name in ("keys", "dir_keys") else a.dtype.str
        table[name] = {"offset": pos, "nbytes": nbytes, "dtype": dtype}
        pos = _align(pos + nbytes)
    header = json.dumps({"format": FORMAT, "version": 2, "uri": m.uri, "created": m.created,
                         "classes": list(m.classes), "count": len(m), "fingerprint": m.fingerprint,
                         **({"folders": len(m.tree.dirs)} if m.tree is not None else {}),
                         "sections": table}, separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, 2, len(header)) + header
    written = write_all(fd, head + b"\0" * (_align(len(head)) - len(head)))
    for name, a in secs.items():
        view = memoryview(a).cast("B") if isinstance(a, np.ndarray) else a
        written += write_all(fd, view) if len(view) else 0
        pad = _align(len(view)) - len(view)
        if pad and name != list(secs)[-1]:
            written += write_all(fd, b"\0" * pad)
    return written


def save(manifest: Manifest, path: str, *, version: int = VERSION) -> None:
    """Write atomically: a reader sees the old manifest or the new one, never half. ``version=1``
    writes the JSON of earlier versions."""
    if version not in (1, 2):
        raise ValueError(f"manifest version {version!r}: choose 1 (JSON) or 2 (binary)")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # a cache home may be shared by the nodes of a cluster: the host in the name keeps two nodes'
    # writers (the same pid, by chance) apart; fsync'ed, so that a crash never leaves a torn one
    tmp = f"{tmp_name(directory, path)}.{socket.gethostname()}"
    if version == 1:
        data = json.dumps(manifest.to_json(), separators=(",", ":")).encode()
        write_atomically(path, tmp, lambda fd: write_all(fd, data), durable=True)
    else:
        write_atomically(path, tmp, lambda fd: _write_v2(manifest, fd), durable=True)


def load(path: str, *, verify: bool = False) -> Manifest:
    """Read a manifest of either version. ``verify``: also recompute the fingerprint of a binary
    one and compare (one pass over the file; the checks of its layout are always made)."""
    with open(path, "rb") as f:
        head = f.read(_PREFIX.size)
        if head[:len(MAGIC)] == MAGIC[:len(head)] and head:
            return _load_v2(path, f, head, verify)
        f.seek(0)
        try:
            doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(
                f"manifest {path} is not valid JSON ({e}) nor a binary manifest: delete it and index the "
                "source again (`clairvoyant index --force`)") from e
    return Manifest.from_json(doc, origin=path)


def _bad(path: str, why: str) -> ManifestError:
    return ManifestError(f"manifest {path} is damaged ({why}): delete it, or rebuild it with "
                         "`clairvoyant index --force`")


def _load_v2(path: str, f, head: bytes, verify: bool) -> Manifest:
    if len(head) < _PREFIX.size:
        raise _bad(path, f"{len(head)} bytes, shorter than the header")
    _, version, hlen = _PREFIX.unpack(head)
    if version != 2:
        raise ManifestError(f"manifest {path} has format version {version}, which this clairvoyant cannot "
                            "read: upgrade clairvoyant, or rebuild it with `clairvoyant index --force`")
    size = os.fstat(f.fileno()).st_size
    if hlen > _MAX_HEADER or _PREFIX.size + hlen > size:
        raise _bad(path, f"header of {hlen} bytes in a file of {size}")
    try:
        doc = json.loads(f.read(hlen))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != 2:
            raise ValueError("not a clairvoyant manifest header")
        count, fp, table = doc["count"], doc["fingerprint"], doc["sections"]
        uri, classes, created = doc["uri"], doc.get("classes", []), float(doc.get("created", 0.0))
        if not (isinstance(count, int) and count >= 0 and isinstance(fp, str) and len(fp) == 20
                and isinstance(uri, str) and isinstance(classes, list)
                and all(isinstance(c, str) for c in classes) and isinstance(table, dict)):
            raise ValueError("header fields of the wrong type")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise _bad(path, f"header: {e}") from e
    base = _align(_PREFIX.size + hlen)
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def section(name: str, allowed: tuple[str, ...], want: int | None) -> np.ndarray:
        s = table.get(name)
        if not (isinstance(s, dict) and isinstance(s.get("offset"), int) and isinstance(s.get("nbytes"), int)
                and s.get("dtype") in allowed):
            raise _bad(path, f"section {name} missing or malformed: {s!r}")
        dt = np.dtype(s["dtype"])
        start, nbytes = base + s["offset"], s["nbytes"]
        if s["offset"] < 0 or nbytes < 0 or start % dt.itemsize or nbytes % dt.itemsize or start + nbytes > size:
            raise _bad(path, f"section {name} at {start}+{nbytes} does not fit a file of {size} bytes")
        if want is not None and nbytes != want * dt.itemsize:
            raise _bad(path, f"section {name} holds {nbytes // dt.itemsize} values, not {want}")
        return np.frombuffer(mm, dtype=dt, count=nbytes // dt.itemsize, offset=start)

    arrays = {name: section(name, allowed, {"key_offsets": count + 1, "keys": None}.get(name, count))
              for name, allowed in _DTYPES.items()}
    tree = _load_tree(path, doc, count, section)
    off, nkeys = arrays["key_offsets"], len(arrays["keys"])
    if int(off[0]) != 0 or int(off[-1]) != nkeys:
        raise _bad(path, f"key offsets span {int(off[0])}..{int(off[-1])}, the keys {nkeys} bytes")
    for a in range(0, count, _CHUNK):   # every key at least its NUL byte: strictly increasing
        part = off[a:a + _CHUNK + 1]
        if not bool(np.all(part[1:] > part[:-1])):
            raise _bad(path, "key offsets not increasing")
    keys = Keys(mm, off, base + table["keys"]["offset"])
    m = Manifest(uri=uri, keys=keys, sizes=arrays["sizes"], labels=arrays["labels"], classes=tuple(classes),
                 created=created, tree=tree)
    m._derived["fingerprint"] = fp
    m._derived["digest_index"] = (arrays["digests"], arrays["digest_order"])
    if verify and m.compute_fingerprint() != fp:
        raise _bad(path, "its content does not match its fingerprint")
    return m


def _load_tree(path: str, doc: dict, count: int, section: Callable) -> Tree | None:
    """The folders and file attributes of a v2 file, if it holds them (``folders`` in its header)."""
    folders = doc.get("folders")
    if folders is None:
        return None
    if not (isinstance(folders, int) and folders >= 0):
        raise _bad(path, f"folders {folders!r} in the header")
    per = {"files": count, "dirs": folders}
    arrays = {name: section(name, allowed, per[_TREE_PER[name][0]] * _TREE_PER[name][1] if _TREE_PER[name]
                            else (folders + 1 if name == "dir_key_offsets" else None))
              for name, allowed in _TREE_SECTIONS.items()}
    try:
        return Tree.from_sections(arrays)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"folder records: {e}") from e


def build(source: Source, progress: Callable[[int], None] | None = None) -> Manifest:
    """Walk the source once (a directory source: its folders and file attributes too)."""
    if source.walks_folders:   # a PosixSource: its walk, folders included
        source.check()
        got = Collector()
        for item in source.walk_tree():
            got.add(*item)
            if progress is not None and not item[1].is_dir and len(got.keys) % 1000 == 0:
                progress(len(got.keys))
        if not got.keys:
            raise EmptySourceError(f"data source {source.root!r} holds no files: point it at the directory that "
                                   "holds the samples")
        keys, sizes, tree = got.finish()
        return Manifest.from_columns(source.uri, keys, sizes, source.labels, tuple(source.classes), tree)
    entries = []
    for entry in source.scan():
        entries.append(entry)
        if progress is not None and len(entries) % 1000 == 0:
            progress(len(entries))
    return Manifest.from_entries(source.uri, entries, source.labels, tuple(source.classes))


def obtain(source: Source, path: str | None = None, *, reindex: bool = False,
           require_folders: bool = False) -> tuple[Manifest, bool]:
    """The persisted manifest of ``source`` if there is one, else build and persist it.

    Returns ``(manifest, built)``; ``built`` says whether the source was walked whole. A JSON
    manifest found at the default place (an earlier version's) is read and saved again in the
    binary format. A directory source's manifest is checked against the source first (one stat
    per folder, :func:`current`); ``require_folders``: one that records no folders (an earlier
    version's) is rebuilt rather than used as it is (the mount shows every folder). A manifest
    ``path`` the caller gave that exists is pinned: checked, a change logged, never rewritten
    (``reindex=True`` builds it anew).
    """
    target = path or default_manifest_path(source.uri)
    found = None if reindex else existing(source.uri, path)
    manifest = None
    if found is not None:
        try:
            manifest = load(found)
        except ManifestError as e:
            if path is not None:   # the user's: theirs to fix
                raise
            # ours, torn or damaged (a crash of an older version): list the source again
            log.warning("the manifest %s of %s cannot be read (%s): listing the source again", found, source.uri, e)
    if manifest is not None:
        if manifest.uri != source.uri:
            raise ManifestError(
                f"manifest {found} belongs to {manifest.uri}, not to {source.uri}: pass the right manifest= "
                "or rebuild with reindex=True")
        pinned = found if path is not None and found == path else None
        fresh, changed = current(source, manifest, found, require_folders=require_folders, pinned=pinned)
        if pinned is not None and fresh is not None:
            return manifest, False   # the user's file, as it is
        manifest = fresh
        if manifest is not None:
            if found != target or changed:
                _save_quietly(manifest, target)
            return manifest, False
    manifest = build(source)
    _save_quietly(manifest, target)
    return manifest, True


def current(source: Source, manifest: Manifest, origin: str, *, require_folders: bool = False,
            pinned: str | None = None) -> tuple[Manifest | None, bool]:
    """``(manifest, changed)``: a directory source's persisted ``manifest`` (read from ``origin``)
    with the folders that changed since listed again (``refresh.py``; ``changed``: save it again);
    other sources' as it is. ``(None, False)`` when it records no folders and ``require_folders``:
    walk the source again."""
    if not source.walks_folders:
        return manifest, False
    if manifest.tree is None:
        if require_folders:
            log.warning("manifest %s of %s records no folders (an earlier clairvoyant wrote it): walking the "
                        "source again, once, to show every folder and to notice later changes", origin, source.root)
            return None, False
        log.warning("manifest %s of %s records no folders (an earlier clairvoyant wrote it): files added to or "
                    "removed from the source since are not noticed; run `clairvoyant index --force %s` once to "
                    "record them", origin, source.root, source.root)
        return manifest, False
    from . import refresh

    fresh, changes = refresh.check(source, manifest, pinned=pinned)
    return fresh, changes.saved


def _save_quietly(manifest: Manifest, path: str) -> None:
    try:
        save(manifest, path)
    except OSError:
        pass  # a read-only cache home costs a re-walk next time, nothing more
