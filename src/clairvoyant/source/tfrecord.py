"""TFRecord files as a source: each record a sample, read by its byte range, its CRCs checked.

A TFRecord file is a run of records, each ``length`` (u64, little-endian), the masked CRC-32C of
those 8 bytes (u32), ``length`` bytes of data, the masked CRC-32C of the data (u32). The files are
walked once, header by header (one sequential pass of buffered reads), when the manifest is made;
a sample's key carries where its record starts (``<file>/<offset>``, the offset zero-padded so
that sorted keys keep the file's order), and its size is the data's length, so the manifest is
the index: a later run reads no headers. A read takes the record's 16 framing bytes with its
data in one request and checks both CRCs; a mismatch is a :class:`SampleReadError` naming the file,
the offset and the sample. Neighbouring records form ranges of about 8 MiB, read whole where the
plan says so.

Readers hand the record's bytes to ``decode=``: a parser of the user's ``tf.train.Example``
(``tf.io.parse_single_example``), or :func:`parse_example`, which reads an Example's features
without TensorFlow. GZIP- or ZLIB-compressed TFRecords cannot be read by byte range and are
refused. The CRCs need the ``crc32c`` package (``pip install 'clairvoyant[tfrecord]'``), or
``check_crc=False``.
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceError
from ..nodeio.fdcache import FdCache
from .base import Source
from .rows import NoLabels
from .files import listed_files, names_files, one_file, read_span, resolve_files

__all__ = ["TFRecordSource", "TFRecordError", "parse_example", "is_tfrecord_path"]

SUFFIXES = (".tfrecord", ".tfrecords")
RANGE_SPAN = 8 * 1024 * 1024
MAX_OPEN = 64
_HEAD = struct.Struct("<QI")     # length, masked crc of the length
_FOOT = struct.Struct("<I")      # masked crc of the data
_MASK_DELTA = 0xA282EAD8


class TFRecordError(SourceError):
    """A TFRecord file whose framing is broken (truncated, a bad header CRC, compressed)."""


def _crc32c():
    try:
        import crc32c
    except ImportError:
        return None
    return crc32c.crc32c


def masked_crc(data) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def is_tfrecord_path(path: str) -> bool:
    """A ``.tfrecord(s)`` file or glob, or a directory whose visible entries are all such files."""
    return names_files(path, SUFFIXES)


class TFRecordSource(Source):
    """The records of TFRecord files: a file, a directory of them, a glob or a list."""

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 check_crc: bool = True, max_open: int = MAX_OPEN) -> None:
        self.paths, root = resolve_files(paths, SUFFIXES, 'TFRecord')
        if check_crc and _crc32c() is None:
            raise ConfigError("checking TFRecord CRCs needs the crc32c package: pip install 'clairvoyant[tfrecord]' "
                              "(or pass check_crc=False)")
        self.check_crc, self.max_open = bool(check_crc), max_open
        self._names = [os.path.relpath(p, root).replace(os.sep, "/") for p in self.paths]
        self._by_name = {n: i for i, n in enumerate(self._names)}
        self._width = [len(str(max(os.path.getsize(p), 1))) for p in self.paths]
        digest, self._mtimes = listed_files(self.paths)
        self.uri = f"tfrecord+file://{root}#{digest}"
        self._fds = FdCache(max_open)

    def __repr__(self) -> str:
        return f"TFRecordSource({self.uri!r}, {len(self.paths)} files)"

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d["_fds"] = None
        d.pop("_known", None)   # (the manifest's sizes: a reader reads a record's header instead)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._fds = FdCache(self.max_open)

    labels = property(lambda self: NoLabels(), doc="-1 for every record (labels are inside the records)")

    # -- the walk ---------------------------------------------------------------------------------

    def _records(self, fi: int) -> Iterator[tuple[int, int]]:
        """``(offset, data length)`` of each record of file ``fi``, from its headers."""
        path = self.paths[fi]
        size = os.path.getsize(path)
        with open(path, "rb", buffering=1 << 20) as f:
            if size >= 2 and f.read(2) == b"\x1f\x8b":
                raise TFRecordError(f"{path} is GZIP-compressed: its records cannot be read by byte range; write "
                                    "the TFRecords uncompressed")
            at = 0
            while at < size:
                f.seek(at)
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    raise TFRecordError(f"{path} is truncated: a record header at byte {at} is cut; copy it again")
                length, crc = _HEAD.unpack(head)
                if self.check_crc and masked_crc(head[:8]) != crc:
                    raise TFRecordError(f"{path}: the record header at byte {at} fails its CRC (not a TFRecord file, "
                                        "a compressed one, or damaged)")
                end = at + _HEAD.size + length + _FOOT.size
                if end > size:
                    raise TFRecordError(f"{path} is truncated: the record at byte {at} runs to {end}, past its end "
                                        f"({size}); copy it again")
                yield at, int(length)
                at = end

    def scan(self) -> Iterator[tuple[str, int]]:
        count = 0
        for fi, name in enumerate(self._names):
            for at, length in self._records(fi):
                count += 1
                yield f"{name}/{at:0{self._width[fi]}d}", length
        if count == 0:
            raise EmptySourceError(f"the TFRecord files of {self.uri} hold no records")

    # -- reads ------------------------------------------------------------------------------------

    def _where(self, key: str) -> tuple[int, int]:
        name, _, at = key.rpartition("/")
        fi = self._by_name.get(name)
        if fi is None or not at.isdigit():
            raise SampleReadError(f"sample {key!r} is not in {self.uri}: the files changed since the manifest was "
                                  "made; run `clairvoyant index --force` on them, or pass reindex=True")
        return fi, int(at)

    def _pread(self, fi: int, offset: int, n: int, what: str) -> bytes:
        return read_span(self._fds, fi, self.paths[fi], offset, n, what)

    def _unframe(self, buf, at: int, length: int, fi: int, key: str) -> bytes:
        """The data of the record framed at ``buf[at:]``, its framing and CRCs checked."""
        head = bytes(buf[at:at + _HEAD.size])
        n, crc = _HEAD.unpack(head)
        data = bytes(buf[at + _HEAD.size:at + _HEAD.size + length])
        foot = _FOOT.unpack(bytes(buf[at + _HEAD.size + length:at + _HEAD.size + length + _FOOT.size]))[0]
        bad = None
        if n != length:
            bad = f"its header says {n} bytes, the manifest {length}"
        elif self.check_crc and (masked_crc(head[:8]) != crc or masked_crc(data) != foot):
            bad = "it fails its CRC"
        if bad:
            raise SampleReadError(f"sample {key!r}: the record at byte {self._where(key)[1]} of {self.paths[fi]} is "
                                  f"corrupt ({bad}); copy the file again, or pass on_error='skip'")
        return data

    def read(self, key: str) -> bytes:
        fi, at = self._where(key)
        length = self._length(fi, at, key)
        buf = self._pread(fi, at, _HEAD.size + length + _FOOT.size, key)
        return self._unframe(buf, 0, length, fi, key)

    def _length(self, fi: int, at: int, key: str) -> int:
        """The record's data length, from its header (one small read: ``read`` without the manifest)."""
        length = self._known.get(key) if self._known is not None else None
        if length is None:
            length, _ = _HEAD.unpack(self._pread(fi, at, _HEAD.size, key))
        return int(length)

    _known: dict | None = None

    def use_manifest(self, manifest: Any) -> None:
        """Reads take each record's length from the manifest (no header read first)."""
        self._known = _Sizes(manifest)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        fi, _ = self._where(key)
        return self.read(key), self._mtimes[fi]   # the version listed (a rewrite is another uri)

    def version(self, key: str) -> tuple[int, int]:
        fi, at = self._where(key)
        return self._length(fi, at, key), self._mtime(fi, key)

    def _mtime(self, fi: int, key: str) -> int:
        try:
            return os.stat(self.paths[fi]).st_mtime_ns
        except OSError as e:
            raise SampleReadError(f"sample {key!r}: {self.paths[fi]} is gone or unreadable ({e.strerror or e})") from e

    # -- ranges -----------------------------------------------------------------------------------

    def sample_ranges(self, keys: Sequence[str], span: int = RANGE_SPAN) -> tuple[np.ndarray, np.ndarray]:
        """Each file's records cut into runs of about ``span`` bytes (by where a record starts)."""
        where = [self._where(k) for k in keys]
        fi = np.fromiter((w[0] for w in where), np.int64, len(where))
        at = np.fromiter((w[1] for w in where), np.int64, len(where))
        end = at + np.fromiter((self._length(w[0], w[1], k) for w, k in zip(where, keys)), np.int64, len(where)) \
            + _HEAD.size + _FOOT.size
        uniq, of = np.unique(np.stack([fi, at // max(1, int(span))], axis=1), axis=0, return_inverse=True)
        of = of.reshape(-1).astype(np.int32)
        lo = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
        hi = np.zeros(len(uniq), np.int64)
        np.minimum.at(lo, of, at)
        np.maximum.at(hi, of, end)
        return of, hi - lo

    def read_range(self, keys: Sequence[str]) -> tuple[list[bytes], int]:
        """The data of ``keys`` (records of one file), in that order, from one read over their span,
        each record's framing and CRCs checked."""
        if not keys:
            return [], 0
        where, fi = one_file([self._where(k) for k in keys], keys)
        lengths = [self._length(fi, at, k) for (_, at), k in zip(where, keys)]
        lo = min(at for _, at in where)
        hi = max(at + _HEAD.size + n + _FOOT.size for (_, at), n in zip(where, lengths))
        buf = memoryview(self._pread(fi, lo, hi - lo, f"{len(keys)} samples from {keys[0]!r}"))
        return [self._unframe(buf, at - lo, n, fi, k) for (_, at), n, k in zip(where, lengths, keys)], \
            self._mtimes[fi]

    def close(self) -> None:
        self._fds.close()


class _Sizes:
    """A manifest's sizes by key: found by bisection over its sorted keys (no dict of 1 M strings)."""

    def __init__(self, manifest: Any) -> None:
        self._m = manifest

    def get(self, key: str) -> int | None:
        keys = self._m.keys
        i = bisect.bisect_left(keys, key)
        return int(self._m.sizes[i]) if i < len(keys) and keys[i] == key else None


# -- tf.train.Example without TensorFlow ------------------------------------------------------------

def _varint(buf: memoryview, at: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[at]
        at += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, at
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a protobuf message: an int for varints, a memoryview
    for length-delimited fields (fixed-width ones as their bytes)."""
    at = 0
    while at < len(buf):
        tag, at = _varint(buf, at)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire in (1, 2, 5):
            if wire == 2:
                n, at = _varint(buf, at)
            else:
                n = 8 if wire == 1 else 4
            if at + n > len(buf):
                raise ValueError(f"a field of {n} bytes at byte {at} runs past the message's end ({len(buf)})")
            value, at = buf[at:at + n], at + n
        else:
            raise ValueError(f"protobuf wire type {wire} is not used by tf.train.Example")
        yield num, wire, value


def parse_example(data: bytes) -> dict[str, Any]:
    """A serialized ``tf.train.Example``'s features without TensorFlow: name -> a list of bytes
    (``bytes_list``), a float32 array (``float_list``) or an int64 array (``int64_list``)."""
    out: dict[str, Any] = {}
    try:
        for num, _, features in _fields(memoryview(data)):
            if num != 1:
                continue
            for fnum, _, entry in _fields(features):   # Features.feature: map<string, Feature>
                if fnum != 1:
                    continue
                name, feature = "", memoryview(b"")
                for enum, _, v in _fields(entry):
                    if enum == 1:
                        name = bytes(v).decode()
                    elif enum == 2:
                        feature = v
                for kind, _, lst in _fields(feature):
                    values = [(w, v) for n, w, v in _fields(lst) if n == 1]
                    if kind == 1:
                        out[name] = [bytes(v) for _, v in values]
                    elif kind == 2:
                        out[name] = np.concatenate([np.frombuffer(v, "<f4") for _, v in values]) if values \
                            else np.zeros(0, np.float32)
                    elif kind == 3:
                        ints: list[int] = []
                        for w, v in values:
                            if w == 0:
                                ints.append(v)
                            else:   # packed
                                at = 0
                                while at < len(v):
                                    x, at = _varint(v, at)
                                    ints.append(x)
                        out[name] = np.array([x - (1 << 64) if x >= 1 << 63 else x for x in ints], np.int64)
    except (IndexError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a serialized tf.train.Example ({type(e).__name__}: {e})") from e
    return out
