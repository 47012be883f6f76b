"""MECHANISM: a node's tiers of one source, opened alike by both front doors (the Loader and
`clairvoyant mount`), and what the local tier holds, as manifest indices.

``open_tiers`` resolves the capacities (bytes, units or a share of the data set; the machine's
defaults otherwise), opens the local tier (the node's directory, shared by its processes) and
the RAM tier (the window of samples needed soonest; the mount keeps none) and hands back
``Tiers``. ``residents`` turns the local tier's entries (named by the key's 64-bit digest) into
the samples of the manifest they hold, at the size the manifest says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from . import capacity as capacity_mod
from .local import LocalStore, prepare_root
from .tiers import Tiers
from ..nodeio.paths import default_local_dir, default_ram_dir


@dataclass(frozen=True)
class NodeTiers:
    tiers: Tiers
    local: capacity_mod.Capacity
    ram: capacity_mod.Capacity | None   # None: no RAM tier (the mount)


def open_tiers(source, entry_sizes: np.ndarray, *, local_dir: str | os.PathLike[str] | None,
               local_capacity: int | str | None, ram_dir: str | os.PathLike[str] | None = None,
               ram_capacity: int | str | None = None, ram: bool = True,
               direct: Callable[[int], bool] = lambda local_bytes: True) -> NodeTiers:
    """The node's tiers for ``source`` whose entries have ``entry_sizes`` (bytes with their
    trailers, per sample). ``ram=False``: a RAM tier of capacity 0 that is never used.
    ``direct(local capacity)``: whether a miss to keep goes straight to the local tier."""
    total, largest = int(entry_sizes.sum()), int(entry_sizes.max())
    rcap = None
    if ram:
        ram_base = prepare_root(os.fspath(ram_dir) if ram_dir is not None else default_ram_dir())
        rcap = capacity_mod.resolve(ram_capacity, what="ram_capacity", dataset_bytes=total, largest_entry=largest,
                                    default=lambda: capacity_mod.default_ram(ram_base, 0))
    else:
        ram_base = default_ram_dir()
    local = LocalStore(os.fspath(local_dir) if local_dir is not None else default_local_dir(), source.uri,
                       expected=len(entry_sizes))
    try:
        lcap = capacity_mod.resolve(local_capacity, what="local_capacity", dataset_bytes=total, largest_entry=largest,
                                    default=lambda: capacity_mod.default_local(local.root, local.ledger.read()[0]))
        tiers = Tiers(local, lambda: LocalStore(ram_base, source.uri, entries=False), lcap.nbytes,
                      rcap.nbytes if rcap is not None else 0, source, direct=direct(lcap.nbytes))
    except BaseException:
        local.close()
        raise
    return NodeTiers(tiers, lcap, rcap)


def residents(manifest, entries: Mapping[str, int], entry_sizes: np.ndarray,
              raw: np.ndarray | None = None) -> dict[int, int]:
    """The samples of ``manifest`` that the local tier's ``entries`` (digest in hex -> entry
    bytes) hold at their current size, as manifest index -> entry bytes. ``raw``: the tier
    compresses (cache/codec.py): an entry no longer than the sample's ``raw`` entry counts too, at
    its length (a stale one is found so at its read)."""
    if not entries:
        return {}
    names = list(entries)
    found = manifest.find_digests(np.array([int(n, 16) for n in names], dtype=np.uint64))
    if raw is not None:   # (counted at their real lengths: what the ledger counts)
        return {i: int(entries[name]) for name, i in zip(names, found.tolist())
                if i >= 0 and entries[name] <= raw[i]}
    return {i: int(entries[name]) for name, i in zip(names, found.tolist())
            if i >= 0 and entries[name] == entry_sizes[i]}
