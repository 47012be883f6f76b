"""NumPy arrays as a source: each row of a ``.npy`` file, or of an ``.npz`` member, is a sample,
read by its byte range.

A ``.npy`` file's header is read once (``numpy.lib.format``): the dtype, the shape ``(n, *s)``
and where the data starts. Row ``i`` is then the bytes ``[start + i*r, start + (i+1)*r)``, with
``r`` the row's size; staging copies those bytes alone, and readers turn them back into an array
of the dtype and shape ``s`` (:class:`ArrayDecoder`, the source's ``decoder``). An ``.npz`` is a
zip of ``.npy`` members: a member stored without compression is read the same way (its data's
place found once from the zip's headers); a compressed member can only be inflated whole, so it
is read through NumPy and kept (up to ``INFLATED`` bytes of members per process, the least recently
read dropped first). With ``per_file=True``
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

import os
import zipfile
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError, SampleReadError, SourceError
from .rows import ArrayDecoder, RowFiles
from .files import Kept, names_files, pack_layout, read_span, resolve_files

__all__ = ["NumpySource", "ArrayDecoder", "ArrayFileError", "is_array_path"]

SUFFIXES = (".npy", ".npz")
RANGE_SPAN = 8 * 1024 * 1024   # sample_ranges: rows read together in pieces of about this many bytes
MAX_OPEN = 64
INFLATED = 1 << 30             # bytes of inflated compressed members a process keeps at most
_LOCAL_HEADER = 30             # a zip local file header's fixed part


class ArrayFileError(SourceError):
    """An array file that cannot serve samples (truncated, not an array, objects, Fortran order)."""


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


def is_array_path(path: str) -> bool:
    """A ``.npy``/``.npz`` file or glob, or a directory whose visible entries are all such files."""
    return names_files(path, SUFFIXES)


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
    if dtype.names is not None:
        raise ArrayFileError(f"{where} holds records (a structured dtype, {dtype}): give an array of plain numbers, "
                             "one per field, or the fields as arrays of their own")
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


class NumpySource(RowFiles):
    """The rows of ``.npy`` files or ``.npz`` members as samples: a file, a directory of them, a
    glob or a list. ``dataset``: the ``.npz`` member holding the samples (needed where a file has
    more than one); ``labels``: an ``.npz`` member, or a ``.npy`` file, of one integer per sample;
    ``fields``: ``.npz`` members that travel with each sample; ``per_file``: each file is one sample."""

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 dataset: str | None = None, labels: str | None = None, fields: Sequence[str] | str = (),
                 per_file: bool = False, max_open: int = MAX_OPEN) -> None:
        if dataset is None and labels is None and pack_layout(paths) == "npz":   # `clairvoyant pack --format npz`
            dataset, labels = "x", "y"
        self.paths, root = resolve_files(paths, SUFFIXES, 'NumPy (.npy, .npz)')
        self.dataset, self.per_file, self.max_open = dataset, bool(per_file), max_open
        self._arrays = [self._open(p) for p in self.paths]
        digest = self._listed(root, self._arrays, [a.rows for a in self._arrays], [a.row_bytes for a in self._arrays],
                              f"{paths!r}", dataset, labels, fields)
        opts = "&".join(f"{k}={v}" for k, v in (("dataset", dataset), ("per_file", int(self.per_file))) if v)
        self.uri = f"npy+file://{root}#{digest}" + (f"?{opts}" if opts else "")

    def __repr__(self) -> str:
        return f"NumpySource({self.uri!r}, {len(self.paths)} files, {self._count} samples)"

    _OWN = ("_fds", "_inflated")

    def _own(self) -> None:
        super()._own()
        self._inflated = Kept(INFLATED, weigh=lambda a: a.nbytes)   # compressed members, whole

    def _open(self, path: str) -> _Array:
        if path.endswith(".npz"):
            member = self.dataset
            if member is None:
                try:
                    with zipfile.ZipFile(path) as zf:
                        names = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
                except (zipfile.BadZipFile, OSError) as e:
                    raise ArrayFileError(f"{path} is not a readable .npz ({e}): copy it again") from e
                if len(names) != 1:
                    raise ConfigError(f"{path} holds {len(names)} arrays {sorted(names)}: pass dataset= the one "
                                      "holding the samples")
                member = names[0]
            return _npz(path, member, self.per_file)
        if self.dataset is not None:
            raise ConfigError(f"dataset={self.dataset!r} names an .npz member, but {path} is a .npy file")
        return _npy(path, self.per_file)

    def _column(self, fi: int, name: str) -> np.ndarray:
        path = self.paths[fi]
        if not path.endswith(".npz"):
            raise ConfigError(f"{name!r} names an .npz member, but {path} is a .npy file: give labels as a .npy "
                              "file of one integer per sample instead")
        with np.load(path, allow_pickle=False) as z:
            if name not in z.files:
                raise ConfigError(f"{path} has no array {name!r}; it has {sorted(z.files)}")
            return np.asarray(z[name])

    def _label_rows(self, name: str) -> np.ndarray:
        """Labels from an ``.npz`` member beside each file's samples, or from a ``.npy`` file of one
        label (or target row) per sample, in key order, for the whole source."""
        if not name.endswith(".npy"):
            return super()._label_rows(name)
        y = np.asarray(np.load(name, allow_pickle=False))
        if y.ndim == 0 or len(y) != self._count:
            raise ConfigError(f"labels from {name}: {0 if y.ndim == 0 else len(y)} rows for {self._count} samples; "
                              "give one per sample")
        return y

    def _read_rows(self, fi: int, rows: list[int], what: str) -> list[bytes]:
        """The bytes of ``rows`` of file ``fi``: one read over the rows they span (or the inflated
        member's)."""
        a = self._arrays[fi]
        n, lo, hi = a.row_bytes, min(rows), max(rows) + 1
        if a.offset < 0:
            block = self._inflate(a, what)
            return [bytes(block[r]) for r in rows]
        view = memoryview(read_span(self._fds, fi, a.path, a.offset + n * lo, n * (hi - lo), what))
        return [bytes(view[(r - lo) * n:(r - lo + 1) * n]) for r in rows]

    def _inflate(self, a: _Array, what: str) -> Any:
        """A compressed member's rows, inflated through NumPy once and kept (up to INFLATED bytes of
        members per process, the least recently read dropped first)."""
        def load() -> np.ndarray:
            try:
                with np.load(a.path, allow_pickle=False) as z:
                    arr = np.ascontiguousarray(z[a.member])
            except (OSError, ValueError, zipfile.BadZipFile) as e:
                raise SampleReadError(f"sample {what!r}: cannot read member {a.member!r} of {a.path} ({e}); copy "
                                      "the file again") from e
            return arr.reshape(a.rows, -1).view(np.uint8)
        return self._inflated.get((a.path, a.member), load)

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

    def close(self) -> None:
        super().close()
        self._inflated.clear()


