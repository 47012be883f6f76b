"""The Loader: what the training loop holds.

It lists the source once (persisted manifest), plans each epoch's order as a
pure function of (seed, epoch, rank), stages upcoming samples to node-local
storage while reader processes decode the already-staged ones, and yields
batches in plan order. PyTorch conventions: ``len``, ``set_epoch``,
``state_dict`` / ``load_state_dict``, ``shuffle``, ``drop_last``.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from .. import manifest as manifest_mod
from ..cache.local import LocalStore
from ..dist.topology import detect, validate
from ..errors import ConfigError, EmptySourceError
from ..paths import default_local_dir
from ..plan import num_batches, plan_epoch
from ..source import as_source
from ..tune.stats import Stats
from .decode import decode_image
from .pipeline import EpochRun
from .transport import Output

STATE_FORMAT = "clairvoyant-loader-state"


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class Loader:
    """Iterate over batches of a source, staging upcoming samples to node-local storage.

    Args:
        source: a directory path or a source object (e.g. ``clairvoyant.testing.EmulatedStore``).
        batch_size: samples per batch on this rank.
        local_dir: node-local staging directory, shared by the ranks of a node; defaults to a
            per-user directory under ``$TMPDIR`` created with mode 0700.
        seed, shuffle, drop_last: as PyTorch's DistributedSampler and DataLoader.
        decode: picklable callable from a sample's bytes to a sample (default: JPEG/PNG to uint8 HWC).
        collate_fn: list of ``(sample, label)`` to a batch (default: stack arrays, labels to int64).
        num_workers: reader processes (default: the CPUs this process may use).
        stage_threads: I/O threads copying from the source.
        lookahead: how many batches ahead of the training loop staging runs.
        prefetch: batches each reader may hold ready.
        rank, world_size: default from torchrun, MPI or SLURM variables, else a single process.
        on_error: ``"raise"`` (default) or ``"skip"`` samples that cannot be read or decoded.
        manifest: path of the persisted manifest (default: under the per-user cache).
        reindex: walk the source again even if a manifest exists.
        output: ``"auto"`` (torch tensors if PyTorch is installed), ``"torch"`` or ``"numpy"``.
        pin_memory: copy batches into page-locked memory (when CUDA is available).
    """

    def __init__(self, source: Any, batch_size: int = 1, *, local_dir: str | os.PathLike[str] | None = None,
                 seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                 decode: Callable[[bytes], Any] | None = None, collate_fn: Callable | None = None,
                 num_workers: int | None = None, stage_threads: int = 32, lookahead: int = 64,
                 prefetch: int = 2, rank: int | None = None, world_size: int | None = None,
                 on_error: str = "raise", manifest: str | None = None, reindex: bool = False,
                 output: str = "auto", pin_memory: bool = False, mp_context: str = "fork") -> None:
        for name, value, low in (("batch_size", batch_size, 1), ("stage_threads", stage_threads, 1),
                                 ("lookahead", lookahead, 1), ("prefetch", prefetch, 1), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ConfigError(f"num_workers must be an integer >= 1 or None, got {num_workers!r}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={on_error!r}: choose 'raise' or 'skip'")
        if decode is not None and not callable(decode):
            raise ConfigError(f"decode={decode!r} is not callable")
        if (rank is None) != (world_size is None):
            raise ConfigError("pass both rank and world_size, or neither (then they come from the launcher)")
        self.topology = detect() if rank is None else validate(int(rank), int(world_size))
        self.source = as_source(source)
        self.manifest, self.indexed = manifest_mod.obtain(self.source, manifest, reindex=reindex)
        if len(self.manifest) == 0:
            raise EmptySourceError(f"data source {self.source.uri} holds no samples: check the path")
        self.store = LocalStore(os.fspath(local_dir) if local_dir is not None else default_local_dir(),
                                self.source.uri)
        self.batch_size, self.seed, self.shuffle, self.drop_last = int(batch_size), int(seed), shuffle, drop_last
        self.decode = decode or decode_image
        self.collate_fn = collate_fn
        self.num_workers = num_workers or _default_workers()
        self.stage_threads, self.lookahead, self.prefetch = stage_threads, lookahead, prefetch
        self.on_error, self.mp_context = on_error, mp_context
        self._output = Output(output, pin_memory)
        self._stats = Stats()
        self._known: set[int] = set()
        self._epoch = 0
        self._resume = 0          # batch to start the next iteration at
        self._done = 0            # batches of the current epoch already yielded (for state_dict)
        self._loaded_epoch: int | None = None
        self._active: weakref.ReferenceType[_EpochIterator] | None = None

    # -- PyTorch conventions --------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    def __len__(self) -> int:
        per_rank = -(-len(self.manifest) // self.world_size)
        return num_batches(per_rank, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows (call it before each epoch)."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self._loaded_epoch:  # keep a resume position loaded for this very epoch
            self._resume = 0
            self._loaded_epoch = None
        if epoch != self._epoch:
            self._done = 0
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        self._close_active()
        plan = plan_epoch(len(self.manifest), seed=self.seed, epoch=self._epoch, rank=self.rank,
                          world_size=self.world_size, batch_size=self.batch_size, shuffle=self.shuffle,
                          drop_last=self.drop_last)
        start, self._resume, self._loaded_epoch = self._resume, 0, None
        self._done = start
        run = EpochRun(source=self.source, manifest=self.manifest, store=self.store,
                       batches=list(plan.batches[start:]), epoch=self._epoch, num_workers=self.num_workers,
                       prefetch=self.prefetch, stage_threads=self.stage_threads,
                       lookahead=self.lookahead, decode=self.decode, collate_fn=self.collate_fn,
                       skip_errors=self.on_error == "skip", output=self._output, stats=self._stats,
                       known=self._known, mp_context=self.mp_context)
        it = _EpochIterator(run, self)
        self._active = weakref.ref(it)
        return it

    def state_dict(self) -> dict:
        """JSON-serialisable position: resuming from it yields exactly the remaining batches."""
        return {"format": STATE_FORMAT, "version": 1, "epoch": self._epoch, "batches_done": self._done,
                "seed": self.seed, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "rank": self.rank, "world_size": self.world_size,
                "num_samples": len(self.manifest), "manifest": self.manifest.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("not a clairvoyant loader state: pass what Loader.state_dict() returned")
        mine = self.state_dict()
        for key in ("seed", "batch_size", "shuffle", "drop_last", "world_size", "rank", "num_samples", "manifest"):
            if state.get(key) != mine[key]:
                raise ConfigError(
                    f"the saved state has {key}={state.get(key)!r} but this loader has {mine[key]!r}: "
                    "resume with the same data, seed, batch size and topology")
        done = int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise ConfigError(f"batches_done={done} is outside [0, {len(self)}]")
        self._close_active()
        self._epoch, self._resume, self._done = int(state["epoch"]), done, done
        self._loaded_epoch = self._epoch

    # -- statistics and lifecycle ---------------------------------------------------------------

    def stats(self) -> dict:
        """Counters since this loader was made: source files/bytes, staged files, local hits,
        on-demand fetches, waits and wait time, batches, samples, skipped keys."""
        return self._stats.snapshot()

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def close(self) -> None:
        """Stop any iteration in progress and release every process, thread and buffer."""
        self._close_active()
        self.store.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _EpochIterator:
    """What ``iter(loader)`` returns. Dropping it (early break, exception, GC) releases everything."""

    def __init__(self, run: EpochRun, loader: Loader) -> None:
        self._run = run
        self._loader = loader

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return len(self._run) - self._run.position

    def __next__(self) -> Any:
        out = self._run.next()
        self._loader._done += 1
        return out

    def close(self) -> None:
        self._run.close()

    def __del__(self) -> None:
        try:
            self._run.close()
        except Exception:
            pass
