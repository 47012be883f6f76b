"""MECHANISM: the peer service's one thread (``clairvoyant-peers``): it moves the messages that
cluster/peers.py's :class:`~clairvoyant.cluster.peers.PeerService` asks and answers with, over whichever
backend carries them (cluster/wire_mpi.py, cluster/wire_zmq.py).

Every call into the backend happens here. Each round the thread sends the messages due (a
message the emulated link or ``DELAY_REPLIES`` held back leaves at its due time, from a queue
ordered by due time: nothing sleeps), sends the callers' queued requests, polls the backend for
what arrived and what it sent, and answers the requests queued; idle, it polls every 50 us to
1.6 ms, or, on a backend that can block (ZeroMQ's ``wait``), waits there (a pause under a
millisecond is a look; a caller's request wakes it at once). A fault that names failed peers (MPI's ULFM) marks them dead and their fetches fail
from then on; one with no peer to blame stops the service. Shutting down lets messages in flight
leave for up to :data:`LINGER` seconds (the backend's ``shut_down``).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

from ..tune.counters import Space
from .wire import REQUEST, REQUEST_MAGIC, STATE_MAGIC, Fault

log = logging.getLogger("clairvoyant")

LINGER = 0.5        # seconds close() lets replies in flight leave


QUIET_AFTER = 0.5    # seconds without a message, a request or a caller waiting: the service is quiet
QUIET_PAUSE = 5e-3   # a quiet service's pause between looks (idle, it polled 600-5,000 times a second)


class ServiceThread:
    """The thread's half of :class:`~clairvoyant.cluster.peers.PeerService` (a base class of it):
    the loop, sends, what the backend reports, faults, shutdown. It calls the
    service's ``_queue_request``, ``_take_reply`` and ``_answer_queued`` (what a message means and
    what it is answered) and ``_finish``/``_fail_waiting`` (a caller's outcome)."""

    # set up by PeerService.__init__
    wire: Any   # the backend (cluster/wire.py)
    latency: float
    bandwidth: float
    idle_max: float
    _lock: threading.Lock
    _wake: threading.Event
    _wire_waits: bool   # the backend has ``wait``/``wake`` (ZeroMQ): the thread sleeps in it
    _stopping: bool
    _closed: bool
    _outbox: deque
    _waiting: dict
    _dead: set[int]
    _largest: int
    _backlog: Counter[int]
    _held: list[tuple[float, int, bytearray, int, str, int]]
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
                busy = self._poll() or busy
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
                if self._wire_waits:   # the backend blocks until a message or a caller's wake
                    self.wire.wait(pause)
                else:
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
            buf = bytearray(REQUEST.pack(STATE_MAGIC if f.state else REQUEST_MAGIC, f.id, f.index, f.size))
            if self._isend(buf, f.peer, "request", f.id):
                with self._lock:
                    self._c.add("sent")
        return bool(batch)

    def _isend(self, buf: bytearray, dest: int, kind: str, fetch_id: int, hold: float = 0.0) -> bool:
        """Send ``buf`` now, or hold it back ``hold`` seconds plus what the emulated link takes."""
        if self.latency or self.bandwidth or hold > 0:
            due = time.monotonic()
            if self.bandwidth:   # one message's bytes after another's on this rank's link
                due = self._link_free = max(due, self._link_free) + len(buf) / self.bandwidth
            heapq.heappush(self._held, (due + self.latency + hold, next(self._held_seq), buf, dest, kind, fetch_id))
            self._backlog[dest] += len(buf)
            return True
        if not self._post(buf, dest, kind, fetch_id):
            return False
        self._backlog[dest] += len(buf)
        return True

    def _post(self, buf: bytearray, dest: int, kind: str, fetch_id: int) -> bool:
        fault = self.wire.post(buf, dest, kind, fetch_id)
        if fault is not None:
            self._fault(fault)
            return False
        return True

    def _send_held(self) -> bool:
        """Send the held-back messages that are due (a request only if its caller still waits)."""
        if not self._held or self._held[0][0] > time.monotonic():
            return False
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            _, _, buf, dest, kind, fetch_id = heapq.heappop(self._held)
            with self._lock:
                gone = dest in self._dead or (fetch_id and fetch_id not in self._waiting)
            if gone or not self._post(buf, dest, kind, fetch_id):
                self._backlog[dest] -= len(buf)
        return True

    def _poll(self) -> bool:
        """Act on what the backend received and sent since the last look; False if nothing."""
        got, sent, faults = self.wire.poll(self._largest)
        for fault in faults:
            self._fault(fault)
        for kind, buf, src in got:
            if kind == "request":
                self._queue_request(buf, src)
            elif kind == "reply":
                self._take_reply(buf, src)
            else:
                self._c.add("refused")
        for dest, n in sent:
            self._backlog[dest] -= n
        return bool(got or sent or faults)

    def _fault(self, fault: Fault) -> None:
        """Failed peers: their fetches fail from now on. Anything else fails the one fetch
        involved; a fatal fault (no peer to blame) stops the service."""
        with self._lock:
            self._c.add("errors")
            if fault.fetch_id and fault.fetch_id in self._waiting:
                self._finish(self._waiting[fault.fetch_id], None, "failed")
            new = set(fault.dead) - self._dead
            self._dead |= new
            self._fail_waiting(lambda f: f.peer in new)
        if new:
            log.warning("clairvoyant: rank(s) %s failed; this rank no longer asks them for samples", sorted(new))
        elif fault.fatal:
            raise fault.error   # stops the service: no way to tell which peer is at fault

    def _shut_down(self) -> None:
        with self._lock:
            self._stopping = self._closed = True
            self._fail_waiting(lambda f: True)
        self._held.clear()   # held back, so never handed to the backend: nothing to wait for
        self.wire.shut_down(LINGER, self._dead)
