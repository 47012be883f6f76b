"""One pass over one epoch's plan: stager threads feed reader processes, batches leave in order.

Data flow for batch k: the stager copies its samples to local_dir; when the last
one lands, k is handed to a worker with a free slot (lowest k first, and only
within ``num_workers x prefetch`` batches of the one the loop needs next); the
worker decodes and collates into the slot; the loop gets batch k viewing that
slot (lent, no copy) and the slot goes back to its worker when the batch is
garbage. Each worker has ``prefetch + LEND`` slots and at most
``num_workers x LEND`` batches are lent at once (later ones are copied out), so
slots held by the window and by lent batches never exhaust them all: the batch
the loop needs next always finds one.

Lifecycle: ``close()`` stops the threads, stops and reaps the workers and frees
the slots. It runs on exhaustion, on an error, on garbage collection of the
iterator, and at interpreter exit, whichever comes first.
"""

from __future__ import annotations

import atexit
import collections
import heapq
import os
import threading
import time
import weakref
from typing import Any, Callable

from ..stage.gate import NodeProgress
from ..cache.tiers import LOCAL, SOURCE, Placement, Tiers
from ..errors import DecodeError, WorkerDied, WorkerError
from ..manifest import Manifest
from ..plan.rank_plan import RankEpochPlan
from ..source import Source
from ..stage.engine import PeerFetch, RangeReader, Stager
from ..tune.stats import Stats
from ..tune.inflight import InFlight
from .options import RunOptions
from .late_drops import LATE_LAG, LateDrops
from .pool import WorkerPool
from .records import EpochWindow, ServedBatch, ServedSample
from .timeline import BatchTimeline
from .transport import Output, unpack_copy, unpack_shared
from .worker import Failed, Item, Job, Loaded, ReaderSpec, send_job

_LIVE: "weakref.WeakSet[EpochRun]" = weakref.WeakSet()
# Batches a worker's slots may hold while the training loop still uses them (lent without a copy);
# past this many per worker, batches are copied out so a loop that keeps batches cannot starve readers.
LEND = 2
FIRST_BATCHES = 4   # batches handed to the stager at a time until the lookahead is full


@atexit.register
def _close_all() -> None:
    for run in list(_LIVE):
        run.close()


def _reader_error(msg: Failed, k: int) -> Exception:
    if msg.kind in ("decode", "transform"):
        what = "decoded" if msg.kind == "decode" else "transformed"
        return DecodeError(
            f"sample {msg.key!r} of the source could not be {what} ({msg.message}): pass on_error='skip' to "
            "skip bad samples, or fix or remove the file and re-index the source")
    if msg.kind == "getitem":
        return DecodeError(f"the dataset's __getitem__ failed for index {int(msg.key)} ({msg.message}): pass "
                           "on_error='skip' to skip such samples, or fix the dataset")
    if msg.kind == "init":
        return WorkerError(f"{msg.message}\n{msg.traceback}")
    return WorkerError(f"reader worker failed on batch {k} at sample {msg.key!r}: {msg.message}\n{msg.traceback}")


