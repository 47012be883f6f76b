"""MECHANISM: one plan of the mount with samplers, carried out: the walk along the node's sequence.

The ranks' published orders of an epoch, as file numbers (mount/numbering.py), are merged into the
node's sequence as the Loader merges its ranks' batches (step by step, ranks in order,
plan/sequence.py ``interleave``), with the next epoch's where every rank sent one. The Loader's
plan of that sequence (plan/ahead.py ``to_stage``) says which misses are kept; the walk goes along
it and does what ``next_step`` decides at each position: skip it, gather it for the stager (a
slot and its room taken; up to ``CHUNK`` files go in one call), evict the victim named (one whose
copy is still on the way goes once it lands: ``settle``), or wait for the readers. It looks at
their progress (the samplers' progress files) every ``PROGRESS_EVERY`` positions and whenever room
runs out, and takes up the daemon's reads then (mount/follow.py). Staged to the end, it keeps
following the readers until newer orders are published, then hands back to the orders watch
(mount/controller.py), which plans again.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, NamedTuple

import numpy as np

from ..cache.entry import entry_size
from ..cache.node import residents
from ..plan.ahead import EVICT, SKIP, WAIT, StagedAhead, next_step, to_stage, wanted
from ..plan.progress import ReadersProgress
from ..plan.sequence import interleave
from .copies import Copies
from .counters import Counters
from .follow import Follower
from .numbering import Numbered
from .orders import PROGRESS_EVERY, WATCH_EVERY, read_progress

CHUNK = 32   # files of the plan handed to the stager in one call, at most


def settle(late: list[int], held: StagedAhead | Iterable[int], in_flight: Callable[[int], bool],
           evict: Callable[[int], int], gathered: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Evict what was chosen for eviction while its copy was on the way (``late``), now that it is
    there; the files whose copy is still on the way (looked at before the eviction: a copy that
    lands in between is evicted, never forgotten). A file staged again meanwhile (in ``held``) or
    gathered to be stays."""
    keep = []
    for v in late:
        if v in held or v in gathered:
            continue
        flying = in_flight(v)
        if not evict(v) and flying:
            keep.append(v)
    return keep


class Parts(NamedTuple):
    """What a walk works with, made once by the controller."""

    copies: Copies
    follower: Follower
    counters: Counters
    orders_dir: str
    changed: Callable[[], bool]                # whether the orders directory may hold something new
    current_key: Callable[[], tuple | None]    # the ``plan_key`` of the newest published orders
    stop: threading.Event
    poll: float


class Following:
    """What every walk of the published orders ``cur`` (rank -> order; ``key``: their ``plan_key``)
    shares: ``current``, which turns False once a look finds newer orders (the orders watch,
    mount/controller.py, then plans again), and the node's ranks' progress through the epoch."""

    def __init__(self, cur: dict, key: tuple, parts: Parts) -> None:
        self._p, self.key, self.current = parts, key, True
        self._ranks = sorted(cur)
        self._epoch = int(cur[self._ranks[0]].epoch)

    def _moved(self) -> bool:
        """At the stop, or newer orders published (``current`` turns False)."""
        p = self._p
        if not p.stop.is_set() and p.changed() and p.current_key() != self.key:
            self.current = False
        return p.stop.is_set() or not self.current

    def _progress(self) -> ReadersProgress:
        """The node's ranks' progress through the epoch (their progress files, plan/progress.py)."""
        return ReadersProgress.of([read_progress(self._p.orders_dir, r) for r in self._ranks], self._epoch)


