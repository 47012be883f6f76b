"""MECHANISM: the reader worker processes, their pipes and their shared slots.

Workers are forked before any staging thread starts. Each has ``slots`` shared
buffers; a batch occupies one until the training process has copied it out.
A worker that dies is noticed through its process sentinel at once.

A process forked while other threads of the training process run (a framework's:
``torch.distributed``'s, Lightning's) can be stuck for good before its first line
of Python, by a lock one of them held at the fork. So each reader's first message
says it came through; one that does not within ``READY_WAIT`` seconds is killed and
forked again (twice at most), with a warning, instead of leaving the epoch
waiting for it for ever.

A pool may serve several passes (the Loader's ``persistent_workers``): each is told its pass
(``next_pass``) where the readers' spec is the same but for the pass's epoch and positions
(``reusable``). So the slots lent to the training loop are the pool's to count (``lent``,
``returned``): a batch the loop still holds from one pass keeps its slot out of the next.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
from collections import deque
from multiprocessing.connection import Connection, wait
from dataclasses import replace

from ..errors import WorkerError
from .transport import Slot
from .worker import READY, Pass, ReaderSpec, send_job, torn, worker_main

log = logging.getLogger("clairvoyant")
READY_WAIT = 20.0   # seconds a forked reader has to say it came through the fork
FORK_TRIES = 3


class Worker:
    def __init__(self, wid: int, process: mp.process.BaseProcess, conn: Connection, slots: list[Slot]) -> None:
        self.wid, self.process, self.conn, self.slots = wid, process, conn, slots
        self.free = list(range(len(slots)))
        self.stopped = False   # told to stop (``WorkerPool.stop``)

    def describe_exit(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"


class WorkerPool:
    def __init__(self, num_workers: int, slots_per_worker: int, spec: ReaderSpec, mp_context: str = "fork") -> None:
        ctx = mp.get_context(mp_context)
        self.workers: list[Worker] = []
        self.spec = spec = replace(spec, num_workers=num_workers)
        self.slots_per_worker, self.mp_context = slots_per_worker, mp_context
        self.lent = 0   # slots whose batches the training loop holds without a copy
        self.returned: deque[tuple[int, int]] = deque()   # (reader, slot) let go of (a finalizer appends)
        self.closed = False
        try:
            for wid in range(num_workers):
                self.workers.append(self._fork(ctx, wid, slots_per_worker, spec))
            for wid in range(num_workers):
                for attempt in range(FORK_TRIES):
                    if self._ready(self.workers[wid]):
                        break
                    w = self.workers[wid]
                    if attempt + 1 == FORK_TRIES:
                        raise WorkerError(f"reader {wid} did not start {FORK_TRIES} times in a row ({READY_WAIT:g} s each): "
                                          f"it {w.describe_exit()}; see the log for its output")
                    log.warning("clairvoyant: reader %d did not start within %g s after its fork (it %s); forking "
                                "it again", wid, READY_WAIT, w.describe_exit())
                    w.process.kill()
                    w.process.join(5)
                    w.conn.close()
                    self.workers[wid] = self._fork(ctx, wid, slots_per_worker, spec)
        except BaseException:
            self.close()
            raise

    def reusable(self, spec: ReaderSpec, slots_per_worker: int, mp_context: str) -> bool:
        """Whether these readers can serve a pass of ``spec``: the same in all but the pass's epoch
        and positions (the same transforms, decode, collate, source, seed, rank, readers), every
        reader alive and none told to stop."""
        if self.closed or (slots_per_worker, mp_context) != (self.slots_per_worker, self.mp_context):
            return False
        if any(w.stopped or not w.process.is_alive() for w in self.workers):
            return False
        try:
            return _fixed(spec) == _fixed(self.spec)
        except Exception:   # noqa: BLE001 - a field that cannot be compared: new readers
            return False

    def next_pass(self, spec: ReaderSpec) -> None:
        """Tell every reader the pass it serves now (``reusable`` said it may)."""
        if (spec.epoch, spec.position, spec.stride) != (self.spec.epoch, self.spec.position, self.spec.stride):
            for w in self.workers:
                send_job(w.conn, Pass(spec.epoch, spec.position, spec.stride))
        self.spec = replace(spec, num_workers=len(self.workers))

    @staticmethod
    def _fork(ctx, wid: int, slots_per_worker: int, spec: ReaderSpec) -> Worker:
        slots = [Slot() for _ in range(slots_per_worker)]
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=worker_main, args=(wid, child, slots, spec), name=f"clairvoyant-reader-{wid}",
                           daemon=True)
        proc.start()
        child.close()
        return Worker(wid, proc, parent, slots)

    @staticmethod
    def _ready(w: Worker) -> bool:
        """Whether reader ``w`` sent its first message (READY) within READY_WAIT seconds; a reader
        that died first is ready in this sense (its death is told where it is noticed)."""
        if not wait([w.conn, w.process.sentinel], READY_WAIT):
            return False
        if w.conn.poll():
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                return True
            if msg != READY:
                raise WorkerError(f"reader {w.wid} sent {type(msg).__name__} before it was ready")
        return True

    def wait(self, timeout: float) -> list:
        """Connections with a message and sentinels of workers that exited."""
        handles = [w.conn for w in self.workers] + [w.process.sentinel for w in self.workers]
        return wait(handles, timeout)

    def stop(self) -> None:
        """Tell every reader to stop after the job in hand (without waiting: ``close`` does)."""
        for w in self.workers:
            if w.stopped:
                continue
            w.stopped = True
            if torn(w.conn):   # a job half sent: the reader would read the stop as its bytes
                w.process.kill()
                continue
            try:
                send_job(w.conn, None)
            except (OSError, ValueError):
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Stop the readers (if ``stop`` did not already) and wait for them to end."""
        self.closed = True
        self.stop()
        for w in self.workers:
            w.process.join(timeout)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout)
            w.conn.close()
            for s in w.slots:
                s.close()
            w.process.close()
        self.workers = []


def _fixed(spec: ReaderSpec) -> ReaderSpec:
    """``spec`` less what changes from pass to pass."""
    return replace(spec, epoch=0, position=0, stride=0)
