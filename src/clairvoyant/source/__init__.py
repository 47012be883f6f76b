"""Sources: where the bytes live. ``as_source`` is the edge: a path, a URL or a source object in,
a :class:`Source` out."""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..errors import ConfigError, describe
from . import adapter
from .adapter import AdaptedSource, adapt
from .arrays import NumpySource, is_array_path
from .hdf5 import HDF5Source, is_hdf5_path
from .indexed import IndexedDataset, is_map_dataset
from .tfrecord import TFRecordSource, is_tfrecord_path
from .base import Source
from .listed import LIST_SUFFIXES, DatasetPort, ListedSource, is_dataset, list_file_source
from .posix import PosixSource
from .shards import TarShardSource, is_shard_dir
from .remote import RemoteSource, is_url

__all__ = ["Source", "AdaptedSource", "HDF5Source", "NumpySource", "TFRecordSource", "PosixSource", "ListedSource", "IndexedDataset", "DatasetPort", "TarShardSource", "RemoteSource",
           "as_source", "is_dataset", "list_file_source"]


def as_source(obj: Any, storage_options: dict | None = None, *, dataset: str | None = None,
              labels: str | None = None, fields: Sequence[str] | str = ()) -> Source:
    """A directory path becomes a :class:`PosixSource`, a list file (.csv, .tsv, .jsonl) a
    :class:`ListedSource`, a path (or glob) ending in .tar or a directory of nothing but .tar files
    a :class:`TarShardSource`, a .npy or .npz file or a directory of nothing but those a
    :class:`NumpySource` (a sample per row), a .tfrecord file, glob or directory of them a
    :class:`TFRecordSource` (a sample per record), an HDF5 file (.h5, .hdf5), glob or directory
    of them an :class:`HDF5Source` (a sample per index of ``dataset``, its labels in ``labels``); a URL (``s3://``, ``gs://``, ``https://``..., not ``file://``) a
    :class:`RemoteSource` with ``storage_options``; a :class:`Source` is returned as is, another
    object with ``uri``, ``scan()`` and ``read(key)`` is adapted (:class:`AdaptedSource`); a
    map-style dataset with no files (``__getitem__`` and ``__len__``) becomes an
    :class:`IndexedDataset`, its samples made in the readers; anything else is a
    :class:`NotASource` error naming what it lacks. ``fields``: arrays beside the samples of HDF5 or
    ``.npy``/``.npz`` files, or columns of a list file, that travel with each sample."""
    if dataset is not None or labels is not None or fields:   # arrays in files: HDF5, .npz
        path = os.fspath(obj) if isinstance(obj, (str, os.PathLike)) else None
        if path is not None and is_hdf5_path(path):
            return HDF5Source(path, dataset=dataset, labels=labels, fields=fields)
        if path is not None and is_array_path(path):
            return NumpySource(path, dataset=dataset, labels=labels, fields=fields)
        if path is not None and fields and dataset is None and labels is None and path.endswith(LIST_SUFFIXES) \
                and not os.path.isdir(path):
            return list_file_source(path, fields=[fields] if isinstance(fields, str) else list(fields))
        raise ConfigError(f"dataset=, labels= and fields= name arrays in HDF5 or .npy/.npz files (fields= also the "
                          f"columns of a .csv/.jsonl list file), but {describe(obj)} is not such a file or folder of "
                          "them: leave them out, or pass a source object")
    if is_url(obj):
        return RemoteSource(obj, storage_options)
    if storage_options is not None:
        raise ConfigError(f"storage_options is given but the source {describe(obj)} is not an object store URL: "
                          "pass storage_options only with s3://, gs://, https://... sources")
    if isinstance(obj, str) and obj[:7].lower() == "file://":
        obj = obj[7:]
    if isinstance(obj, (str, os.PathLike)):
        if os.fspath(obj).endswith(LIST_SUFFIXES) and not os.path.isdir(obj):
            return list_file_source(obj)
        if (os.fspath(obj).endswith(".tar") and not os.path.isdir(obj)) or is_shard_dir(os.fspath(obj)):
            return TarShardSource(obj)
        if is_array_path(os.fspath(obj)):
            return NumpySource(obj)
        if is_hdf5_path(os.fspath(obj)):
            return HDF5Source(obj)
        if is_tfrecord_path(os.fspath(obj)):
            return TFRecordSource(obj)
        return PosixSource(obj)
    if is_map_dataset(obj) and adapter.missing(obj):
        return IndexedDataset(obj)
    return adapt(obj)
