"""The manifest in memory: every sample's key, size and label, in a stable order (sorted keys).

:class:`Keys` holds the keys as one blob of NUL-terminated UTF-8 with offsets (mapped from a
version-2 file, or built from strings); :class:`Manifest` adds sizes, labels, classes and a
directory source's tree, and derives the fingerprint and the digest index (the local tier's
entry names) once. Version 1's JSON document is built and read here (``to_json``/``from_json``);
the file format is ``fileformat.py``.

Labels follow torchvision's ImageFolder: when every key lies in a top-level
sub-directory, those directories are the classes, in sorted order; otherwise
every sample's label is -1. A listed source (a list file, a torchvision-style
dataset) gives its own labels and classes.
"""


from __future__ import annotations

import hashlib
import mmap
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..errors import ManifestError
from .tree import Tree

FORMAT = "clairvoyant-manifest"
_CHUNK = 1 << 20               # samples per step of a whole-array check: bounded temporaries


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
