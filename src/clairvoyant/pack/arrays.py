"""Pack a tree of ``.npy`` files, one sample each, into NumPy or HDF5 shards (``clairvoyant pack
--format npz`` or ``--format hdf5``).

A shard is an ``.npz`` whose members are stored, not compressed, or an HDF5 file (``.h5``) whose
datasets are contiguous and unfiltered: ``x``, the samples' arrays stacked in the manifest's order,
and ``y``, their labels (int64, -1 where a sample has none). ``NumpySource`` or ``HDF5Source`` then
reads each sample by its byte range, one read for many neighbours (``Loader(DST)`` finds the pack's
``x`` and ``y`` by itself). Every sample must have the first one's dtype and shape; a shard holds as
many whole samples as ``shard_size`` allows (at least one).

As ``tar.py`` (whose state file and checks this shares): deterministic (the zip's times fixed, the
same manifest and bytes give the same shards, byte for byte), each shard written under a hidden
temporary name and renamed once whole, resumable with the same settings. The samples' ``.npy``
bytes are parsed here without unpickling (object arrays are refused).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import zipfile
from typing import Any, Callable

import numpy as np

from .. import manifest as manifest_mod
from ..errors import ConfigError
from ..nodeio.fileio import discard, pid
from ..source import PosixSource, as_source
from ..units import parse_bytes
from .tar import FORMAT, PackResult, _write_state, read_in_order, start

MEMBER, LABELS = "x", "y"
_EPOCH = (1980, 1, 1, 0, 0, 0)   # every member's time in the zip: the shards do not depend on the clock


LAYOUTS = {"npz": ".npz", "hdf5": ".h5"}


def shard_name(i: int, layout: str = "npz") -> str:
    return f"shard-{i:06d}{LAYOUTS[layout]}"


def _array(key: str, data: bytes) -> np.ndarray:
    """The array in one sample's ``.npy`` bytes (never unpickled)."""
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise ConfigError(f"sample {key!r} is not a NumPy array of numbers ({type(e).__name__}: {e}): --format npz "
                          "packs a tree of .npy files, one sample each") from e
    if not isinstance(arr, np.ndarray):   # an .npz: several arrays
        arr.close()
        raise ConfigError(f"sample {key!r} is an .npz of several arrays: --format npz packs a tree of .npy files, "
                          "one sample each")
    return arr


def _write_shard(final: str, x: np.ndarray, y: np.ndarray, layout: str = "npz") -> None:
    """``x`` and ``y`` as an ``.npz`` of stored members or an HDF5 file of contiguous datasets,
    under a temporary name, then renamed."""
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{pid()}.tmp")
    try:
        if layout == "hdf5":
            import h5py
            with h5py.File(tmp, "w", track_order=False) as f:   # (no times recorded: packs are byte-equal)
                for name, arr in ((MEMBER, x), (LABELS, y)):
                    f.create_dataset(name, data=np.ascontiguousarray(arr), track_times=False)
            os.chmod(tmp, 0o644)
        else:
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
                for name, arr in ((MEMBER, x), (LABELS, y)):
                    info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
                    info.external_attr = 0o644 << 16
                    with zf.open(info, "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        discard(tmp)
        raise


def pack_arrays(src: Any, dst: str | os.PathLike[str], *, shard_size: int | str = "256MiB", threads: int = 16,
                progress: Callable[[int], None] | None = None, reindex: bool = False,
                layout: str = "npz") -> PackResult:
    """Write the ``.npy`` samples of ``src`` as ``dst/shard-000000.npz``, ... (``layout="hdf5"``:
    ``.h5``); ``progress(n)`` as each ``n`` more samples are done."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r}: choose one of {', '.join(LAYOUTS)}")
    if layout == "hdf5":
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise ConfigError("--format hdf5 needs h5py: pip install 'clairvoyant[hdf5]'") from None
    size = parse_bytes(shard_size, what="shard_size")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
    # a directory's files whole (as_source would read a folder of .npy files as their rows)
    source = PosixSource(src) if isinstance(src, (str, os.PathLike)) and os.path.isdir(src) else as_source(src)
    man, _ = manifest_mod.obtain(source, reindex=reindex)
    keys, sizes, labels = list(man.keys), man.sizes.tolist(), man.labels.astype(np.int64)
    if not keys:
        raise ConfigError(f"{src!r} holds no samples to pack")
    first = _array(keys[0], source.read(keys[0]))
    per = max(1, size // max(1, first.nbytes))
    plan = [(a, min(a + per, len(keys))) for a in range(0, len(keys), per)]
    dst = os.path.abspath(os.fspath(dst))
    state = {"format": FORMAT, "version": 1, "source": source.uri, "fingerprint": man.fingerprint,
             "samples": len(keys), "shard_size": size, "shards": len(plan), "complete": False,
             "layout": layout, "dtype": first.dtype.str, "shape": list(first.shape)}
    todo = start(dst, state, plan, lambda i: shard_name(i, layout), len(keys), progress)
    with contextlib.closing(read_in_order(source, keys, sizes, todo, threads)) as samples:
        for s, a, b in todo:
            x = np.empty((b - a, *first.shape), first.dtype)
            for i, data in itertools.islice(samples, b - a):
                arr = _array(keys[i], data)
                if arr.dtype != first.dtype or arr.shape != first.shape:
                    raise ConfigError(f"sample {keys[i]!r} is {arr.dtype} {arr.shape}, but {keys[0]!r} is "
                                      f"{first.dtype} {first.shape}: an array pack's samples share a dtype and a "
                                      "shape")
                x[i - a] = arr
                if progress is not None:
                    progress(1)
            _write_shard(os.path.join(dst, shard_name(s, layout)), x, labels[a:b], layout)
    _write_state(dst, dict(state, complete=True))
    total = sum(os.path.getsize(os.path.join(dst, shard_name(s, layout))) for s in range(len(plan)))
    return PackResult(dst, len(plan), len(todo), len(plan) - len(todo), len(keys), total, None)
