"""POLICY: which epoch, and from which position, each pass over a Loader runs; what ``iter(loader)``
returns.

A pass after one that reached its epoch's end is the next epoch's (as a re-shuffling DataLoader
draws a new order each pass) unless ``set_epoch`` came in between; ``set_epoch`` during a pass
that has yielded batches counts for the next one (as a sampler's would); a pass closed before its
end leaves the epoch to start again (the Loader warns). The pass is planned at its iterator's
first ``next()``, so a ``set_epoch`` between ``iter()`` and the first batch still counts (Lightning
calls them in that order). ``loader.sampler`` is an ``EpochSetter`` for frameworks that set a
DataLoader's epoch through its sampler.

``EpochCursor`` is a part of the Loader (load/loader.py): it holds the epoch and the position and
nothing else; its iterator asks the Loader, through the two functions it is given, to plan and
start a pass (``begin``) and to judge a finished one (``finish``).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import ConfigError
from ..plan import position_after

if TYPE_CHECKING:
    from .pipeline import EpochRun

log = logging.getLogger("clairvoyant")


class EpochCursor:
    """The epoch the next pass follows and how far the current one is: ``set_epoch``, the passes,
    ``position`` and what a state dict saves of them."""

    def __init__(self) -> None:
        self.epoch = 0
        self.passed = False      # the current epoch's pass reached its end: the next iteration moves on
        self.deferred: int | None = None   # set_epoch during a pass: for the next one
        self.broken: int | None = None     # the epoch of a pass closed before its end
        self.resume = 0          # global position of the epoch to start the next iteration at
        self.start = 0           # global position the current iteration started at
        self.span = 0            # batches of the current iteration
        self.done = 0            # batches of the current iteration already yielded (for state_dict)
        self.loaded_epoch: int | None = None
        self.active: weakref.ReferenceType[_EpochIterator] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if self.in_pass():   # as a sampler's: the pass under way keeps its order
            self.deferred = int(epoch)
            return
        self.deferred = None
        self._select(int(epoch))

    def _select(self, epoch: int) -> None:
        self.passed, self.broken = False, None
        if epoch != self.loaded_epoch:  # keep a resume position loaded for this very epoch
            self.resume = 0
            self.loaded_epoch = None
        if epoch != self.epoch:
            self.done = self.start = self.span = 0
        self.epoch = int(epoch)

    def iterate(self, begin: Callable[[], EpochRun], finish: Callable[[EpochRun], None]) -> _EpochIterator:
        """A new pass's iterator (the one before it closed)."""
        self.close_active()
        it = _EpochIterator(self, begin, finish)
        self.active = weakref.ref(it)
        return it

    def in_pass(self) -> bool:
        """A pass has yielded batches and not reached its end: ``set_epoch`` waits for the next one."""
        it = self.active() if self.active is not None else None
        return it is not None and it.started and not it.finished and self.done > 0 and not self.passed

    def settle(self) -> None:
        """Apply a ``set_epoch`` that came while a pass was under way, once it is not."""
        if self.deferred is not None and not self.in_pass():
            epoch, self.deferred = self.deferred, None
            self._select(epoch)

    def next_pass(self) -> int:
        """A pass is about to be planned: its epoch settled (the next one after a complete pass),
        and the global position it starts at."""
        self.settle()
        if self.passed:
            self.epoch, self.resume, self.loaded_epoch, self.passed = self.epoch + 1, 0, None, False
        elif self.broken == self.epoch:
            log.warning("clairvoyant: the last pass over epoch %d stopped before its end; this pass starts "
                        "that epoch again from position %d (call set_epoch(e) before each pass to choose, "
                        "or iterate to the end)", self.epoch, self.resume)
        self.broken = None
        start, self.resume, self.loaded_epoch = self.resume, 0, None
        return start

    def started(self, start: int, span: int) -> None:
        """The pass starting at global ``start`` runs ``span`` batches."""
        self.start, self.span, self.done = start, span, 0

    def load(self, epoch: int, position: int, at_end: bool) -> None:
        """Continue epoch ``epoch`` from global ``position`` (``at_end``: saved at the epoch's end,
        a bare loop goes on with the next epoch)."""
        self.close_active()
        self.epoch, self.resume, self.done, self.start, self.span = epoch, position, 0, position, 0
        self.loaded_epoch, self.deferred, self.broken = epoch, None, None
        self.passed = at_end

    def position(self, samples: int, batch_size: int, world_size: int) -> int:
        """Samples of the current epoch's order consumed by all ranks together (a prefix of the
        order, plan/partition.py): where a resume, at any world size, continues."""
        self.settle()
        if self.loaded_epoch is not None:
            return self.resume
        if self.span == 0:   # nothing iterated yet at this position
            return self.start
        return position_after(samples, self.start, self.done, batch_size, world_size, self.span)

    def close_active(self) -> None:
        it = self.active() if self.active is not None else None
        if it is not None:
            it.close()
        self.active = None
        self.settle()


class EpochSetter:
    """``loader.sampler``: what frameworks that set a DataLoader's epoch through its sampler call."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class _EpochIterator:
    """What ``iter(loader)`` returns; the pass is planned at its first ``next()``. Dropping it
    (early break, exception, GC) releases everything."""

    def __init__(self, cursor: EpochCursor, begin: Callable[[], EpochRun],
                 finish: Callable[[EpochRun], None]) -> None:
        self._cursor, self._begin, self._finish = cursor, begin, finish
        self._run: EpochRun | None = None
        self._reported = False
        self.finished = False   # reached the epoch's end, or closed

    @property
    def started(self) -> bool:
        return self._run is not None

    def _mine(self) -> bool:
        c = self._cursor
        return c.active is not None and c.active() is self

    def __iter__(self) -> "_EpochIterator":
        return self

    def _started_run(self) -> EpochRun | None:
        """The pass's run, planned now if this is its first use; None once closed unstarted."""
        if self._run is None and not self.finished:
            self._run = self._begin()
        return self._run

    def __len__(self) -> int:
        run = self._started_run()
        return 0 if run is None else len(run) - run.position

    def __next__(self) -> Any:
        cursor = self._cursor
        if self._started_run() is None:
            raise StopIteration
        try:
            out = self._run.next()
        except StopIteration:
            if self._run.completed and not self._reported:
                self._reported = True
                if self._mine():
                    cursor.passed = True
                self._finish(self._run)
            self.finished = True
            raise
        cursor.done += 1
        if cursor.done >= cursor.span and self._mine():   # the last batch (a framework may not ask past it)
            cursor.passed = True
        return out

    def close(self) -> None:
        if self._run is not None and not self.finished and self._mine() and not self._cursor.passed:
            self._cursor.broken = self._cursor.epoch   # stopped before the epoch's end
        self.finished = True
        if self._run is not None:
            self._run.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
