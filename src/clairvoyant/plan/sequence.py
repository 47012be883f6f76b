"""POLICY, pure: how several ranks' batches make one access sequence.

Ranks that train in lockstep read step by step: at step s the first rank's
batch s, then the second rank's, and so on (a rank with fewer batches has none
in the later steps). ``interleave`` is that merge, the only one: a node's
sequence (its ranks; plan/residency.py, plan/rank_plan.py), the cluster's
(every rank; plan/cluster.py), the mount's (the ranks' published orders;
mount/walk.py) and the simulator's (sim/policies.py). Its result also
answers the inverse: where each rank's batch of each step lies in the
sequence, and which rank and step made an access.

Everything is vectorised: no Python loop over samples or batches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from .order import epoch_order
from .partition import batch_lengths, rank_rows

__all__ = ["Interleaved", "interleave", "epoch_sequence", "node_sequence", "cluster_sequence"]


@dataclass(frozen=True, eq=False)
class Interleaved:
    """An access sequence merged from several ranks' batches: ``samples`` per access, and
    ``lengths[s, i]`` the samples of the ``i``-th rank's batch at step ``s`` (0: none; read-only).
    Ranks are numbered by their place among those interleaved."""

    samples: np.ndarray
    lengths: np.ndarray   # (steps, ranks) int64

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def steps(self) -> int:
        return self.lengths.shape[0]

    @functools.cached_property
    def step_ends(self) -> np.ndarray:
        """int64 per step: the accesses up to the end of that step."""
        return np.cumsum(self.lengths.sum(axis=1, dtype=np.int64))

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """(steps, ranks) int64: where each rank's batch of each step begins in ``samples``."""
        flat = self.lengths.reshape(-1)
        out = np.cumsum(flat) - flat
        out.setflags(write=False)
        return out.reshape(self.lengths.shape)

    def spans(self, i: int) -> np.ndarray:
        """(steps, 2) int64: ``[start, stop)`` of the ``i``-th rank's batch of each step."""
        a = self.starts[:, i]
        return np.stack([a, a + self.lengths[:, i]], axis=1)

    def rank_and_step(self, where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """int32 rank (its place among those interleaved) and step of every access, or of the
        accesses at positions ``where`` only."""
        steps, ranks = self.lengths.shape
        if where is None:
            ids = np.arange(steps * ranks, dtype=np.int32 if steps * ranks < 2**31 else np.int64)
            block = np.repeat(ids, self.lengths.reshape(-1))
        else:
            where = np.asarray(where, dtype=np.int64)
            if len(where) and (int(where.min()) < 0 or int(where.max()) >= len(self)):
                raise IndexError(f"positions outside the sequence's {len(self)} accesses")
            # the last batch starting at or before each position: an empty batch shares its start
            # with the one after it, which comes later in the order and so is the one found
            block = np.searchsorted(self.starts.reshape(-1), where, side="right") - 1
        if not ranks:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        return (block % ranks).astype(np.int32), (block // ranks).astype(np.int32)

    def only(self, ranks: Sequence[int]) -> tuple[np.ndarray, Interleaved]:
        """The accesses of some of the ranks (their places among those interleaved; ascending
        places keep the positions ascending): their int64 positions here, and the interleaving of
        those ranks alone (a node's sequence within the cluster's), with this one's steps."""
        cols = np.asarray(ranks, dtype=np.int64)
        lens = np.ascontiguousarray(self.lengths[:, cols])
        lens.setflags(write=False)
        pos = _runs(self.starts[:, cols].reshape(-1), lens.reshape(-1))
        return pos, Interleaved(self.samples[pos], lens)


def interleave(batches: np.ndarray | Sequence[np.ndarray], lengths: np.ndarray | Sequence[np.ndarray]) -> Interleaved:
    """Merge ranks' batches step by step, ranks in the order given.

    ``batches``: per rank, its samples in order (its batches one after another): a 2-D array (a
    row per rank) or a sequence of 1-D arrays. ``lengths``: the lengths of the batches in order,
    as a 1-D array (the same for every rank) or one per rank (a rank with fewer has no batch in
    the later steps). A rank's samples past its batches are left out. The samples keep their
    dtype."""
    ranks = len(batches)
    if isinstance(lengths, np.ndarray) and lengths.ndim == 1:
        shared = lengths.astype(np.int64, copy=False)
        grid = np.broadcast_to(shared[:, None], (len(shared), ranks))
    else:
        if len(lengths) != ranks:
            raise ValueError(f"{len(lengths)} rows of batch lengths for {ranks} ranks: give one per rank")
        per = [np.asarray(x, dtype=np.int64).reshape(-1) for x in lengths]
        shared = None
        grid = np.zeros((max((len(x) for x in per), default=0), ranks), np.int64)
        for i, x in enumerate(per):
            grid[:len(x), i] = x
        grid.setflags(write=False)
    rows = isinstance(batches, np.ndarray) and batches.ndim == 2
    have = (np.full(ranks, batches.shape[1], np.int64) if rows
            else np.array([len(b) for b in batches], dtype=np.int64))
    if grid.size and int(grid.min()) < 0:
        raise ValueError("a batch length is negative")
    short = np.flatnonzero(grid.sum(axis=0) > have)
    if len(short):
        i = int(short[0])
        raise ValueError(f"rank {i}'s batches take {int(grid[:, i].sum())} samples but it has {int(have[i])}")
    if rows and shared is not None and _even(shared):
        return Interleaved(_interleave_even(batches, shared), grid)
    if rows:
        flat = batches.reshape(-1)
    else:
        flat = (np.concatenate([np.asarray(b).reshape(-1) for b in batches]) if ranks
                else np.zeros(0, np.int64))
    src = (np.cumsum(have) - have)[None, :] + (np.cumsum(grid, axis=0) - grid)   # where each batch is in flat
    return Interleaved(flat[_runs(src.reshape(-1), grid.reshape(-1))], grid)


def _even(lengths: np.ndarray) -> bool:
    """Whether every batch but the last has the first's length and the last no more."""
    return len(lengths) > 0 and lengths[0] > 0 and bool((lengths[:-1] == lengths[0]).all()) \
        and lengths[-1] <= lengths[0]


def _interleave_even(rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``interleave`` of equal rows in batches of B but a shorter last one, by reshaping: one copy
    of the samples, none of the rows (a view of the padded order stays a view)."""
    ranks, b = rows.shape[0], int(lengths[0])
    full = len(lengths) if lengths[-1] == b else len(lengths) - 1
    rem = int(lengths[-1]) if full < len(lengths) else 0
    head = full * b * ranks
    out = np.empty(head + rem * ranks, rows.dtype)
    out[:head].reshape(full, ranks, b)[...] = rows[:, :full * b].reshape(ranks, full, b).transpose(1, 0, 2)
    out[head:].reshape(ranks, rem)[...] = rows[:, full * b:full * b + rem]
    return out


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 positions of the runs ``[starts[k], starts[k] + lengths[k])``, one after another."""
    lengths = np.asarray(lengths, dtype=np.int64)
    before = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, dtype=np.int64) - before, lengths) + np.arange(int(lengths.sum()))


# -- an epoch's sequences (plan/partition.py's split, interleaved) ----------------------------------

def epoch_sequence(num_samples: int, *, seed: int, epoch: int, world_size: int, batch_size: int,
                   ranks: Sequence[int] | None = None, shuffle: bool = True, drop_last: bool = False,
                   position: int = 0) -> Interleaved:
    """The accesses of ``ranks`` (default: every rank, in rank order) in ``epoch`` from global
    ``position`` on: each rank's share of the order (plan/partition.py) cut into batches,
    interleaved. Steps count from ``position``; the samples keep the order's dtype."""
    if batch_size < 1 or world_size < 1:
        raise ConfigError(f"batch_size and world_size must be >= 1, got {batch_size}, {world_size}")
    rows = rank_rows(epoch_order(num_samples, seed, epoch, shuffle), world_size, position)
    if ranks is not None:
        rows = rows[np.asarray(ranks, dtype=np.int64)]   # a copy of these ranks' rows only
    return interleave(rows, batch_lengths(rows.shape[1], batch_size, drop_last))


def node_sequence(num_samples: int, *, seed: int, epoch: int, world_size: int, ranks: Sequence[int],
                  batch_size: int, shuffle: bool = True, drop_last: bool = False, position: int = 0) -> np.ndarray:
    """int64: the samples a node's ``ranks`` read in one epoch from its global ``position`` on,
    step by step (``epoch_sequence``)."""
    return epoch_sequence(num_samples, seed=seed, epoch=epoch, world_size=world_size, batch_size=batch_size,
                          ranks=ranks, shuffle=shuffle, drop_last=drop_last,
                          position=position).samples.astype(np.int64, copy=False)


def cluster_sequence(num_samples: int, *, seed: int, epoch: int, batch_size: int, world_size: int,
                     shuffle: bool = True, drop_last: bool = False, position: int = 0,
                     samples_only: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every access of the epoch from global ``position`` on, in cluster order (step, then rank,
    then place in the batch): ``(samples int64, rank int32, step int32)``; restricted to a node's
    ranks it is that node's ``node_sequence``. ``samples_only``: rank and step come back empty."""
    seq = epoch_sequence(num_samples, seed=seed, epoch=epoch, world_size=world_size, batch_size=batch_size,
                         shuffle=shuffle, drop_last=drop_last, position=position)
    samples = seq.samples.astype(np.int64, copy=False)
    if samples_only:
        return samples, np.zeros(0, np.int32), np.zeros(0, np.int32)
    return (samples, *seq.rank_and_step())
