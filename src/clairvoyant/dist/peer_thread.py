"""MECHANISM: the peer service's one MPI thread (``clairvoyant-peers``): it moves the messages
that dist/peers.py's :class:`~clairvoyant.dist.peers.PeerService` asks and answers with.

Every MPI call of the service happens here. Each round the thread sends the messages due (a
message the emulated link or ``DELAY_REPLIES`` held back leaves at its due time, from a queue
ordered by due time: nothing sleeps), sends the callers' queued requests, posts a receive for
each message waiting (a message not ours is received into a small buffer and refused), tests
every receive and send in flight, and answers the requests queued; idle, it polls every 50 us to
1.6 ms. An MPI error that names a failed peer (ULFM) is acknowledged and that peer's fetches
fail from then on; one with no peer to blame stops the service. Shutting down lets replies in
flight leave for up to :data:`LINGER` seconds, then abandons what is left (kept alive, with its
buffers, for the life of the process) and frees the private communicator only when nothing is
outstanding and no peer has failed.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

from ..tune.counters import Space
from .wire import DRAIN, REPLY, REQUEST, REQUEST_MAGIC

log = logging.getLogger("clairvoyant")

LINGER = 0.5        # seconds close() lets replies in flight leave
_ABANDONED: list[Any] = []   # (request, buffer, ...) still active when a service closed: kept alive


QUIET_AFTER = 0.5    # seconds without a message, a request or a caller waiting: the service is quiet
QUIET_PAUSE = 5e-3   # a quiet service's pause between looks (idle, it polled 600-5,000 times a second)


class ServiceThread:
    """The thread's half of :class:`~clairvoyant.dist.peers.PeerService` (a base class of it):
    the loop, sends, receives and their completions, MPI errors, shutdown. It calls the
    service's ``_queue_request``, ``_take_reply`` and ``_answer_queued`` (what a message means and
    what it is answered) and ``_finish``/``_fail_waiting`` (a caller's outcome)."""

    # set up by PeerService.__init__
    comm: Any
    _MPI: Any
    latency: float
    bandwidth: float
    idle_max: float
    _lock: threading.Lock
    _wake: threading.Event
    _stopping: bool
    _closed: bool
    _outbox: deque
    _waiting: dict
    _dead: set[int]
    _largest: int
    _req_tag: int
    _rep_tag: int
    _recvs: list[tuple[Any, bytearray, int, str]]
    _sends: list[tuple[Any, bytearray, int, int]]
    _backlog: Counter[int]
    _held: list[tuple[float, int, bytearray, int, int, int]]
    _held_seq: Any
    _link_free: float
    _c: Space   # tune/counters.py's peer.*
    _queue_request: Callable[[bytearray, int], None]
    _take_reply: Callable[[bytearray, int], None]
    _answer_queued: Callable[[], bool]
    _send_answers: Callable[[], bool]
    _fail_waiting: Callable[[Callable[[Any], bool]], None]
    _finish: Callable[[Any, bytes | None, str], bool]

    def _run(self) -> None:
        idle, last = 0, time.monotonic()
        try:
            while not self._stopping:
                busy = self._send_held()
                busy = self._send_requests() or busy
                busy = self._probe() or busy
                busy = self._progress() or busy
                busy = self._answer_queued() or busy
                busy = self._send_answers() or busy
                if busy:
                    idle, last = 0, time.monotonic()
                    continue
                idle = min(idle + 1, 8)
                cap = self.idle_max   # 50 us .. 1.6 ms (the default) between polls when idle
                if not self._waiting and time.monotonic() - last > QUIET_AFTER:
                    cap = max(cap, QUIET_PAUSE)   # nothing for a while: look less often, spend little CPU
                pause = min(25e-6 * 2 ** idle, cap)
                if self._held:   # not past the next held message's due time
                    pause = min(pause, max(0.0, self._held[0][0] - time.monotonic()))
                self._wake.wait(pause)
                self._wake.clear()
        except Exception:
            log.exception("clairvoyant: the peer service stopped; fetches return None from now on")
        finally:
            self._shut_down()

    def _send_requests(self) -> bool:
        with self._lock:
            batch = [f for f in self._outbox if f.id in self._waiting]
            self._outbox.clear()
            for f in batch:
                f.sent = True
        for f in batch:
            buf = bytearray(REQUEST.pack(REQUEST_MAGIC, f.id, f.index, f.size))
            if self._isend(buf, f.peer, self._req_tag, f.id):
                with self._lock:
                    self._c.add("sent")
        return bool(batch)

    def _isend(self, buf: bytearray, dest: int, tag: int, fetch_id: int, hold: float = 0.0) -> bool:
        """Send ``buf`` now, or hold it back ``hold`` seconds plus what the emulated link takes."""
        if self.latency or self.bandwidth or hold > 0:
            due = time.monotonic()
            if self.bandwidth:   # one message's bytes after another's on this rank's link
                due = self._link_free = max(due, self._link_free) + len(buf) / self.bandwidth
            heapq.heappush(self._held, (due + self.latency + hold, next(self._held_seq), buf, dest, tag, fetch_id))
            self._backlog[dest] += len(buf)
            return True
        if not self._post(buf, dest, tag, fetch_id):
            return False
        self._backlog[dest] += len(buf)
        return True

    def _post(self, buf: bytearray, dest: int, tag: int, fetch_id: int) -> bool:
        try:
            self._sends.append((self.comm.Isend(buf, dest, tag), buf, dest, fetch_id))
        except self._MPI.Exception as e:
            self._mpi_error(e, dest, fetch_id)
            return False
        return True

    def _send_held(self) -> bool:
        """Send the held-back messages that are due (a request only if its caller still waits)."""
        if not self._held or self._held[0][0] > time.monotonic():
            return False
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            _, _, buf, dest, tag, fetch_id = heapq.heappop(self._held)
            with self._lock:
                gone = dest in self._dead or (fetch_id and fetch_id not in self._waiting)
            if gone or not self._post(buf, dest, tag, fetch_id):
                self._backlog[dest] -= len(buf)
        return True

    def _probe(self) -> bool:
        """Post a receive for each message waiting (up to 64 a round); False if there was none."""
        MPI, status = self._MPI, self._MPI.Status()
        for n_seen in range(64):
            try:
                msg = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            except MPI.Exception as e:
                self._mpi_error(e, None, 0)
                return True
            if msg is None:
                return n_seen > 0
            src, tag, n = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
            if tag == self._req_tag and n == REQUEST.size:
                kind = "request"
            elif tag == self._rep_tag and REPLY.size <= n <= REPLY.size + self._largest:
                kind = "reply"
            else:
                kind, n = "refused", min(max(n, 0), DRAIN)   # a count past 2**31 may read as negative
            buf = bytearray(n)
            self._recvs.append((msg.Irecv(buf), buf, src, kind))
        return True

    def _progress(self) -> bool:
        """Test every receive and send in flight; act on those that completed."""
        MPI, done_any = self._MPI, False
        recvs, self._recvs = self._recvs, []
        for item in recvs:
            req, buf, src, kind = item
            try:
                if not req.Test():
                    self._recvs.append(item)
                    continue
            except MPI.Exception as e:
                if e.Get_error_class() == MPI.ERR_TRUNCATE and kind == "refused":
                    self._count("refused")
                else:
                    self._mpi_error(e, src, 0)
                done_any = True
                continue
            done_any = True
            if kind == "request":
                self._queue_request(buf, src)
            elif kind == "reply":
                self._take_reply(buf, src)
            else:
                self._count("refused")
        sends, self._sends = self._sends, []
        for item in sends:
            req, buf, dest, fetch_id = item
            try:
                if not req.Test():
                    self._sends.append(item)
                    continue
            except MPI.Exception as e:
                self._mpi_error(e, dest, fetch_id)
            self._backlog[dest] -= len(buf)
            done_any = True
        return done_any

    def _count(self, key: str) -> None:
        self._c.add(key)

    def _mpi_error(self, e: Exception, peer: int | None, fetch_id: int) -> None:
        """A failed peer (ULFM): acknowledge, and fail its fetches from now on. Anything else fails
        the one fetch involved; an error with no peer to blame stops the service."""
        MPI = self._MPI
        failure = e.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING)
        dead = self._acknowledge_failures() if failure else set()
        with self._lock:
            self._c.add("errors")
            if fetch_id and fetch_id in self._waiting:
                self._finish(self._waiting[fetch_id], None, "failed")
            new = dead - self._dead
            self._dead |= new
            self._fail_waiting(lambda f: f.peer in new)
        if new:
            log.warning("clairvoyant: rank(s) %s failed; this rank no longer asks them for samples", sorted(new))
        elif peer is None and not failure:
            raise e   # stops the service: no way to tell which peer is at fault

    def _acknowledge_failures(self) -> set[int]:
        MPI = self._MPI
        try:
            self.comm.Ack_failed()
            failed, mine = self.comm.Get_failed(), self.comm.Get_group()
            ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), mine)
            failed.Free()
            mine.Free()
            return {r for r in ranks if r != MPI.UNDEFINED}
        except (MPI.Exception, NotImplementedError, AttributeError):
            return set()

    def _shut_down(self) -> None:
        with self._lock:
            self._stopping = self._closed = True
            self._fail_waiting(lambda f: True)
        self._held.clear()   # held back, so never handed to MPI: nothing to wait for
        if self._MPI.Is_finalized():
            return
        deadline = time.monotonic() + LINGER
        while (self._sends or self._recvs) and time.monotonic() < deadline:
            if not self._progress():
                time.sleep(0.001)
        for req, *_ in self._recvs:
            try:
                req.Cancel()   # works for a receive not yet matched; a matched one completes or stays
            except self._MPI.Exception:
                pass
        if self._sends or self._recvs:
            _ABANDONED.extend(self._sends + self._recvs)   # MPI may still touch their buffers
        else:
            self._free_comm()

    def _free_comm(self) -> None:
        if not self._dead and self.comm != self._MPI.COMM_NULL and not self._MPI.Is_finalized():
            try:
                self.comm.Free()
            except self._MPI.Exception:
                pass

