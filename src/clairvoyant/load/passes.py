"""POLICY: which epoch, and from which position, each pass over a Loader runs; what ``iter(loader)``
returns.

A pass after one that reached its epoch's end is the next epoch's (as a re-shuffling DataLoader
draws a new order each pass) unless ``set_epoch`` came in between; ``set_epoch`` during a pass
that has yielded batches counts for the next one (as a sampler's would); a pass closed before its
end leaves the epoch to start again (the Loader warns). The pass is planned at its iterator's
first ``next()``, so a ``set_epoch`` between ``iter()`` and the first batch still counts (Lightning
calls them in that order). ``loader.sampler`` is an ``EpochSetter`` for frameworks that set a
DataLoader's epoch through its sampler.

``EpochPasses`` is a base class of the Loader (load/loader.py): its methods use the Loader's
attributes, named below; the iterator calls the Loader's ``_begin`` and ``_epoch_done``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..errors import ConfigError
from ..manifest import Manifest
from ..plan import position_after

if TYPE_CHECKING:
    from .pipeline import EpochRun


class EpochPasses:
    """The Loader's passes: ``set_epoch``, ``iter()``, ``position``."""

    # the Loader's attributes these methods use (set in Loader.__init__)
    manifest: Manifest
    batch_size: int
    world_size: int
    _epoch: int
    _passed: bool
    _deferred: int | None
    _broken: int | None
    _resume: int
    _start: int
    _span: int
    _done: int
    _loaded_epoch: int | None
    _active: weakref.ReferenceType[_EpochIterator] | None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows. Optional: without it, each
        iteration after a complete pass moves to the next epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if self._in_pass():   # as a sampler's: the pass under way keeps its order
            self._deferred = int(epoch)
            return
        self._deferred = None
        self._select(int(epoch))

    def _select(self, epoch: int) -> None:
        self._passed, self._broken = False, None
        if epoch != self._loaded_epoch:  # keep a resume position loaded for this very epoch
            self._resume = 0
            self._loaded_epoch = None
        if epoch != self._epoch:
            self._done = self._start = self._span = 0
        self._epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:
        """One pass over the rest of the current epoch. After a pass that reached the epoch's end,
        the next iteration is the next epoch's (as a re-shuffling DataLoader draws a new order each
        pass) unless ``set_epoch`` was called in between. The pass is planned at its first batch,
        so a ``set_epoch`` between ``iter()`` and the first ``next()`` still counts (Lightning
        calls them in that order)."""
        self._close_active()
        it = _EpochIterator(self)
        self._active = weakref.ref(it)
        return it

    def _in_pass(self) -> bool:
        """A pass has yielded batches and not reached its end: ``set_epoch`` waits for the next one."""
        it = self._active() if self._active is not None else None
        return it is not None and it.started and not it.finished and self._done > 0 and not self._passed

    def _settle_epoch(self) -> None:
        """Apply a ``set_epoch`` that came while a pass was under way, once it is not."""
        if self._deferred is not None and not self._in_pass():
            epoch, self._deferred = self._deferred, None
            self._select(epoch)

    @property
    def position(self) -> int:
        """Samples of the current epoch's order consumed by all ranks together (a prefix of the
        order, plan/partition.py): where a resume, at any world size, continues."""
        self._settle_epoch()
        if self._loaded_epoch is not None:
            return self._resume
        if self._span == 0:   # nothing iterated yet at this position
            return self._start
        return position_after(len(self.manifest), self._start, self._done, self.batch_size, self.world_size,
                              self._span)

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None
        self._settle_epoch()


class EpochSetter:
    """``loader.sampler``: what frameworks that set a DataLoader's epoch through its sampler call."""

    def __init__(self, loader: EpochPasses) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class _EpochIterator:
    """What ``iter(loader)`` returns; the pass is planned at its first ``next()``. Dropping it
    (early break, exception, GC) releases everything."""

    def __init__(self, loader: EpochPasses) -> None:   # (the Loader: it derives from EpochPasses)
        self._loader = loader
        self._run: EpochRun | None = None
        self._reported = False
        self.finished = False   # reached the epoch's end, or closed

    @property
    def started(self) -> bool:
        return self._run is not None

    def _mine(self) -> bool:
        ld = self._loader
        return ld._active is not None and ld._active() is self

    def __iter__(self) -> "_EpochIterator":
        return self

    def _started_run(self) -> EpochRun | None:
        """The pass's run, planned now if this is its first use; None once closed unstarted."""
        if self._run is None and not self.finished:
            self._run = self._loader._begin()
        return self._run

    def __len__(self) -> int:
        run = self._started_run()
        return 0 if run is None else len(run) - run.position

    def __next__(self) -> Any:
        loader = self._loader
        if self._started_run() is None:
            raise StopIteration
        try:
            out = self._run.next()
        except StopIteration:
            if self._run.completed and not self._reported:
                self._reported = True
                if self._mine():
                    loader._passed = True
                loader._epoch_done(self._run)
            self.finished = True
            raise
        loader._done += 1
        if loader._done >= loader._span and self._mine():   # the last batch (a framework may not ask past it)
            loader._passed = True
        return out

    def close(self) -> None:
        if self._run is not None and not self.finished and self._mine() and not self._loader._passed:
            self._loader._broken = self._loader._epoch   # stopped before the epoch's end
        self.finished = True
        if self._run is not None:
            self._run.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
