"""`clairvoyant pack`: a tree of small files into large, deterministic, resumable shards whose
batches equal the tree's. ``tar.py``: WebDataset-layout tar shards (and the state file every pack
keeps); ``arrays.py``: a tree of ``.npy`` files into ``.npz`` or HDF5 shards."""

from .arrays import pack_arrays
from .tar import STATE, PackResult, pack

__all__ = ["pack", "pack_arrays", "PackResult", "STATE"]
