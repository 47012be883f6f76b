"""Packed tar shards (WebDataset layout) as a source: each sample read by its byte range.

A shard is an uncompressed tar. Its members are grouped into samples by the
member path up to the first dot of its last component (``class0/img001.jpg``
and ``class0/img001.cls`` are one sample); the part after that dot is the
member's field. A sample's bytes are its data member: the first of
:data:`DATA_EXTENSIONS` it has (or the field ``data_key=``). Its label is the
integer text of its ``cls`` member; where no sample has one, labels follow
ImageFolder (the first path component, classes sorted), else -1. A ``json``
member can travel with the sample as its fields (``fields=True``).

A sample's key is its data member's path (``class0/img001.jpg``), not the bare
WebDataset key: a tree of files and its pack (``clairvoyant pack``) then have
the same keys, so the same sorted manifest and, for a seed, the same batches.

Where each sample lies (shard, offset, length) is found once from the tar
headers and persisted (``source/tarindex.py``), so a later run reads no
headers. Reads are ``os.pread`` on descriptors kept open per process
(``nodeio/fdcache.py``); ``read_many`` coalesces neighbouring ranges of one shard.
"""

from __future__ import annotations

import glob as globmod
import hashlib
import json
import os
from typing import Iterator, Sequence

import numpy as np

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceNotFound
from ..nodeio.fdcache import FdCache
from . import tarindex
from .base import Source
from .files import names_files, resolve_files
from .tarindex import ShardError, ShardIndex, index_path, split_member

__all__ = ["TarShardSource", "ShardError", "split_member", "is_shard_dir"]

DEFAULT_GAP = 64 * 1024        # read_many: neighbours closer than this share one pread
RANGE_SPAN = 8 * 1024 * 1024   # sample_ranges: a shard is read whole in pieces of about this many bytes
MAX_SPAN = 16 * 1024 * 1024    # read_many: no single pread longer than this (unless one sample is)
MAX_OPEN = 64                  # shard descriptors kept open per process


# -- open descriptors, per process ------------------------------------------------------------

def _opener(path: str) -> int:
    return tarindex._open_shard(path)   # looked up at each call, so that tests can count opens


