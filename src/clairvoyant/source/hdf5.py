"""HDF5 files as a source (``h5py``, the ``hdf5`` extra): one index along the first axis of a named
dataset is a sample, shuffled across every file.

Where each sample's bytes lie is found once from the files' metadata, when the source is made:

- a **contiguous** dataset: row ``i`` is ``row`` bytes at ``offset + i*row`` (h5py gives the offset);
- a **chunked** dataset without filters whose chunks hold whole samples (``chunks[1:] ==
  shape[1:]``): row ``i`` lies in its chunk, whose place h5py tells (``get_chunk_info``);
- anything else (compressed or filtered chunks, chunks that cut a sample, chunks never written):
  the rows are read **through h5py**, a chunk's rows together where the plan reads a range.

Rows with a place are read by ``os.pread`` (no HDF5 call at all after listing) and neighbouring
ones form ranges of about 8 MiB; the tiers keep samples only, never whole files. Readers turn a
sample's bytes back into an array of the dataset's dtype and sample shape (``ArrayDecoder``);
``labels=`` names a dataset of one integer per sample, beside the samples in each file.

Refused with a typed error naming the file: a file h5py cannot open (truncated, not HDF5), a
dataset that is not there (the file's datasets are listed), a group instead of a dataset, Python
objects or variable-length data, a dataset whose data runs past the file's end, files whose
samples differ in dtype or shape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigError, SampleReadError
from .arrays import ArrayFileError
from .rows import RowFiles
from .files import Kept, names_files, pack_layout, read_span, resolve_files

__all__ = ["HDF5Source", "is_hdf5_path"]

SUFFIXES = (".h5", ".hdf5", ".he5")
RANGE_SPAN = 8 * 1024 * 1024
MAX_OPEN = 64


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ConfigError("HDF5 files need h5py: pip install 'clairvoyant[hdf5]'") from None
    return h5py


def is_hdf5_path(path: str) -> bool:
    """An HDF5 file (by its suffix) or glob, or a directory whose visible entries are all such files."""
    return names_files(path, SUFFIXES)


@dataclass(frozen=True)
class _Layout:
    """One file's samples: each row's byte offset (-1: read through h5py), rows per chunk along the
    first axis (what h5py reads together), the sample's dtype, shape and bytes."""

    path: str
    offsets: np.ndarray
    chunk_rows: int
    dtype: str
    shape: tuple[int, ...]
    row_bytes: int


def _close(f) -> None:
    try:
        f.close()
    except Exception:   # a handle of a file already gone
        pass


def _datasets(f) -> list[str]:
    h5py, names = _h5py(), []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(names)


