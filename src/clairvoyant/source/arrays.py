"""NumPy arrays as a source: each row of a ``.npy`` file, or of an ``.npz`` member, is a sample,
read by its byte range.

A ``.npy`` file's header is read once (``numpy.lib.format``): the dtype, the shape ``(n, *s)``
and where the data starts. Row ``i`` is then the bytes ``[start + i*r, start + (i+1)*r)``, with
``r`` the row's size; staging copies those bytes alone, and readers turn them back into an array
of the dtype and shape ``s`` (:class:`ArrayDecoder`, the source's ``decoder``). An ``.npz`` is a
zip of ``.npy`` members: a member stored without compression is read the same way (its data's
place found once from the zip's headers); a compressed member can only be inflated whole, so it
is read through NumPy once per process and kept while its rows are read. With ``per_file=True``
each file is one sample (its whole array, shape and all).

Keys are ``<file>/<row>``, the row zero-padded so that sorted keys keep the rows' order (and
neighbouring rows fall in one range: ``sample_ranges``), or ``<file>`` with ``per_file``; files
are named relative to the common folder. Labels: ``labels=`` names an ``.npz`` member (one
integer per row of ``dataset``), or a ``.npy`` file of one integer per sample in key order.

Refused with a typed error naming the file: arrays of Python objects (loading them would mean
unpickling, which clairvoyant never does), Fortran-ordered arrays (a row is not contiguous), a
file shorter than its header says, a member that is not an array, rows of another dtype or
shape than the first file's.
"""

from __future__ import annotations

import glob as globmod
import hashlib
import os
import zipfile
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ConfigError, EmptySourceError, SampleReadError, SourceError, SourceNotFound
from ..fdcache import FdCache
from .base import Source

__all__ = ["NumpySource", "ArrayDecoder", "ArrayFileError", "is_array_path"]

SUFFIXES = (".npy", ".npz")
RANGE_SPAN = 8 * 1024 * 1024   # sample_ranges: rows read together in pieces of about this many bytes
MAX_OPEN = 64
_LOCAL_HEADER = 30             # a zip local file header's fixed part


class ArrayFileError(SourceError):
    """An array file that cannot serve samples (truncated, not an array, objects, Fortran order)."""


@dataclass(frozen=True)
class ArrayDecoder:
    """A sample's bytes back into its array: ``np.frombuffer(b, dtype).reshape(shape)``
    (read-only: it shares the bytes; the collation copies it into the batch)."""

    dtype: str
    shape: tuple[int, ...]

    def __call__(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.dtype(self.dtype)).reshape(self.shape)


@dataclass(frozen=True)
class _Array:
    """Where one array's rows are: file, member (``""`` for a ``.npy``), data offset (-1: compressed,
    read through NumPy), rows, the row's dtype, shape and bytes."""

    path: str
    member: str
    offset: int
    rows: int
    dtype: str
    shape: tuple[int, ...]
    row_bytes: int


class _NoLabels(Mapping):
    """-1 for every key, without a dict of them."""

    def __getitem__(self, key: str) -> int:
        return -1

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def is_array_path(path: str) -> bool:
    """A ``.npy``/``.npz`` file or glob, or a directory whose visible entries are all such files."""
    if path.endswith(SUFFIXES) and (os.path.isfile(path) or globmod.has_magic(path)):
        return True
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return False
    return bool(names) and all(n.endswith(SUFFIXES) and os.path.isfile(os.path.join(path, n)) for n in names)