def _pread(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    while len(data) < n:   # a short read: a large range, or a network file system
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


# -- the source -------------------------------------------------------------------------------

class TarShardSource(Source):
    """The samples of a directory of ``.tar`` shards, a list of shard paths, or a glob."""

    def __init__(self, shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 data_key: str | None = None, fields: bool | Sequence[str] = False,
                 max_open: int = MAX_OPEN) -> None:
        if data_key is not None and (not isinstance(data_key, str) or not data_key):
            raise ConfigError(f"data_key={data_key!r}: give the field (extension) of the data member, e.g. 'npy'")
        if not isinstance(max_open, int) or max_open < 1:
            raise ConfigError(f"max_open must be an integer >= 1, got {max_open!r}")
        self.paths, self.uri = _resolve(shards)
        if data_key is not None:
            data_key = data_key.lower().lstrip(".")
            self.uri += f"?data={data_key}"
        self.data_key, self.max_open, self._want_fields = data_key, max_open, fields
        self._fds = FdCache(max_open, opener=_opener)
        self._index: ShardIndex | None = None
        self._index_file: str | None = None   # where the index was loaded from or saved to
        self._load_index()

    def __repr__(self) -> str:
        return f"TarShardSource({self.uri!r}, {len(self.paths)} shards)"

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d["_fds"] = None
        d["_index"] = None
        d["_stamp"] = self._index.stamp if self._index is not None else None
        return d

    def __setstate__(self, d: dict) -> None:
        stamp = d.pop("_stamp", None)
        self.__dict__.update(d)
        self._fds = FdCache(self.max_open, opener=_opener)
        if stamp is not None and self._index_file is not None:   # checked by the pickling process
            try:
                index = ShardIndex.load(self._index_file)
                if index.stamp == stamp:
                    self._index = index
                    return
            except (OSError, ValueError, KeyError, TypeError):
                pass
        self._load_index()

    # -- the index ---------------------------------------------------------------------------

    def _load_index(self) -> None:
        shards = []
        for p in self.paths:
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise SourceNotFound(f"shard {p} does not exist: check the path (is the file system "
                                     "mounted?)") from None
            shards.append((p, st.st_size, st.st_mtime_ns))
        path = index_path(self.paths, self.data_key)
        old = None
        try:
            old = ShardIndex.load(path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            old = None   # damaged or of another version: it is rebuilt
        if old is not None and old.shards == shards and old.data_key == self.data_key:
            self._index, self._index_file = old, path
            return
        index = ShardIndex.build(shards, self.data_key, reuse=old)
        if index.count == 0:
            raise EmptySourceError(f"the shards of {self.uri} hold no samples: check the paths")
        try:
            index.save(path)
            self._index_file = path
        except OSError:
            self._index_file = None   # a read-only cache home costs a header scan next time
        self._index = index

    @property
    def index(self) -> ShardIndex:
        if self._index is None:
            self._load_index()
        return self._index

    @property
    def labels(self) -> dict[str, int]:
        """Each sample's label (what the manifest records)."""
        ix = self.index
        return dict(zip(ix.keys(), ix.label.tolist()))

    @property
    def classes(self) -> tuple[str, ...]:
        return self.index.classes

    @property
    def has_fields(self) -> bool:
        return bool(self._want_fields) and self.index.has_json()

    #: a sample is a plain byte span of its shard (``native_span``): the native staging threads
    #: pread it themselves; False for a subclass that reads, charges or checks otherwise
    native_reads = True

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "native_reads" not in cls.__dict__ and any(
                m in cls.__dict__ for m in ("read", "read_versioned", "_read_range", "read_range")):
            cls.native_reads = False

    def native_span(self, key: str, size: int) -> tuple[str, int, int] | None:
        ix = self.index
        i = ix.find(key)
        if i < 0 or int(ix.length[i]) != size:
            return None
        path, _, mtime_ns = ix.shards[int(ix.shard[i])]
        return path, int(ix.offset[i]), int(mtime_ns)

    def locate(self, key: str) -> tuple[str, int, int]:
        """``(shard path, offset, length)`` of sample ``key``."""
        ix, i = self.index, self._row(key)
        return ix.shards[int(ix.shard[i])][0], int(ix.offset[i]), int(ix.length[i])

    def _row(self, key: str) -> int:
        i = self.index.find(key)
        if i < 0:
            raise SampleReadError(f"sample {key!r} is not in the shards of {self.uri}: they changed since the "
                                  "manifest was made; run `clairvoyant index --force` on them, or pass reindex=True")
        return i

    # -- the Source interface ----------------------------------------------------------------

    def scan(self) -> Iterator[tuple[str, int]]:
        ix = self.index
        for i, key in enumerate(ix.keys()):
            yield key, int(ix.length[i])

    def read(self, key: str) -> bytes:
        ix = self.index
        i = self._row(key)
        return self._read_range(int(ix.shard[i]), int(ix.offset[i]), int(ix.length[i]), key)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        """The bytes and the shard's modification time (ns) when its headers were read."""
        ix = self.index
        i = self._row(key)
        sid = int(ix.shard[i])
        return self._read_range(sid, int(ix.offset[i]), int(ix.length[i]), key), ix.shards[sid][2]

    def version(self, key: str) -> tuple[int, int]:
        """``(size, modification time in ns of its shard)`` now: one stat."""
        ix = self.index
        i = self._row(key)
        path = ix.shards[int(ix.shard[i])][0]
        try:
            st = os.stat(path)
        except OSError as e:
            raise self.read_error(key, path, e) from e
        return int(ix.length[i]), st.st_mtime_ns

    def fields_of(self, key: str) -> dict:
        """The sample's json member, parsed (its keys restricted to ``fields=`` when a list)."""
        raw = self.index.json_of(self._row(key))
        try:
            doc = json.loads(raw) if raw else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise SampleReadError(f"the json member of sample {key!r} in {self.uri} is not JSON ({e}): fix the "
                                  "shard") from e
        doc = doc if isinstance(doc, dict) else {"json": doc}
        if isinstance(self._want_fields, (list, tuple)):
            return {n: doc.get(n) for n in self._want_fields}
        return doc

    def read_many(self, keys: Sequence[str], gap: int = DEFAULT_GAP, max_span: int = MAX_SPAN) -> list[bytes]:
        """The bytes of each of ``keys``, in order. Ranges of one shard that lie within ``gap`` bytes
        of each other are read by one pread (no longer than ``max_span`` unless one sample is)."""
        ix = self.index
        spans = []
        for pos, key in enumerate(keys):
            i = self._row(key)
            spans.append((int(ix.shard[i]), int(ix.offset[i]), int(ix.length[i]), pos))
        spans.sort()
        out: list[bytes] = [b""] * len(keys)
        run: list[tuple[int, int, int, int]] = []
        end = 0
        for s in spans:
            sid, off, n, _ = s
            if run and (sid != run[0][0] or off - end > gap or max(end, off + n) - run[0][1] > max_span):
                self._read_run(run, end, out, keys)
                run = []
            end = max(end, off + n) if run else off + n
            run.append(s)
        if run:
            self._read_run(run, end, out, keys)
        return out

    def _read_run(self, run, end: int, out: list[bytes], keys: Sequence[str]) -> None:
        sid, start = run[0][0], run[0][1]
        what = keys[run[0][3]] if len(run) == 1 else f"{len(run)} samples from {keys[run[0][3]]!r}"
        buf = memoryview(self._read_range(sid, start, end - start, what))
        for _, off, n, pos in run:
            out[pos] = bytes(buf[off - start:off - start + n])

    def _read_range(self, sid: int, offset: int, n: int, what: str) -> bytes:
        path = self.index.shards[sid][0]
        try:
            fd = self._fds.acquire(sid, path)
        except OSError as e:
            raise self.read_error(what, path, e) from e
        try:
            data = _pread(fd, n, offset)
        except OSError as e:
            raise self.read_error(what, path, e) from e
        finally:
            self._fds.release(sid)
        if len(data) != n:
            raise SampleReadError(f"sample {what!r}: shard {path} ends before its bytes {offset}..{offset + n}: "
                                  "it changed or was cut since it was indexed; copy it again (a new run "
                                  "re-reads its headers)")
        return data

    # -- ranges: samples read together ---------------------------------------------------------

    def sample_ranges(self, keys: Sequence[str], span: int = RANGE_SPAN) -> tuple[np.ndarray, np.ndarray]:
        """The shards cut into ranges of about ``span`` bytes (by where a sample starts), as the
        manifest ``keys`` number the samples: each sample's range (int32) and the bytes one read of
        each range takes (int64), plan/ranges.py's ``Ranges``. ``read_range`` reads one."""
        ix = self.index
        rows = self._rows_of(keys)
        shard, offset = ix.shard[rows].astype(np.int64), ix.offset[rows].astype(np.int64)
        end = offset + ix.length[rows].astype(np.int64)
        piece = np.stack([shard, offset // max(1, int(span))], axis=1)
        uniq, of = np.unique(piece, axis=0, return_inverse=True)
        of = of.reshape(-1).astype(np.int32)
        n = len(uniq)
        start = np.full(n, np.iinfo(np.int64).max, np.int64)
        stop = np.zeros(n, np.int64)
        np.minimum.at(start, of, offset)
        np.maximum.at(stop, of, end)
        return of, stop - start

    def read_range(self, keys: Sequence[str]) -> tuple[list[bytes], int]:
        """The bytes of ``keys`` (samples of one shard: one range of ``sample_ranges``), in that
        order, read with one request over the span they lie in, and the shard's modification time
        (ns) when its headers were read."""
        ix = self.index
        rows = [self._row(k) for k in keys]
        if not rows:
            return [], 0
        sid = int(ix.shard[rows[0]])
        if any(int(ix.shard[r]) != sid for r in rows):
            raise ValueError(f"read_range: {len(keys)} samples from more than one shard ({keys[0]!r}...)")
        first = min(int(ix.offset[r]) for r in rows)
        stop = max(int(ix.offset[r]) + int(ix.length[r]) for r in rows)
        what = f"{len(rows)} samples from {keys[0]!r} (bytes {first}..{stop} of {ix.shards[sid][0]})"
        buf = memoryview(self._read_range(sid, first, stop - first, what))
        out = []
        for r in rows:
            at = int(ix.offset[r]) - first
            out.append(bytes(buf[at:at + int(ix.length[r])]))
        return out, ix.shards[sid][2]

    def _rows_of(self, keys: Sequence[str]) -> np.ndarray:
        """The index row of each manifest key (the identity where the manifest lists the index)."""
        ix = self.index
        if len(keys) == ix.count and all(a == b for a, b in zip(keys, ix.keys())):
            return np.arange(ix.count, dtype=np.int64)
        return np.fromiter((self._row(k) for k in keys), np.int64, len(keys))

    def read_error(self, key: str, path: str, e: OSError) -> SampleReadError:
        if isinstance(e, FileNotFoundError):
            return SampleReadError(f"sample {key!r}: shard {path} is gone: the shards changed since they were "
                                   "indexed; run `clairvoyant index --force` on them, or pass reindex=True")
        return SampleReadError(f"cannot read sample {key!r} from shard {path}: {e.strerror or e}; check the "
                               "file and its permissions")

    def close(self) -> None:
        """Close this process's shard descriptors (they reopen on the next read)."""
        self._fds.close()


def _resolve(shards) -> tuple[list[str], str]:
    """The shard paths (absolute, sorted) and the source's uri: the directory's, the one shard's, or
    the shards' common folder with a digest of their paths."""
    paths, root = resolve_files(shards, (".tar",), "tar shard", any_suffix=True,
                                hint=", or make them with `clairvoyant pack`")
    if isinstance(shards, (str, os.PathLike)) and not globmod.has_magic(os.fspath(shards)):
        return paths, "tar+file://" + (root if os.path.isdir(os.fspath(shards)) else paths[0])
    digest = hashlib.sha1("\0".join(paths).encode()).hexdigest()[:16]
    return paths, f"tar+file://{root}#{digest}"


def is_shard_dir(path: str) -> bool:
    """A directory whose visible entries are all ``.tar`` files (at least one)."""
    return os.path.isdir(path) and names_files(path, (".tar",))