def _layout(path: str, dataset: str, per_file: bool = False) -> _Layout:
    h5py = _h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ArrayFileError(f"{path} cannot be opened as HDF5 ({e}): it is truncated or not an HDF5 file; copy it "
                             "again") from e
    with f:
        ds = f.get(dataset)
        if ds is None:
            raise ConfigError(f"{path} has no dataset {dataset!r}; it has {_datasets(f)}: pass dataset= one of them")
        if not isinstance(ds, h5py.Dataset):
            raise ConfigError(f"{dataset!r} in {path} is a group, not a dataset; its datasets: {_datasets(ds)}")
        dtype = ds.dtype
        if dtype.names is not None:
            raise ArrayFileError(f"dataset {dataset!r} of {path} holds records (a compound type, {dtype}): give a "
                                 "dataset of plain numbers, or each field as a dataset of its own")
        if dtype.hasobject or h5py.check_dtype(vlen=dtype) is not None:
            raise ArrayFileError(f"dataset {dataset!r} of {path} holds variable-length data or objects ({dtype}): "
                                 "give a dataset of fixed-size numbers")
        if len(ds.shape) == 0 and not per_file:
            raise ArrayFileError(f"dataset {dataset!r} of {path} is a single value: give one with a sample per row, "
                                 "or per_file=True")
        shape = tuple(int(x) for x in ds.shape)
        n, sample = (1, shape) if per_file else (shape[0], shape[1:])
        row = int(dtype.itemsize * int(np.prod(sample, dtype=np.int64)))
        offsets = np.full(n, -1, np.int64)
        plist = ds.id.get_create_plist()
        chunk_rows = 1 if per_file else int(ds.chunks[0]) if ds.chunks else max(1, RANGE_SPAN // max(row, 1))
        if ds.chunks is None:
            at = ds.id.get_offset()
            if at is not None:   # None: nothing written (fill values): through h5py
                offsets[:] = at + np.arange(n, dtype=np.int64) * row
        elif not per_file and plist.get_nfilters() == 0 and tuple(ds.chunks[1:]) == sample:
            k = int(ds.chunks[0])
            for c in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(c)
                first = int(info.chunk_offset[0])
                last = min(first + k, n)
                offsets[first:last] = info.byte_offset + np.arange(last - first, dtype=np.int64) * row
    size = os.path.getsize(path)
    placed = offsets[offsets >= 0]
    if len(placed) and int(placed.max()) + row > size:
        raise ArrayFileError(f"{path} is truncated: dataset {dataset!r} runs to byte {int(placed.max()) + row}, "
                             f"past its end ({size}); copy it again")
    return _Layout(path, offsets, chunk_rows, dtype.str, sample, row)


class HDF5Source(RowFiles):
    """Samples along the first axis of ``dataset`` in HDF5 files: a file, a directory of them, a
    glob or a list; ``labels``: a dataset of one integer per sample in each file; ``fields``:
    datasets beside the samples that travel with each (float targets, masks); ``per_file``: each
    file is one sample (its whole dataset; a field or label is then the file's whole array)."""

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 dataset: str | None = None, labels: str | None = None, fields: Sequence[str] | str = (),
                 per_file: bool = False, max_open: int = MAX_OPEN) -> None:
        if dataset is None and labels is None and pack_layout(paths) == "hdf5":   # `clairvoyant pack --format hdf5`
            dataset, labels = "x", "y"
        self.paths, root = resolve_files(paths, SUFFIXES, 'HDF5')
        if dataset is None:   # the file's one dataset (besides the labels), if it has one
            h5py = _h5py()
            try:
                with h5py.File(self.paths[0], "r") as f:
                    names = [n for n in _datasets(f) if n != labels]
            except OSError as e:
                raise ArrayFileError(f"{self.paths[0]} cannot be opened as HDF5 ({e}): it is truncated or not an "
                                     "HDF5 file; copy it again") from e
            if len(names) != 1:
                raise ConfigError(f"{self.paths[0]} holds datasets {names}: pass dataset= the one holding the samples")
            dataset = names[0]
        if not isinstance(dataset, str) or not dataset:
            raise ConfigError(f"dataset={dataset!r}: name the dataset that holds the samples, e.g. 'x'")
        self.dataset, self.labels_name, self.max_open = dataset, labels, max_open
        self.per_file = bool(per_file)
        self._files = [_layout(p, dataset, self.per_file) for p in self.paths]
        digest = self._listed(root, self._files, [len(lay.offsets) for lay in self._files],
                              [lay.row_bytes for lay in self._files], f"dataset {dataset!r} of {paths!r}",
                              dataset, labels, fields)
        self.uri = f"hdf5+file://{root}#{digest}?dataset={dataset}"

    def __repr__(self) -> str:
        return f"HDF5Source({self.uri!r}, {len(self.paths)} files, {self._count} samples)"

    _OWN = ("_fds", "_h5")

    def _own(self) -> None:
        super()._own()
        self._h5 = Kept(self.max_open, drop=_close)   # open files, for what is read through h5py

    def _column(self, fi: int, name: str) -> np.ndarray:
        h5py = _h5py()
        with h5py.File(self.paths[fi], "r") as f:
            ds = f.get(name)
            if ds is None or not isinstance(ds, h5py.Dataset):
                raise ConfigError(f"{self.paths[fi]} has no dataset {name!r}; it has {_datasets(f)}")
            return np.asarray(ds[()])

    def _read_rows(self, fi: int, rows: list[int], what: str) -> list[bytes]:
        """The bytes of ``rows`` of file ``fi``: those with a place by one pread over their span, the
        others through h5py (one read of the slice they span)."""
        lay = self._files[fi]
        at = lay.offsets[rows]
        out: list[bytes] = [b""] * len(rows)
        placed = [i for i, a in enumerate(at) if a >= 0]
        if placed:
            lo, hi = int(at[placed].min()), int(at[placed].max()) + lay.row_bytes
            buf = memoryview(self._pread(fi, lo, hi - lo, what))
            for i in placed:
                o = int(at[i]) - lo
                out[i] = bytes(buf[o:o + lay.row_bytes])
        rest = [i for i, a in enumerate(at) if a < 0]
        if rest:
            lo, hi = min(rows[i] for i in rest), max(rows[i] for i in rest) + 1
            try:
                ds = self._dataset(fi)
                block = np.ascontiguousarray(ds[()][None] if self.per_file else ds[lo:hi])
            except (OSError, ValueError, KeyError) as e:
                raise SampleReadError(f"cannot read sample {what!r} from {lay.path} through h5py ({e}); check the "
                                      "file") from e
            for i in rest:
                out[i] = block[rows[i] - lo].tobytes()
        return out

    def _pread(self, fi: int, offset: int, n: int, what: str) -> bytes:
        return read_span(self._fds, fi, self.paths[fi], offset, n, what)

    def _dataset(self, fi: int):
        """The dataset of file ``fi``, its file opened once per process (never another process's
        handle) and kept among at most ``max_open``."""
        f = self._h5.get(fi, lambda: _h5py().File(self.paths[fi], "r"))
        return f[self.dataset]

    # -- ranges ---------------------------------------------------------------------------------

    def sample_ranges(self, keys: Sequence[str], span: int = RANGE_SPAN) -> tuple[np.ndarray, np.ndarray]:
        """Rows with a place cut into runs of about ``span`` bytes by where they lie; the others by
        their chunk (what h5py reads together)."""
        where = [self._where(k) for k in keys]
        fi = np.fromiter((w[0] for w in where), np.int64, len(where))
        row = np.fromiter((w[1] for w in where), np.int64, len(where))
        at = np.fromiter((self._files[f].offsets[r] for f, r in where), np.int64, len(where))
        chunk = np.fromiter((self._files[f].chunk_rows for f, _ in where), np.int64, len(where))
        piece = np.where(at >= 0, at // max(1, int(span)), -1 - row // chunk)
        uniq, of = np.unique(np.stack([fi, piece], axis=1), axis=0, return_inverse=True)
        of = of.reshape(-1).astype(np.int32)
        size = np.fromiter((self._files[f].row_bytes for f, _ in where), np.int64, len(where))
        start = np.where(at >= 0, at, row * size)
        lo = np.full(len(uniq), np.iinfo(np.int64).max, np.int64)
        hi = np.zeros(len(uniq), np.int64)
        np.minimum.at(lo, of, start)
        np.maximum.at(hi, of, start + size)
        return of, hi - lo

    def close(self) -> None:
        super().close()
        self._h5.clear()


