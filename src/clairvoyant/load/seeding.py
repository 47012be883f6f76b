"""The random state of reader processes: which seed each reader and each batch gets, and
``get_worker_info()``.

PyTorch's DataLoader seeds each worker from a base seed and its worker id, so
that augmentations differ across workers. Readers here do that too (the
reader's seed, from (loader seed, epoch, rank, reader index), is what
``get_worker_info().seed`` reports and what the generators hold when
``worker_init_fn`` runs), and go one step further: before each batch, the
reader seeds Python's ``random``, NumPy's global generator and torch's from
(loader seed, epoch, rank, the batch's position in the epoch). So the draws of
a batch do not depend on which reader happened to get it, on how many readers
there are, or on whether the epoch was resumed half-way; they differ across
batches, ranks and epochs, and the same seed gives the same draws.

Seeds come from NumPy's SeedSequence (a hash of the words), so nearby inputs
give unrelated streams.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

import numpy as np

_READER, _BATCH = 1, 2   # domain tags: reader seeds and batch seeds never coincide

# Set False (in the training process, before iterating) to leave reader generators as fork left
# them: the behaviour before seeding existed, kept for the tests' negative control.
ENABLED = True


def _derive(*words: int) -> int:
    state = np.random.SeedSequence([int(w) & (2**63 - 1) for w in words]).generate_state(2, np.uint32)
    return int(state[0]) | int(state[1]) << 32


def reader_seed(seed: int, epoch: int, rank: int, reader: int) -> int:
    """The 64-bit seed of reader ``reader`` of rank ``rank`` in ``epoch``."""
    return _derive(_READER, seed, epoch, rank, reader)


def batch_seed(seed: int, epoch: int, rank: int, position: int) -> int:
    """The 64-bit seed of the batch at global ``position`` of ``epoch`` on rank ``rank``."""
    return _derive(_BATCH, seed, epoch, rank, position)


def seed_generators(seed: int) -> None:
    """Seed ``random``, NumPy's global generator and (if loaded) torch's with one 64-bit seed."""
    if not ENABLED:
        return
    random.seed(seed)
    np.random.seed([seed & 0xFFFFFFFF, seed >> 32])
    torch = sys.modules.get("torch")
    if torch is not None:
        # the CPU generator: what transforms draw from in a reader (1 us; torch.manual_seed also
        # visits every accelerator backend, 200 us, per batch)
        torch.default_generator.manual_seed(seed)


@dataclass(frozen=True)
class ReaderInfo:
    """What ``get_worker_info()`` returns inside a reader process."""

    id: int             # this reader's index, 0 .. num_workers - 1
    num_workers: int    # readers of this rank in this epoch
    seed: int           # this reader's seed for the epoch (see the module's docstring)
    epoch: int
    rank: int


_info: ReaderInfo | None = None


def get_worker_info() -> ReaderInfo | None:
    """In a reader process: its id, the reader count, its seed, the epoch and rank; None elsewhere
    (as ``torch.utils.data.get_worker_info``)."""
    return _info


def start_reader(info: ReaderInfo) -> None:
    """Called first thing in a reader process."""
    global _info
    _info = info
    seed_generators(info.seed)