def _header(f, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """The dtype, shape and Fortran order from the ``.npy`` header at ``f``'s position."""
    from numpy.lib import format as npformat
    try:
        version = npformat.read_magic(f)
        read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except (ValueError, EOFError) as e:
        raise ArrayFileError(f"{where} is not a NumPy array ({e}): give .npy files or .npz members written "
                             "by numpy.save / numpy.savez") from e
    if dtype.hasobject:
        raise ArrayFileError(f"{where} holds Python objects (dtype {dtype}): reading them would unpickle, which "
                             "clairvoyant never does; save the data as a numeric array")
    return dtype, tuple(int(x) for x in shape), bool(fortran)


def _layout(path: str, member: str, dtype: np.dtype, shape: tuple, fortran: bool, offset: int,
            per_file: bool, where: str) -> _Array:
    if not per_file and len(shape) == 0:
        raise ArrayFileError(f"{where} is a single value (shape ()): give arrays with a row per sample, or "
                             "per_file=True")
    if fortran and len(shape) > 1:
        raise ArrayFileError(f"{where} is stored in Fortran order, so its rows are not contiguous: save it "
                             "with numpy.ascontiguousarray(a)")
    rows, row_shape = (1, shape) if per_file else (shape[0], shape[1:])
    row_bytes = int(dtype.itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return _Array(path, member, offset, int(rows), dtype.str, tuple(row_shape), row_bytes)


def _npy(path: str, per_file: bool) -> _Array:
    with open(path, "rb") as f:
        dtype, shape, fortran = _header(f, path)
        start = f.tell()
    a = _layout(path, "", dtype, shape, fortran, start, per_file, path)
    have, need = os.path.getsize(path), start + a.rows * a.row_bytes
    if have < need:
        raise ArrayFileError(f"{path} is truncated: it holds {have} bytes, its header promises {need}; copy it "
                             "again")
    return a


def _npz(path: str, member: str, per_file: bool) -> _Array:
    where = f"member {member!r} of {path}"
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ArrayFileError(f"{path} is not a readable .npz ({e}): copy it again") from e
    with zf:
        names = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
        if member not in names:
            raise ConfigError(f"{path} has no array {member!r}; it has {sorted(names)}: pass dataset= one of them")
        info = zf.getinfo(member + ".npy")
        if info.compress_type != zipfile.ZIP_STORED:   # inflated whole, through NumPy
            with zf.open(info) as f:
                dtype, shape, fortran = _header(f, where)
            return _layout(path, member, dtype, shape, fortran, -1, per_file, where)
    with open(path, "rb") as f:   # stored: the data's place in the file, past the local header
        f.seek(info.header_offset)
        head = f.read(_LOCAL_HEADER)
        if len(head) < _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
            raise ArrayFileError(f"{where}: the zip's headers are damaged; copy the file again")
        name_len, extra_len = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
        f.seek(info.header_offset + _LOCAL_HEADER + name_len + extra_len)
        dtype, shape, fortran = _header(f, where)
        start = f.tell()
    a = _layout(path, member, dtype, shape, fortran, start, per_file, where)
    if os.path.getsize(path) < start + a.rows * a.row_bytes:
        raise ArrayFileError(f"{where} is truncated: copy the file again")
    return a


class NumpySource(Source):
    """The rows of ``.npy`` files or ``.npz`` members as samples: a file, a directory of them, a
    glob or a list. ``dataset``: the ``.npz`` member holding the samples (needed where a file has
    more than one); ``labels``: an ``.npz`` member, or a ``.npy`` file, of one integer per sample;
    ``per_file``: each file is one sample."""

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 dataset: str | None = None, labels: str | None = None, per_file: bool = False,
                 max_open: int = MAX_OPEN) -> None:
        self.paths, root = _resolve(paths)
        self.dataset, self.per_file, self.max_open = dataset, bool(per_file), max_open
        self._arrays = [self._open(p) for p in self.paths]
        first = self._arrays[0]
        for a in self._arrays[1:]:
            if (a.dtype, a.shape) != (first.dtype, first.shape):
                raise ConfigError(f"{a.path} holds samples of {np.dtype(a.dtype)} {a.shape}, but {first.path} of "
                                  f"{np.dtype(first.dtype)} {first.shape}: a source's samples share a dtype and a "
                                  "shape")
        self.decoder = ArrayDecoder(first.dtype, first.shape)
        names = [os.path.relpath(a.path, root).replace(os.sep, "/") for a in self._arrays]
        self._names = names
        self._width = [len(str(max(a.rows - 1, 0))) for a in self._arrays]
        self._by_name = {n: i for i, n in enumerate(names)}
        self._count = sum(a.rows for a in self._arrays)
        if self._count == 0:
            raise EmptySourceError(f"the arrays of {paths!r} hold no rows: check the paths")
        opts = "&".join(f"{k}={v}" for k, v in (("dataset", dataset), ("per_file", int(self.per_file))) if v)
        digest = hashlib.sha1("\0".join(self.paths).encode()).hexdigest()[:16]
        self.uri = f"npy+file://{root}#{digest}" + (f"?{opts}" if opts else "")
        self._labels = self._read_labels(labels) if labels is not None else None
        self._fds = FdCache(max_open)
        self._inflated: tuple[tuple[str, str], np.ndarray] | None = None   # a compressed member, whole

    def __repr__(self) -> str:
        return f"NumpySource({self.uri!r}, {len(self.paths)} files, {self._count} samples)"

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d["_fds"], d["_inflated"] = None, None
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._fds = FdCache(self.max_open)

    def _open(self, path: str) -> _Array:
        if path.endswith(".npz"):
            member = self.dataset
            if member is None:
                with zipfile.ZipFile(path) as zf:
                    names = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
                if len(names) != 1:
                    raise ConfigError(f"{path} holds {len(names)} arrays {sorted(names)}: pass dataset= the one "
                                      "holding the samples")
                member = names[0]
            return _npz(path, member, self.per_file)
        if self.dataset is not None:
            raise ConfigError(f"dataset={self.dataset!r} names an .npz member, but {path} is a .npy file")
        return _npy(path, self.per_file)

    def _read_labels(self, labels: str) -> np.ndarray:
        """One integer per sample, in key order: an ``.npz`` member beside each file's samples, or a
        ``.npy`` file for the whole source."""
        if labels.endswith(".npy"):
            out = np.load(labels, allow_pickle=False)
            where = labels
        else:
            parts = []
            for a in self._arrays:
                if not a.path.endswith(".npz"):
                    raise ConfigError(f"labels={labels!r} names an .npz member, but {a.path} is a .npy file: give a "
                                      ".npy file of labels instead")
                with np.load(a.path, allow_pickle=False) as z:
                    if labels not in z.files:
                        raise ConfigError(f"{a.path} has no array {labels!r} for labels; it has {sorted(z.files)}")
                    parts.append(np.asarray(z[labels]).reshape(-1))
                    if len(parts[-1]) != a.rows:
                        raise ConfigError(f"labels {labels!r} of {a.path} has {len(parts[-1])} entries for "
                                          f"{a.rows} samples")
            out, where = np.concatenate(parts), f"member {labels!r}"
        out = np.asarray(out).reshape(-1)
        if len(out) != self._count or not np.issubdtype(out.dtype, np.integer):
            raise ConfigError(f"labels from {where}: {len(out)} values of {out.dtype} for {self._count} samples; "
                              "give one integer per sample")
        return out.astype(np.int64)

    # -- keys ------------------------------------------------------------------------------------

    def _keys(self) -> Iterator[tuple[str, int, int]]:
        for fi, (name, a) in enumerate(zip(self._names, self._arrays)):
            if self.per_file:
                yield name, fi, 0
            else:
                w = self._width[fi]
                for r in range(a.rows):
                    yield f"{name}/{r:0{w}d}", fi, r

    def _where(self, key: str) -> tuple[int, int]:
        """``(file, row)`` of sample ``key``."""
        fi = self._by_name.get(key)
        if fi is not None and self.per_file:
            return fi, 0
        name, _, row = key.rpartition("/")
        fi = self._by_name.get(name)
        if fi is None or self.per_file or not row.isdigit() or int(row) >= self._arrays[fi].rows:
            raise SampleReadError(f"sample {key!r} is not in {self.uri}: the files changed since the manifest was "
                                  "made; run `clairvoyant index --force` on them, or pass reindex=True")
        return fi, int(row)

    @property
    def labels(self) -> Mapping[str, int]:
        """Each sample's label (-1 for all without ``labels=``: file names are not classes)."""
        if self._labels is None:
            return _NoLabels()
        return {key: int(self._labels[i]) for i, (key, _, _) in enumerate(self._keys())}

    # -- the Source interface ----------------------------------------------------------------------

    def scan(self) -> Iterator[tuple[str, int]]:
        for key, fi, _ in self._keys():
            yield key, self._arrays[fi].row_bytes

    def read(self, key: str) -> bytes:
        fi, row = self._where(key)
        return self._rows(fi, row, 1, key)[0]

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        fi, row = self._where(key)
        return self._rows(fi, row, 1, key)[0], self._mtime(fi, key)

    def version(self, key: str) -> tuple[int, int]:
        fi, _ = self._where(key)
        return self._arrays[fi].row_bytes, self._mtime(fi, key)

    def _mtime(self, fi: int, key: str) -> int:
        try:
            return os.stat(self._arrays[fi].path).st_mtime_ns
        except OSError as e:
            raise self._error(key, self._arrays[fi].path, e) from e

    def _rows(self, fi: int, row: int, count: int, what: str) -> list[bytes]:
        """The bytes of ``count`` rows of file ``fi`` from ``row``: one read."""
        a = self._arrays[fi]
        n = a.row_bytes
        if a.offset < 0:
            return [bytes(x) for x in self._inflate(a, what)[row:row + count]]
        try:
            fd = self._fds.acquire(fi, a.path)
        except OSError as e:
            raise self._error(what, a.path, e) from e
        try:
            data = os.pread(fd, n * count, a.offset + n * row)
            while len(data) < n * count:   # a short read: a large range, or a network file system
                more = os.pread(fd, n * count - len(data), a.offset + n * row + len(data))
                if not more:
                    break
                data += more
        except OSError as e:
            raise self._error(what, a.path, e) from e
        finally:
            self._fds.release(fi)
        if len(data) != n * count:
            raise SampleReadError(f"sample {what!r}: {a.path} ends before row {row + count - 1}: it was cut or "
                                  "changed since it was listed; copy it again, or pass reindex=True")
        view = memoryview(data)
        return [bytes(view[i * n:(i + 1) * n]) for i in range(count)] if count > 1 else [data]

    def _inflate(self, a: _Array, what: str) -> Any:
        """A compressed member's rows, read through NumPy once and kept while they are read."""
        key = (a.path, a.member)
        if self._inflated is None or self._inflated[0] != key:
            try:
                with np.load(a.path, allow_pickle=False) as z:
                    arr = np.ascontiguousarray(z[a.member])
            except (OSError, ValueError, zipfile.BadZipFile) as e:
                raise SampleReadError(f"sample {what!r}: cannot read member {a.member!r} of {a.path} ({e}); copy "
                                      "the file again") from e
            self._inflated = (key, arr.reshape(a.rows, -1).view(np.uint8))
        return self._inflated[1]

    def _error(self, key: str, path: str, e: OSError) -> SampleReadError:
        if isinstance(e, FileNotFoundError):
            return SampleReadError(f"sample {key!r}: {path} is gone: run `clairvoyant index --force`, or pass "
                                   "reindex=True")
        return SampleReadError(f"cannot read sample {key!r} from {path}: {e.strerror or e}; check the file and "
                               "its permissions")

    # -- ranges: neighbouring rows read together ----------------------------------------------------

    def sample_ranges(self, keys: Sequence[str], span: int = RANGE_SPAN) -> tuple[np.ndarray, np.ndarray]:
        """Each file's rows cut into runs of about ``span`` bytes, as the manifest ``keys`` number the
        samples: each sample's range (int32) and the bytes one read of it takes (int64)."""
        where = [self._where(k) for k in keys]
        fi = np.fromiter((w[0] for w in where), np.int64, len(where))
        row = np.fromiter((w[1] for w in where), np.int64, len(where))
        size = np.array([a.row_bytes for a in self._arrays], np.int64)[fi]
        per = np.maximum(1, int(span) // np.maximum(size, 1))
        uniq, of = np.unique(np.stack([fi, row // per], axis=1), axis=0, return_inverse=True)
        of = of.reshape(-1).astype(np.int32)
        lo = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
        hi = np.zeros(len(uniq), np.int64)
        np.minimum.at(lo, of, row)
        np.maximum.at(hi, of, row + 1)
        return of, (hi - lo) * np.array([a.row_bytes for a in self._arrays], np.int64)[uniq[:, 0]]

    def read_range(self, keys: Sequence[str]) -> tuple[list[bytes], int]:
        """The bytes of ``keys`` (rows of one file: one range of ``sample_ranges``), in that order, from
        one read over the rows they span, and the file's modification time."""
        if not keys:
            return [], 0
        where = [self._where(k) for k in keys]
        fi = where[0][0]
        if any(w[0] != fi for w in where):
            raise ValueError(f"read_range: {len(keys)} samples from more than one file ({keys[0]!r}...)")
        lo = min(w[1] for w in where)
        hi = max(w[1] for w in where) + 1
        rows = self._rows(fi, lo, hi - lo, f"{len(keys)} samples from {keys[0]!r}")
        return [rows[w[1] - lo] for w in where], self._mtime(fi, keys[0])

    def close(self) -> None:
        self._fds.close()
        self._inflated = None


def _resolve(paths) -> tuple[list[str], str]:
    """The array files (absolute, sorted) and the folder their names are relative to."""
    if isinstance(paths, (str, os.PathLike)):
        spec = os.fspath(paths)
        if os.path.isdir(spec):
            root = os.path.abspath(spec)
            found = sorted(os.path.join(root, n) for n in os.listdir(root)
                           if n.endswith(SUFFIXES) and not n.startswith(".") and os.path.isfile(os.path.join(root, n)))
            if not found:
                raise EmptySourceError(f"directory {root} holds no .npy or .npz files: point at their directory")
            return found, root
        if os.path.isfile(spec):
            found = [os.path.abspath(spec)]
        elif globmod.has_magic(spec):
            found = sorted(os.path.abspath(p) for p in globmod.glob(spec) if os.path.isfile(p))
            if not found:
                raise SourceNotFound(f"no array file matches {spec!r}: check the pattern")
        else:
            raise SourceNotFound(f"{spec!r} does not exist: check the path (is the file system mounted?)")
    else:
        found = sorted(os.path.abspath(os.fspath(p)) for p in paths)
        if not found:
            raise ConfigError("the list of array files is empty: give at least one .npy or .npz path")
        if len(set(found)) != len(found):
            raise ConfigError("the list of array files names one twice: name each once")
    bad = [p for p in found if not p.endswith(SUFFIXES)]
    if bad:
        raise ConfigError(f"{bad[0]} is not a .npy or .npz file")
    return found, os.path.commonpath([os.path.dirname(p) for p in found])
