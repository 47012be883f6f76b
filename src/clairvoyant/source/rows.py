"""Sources whose files hold their samples as rows (NumPy arrays, HDF5 datasets): the keys, the
labels and the reads they share, built once.

A sample's key is ``<file>/<row>``, the file named relative to the common folder and the row
zero-padded so that sorted keys keep each file's rows in order (neighbouring rows then fall in
one range), or ``<file>`` alone where each file is one sample (``per_file``). Labels, where given,
are one per sample in key order: integers become the manifest's labels, anything else (floats, a
vector per sample: a regression's targets) is carried as the source's ``target_field``; fields (``fields=``: float targets, masks) are arrays
beside the samples, a row each, read into memory once and handed with each sample as its third
element. A subclass lists its files (``_name_files``) and reads
rows (``_read_rows``); it cuts its own ranges (``sample_ranges``).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import ConfigError, EmptySourceError, SampleReadError
from .base import Source
from ..nodeio.fdcache import FdCache
from .files import listed_files, one_file, unreadable


@dataclass(frozen=True)
class ArrayDecoder:
    """A sample's bytes back into its array: ``np.frombuffer(b, dtype).reshape(shape)``
    (read-only: it shares the bytes; the collation copies it into the batch)."""

    dtype: str
    shape: tuple[int, ...]

    def __call__(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.dtype(self.dtype)).reshape(self.shape)


class NoLabels(Mapping):
    """-1 for every key, without a dict of them (file names are not classes)."""

    def __getitem__(self, key: str) -> int:
        return -1

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class RowFiles(Source):
    """Files of rows (module docstring); ``paths``, ``per_file``, ``_labels``, ``_fields`` and
    ``_layouts`` (per file: its ``path``, the sample's ``dtype`` and ``shape``) set by the subclass."""

    paths: list[str]
    _mtimes: list[int]         # each file's modification time when listed (files.listed_files)
    _layouts: Sequence
    _fields: dict[str, np.ndarray] | None = None
    per_file: bool = False
    _labels: np.ndarray | None = None

    def _name_files(self, root: str, rows: Sequence[int], row_bytes: Sequence[int], what: str) -> None:
        """Each file's name (relative to ``root``), rows and bytes per row."""
        first = self._layouts[0]
        for lay in self._layouts[1:]:
            if (lay.dtype, lay.shape) != (first.dtype, first.shape):
                raise ConfigError(f"{lay.path} holds samples of {np.dtype(lay.dtype)} {lay.shape}, but {first.path} "
                                  f"of {np.dtype(first.dtype)} {first.shape}: a source's samples share a dtype and "
                                  "a shape")
        self.decoder = ArrayDecoder(first.dtype, first.shape)
        self._names = [os.path.relpath(p, root).replace(os.sep, "/") for p in self.paths]
        self._by_name = {n: i for i, n in enumerate(self._names)}
        self._file_rows, self._file_row_bytes = [int(r) for r in rows], [int(b) for b in row_bytes]
        self._width = [len(str(max(r - 1, 0))) for r in self._file_rows]
        self._count = sum(self._file_rows)
        self._starts = np.concatenate([[0], np.cumsum(self._file_rows)[:-1]]).astype(np.int64)
        if self._count == 0:
            raise EmptySourceError(f"{what} holds no samples: check the paths")

    def _listed(self, root: str, layouts: Sequence, rows: Sequence[int], row_bytes: Sequence[int], what: str,
                dataset: str | None, labels: str | None, fields: Sequence[str] | str) -> str:
        """The files' samples named (``_name_files``), their labels and fields read, this process's
        descriptors made: what every row source does once its files are laid out. Returns the
        listing's digest (for the source's uri: each file's size and time, and the options)."""
        self._layouts = layouts
        self._name_files(root, rows, row_bytes, what)
        digest, self._mtimes = listed_files(self.paths, dataset, labels, self.per_file)
        self._fields = self._load_fields(fields) if fields else None
        self._labels = None
        if labels is not None:
            y = self._label_rows(labels)
            if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):   # class indices: the manifest's labels
                self._labels = y.astype(np.int64)
            else:   # float or vector targets (a regression): each sample's row of y is its target
                self.target_field = labels
                self._fields = dict(self._fields or {}, **{labels: y})
        self._own()
        return digest

    #: attributes that belong to one process (descriptors, caches): never pickled, made anew by ``_own``
    _OWN: tuple[str, ...] = ("_fds",)

    def _own(self) -> None:
        """This process's descriptors (and a subclass's caches), at construction and in a process
        that unpickles the source."""
        self._fds = FdCache(self.max_open)

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        for name in self._OWN:
            d.pop(name, None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._own()

    def close(self) -> None:
        """Close this process's descriptors (they reopen on the next read)."""
        self._fds.close()

    @abc.abstractmethod
    def _read_rows(self, fi: int, rows: list[int], what: str) -> list[bytes]:
        """The bytes of ``rows`` of file ``fi`` (read together where they can be)."""

    @abc.abstractmethod
    def _column(self, fi: int, name: str) -> np.ndarray:
        """The array ``name`` beside file ``fi``'s samples (a row per sample); ConfigError naming the
        file and what it has if there is none."""

    def _columns(self, name: str, what: str) -> np.ndarray:
        """``name`` of every file, in key order, a row per sample (checked)."""
        parts = []
        for fi, path in enumerate(self.paths):
            col = np.asarray(self._column(fi, name))
            if self.per_file:   # the file is the sample: its whole array is the sample's
                col = col[None]
            if col.ndim == 0 or len(col) != self._file_rows[fi]:
                raise ConfigError(f"{what} {name!r} of {path} has {0 if col.ndim == 0 else len(col)} rows for "
                                  f"{self._file_rows[fi]} samples: give one per sample")
            parts.append(col)
        return np.concatenate(parts)

    def _label_rows(self, name: str) -> np.ndarray:
        """The labels ``name`` of every sample, in key order (integers, or a float or vector target
        per sample): the arrays ``name`` beside each file's samples."""
        return self._columns(name, "labels")

    def _load_fields(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Arrays beside the samples that travel with each (``fields=``: a regression's float targets,
        a mask), read once into memory: they are small beside the samples."""
        if isinstance(names, str):
            names = [names]
        return {n: self._columns(n, "field") for n in names}

    @property
    def has_fields(self) -> bool:  # type: ignore[override]
        return self._fields is not None

    def fields_of(self, key: str) -> dict:
        """The sample's fields (``fields=``), each its row of the array beside the samples."""
        if self._fields is None:
            return {}
        fi, row = self._where(key)
        i = self._starts[fi] + row
        return {n: a[i] for n, a in self._fields.items()}

    # -- keys -------------------------------------------------------------------------------------

    def _keys(self) -> Iterator[tuple[str, int, int]]:
        for fi, name in enumerate(self._names):
            if self.per_file:
                yield name, fi, 0
                continue
            w = self._width[fi]
            for r in range(self._file_rows[fi]):
                yield f"{name}/{r:0{w}d}", fi, r

    def _where(self, key: str) -> tuple[int, int]:
        """``(file, row)`` of sample ``key``."""
        if self.per_file:
            fi = self._by_name.get(key)
            if fi is not None:
                return fi, 0
        else:
            name, _, row = key.rpartition("/")
            fi = self._by_name.get(name)
            if fi is not None and row.isdigit() and int(row) < self._file_rows[fi]:
                return fi, int(row)
        raise SampleReadError(f"sample {key!r} is not in {self.uri}: the files changed since the manifest was made; "
                              "run `clairvoyant index --force` on them, or pass reindex=True")

    @property
    def labels(self) -> Mapping[str, int]:
        """Each sample's label: the ones given, else -1 for all."""
        if self._labels is None:
            return NoLabels()
        return {key: int(self._labels[i]) for i, (key, _, _) in enumerate(self._keys())}

    # -- the Source interface ---------------------------------------------------------------------

    def scan(self) -> Iterator[tuple[str, int]]:
        for key, fi, _ in self._keys():
            yield key, self._file_row_bytes[fi]

    def read(self, key: str) -> bytes:
        fi, row = self._where(key)
        return self._read_rows(fi, [row], key)[0]

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        fi, row = self._where(key)
        return self._read_rows(fi, [row], key)[0], self._mtimes[fi]   # the version listed

    def version(self, key: str) -> tuple[int, int]:
        fi, _ = self._where(key)
        return self._file_row_bytes[fi], self._mtime(fi, key)

    def _mtime(self, fi: int, key: str) -> int:
        try:
            return os.stat(self.paths[fi]).st_mtime_ns
        except OSError as e:
            raise unreadable(key, self.paths[fi], e) from e

    def read_range(self, keys: Sequence[str]) -> tuple[list[bytes], int]:
        """The bytes of ``keys`` (rows of one file: one range of ``sample_ranges``), in that order,
        read together, and the file's modification time."""
        if not keys:
            return [], 0
        where, fi = one_file([self._where(k) for k in keys], keys)
        return (self._read_rows(fi, [r for _, r in where], f"{len(keys)} samples from {keys[0]!r}"),
                self._mtimes[fi])