class Walk(Following):
    """The plan of the published orders ``cur`` (``numbers``: each rank's, ranks in order), and its
    walk (``run``)."""

    def __init__(self, cur: dict, key: tuple, numbers: list[Numbered], parts: Parts) -> None:
        super().__init__(cur, key, parts)
        merged = interleave([n.files for n in numbers], [n.counts for n in numbers])   # like the Loader's
        seq, self._per_step = merged.samples, merged.step_ends.tolist()
        # the next epoch's order, where every rank sent one: its uses count as next uses, and once
        # this epoch is staged, staging goes on into it (within the capacity)
        after = (interleave([n.next_files for n in numbers], [n.next_counts for n in numbers]).samples
                 if all(cur[r].following for r in self._ranks) else np.zeros(0, np.int64))
        parts.counters.new_plan(epoch=self._epoch, ranks=len(self._ranks), sequence=len(seq),
                                following=len(after))
        copies = parts.copies
        self._capacity = copies.tiers.local_capacity
        entry = copies.sizes + entry_size(0)
        held_now = residents(copies.manifest, copies.tiers.local.entries(), entry)   # as the Loader finds them
        # the Loader's plan of this node's epoch: only the misses it keeps are staged ahead
        self._stage = to_stage(seq, after, entry, self._capacity, held_now)
        self.held = StagedAhead(np.concatenate([seq, after]), len(copies.manifest), list(held_now), keep=self._stage)
        self._seq = seq.tolist()
        self._reach = 0   # how far the fastest rank can have got (a read of a use beyond it is of an earlier one)
        self._looked, self._handed = -1.0, 0   # when the progress files were read, and the position they gave
        self._taken = parts.follower.taken      # the reads taken up before this walk: none of its readers'
        self._since = 0                         # positions before this one count as read (``_follow``)
        self._chunk: list[tuple[int, int]] = []   # (position, file): a slot and room taken, not yet submitted
        self._gathered: set[int] = set()

    def run(self) -> None:
        """Stage the plan, then follow the readers until newer orders come or the stop."""
        p = self._p
        try:
            self._walk()
            looked = 0.0
            while not p.stop.wait(WATCH_EVERY):   # staged to the end: keep following the readers
                if self._moved():   # a new order: the watch thread plans it
                    return
                now = time.monotonic()
                if p.follower.pending() or now - looked >= p.poll:   # the progress files: read when it matters
                    looked = now
                    self._follow()
                p.counters.maybe_publish()
        except BaseException:
            if self._chunk:   # gathered, never handed on: their slots go back
                p.copies.release(len(self._chunk))
            raise

    # -- the readers ----------------------------------------------------------------------------

    def _position(self, steps: int) -> int:
        return self._per_step[min(steps, len(self._per_step)) - 1] if steps > 0 else 0

    def _consumed(self) -> int:
        """The position the slowest rank was handed, from the progress files (read at most every
        ``WATCH_EVERY``: they change every ``PROGRESS_EVERY`` indices)."""
        now = time.monotonic()
        if now - self._looked >= WATCH_EVERY:
            steps = self._progress()
            self._reach = self._position(steps.fastest + 2 * PROGRESS_EVERY)   # reads run up to a report ahead of it
            self._looked, self._handed = now, self._position(steps.slowest)
        return self._handed

    def _follow(self) -> int:
        """The readers' progress and reads taken up: the position before which the readers may
        have read every file: ``lag`` before the fewer of the positions handed out and the reads
        heard since this walk began (a sampler hands out indices a DataLoader's prefetch ahead of
        its workers' opens, and the workers read about in order: what is handed out and not yet
        read, the first batches' files included, is staged too)."""
        self._flush()   # what is gathered is in the plan's residents before any read is weighed
        handed = self._consumed()
        self._p.counters.set(consumed=handed)
        follower = self._p.follower
        follower.follow(self.held, handed, self._reach, self._capacity)
        read = follower.taken - self._taken   # reads heard since this walk began: about how far they got
        self._since = max(self._since, min(handed, read) - follower.lag)
        return self._since

    # -- the walk -------------------------------------------------------------------------------

    def _flush(self) -> None:
        """The chunk goes to the stager in one call, its slots with it; counted staged in the plan."""
        if not self._chunk:
            return
        chunk = self._chunk[:]
        self._chunk.clear()
        self._gathered.clear()
        self._p.copies.submit_files([i for _, i in chunk])
        for pos, i in chunk:
            self.held.staged(i, pos)
        self._p.copies.staged_ahead(i for _, i in chunk)
        self._p.counters.set(frontier=chunk[-1][0] + 1)

    def _settle(self, late: list[int], gathered: set[int] | frozenset[int] = frozenset()) -> list[int]:
        return settle(late, self.held, self._p.copies.in_flight, self._p.copies.evict, gathered)

    def _walk(self) -> None:
        """Stage the positions the plan marks, in order, within the capacity, evicting by farthest
        next use: files are gathered into the chunk (a slot and room taken for each) and handed on
        by ``_flush``. A position the readers may have read already (``_follow``) is not staged:
        its reader took the file from wherever it was, and a copy started now would only take room
        from the files ahead. One handed out but not yet read is: its reader opens it soon, and a
        reader that opens it while it is copied waits for the copy (the daemon's reads and the
        copies share the key's lock and the handoff: the store is read once either way). Before,
        the first batches a DataLoader's prefetch took (16 x 32 files) were all read from the
        store by its 8 workers one file at a time: the first epoch at 0.6 of the store's limit."""
        p, held, stage, gathered = self._p, self.held, self._stage, self._gathered
        # not staged: a file gathered for a copy, or one its readers read since the walk began (its
        # handoff may be gone by now: a copy would read the store a second time)
        skip = p.follower.read_since(self._taken, also=gathered)
        late: list[int] = []   # chosen for eviction while their copy was on the way
        room = 0   # bytes known free in the tier beyond the chunk's
        handed = self._follow()
        for pos, i in enumerate(self._seq):
            if p.stop.is_set() or not self.current:
                self._flush()
                return
            if late:
                late = self._settle(late, gathered)
            if pos % PROGRESS_EVERY == 0:
                handed = self._follow()
            if not wanted(held, pos, i, bool(stage[pos]), handed, skip):
                continue
            need = entry_size(int(p.copies.sizes[i]))
            p.counters.maybe_publish()
            if need > room:   # what is gathered goes first; then the room and the readers are read
                self._flush()
                room = self._capacity - p.copies.used()
                handed = self._follow()
            step = next_step(held, pos, i, True, handed, need, room, skip)
            while step.kind in (EVICT, WAIT):   # carried out here; the decisions are plan/ahead.py's
                if step.kind == EVICT:
                    if not p.copies.evict(step.victim):   # its copy is still on the way: it goes once there
                        late.append(step.victim)
                else:
                    late = self._settle(late)
                    if not self.current or p.stop.wait(p.poll):
                        return
                    self.current = p.current_key() == self.key
                    if not self.current:
                        return
                if p.stop.is_set():
                    return
                handed = self._follow()
                room = self._capacity - p.copies.used()
                step = next_step(held, pos, i, True, handed, need, room, skip)
            if step.kind == SKIP:   # (also: the readers got there while it waited)
                continue
            if not p.copies.take_slot(wait=False):   # the slots are taken: what is gathered goes first
                self._flush()
                if not p.copies.take_slot(wait=True):
                    return
            self._chunk.append((pos, i))
            gathered.add(i)
            room -= need
            if len(self._chunk) >= CHUNK:
                self._flush()
        self._flush()
        deadline = time.monotonic() + 5.0
        while late and self.current and time.monotonic() < deadline and not p.stop.wait(WATCH_EVERY):
            late = self._settle(late)   # the last copies land: what was chosen goes
