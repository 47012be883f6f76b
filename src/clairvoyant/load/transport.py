"""Batches in shared memory: a slot is an anonymous memory file shared by fork.

A reader worker writes a collated batch into one of its slots and sends back
only a small description (dtypes, shapes, offsets); the training process maps
the same memory and copies the arrays out, so batch data never goes through a
pickle. Slots are anonymous (memfd), so nothing can be left in /dev/shm, even
after SIGKILL.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import numpy as np
import xxhash

_ALIGN = 64


class Slot:
    """A growable shared buffer; create it before forking the processes that share it."""

    def __init__(self) -> None:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("clairvoyant-batch", 0)
        else:  # an unlinked temporary file serves the same purpose elsewhere
            self.fd = os.dup(tempfile.TemporaryFile().fileno())
        self._mm: mmap.mmap | None = None
        self._mapped = 0

    def buffer(self, size: int, grow: bool = False) -> mmap.mmap:
        """A mapping of at least ``size`` bytes; the writer grows the file, the reader follows. (A batch
        with no array, a collate that gives bytes or strings, still maps one byte: no empty map.)"""
        size = max(int(size), 1)
        if self._mm is None or self._mapped < size:
            actual = os.fstat(self.fd).st_size
            if actual < size:
                if not grow:
                    raise RuntimeError(f"batch slot holds {actual} bytes, {size} expected")
                actual = max(size + size // 4, 1 << 20)
                os.ftruncate(self.fd, actual)
            if self._mm is not None:
                self._mm.close()
            self._mm = mmap.mmap(self.fd, actual)
            self._mapped = actual
        return self._mm

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # an array still views it; the mapping goes with the array
                pass
            self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Stack:
    """A leaf of a collated batch still to be stacked: stacked straight into the slot. ``dtype`` and
    ``fill(dest, array)``: each array converted as it lands (e.g. uint8 to normalized float32:
    load/fast_transform.py), in place of a plain copy."""

    __slots__ = ("arrays", "dtype", "fill")

    def __init__(self, arrays: list[np.ndarray], dtype: Any = None, fill: Any = None) -> None:
        self.arrays, self.dtype, self.fill = arrays, dtype, fill


def _leaf_array(x: Any) -> np.ndarray | None:
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    if is_pil_image(x):
        return np.asarray(x)
    return None


def is_pil_image(x: Any) -> bool:
    """A PIL image (told by its interface, so that PIL need not be imported)."""
    return hasattr(x, "getbands") and hasattr(x, "__array_interface__")


def _plan(tree: Any, cursor: list[int], jobs: list) -> Any:
    """Describe ``tree`` and assign offsets; ``jobs`` collects (offset, shape, dtype, source)."""
    if isinstance(tree, Stack):
        first = np.asarray(tree.arrays[0])
        shape = (len(tree.arrays),) + first.shape
        for a in tree.arrays:
            if np.shape(a) != first.shape:
                raise ValueError(
                    f"cannot stack samples of shapes {first.shape} and {np.shape(a)} into one batch: "
                    "resize them in decode=, or pass a collate_fn")
        return _place(shape, np.dtype(tree.dtype) if tree.dtype is not None else first.dtype, tree, cursor, jobs)
    arr = _leaf_array(tree)
    if arr is not None:
        return _place(arr.shape, arr.dtype, arr, cursor, jobs)
    if isinstance(tree, tuple):
        return ("t", [_plan(x, cursor, jobs) for x in tree])
    if isinstance(tree, list):
        return ("l", [_plan(x, cursor, jobs) for x in tree])
    if isinstance(tree, dict):
        return ("d", [(k, _plan(v, cursor, jobs)) for k, v in tree.items()])
    return ("o", tree)


def _place(shape: tuple, dtype: np.dtype, src: Any, cursor: list[int], jobs: list) -> tuple:
    if dtype.hasobject:
        raise TypeError("arrays of Python objects cannot travel in shared memory: decode to numeric arrays")
    offset = cursor[0]
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    cursor[0] = offset + (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    jobs.append((offset, shape, dtype, src))
    return ("a", dtype.str, list(shape), offset)


def pack(tree: Any, slot: Slot, digests: bool = False) -> tuple[Any, int, list[int] | None]:
    """Write every array of ``tree`` into ``slot`` (each sample's array straight into its place in the
    batch: the one copy collation needs); return (description, bytes used, and with ``digests`` the
    xxh3-64 of each array as written, in the description's order)."""
    cursor, jobs = [0], []
    spec = _plan(tree, cursor, jobs)
    buf = slot.buffer(cursor[0], grow=True)
    leaves: list[int] | None = [] if digests else None
    for offset, shape, dtype, src in jobs:
        out = np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset)
        if isinstance(src, Stack) and src.fill is not None:
            for i, a in enumerate(src.arrays):
                src.fill(out[i], a)
        elif isinstance(src, Stack):
            for i, a in enumerate(src.arrays):
                out[i] = a
        else:
            out[...] = src
        if leaves is not None:
            leaves.append(xxhash.xxh3_64_intdigest(out.data))
    return spec, cursor[0], leaves