class EpochRun:
    def __init__(self, *, plan: RankEpochPlan, source: Source, manifest: Manifest, tiers: Tiers, reader: ReaderSpec,
                 options: RunOptions, output: Output, stats: Stats, progress: "NodeProgress | None" = None,
                 tuner: "InFlight | None" = None, peer_fetch: "PeerFetch | None" = None,
                 ranges: "RangeReader | None" = None, pool: WorkerPool | None = None) -> None:
        """Carry out ``plan`` (plan/rank_plan.py): it says what to read and where each sample is.
        ``options``: the run's reader, staging and error options (load/options.py); ``progress``:
        the node's deadline gate (balance=True); ``tuner``: the limit on requests in flight
        (stage_threads="auto", tune/inflight.py); ``peer_fetch``: the cluster cache's reads from other nodes; ``ranges``: the source's ranges,
        where the plan reads some whole (plan/ranges.py); ``pool``: readers kept across passes
        (``persistent_workers``): this run borrows them and leaves them running if it reaches its end
        (else it ends them), where None it forks its own and ends them."""
        epoch, batches = plan.epoch, list(plan.batches)
        self._manifest, self._tiers, self._batches, self._epoch = manifest, tiers, batches, epoch
        self.epoch = epoch
        self._actions = list(zip(plan.hit, plan.keep))   # per batch: (hit, keep) per sample
        self._peer = plan.peer                           # per batch: the node serving each sample (cluster)
        self._whole = plan.whole                         # per batch: read the sample's range whole (ranges)
        self._late = LateDrops(plan.late_drops, plan.late_on_serve)   # home samples a peer has read
        self._placed: dict[int, dict[int, Placement]] = {}   # batch -> position -> where it was staged
        self._positions: dict[int, list[int]] = {}           # batch -> positions handed to the worker
        self._served: dict[int, list[ServedSample]] = {}     # batch -> what the guard checks, until taken
        self.completed = False
        self._timeline = BatchTimeline()   # for splitting the loop's waits into causes
        self.window = EpochWindow()   # this epoch's waits, steps and causes, for its verdict
        self.on_batch: Callable[[dict], None] | None = None   # a record per batch (metrics log)
        self._tuner = tuner          # the limit on requests in flight (stage_threads="auto")
        self._made = source.made_in_reader   # samples made by the readers (source/indexed.py): none staged

        # deadline scheduling across the node's ranks: this rank's staging frontier, shared
        self._progress, self._base = progress, (epoch << 32) + plan.first_batch
        self._frontier = 0
        self._skip, self._output, self._stats = options.skip_errors, output, stats
        self._lookahead = max(1, options.lookahead)
        self._lock = threading.Lock()
        self._remaining = [len(b) for b in batches]
        self._failed: dict[int, list[tuple[int, BaseException]]] = {}
        self._ready: list[int] = []
        self._results: dict[int, tuple] = {}
        self._inflight: dict[int, int] = {}  # batch -> worker id
        self._next = 0
        self._last_return: float | None = None  # when next() last handed a batch to the loop
        self._submitted = 0
        self._closed = False
        self._owner_pid = os.getpid()
        # Fork the readers before any staging thread exists.
        num_workers, prefetch = options.num_workers, options.prefetch
        self._borrowed = pool is not None
        if pool is not None:
            pool.next_pass(reader)
        self._pool = pool if pool is not None else WorkerPool(num_workers, prefetch + LEND, reader, options.mp_context)
        self._digests = reader.digests
        self.served: collections.deque | None = None   # the guard's record of the last batches served
        self._window = num_workers * prefetch  # batches that may occupy slots ahead of the loop
        self._lend_limit = num_workers * LEND if output.can_share else 0
        gate = None
        if progress is not None:
            progress.set(self._base)
            gate = lambda k, stopped: progress.wait_for(self._base + k, stopped)  # noqa: E731
        if tuner is not None:
            tuner.rebase()   # this run's engines count from 0
        self._stager = Stager(source, tiers, manifest, threads=options.stage_threads, on_done=self._on_staged,
                              most=None if tuner is None else tuner.hi,
                              peer_wait=options.peer_wait, gate=gate, peer_fetch=peer_fetch, ranges=ranges,
                              due=lambda k: k <= self._next + self._window)
        _LIVE.add(self)
        self._stager.drop([manifest.keys[s] for s in plan.drops])
        self._stager.start()
        # the first batches at once, the rest of the lookahead while the loop waits for the first
        # (``next``): 64 batches' items took 60 ms to hand over before the first fetch was collected
        self._fill_window(FIRST_BATCHES)

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def position(self) -> int:
        return self._next

    # -- staging side (called from stager threads) -------------------------------------------

    def _on_staged(self, k: int, j: int, outcome: Placement | BaseException, seconds: float = 0.0,
                   peer_seconds: float = 0.0) -> None:
        with self._lock:
            self._timeline.fetched(k, seconds, peer_seconds)
            if self._closed:  # nobody will read it: undo a RAM placement now
                if isinstance(outcome, Placement):
                    self._tiers.after_use(self._manifest.keys[int(self._batches[k][j])], outcome,
                                          outcome.tier == LOCAL and bool(self._actions[k][1][j]), False)
                return
            if isinstance(outcome, Placement):
                self._placed.setdefault(k, {})[j] = outcome
                self._stats.count_staged(self._epoch, outcome.tier, outcome.fetched or outcome.tier == SOURCE,
                                         int(self._manifest.sizes[int(self._batches[k][j])]), outcome.peer)
            else:
                self._failed.setdefault(k, []).append((j, outcome))
            self._remaining[k] -= 1
            if self._remaining[k] == 0:
                self._timeline.staged(k)
                heapq.heappush(self._ready, k)
                if self._progress is not None and k == self._frontier:
                    while self._frontier < len(self._remaining) and self._remaining[self._frontier] == 0:
                        self._frontier += 1
                    self._progress.set(self._base + self._frontier)
                self._dispatch_locked()

    def _release_locked(self, k: int, corrupt: set[int] = frozenset()) -> None:
        """The accesses of batch ``k`` are done: keep or delete what they used."""
        placed = self._placed.pop(k, None)
        if not placed:
            return
        keep = self._actions[k][1]
        keys = self._manifest.keys
        self._stager.after_use([(keys[int(self._batches[k][j])], p, bool(keep[j]), j in corrupt)
                                for j, p in placed.items()])

    def _fill_window(self, most: int | None = None) -> None:
        """Hand the stager the batches within the lookahead not handed yet (``most``: that many at
        most)."""
        end = min(len(self._batches), self._next + self._lookahead)
        if most is not None:
            end = min(end, self._submitted + most)
        while self._submitted < end:
            k = self._submitted
            if self._made:   # a dataset with no files: its readers make each sample, nothing to stage
                for j in range(len(self._batches[k])):
                    self._on_staged(k, j, Placement(SOURCE, None, False))
                self._submitted += 1
                continue
            hit, keep = self._actions[k]
            self._stager.submit(k, self._batches[k], hit, keep, None if self._peer is None else self._peer[k],
                                None if self._whole is None else self._whole[k])
            self._submitted += 1

    def _dispatch_locked(self) -> None:
        pool = self._pool
        while pool.returned:  # slots of lent batches that the training loop has let go of
            wid, slot = pool.returned.popleft()
            pool.lent -= 1
            if wid < len(self._pool.workers):
                self._pool.workers[wid].free.append(slot)
        limit = self._next + self._window
        while self._ready and self._ready[0] < limit:
            worker = max(self._pool.workers, key=lambda w: len(w.free))
            if not worker.free:
                return
            k = heapq.heappop(self._ready)
            failed = self._failed.get(k, [])
            if failed and not self._skip:
                _, err = failed[0]
                self._results[k] = err
                self._release_locked(k)
                continue
            bad = {j for j, _ in failed}
            for j, err in failed:
                self._stats.skip([self._manifest.keys[int(self._batches[k][j])]])
            m, placed = self._manifest, self._placed.get(k, {})
            positions = [j for j in range(len(self._batches[k])) if j not in bad]
            items = []
            for j in positions:
                i = int(self._batches[k][j])
                p = placed[j]
                items.append(Item(m.keys[i], p.path, int(m.sizes[i]), int(m.labels[i]), p.data, p.tier == SOURCE))
            self._positions[k] = positions
            slot = worker.free.pop()
            self._inflight[k] = worker.wid
            send_job(worker.conn, Job(k, slot, items, self._skip))
            self._timeline.dispatched(k)

    # -- consumer side (the training loop's thread) ------------------------------------------

    def next(self) -> Any:
        if self._closed:
            raise StopIteration
        k = self._next
        if k >= len(self._batches):
            self.close()
            raise StopIteration
        t0 = time.perf_counter()
        causes = None
        try:
            if k not in self._results:
                with self._lock:
                    missing = self._remaining[k]
                self._stats.add(on_demand=missing, waits=1)
                while k not in self._results:
                    if self._submitted < min(len(self._batches), k + self._lookahead):
                        self._fill_window(FIRST_BATCHES)   # the window is not full yet: a few more, then a look
                        self._poll(0.0)
                    else:
                        self._poll(0.1)
                    if self._stager.fatal is not None:
                        raise WorkerError(f"the staging engine stopped: {self._stager.fatal!r}") \
                            from self._stager.fatal
                t1 = time.perf_counter()
                self._stats.add(wait_seconds=t1 - t0)
                with self._lock:
                    causes = self._timeline.causes(k, t0, t1)
            out, n = self._take(k)
        except BaseException:
            self.close()
            raise
        now = time.perf_counter()
        step = None if self._last_return is None else t0 - self._last_return
        self._stats.timings.record(now - t0, step, n)
        self._stats.add_causes(causes)
        self.window.add(now - t0, step, n, causes)
        if self.on_batch is not None:
            self.on_batch({"type": "batch", "epoch": self._epoch, "batch": k, "wait": now - t0, "loop": step,
                           "samples": n, "causes": causes})
        self._timeline.forget(k)
        if self._tuner is not None:
            self._tune(now)
        self._last_return = now
        self._next = k + 1
        self._stager.advance()   # samples parked for their range's read that are due now
        if self._late:
            self._drop_late(k - LATE_LAG)
        self._fill_window()
        with self._lock:
            self._dispatch_locked()
        return out

    def peer_served(self, index: int) -> None:
        """A peer has been served sample ``index`` (from the peer service's thread): a late drop
        that the epoch reads only there goes now, not after the step lag, so that the tier has the
        room the plan counted on."""
        with self._lock:
            if self._closed or not self._late.served(index):
                return
            self._stager.drop([self._manifest.keys[index]])   # queued before close() can stop it
        self._tiers.counters.add("late_drops")

    def _drop_late(self, upto: int) -> None:
        """Delete home samples whose last reader this epoch was a peer, at batch ``upto`` or before."""
        keys = self._manifest.keys
        with self._lock:
            gone = [keys[s] for s in self._late.due(upto)]
        if gone:
            self._tiers.counters.add("late_drops", len(gone))
            self._stager.drop(gone)

    def _tune(self, now: float) -> None:
        """Hand the staging's own counters to the policy (tune/inflight.py); apply its limit."""
        n = self._tuner.follow(now, self._stager.load())
        if n is not None:
            self._stager.limit(n)

    def _take(self, k: int) -> Any:
        res = self._results.pop(k)
        if isinstance(res, BaseException):   # staging could not read a sample
            raise res
        if isinstance(res, Failed):
            raise _reader_error(res, k)
        slot_id, spec, size, skipped = res.slot, res.spec, res.size, res.skipped
        wid = self._inflight.pop(k)
        worker = self._pool.workers[wid]
        if size and self._pool.lent < self._lend_limit:
            out, base = unpack_shared(spec, worker.slots[slot_id], size, self._output)
            with self._lock:
                self._pool.lent += 1
            # deque.append needs no lock, so it is safe whenever the garbage collector runs it
            weakref.finalize(base, self._pool.returned.append, (wid, slot_id))
        else:
            try:
                out = unpack_copy(spec, worker.slots[slot_id], size, self._output)
            finally:
                with self._lock:
                    worker.free.append(slot_id)
        if skipped:
            self._stats.skip(key for key, _ in skipped)
        n = len(self._batches[k]) - len(skipped) - len(self._failed.get(k, ()))
        self._stats.add(batches=1, samples=n)
        if self._digests:
            self._remember(k, res, out)
        return self._output.deliver(out), n

    def _remember(self, k: int, res: Loaded, out: Any) -> None:
        """The batch just handed out, as the guard checks it: its samples' records and the checksum
        of every array as the reader wrote it."""
        samples = self._served.pop(k, [])
        if self.served is not None:
            self.served.append(ServedBatch(self._epoch, k, samples, res.spec, res.leaves or [], out))

    def _poll(self, timeout: float) -> None:
        ready = self._pool.wait(timeout)
        died = []
        for w in self._pool.workers:
            if w.conn in ready:
                try:
                    while w.conn.poll():
                        self._receive(w, w.conn.recv())
                except (EOFError, OSError):
                    died.append(w)
            if w.process.sentinel in ready:
                died.append(w)
        for w in died:
            batches = [k for k, wid in self._inflight.items() if wid == w.wid and k not in self._results]
            if batches or w.process.exitcode is not None:
                w.process.join(1.0)
                raise WorkerDied(
                    f"reader worker {w.wid} (pid {w.process.pid}) {w.describe_exit()} while loading "
                    f"batch {min(batches) if batches else '-'} of epoch {self._epoch}: it may have run out of "
                    "memory (see `dmesg`) or been killed; the loader stopped, restart the epoch or resume "
                    "from a state_dict")

    def _receive(self, w, msg: Loaded | Failed) -> None:
        k = msg.batch
        if k < 0:   # the reader could not start (worker_init_fn raised)
            raise _reader_error(msg, k)
        positions = self._positions.pop(k, [])
        corrupt = set()
        if isinstance(msg, Loaded):
            self._timeline.read(k, msg.times)
            self._stats.add_worker(msg.times, len(positions))
            for p, why in msg.repaired:
                j = positions[p]
                if why != "gone":
                    corrupt.add(j)
                self._stats.count_epoch(self._epoch, repaired=1)
        with self._lock:
            if isinstance(msg, Failed):  # the worker wrote nothing into the slot: it is free again
                self._inflight.pop(k, None)
                w.free.append(msg.slot)
            elif msg.served is not None:   # the guard's record, before the placements are let go
                placed, keys = self._placed.get(k, {}), self._manifest.keys
                self._served[k] = [ServedSample(keys[int(self._batches[k][positions[p]])], where, digest,
                                                placed[positions[p]].mtime_ns)
                                   for p, where, digest in msg.served]
            self._release_locked(k, corrupt)
        self._results[k] = msg

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._owner_pid:
            return  # a forked child must not tear down its parent's workers
        self.completed = self._next >= len(self._batches)
        if self.completed and self._late:   # the peers have read them (they stage well ahead)
            self._drop_late(len(self._batches))
        # readers borrowed for a pass that reached its end, every batch taken, stay for the next
        keep = self._borrowed and self.completed and not self._inflight and not self._placed
        if not keep:
            self._pool.stop()    # a pass run to its end: the readers end while the staging threads do
        if self._placed:     # one stopped early: what was staged but not used (RAM entries go, local
            self._pool.close()   # ones stay as planned) is let go once no reader uses it, by the
            with self._lock:     # staging threads' after-use work, which their close finishes
                for k in list(self._placed):
                    self._release_locked(k)
        self._stager.close()
        if not keep:
            self._pool.close()
        self._tiers.settle(final=True)   # kept samples still waiting for room in the local tier
        if self._progress is not None:
            self._progress.set(-1)
        _LIVE.discard(self)
