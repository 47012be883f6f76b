"""POLICY: which byte ranges of the source are read whole, each of its samples placed on its own.

A source that packs samples together (tar shards; later HDF5 chunks, TFRecord files) divides them
into *ranges*: runs of samples that lie next to each other in one file, each readable with one
request. Staging reads a sample at a time by default; reading a range whole at its first miss of
the epoch costs the range's bytes once and saves a request per other sample of it that the node
would read from the source.

The plan reads a range whole only where the placement is free, and where it pays:

- **free**: the local tier holds the whole data set (every miss is kept, nothing is ever
  evicted), so a sample placed at its range's first miss rather than at its own first access
  takes room the plan gives it anyway. With less room, a sample placed early would hold room the
  farthest-next-use plan gives to another sample until then, and the plan's hits would no longer
  be sure: there the plan reads per sample (see docs/benchmarks.md, "Shard-granular reads").
- **pays**: the range's bytes are at most what its absent samples cost read one by one, each
  sample's bytes plus ``request_bytes`` (the bytes one request's latency is worth: latency times
  bandwidth). A range of which one sample is absent is not read whole for it. Where requests cost
  nothing beyond their bytes (``request_bytes`` 0: the native staging threads keep the file open
  and carry as many requests at once as the store takes, so their latency is hidden), no range
  pays: per-sample reads fetch the same bytes in the order the readers need them, where a
  range's read delivers samples needed late first and those needed early are read twice
  (issue 39: tar shards' first epoch at 0.78 of the store's bandwidth read whole, 0.89 per sample).

Once a range is read whole, each later first access of one of its samples in the node's sequence
is a planned hit (the stager finds it in the local tier), and every one of its samples is resident
at the epoch's end, those the node does not read this epoch included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .residents import Residents

DEFAULT_REQUEST_BYTES = 1 << 20   # 1 MiB: 2 ms of latency at 500 MB/s, a shared file system's order


@dataclass(frozen=True)
class Ranges:
    """The ranges of a source's samples, as manifest indices: ``of[i]`` is sample i's range and
    ``nbytes[r]`` the bytes one read of range r takes (its samples and what lies between them)."""

    of: np.ndarray       # int32 per sample
    nbytes: np.ndarray   # int64 per range

    def __post_init__(self) -> None:
        of, nbytes = np.asarray(self.of), np.asarray(self.nbytes)
        if of.ndim != 1 or nbytes.ndim != 1:
            raise ValueError("Ranges: of and nbytes are one-dimensional")
        if len(of) and (int(of.min()) < 0 or int(of.max()) >= len(nbytes)):
            raise ValueError(f"Ranges: a sample's range is outside 0 .. {len(nbytes) - 1}")

    @property
    def count(self) -> int:
        return len(self.nbytes)

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, cuts)``: range r's samples are ``order[cuts[r]:cuts[r + 1]]``, ascending."""
        order = np.argsort(np.asarray(self.of), kind="stable")
        cuts = np.zeros(self.count + 1, np.int64)
        np.cumsum(np.bincount(np.asarray(self.of), minlength=self.count), out=cuts[1:])
        return order.astype(np.int64), cuts


@dataclass(frozen=True)
class WholeReads:
    """What reading ranges whole changes in one epoch's node plan."""

    hit: np.ndarray                 # bool per access: the residency plan's hits plus the samples placed early
    whole: np.ndarray               # bool per access: read this sample's range whole here
    ranges: np.ndarray              # int64: the ranges read whole, in the order they are read
    residents_after: Residents      # the plan's residents plus every sample of those ranges


def whole_reads(seq: np.ndarray, hit: np.ndarray, sizes: np.ndarray, capacity: int, residents: Residents,
                residents_after: Residents, ranges: Ranges, *,
                request_bytes: int = DEFAULT_REQUEST_BYTES) -> WholeReads | None:
    """Which ranges the node reads whole this epoch (module docstring), given the farthest-next-use
    plan of its sequence ``seq`` (``hit`` per access) for a tier of ``capacity`` bytes holding
    ``residents`` at the start; ``sizes`` are entry bytes per sample. None where no range is read
    whole (the tier does not hold the data set, or no range pays)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    seq = np.asarray(seq, dtype=np.int64)
    if len(ranges.of) != len(sizes):
        raise ValueError(f"the ranges cover {len(ranges.of)} samples, the manifest {len(sizes)}")
    if capacity < int(sizes.sum()) or not len(seq):
        return None
    present = np.zeros(len(sizes), bool)
    present[residents.samples] = True
    absent = ~present
    rng = np.asarray(ranges.of, dtype=np.int64)
    # what the absent samples of each range cost read one by one, against one read of the range
    count = np.bincount(rng[absent], minlength=ranges.count)
    alone = np.bincount(rng[absent], weights=sizes[absent] + request_bytes, minlength=ranges.count)
    pays = (count > 1) & (request_bytes > 0) & (np.asarray(ranges.nbytes, dtype=np.float64) <= alone)
    miss = np.flatnonzero(~np.asarray(hit, bool))
    if not len(miss):
        return None
    r_of_miss = rng[seq[miss]]
    chosen, first = np.unique(r_of_miss, return_index=True)   # each range's first miss
    keep = pays[chosen]
    chosen, first = chosen[keep], first[keep]
    if not len(chosen):
        return None
    whole = np.zeros(len(seq), bool)
    whole[miss[first]] = True
    new_hit = np.array(hit, dtype=bool, copy=True)
    placed_early = pays[r_of_miss] & ~whole[miss]
    new_hit[miss[placed_early]] = True
    read = np.zeros(ranges.count, bool)
    read[chosen] = True
    extra = np.flatnonzero(read[rng] & absent)
    after = _union(residents_after, extra, sizes)
    by_time = chosen[np.argsort(first, kind="stable")]
    return WholeReads(hit=new_hit, whole=whole, ranges=by_time, residents_after=after)


def _union(res: Residents, samples: np.ndarray, sizes: np.ndarray) -> Residents:
    s = np.concatenate([np.asarray(res.samples, np.int64), samples.astype(np.int64)])
    z = np.concatenate([np.asarray(res.sizes, np.int64), sizes[samples]])
    s, at = np.unique(s, return_index=True)
    return Residents(s, z[at])