def leaf_digests(spec: Any, batch: Any) -> list[int]:
    """The xxh3-64 of each array of a batch as the loop holds it, in the order ``pack`` recorded."""
    out: list[int] = []

    def walk(s: Any, x: Any) -> None:
        kind = s[0]
        if kind == "a":
            arr = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
            out.append(xxhash.xxh3_64_intdigest(np.ascontiguousarray(arr).data))
        elif kind in ("t", "l"):
            for sub, y in zip(s[1], x):
                walk(sub, y)
        elif kind == "d":
            for k, sub in s[1]:
                walk(sub, x[k])
    walk(spec, batch)
    return out


def unpack_copy(spec: Any, slot: Slot, size: int, output: "Output") -> Any:
    """Copy a packed batch out of ``slot``, which is free again as soon as this returns."""
    return _unpack(spec, np.frombuffer(slot.buffer(size), np.uint8, size), output.copy)


def unpack_shared(spec: Any, slot: Slot, size: int, output: "Output") -> tuple[Any, np.ndarray]:
    """Hand the batch out without copying: its arrays view a fresh mapping of ``slot``.

    Returns ``(batch, base)``; every array of the batch keeps ``base`` alive, so the
    slot may be reused once ``base`` is garbage (watch it with ``weakref.finalize``).
    """
    base = np.frombuffer(mmap.mmap(slot.fd, size), np.uint8)
    return _unpack(spec, base, output.share), base


def _unpack(spec: Any, base: np.ndarray, convert) -> Any:
    kind = spec[0]
    if kind == "a":
        _, dtype, shape, offset = spec
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return convert(base[offset:offset + nbytes].view(dt).reshape(shape))
    if kind == "t":
        return tuple(_unpack(s, base, convert) for s in spec[1])
    if kind == "l":
        return [_unpack(s, base, convert) for s in spec[1]]
    if kind == "d":
        return {k: _unpack(s, base, convert) for k, s in spec[1]}
    return spec[1]


def _leaves_to(batch: Any, fn) -> Any:
    if isinstance(batch, tuple):
        return tuple(_leaves_to(x, fn) for x in batch)
    if isinstance(batch, list):
        return [_leaves_to(x, fn) for x in batch]
    if isinstance(batch, dict):
        return {k: _leaves_to(v, fn) for k, v in batch.items()}
    return fn(batch)


class Output:
    """What batches are made of: torch tensors (optionally pinned) or NumPy arrays."""

    def __init__(self, kind: str = "auto", pin_memory: bool = False, device: Any = None) -> None:
        from ..errors import ConfigError
        if kind not in ("auto", "torch", "numpy"):
            raise ConfigError(f"output={kind!r}: choose 'auto', 'torch' or 'numpy'")
        self.torch = None
        if kind != "numpy":
            try:
                import torch
                self.torch = torch
            except ImportError:
                if kind == "torch":
                    raise ConfigError("output='torch' but PyTorch is not installed: pip install torch") from None
        self.device = None   # where batches arrive (``deliver``); None: as the readers made them
        self.convert = None  # what ``deliver`` does there to a batch's uint8 images (load/fast_transform.py)
        self.decode = None   # what makes a batch's images there from the JPEGs the readers sent (decode_on="device")
        if device is not None:
            if self.torch is None:
                raise ConfigError(f"device={device!r} needs torch tensors: install PyTorch and leave output='auto'")
            try:
                self.device = self.torch.device(device)
            except (RuntimeError, TypeError) as e:
                raise ConfigError(f"device={device!r}: {e}") from None
            if self.device.type == "cuda" and not self.torch.cuda.is_available():
                raise ConfigError(f"device={device!r} but CUDA is not available here: pass device=None (the CPU)")
        self.pin = bool(pin_memory) and self.torch is not None and self.torch.cuda.is_available()
        # pinned memory needs a copy anyway; everything else can be lent without one
        self.can_share = not self.pin

    def deliver(self, batch: Any) -> Any:
        """``batch`` on the device (its uint8 images converted and normalized there), or as it is."""
        if self.device is None:
            return batch
        torch = self.torch
        move = lambda t: t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t   # noqa: E731
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else None
        if self.decode is not None and isinstance(first, dict) and "deferred" in first:
            rest = [_leaves_to(x, move) for x in batch[1:]]   # (the JPEGs stay on the host: the decoder takes them)
            moved = (self.decode(first), *rest) if isinstance(batch, tuple) else [self.decode(first), *rest]
        else:
            moved = _leaves_to(batch, move)
        if self.convert is not None and isinstance(moved, (list, tuple)) and moved \
                and isinstance(moved[0], torch.Tensor) and moved[0].dtype == torch.uint8:
            images = self.convert(moved[0])
            moved = (images, *moved[1:]) if isinstance(moved, tuple) else [images, *moved[1:]]
        return moved

    def copy(self, view: np.ndarray) -> Any:
        if self.torch is None:
            return view.copy()
        out = self.torch.empty(view.shape, dtype=self.torch.from_numpy(view[:0]).dtype, pin_memory=self.pin)
        out.numpy()[...] = view
        return out

    def share(self, view: np.ndarray) -> Any:
        return view if self.torch is None else self.torch.from_numpy(view)
