"""The samplers' published orders as the manifest's file numbers: pure, but for a cache.

A published order (mount/orders.py) names the files behind each index by path; the plan works on
file numbers (the manifest's indices), merged over the ranks by ``interleave`` (plan/sequence.py),
which takes each rank's files in order and how many of them each index has. ``numbered`` makes
those, for the epoch and the next; a path the manifest does not know is left out, its index
counting one file fewer. ``plan_key`` is what identifies a set of published orders (a plan is
made again only when it changes). ``OrderNumbers`` keeps each order file's parse and numbers until
the file is replaced, so that the mount's look every few milliseconds parses nothing again.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np


class Numbered(NamedTuple):
    """A published order's files as numbers: ``files`` in order, ``counts`` per index (as many as
    the manifest knows), for this epoch and the next (``next_*``)."""

    files: np.ndarray
    counts: np.ndarray
    next_files: np.ndarray
    next_counts: np.ndarray


def plan_key(cur: dict) -> tuple:
    """What identifies a set of published orders: each rank's epoch and publication stamp."""
    return tuple(sorted((r, o.epoch, o.stamp) for r, o in cur.items()))


def numbered(order, index: Mapping[str, int]) -> Numbered:
    """A published order's files as file numbers (``index``: path -> number), for ``interleave``:
    for this epoch and the next, every file known to ``index`` in order (int64) and how many of
    them each index of the order has."""

    def of(groups: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        found = np.fromiter((index.get(k, -1) for g in groups for k in g), np.int64)
        per = np.fromiter((len(g) for g in groups), np.int64, len(groups))
        known = found >= 0
        counts = np.bincount(np.repeat(np.arange(len(groups)), per)[known], minlength=len(groups))
        return found[known], counts.astype(np.int64)

    return Numbered(*of(order.groups), *of(order.following))


class OrderNumbers:
    """Published orders of one mount, each parsed and numbered once per version of its file."""

    def __init__(self, manifest) -> None:
        self.manifest = manifest
        self._index: dict[str, int] | None = None
        # order file -> ((inode, mtime, size), its parsed order, its files as numbers)
        self._parsed: dict[str, tuple] = {}

    def index(self) -> dict[str, int]:
        """The manifest's path -> file number, made at the first order."""
        if self._index is None:
            self._index = {self.manifest.keys[i]: i for i in range(len(self.manifest))}
        return self._index

    def parsed(self, path: str, ident: tuple):
        """The order parsed from ``path`` when the file was ``ident`` (inode, mtime, size), or None
        (never parsed, or replaced since)."""
        cached = self._parsed.get(path)
        return None if cached is None or cached[0] != ident else cached[1]

    def remember(self, path: str, ident: tuple, order):
        """``order``, just parsed from ``path`` (``ident``), numbered and kept; returned."""
        self._parsed[path] = (ident, order, numbered(order, self.index()))
        return order

    def of(self, order) -> Numbered:
        """The numbers of ``order``: as worked out when it was parsed, else now."""
        for _, parsed, numbers in self._parsed.values():
            if parsed is order:
                return numbers
        return numbered(order, self.index())
