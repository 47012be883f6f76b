"""MECHANISM: the data plane by which the ranks of a job serve each other's staged samples.

A :class:`PeerService` per process answers the other ranks' requests with its
``serve`` function and sends this process's own requests (:meth:`~PeerService.fetch`,
from any number of threads). It decides nothing about *whom* to ask for *what*:
that is planning's. What it does decide:

- **The wire.** Fixed little-endian ``struct`` headers and raw bytes, over one of
  two backends with one interface (cluster/wire.py): MPI (cluster/wire_mpi.py, on a
  private duplicate of the communicator; the default where ``comm`` is an MPI
  communicator) or ZeroMQ over TCP (cluster/wire_zmq.py, for jobs started by
  torchrun and its kin). Nothing is pickled or unpickled, ever: a message whose
  kind, size or magic is not ours is refused unread and counted as ``refused``.
  A request is :data:`REQUEST`; a reply is :data:`REPLY` followed by the payload
  in the same message, with the payload's xxh3-64 in the header.
- **One thread.** Every call into the backend happens in the service's thread
  (``clairvoyant-peers``). Callers queue a request and wait on an Event with
  their own time-out; the thread sends it, polls for messages, calls ``serve``,
  replies, and hands each verified reply to its waiting caller.
- **Bounds.** At most ``max_inflight`` requests and ``max_bytes`` of expected
  replies are outstanding (a larger single sample goes alone); further callers
  wait within their time-out. A server has at most ``max_bytes`` of replies
  leaving for any one requester; that requester's further requests wait their
  turn, so a requester that does not receive slows down only itself.
- **Failure costs a time-out, nothing more.** A reply that is late (its caller
  gave up) is received and dropped; one whose length or checksum is off is
  dropped and counted. A dead peer: Open MPI ends the whole job when a rank dies
  unless it runs with ULFM (``mpirun --with-ft ulfm``); then MPI reports
  MPI_ERR_PROC_FAILED, the service acknowledges the failure and fetches from
  that rank return None at once (here, tens of ms after the kill); until MPI
  notices, they time out. Over ZeroMQ a dead peer's fetches time out (then it is
  passed over, below); the service goes on.
- **A slow peer costs one time-out, not one per sample.** A peer that let a
  fetch time out (its request went out, no answer came in time) is passed over
  for :data:`PASS_OVER` times that time-out: fetches from it return None at
  once, counted as ``passed_over``. Then the next fetch asks it again, alone
  (the others are still passed over while it waits): an answer in time, hit or
  miss, ends the pass-over; another time-out starts a new one. Any answer in
  time from a peer ends its pass-over too.
- **An emulated interconnect, for benchmarks.** ``CLAIRVOYANT_PEER_LATENCY``
  (seconds, e.g. ``20e-6``) and ``CLAIRVOYANT_PEER_BANDWIDTH`` (bytes per
  second, e.g. ``10e9``), read once when a service is made (or given to it):
  every message this rank sends, request or reply, leaves after the latency
  plus its size over the bandwidth, as on a wire where latencies overlap and
  bytes go one message after another (a round trip costs two latencies and the
  reply's transfer). The service thread holds such messages in a queue by due
  time and goes on receiving and answering meanwhile: nothing sleeps. Unset or
  0: no delay. The test hook :data:`DELAY_REPLIES` holds this rank's replies
  back the same way (a slow peer).
- **One probe of who answers** (:meth:`~PeerService.probe`): a request for the piece ``ALIVE``
  of a peer's state, sent even to a peer passed over, twice to one that does not answer the first;
  what its ``alive`` callback says (``SERVING`` by default). Whether a node is lost is
  plan/membership.py's decision from the answers, for the Loader and the mounts alike. The same
  probe may ask for the piece ``ENTERED`` instead: how many of the job's gathers the rank has
  entered (its ``entered`` callback), by which a gather that timed out names the ranks that did
  not come to it (cluster/mpi.py).
- **Closing never waits on a peer.** :meth:`~PeerService.close` stops the
  thread, lets replies in flight leave for up to :data:`LINGER` seconds, then
  abandons what is left (the backend's ``shut_down``). No collective is called.

This module holds the service's API and what its messages mean (a fetch asked,
a request answered, a reply taken); the wire's formats and the emulated link
are cluster/wire.py's, the backends cluster/wire_mpi.py's and cluster/wire_zmq.py's, the
thread that moves the messages cluster/peer_thread.py's.
For the loader's start-up, :func:`available` is cluster/mpi.py's, :func:`node_groups` and
:func:`agree` cluster/group.py's (importable from here too, as are
:func:`node_name` and the wire's names). mpi4py is imported only inside the
functions that need it, so clairvoyant imports without it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from typing import Any, Callable

import xxhash

from ..errors import ConfigError
from ..plan.membership import SERVING
from ..tune.counters import Counters
from .timeouts import PROBE_WAIT
from .group import agree, node_groups
from .mpi import available
from .peer_thread import LINGER, ServiceThread
from .wire_mpi import MPIWire
from .topology import node_name
from .wire import (BANDWIDTH_VAR, HIT, LATENCY_VAR, MISS, REPLY, REPLY_MAGIC, REQUEST, REQUEST_MAGIC, STATE_MAGIC,
                   emulated_link)

__all__ = ["PeerService", "available", "emulated_link", "node_groups", "agree", "node_name", "REQUEST",
           "REPLY", "REQUEST_MAGIC", "REPLY_MAGIC", "STATE_MAGIC", "HIT", "MISS", "LINGER", "CLOSE_WAIT", "PASS_OVER",
           "CORRUPT_ON_SEND", "DELAY_REPLIES", "LATENCY_VAR", "BANDWIDTH_VAR"]

log = logging.getLogger("clairvoyant")

CLOSE_WAIT = 5.0    # seconds close() waits for the thread (it may be inside ``serve``)
PASS_OVER = 5.0     # a peer that let a fetch time out is not asked for this many times that time-out
CORRUPT_ON_SEND: set[int] = set()   # test hook: these indices' payloads get a bit flipped after the checksum
DELAY_REPLIES = 0.0   # test hook: seconds this rank's replies are held back (a slow peer; the thread goes on)
ALIVE = 1 << 62       # the piece of a node's state a probe asks for (a mount's orders and homes are below it)
ENTERED = ALIVE + 1   # the piece that says how many gathers the rank has entered (8 bytes, little-endian)

_LATE_KEPT = 4096     # ids of requests whose callers gave up, so a late reply is told from garbage
_LIVE: weakref.WeakSet[PeerService] = weakref.WeakSet()


class _Fetch:
    """One caller's request, from queueing to its outcome."""

    __slots__ = ("id", "peer", "index", "size", "state", "urgent", "sent", "result", "done")

    def __init__(self, rid: int, peer: int, index: int, size: int, state: bool = False, urgent: bool = False) -> None:
        self.id, self.peer, self.index, self.size, self.state, self.urgent = rid, peer, index, size, state, urgent
        self.sent = False
        self.result: bytes | None = None
        self.done = threading.Event()


class PeerService(ServiceThread):
    """This rank's end of the data plane: serves ``serve(index)`` to the other ranks and fetches from them.

    ``comm``: an MPI communicator (constructing the service is then collective over it: it
    duplicates the communicator) or a backend of cluster/wire.py (a ``ZmqWire``, connected);
    :meth:`start` starts the thread. ``serve(index)`` returns the staged sample's
    verified bytes, or None for a miss; it runs in the service thread. ``latency`` (seconds) and
    ``bandwidth`` (bytes/s, 0: unlimited) emulate an interconnect (see the module's notes); None
    takes them from the environment (:func:`emulated_link`). ``alive()`` answers a probe (None:
    ``SERVING``). ``entered()`` answers a probe for the piece ``ENTERED`` (None: not answered).
    """

    def __init__(self, comm: Any, serve: Callable[[int], bytes | None], *,
                 state: Callable[[int], bytes | None] | None = None, max_inflight: int = 32,
                 max_bytes: int = 64 << 20, tag_base: int = 7000, latency: float | None = None,
                 bandwidth: float | None = None, serve_threads: int = 0, idle_max: float = 1.6e-3,
                 alive: Callable[[], bytes] | None = None, entered: Callable[[], int] | None = None) -> None:
        if max_inflight < 1 or max_bytes < 1:
            raise ConfigError(f"max_inflight={max_inflight} and max_bytes={max_bytes} must be >= 1")
        if serve_threads < 0:
            raise ConfigError(f"serve_threads={serve_threads} must be >= 0")
        if not idle_max > 0:
            raise ConfigError(f"idle_max={idle_max} must be > 0 seconds")
        # the longest pause between two looks for messages when nothing happens: a request waits up
        # to this long to be seen (the mount's cluster, where a program waits on each, looks oftener)
        self.idle_max = float(idle_max)
        env_latency, env_bandwidth = emulated_link()
        self.latency = env_latency if latency is None else float(latency)
        self.bandwidth = env_bandwidth if bandwidth is None else float(bandwidth)
        if not (self.latency >= 0 and self.bandwidth >= 0):
            raise ConfigError(f"latency={latency} and bandwidth={bandwidth} must be >= 0")
        self.wire = comm if hasattr(comm, "post") else MPIWire(comm, tag_base)
        self.rank, self.size = self.wire.rank, self.wire.size
        self.max_inflight, self.max_bytes = max_inflight, max_bytes
        self._serve = serve
        self._state = state   # answers requests for this node's state (a kind of message of its own); None: misses
        self._alive = alive or (lambda: SERVING)   # answers a probe (the piece ``ALIVE`` of the state)
        self._entered = entered                    # answers a probe for the piece ``ENTERED``
        self._serve_failed = False   # a failing serve callback is logged once as a warning
        # serve_threads > 0: ``serve`` may block (a home reading the store for a peer, the mount's
        # cluster cache): it runs in a pool of that many threads, and the service thread sends each
        # answer once it is ready (``_answers``), receiving and answering others meanwhile
        self._pool = (concurrent.futures.ThreadPoolExecutor(serve_threads, thread_name_prefix="clairvoyant-serve")
                      if serve_threads else None)
        self._answers: deque[tuple[int, int, int, int, bytes | None]] = deque()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._wire_waits = callable(getattr(self.wire, "wait", None)) and callable(getattr(self.wire, "wake", None))
        self._outbox: deque[_Fetch] = deque()
        self._waiting: dict[int, _Fetch] = {}          # callers still waiting, by request id
        self._late: OrderedDict[int, int] = OrderedDict()  # request id -> peer, for callers that gave up
        self._ids = itertools.count(1)
        self._inflight = self._inflight_bytes = 0
        self._largest = max_bytes      # the largest reply expected
        self._dead: set[int] = set()
        self._passed: dict[int, float] = {}   # peer -> until when it is passed over (after a time-out)
        self._probing: set[int] = set()       # passed-over peers a fetch is asking again now
        self._stopping = self._closed = False
        self._thread: threading.Thread | None = None
        self._backlog: Counter[int] = Counter()   # bytes being sent (or held back), by destination
        # messages held back by the emulated link or DELAY_REPLIES: (due, seq, buffer, dest, kind, fetch id)
        self._held: list[tuple[float, int, bytearray, int, str, int]] = []
        self._held_seq = itertools.count()
        self._link_free = 0.0   # when the emulated link has sent the bytes given to it so far
        # requests to answer: id, index, size, source, whether it asks for the node's state
        self._queued: deque[tuple[int, int, int, int, bool]] = deque()
        self._c = Counters(["peer"]).space("peer")   # tune/counters.py's peer.*
        self._peer_hits: Counter[int] = Counter()
        self._peer_bytes: Counter[int] = Counter()

    @property
    def comm(self) -> Any:
        """The MPI backend's private communicator."""
        return self.wire.comm

    def start(self) -> None:
        """Start the service thread (once; nothing after close)."""
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._run, name="clairvoyant-peers", daemon=True)
        _LIVE.add(self)
        self._thread.start()

    def fetch(self, peer: int, index: int, size: int, timeout: float, *, state: bool = False,
              urgent: bool = False) -> bytes | None:
        """Sample ``index`` (``size`` bytes at most: a caller that needs exactly that many checks the
        length) from rank ``peer``, verified, or None: a miss, no answer within ``timeout`` seconds,
        a longer answer or a bad checksum, a failed peer, a closed service. ``state``: piece
        ``index`` of the peer's state instead (its ``state`` callback answers it, on the service
        thread: no queue behind the samples being served). ``urgent``: asked even of a peer passed
        over, and past the bound on requests in flight (a probe of who answers: counted in
        ``probes``, apart from the fetches and their outcomes)."""
        if not 0 <= peer < self.size or peer == self.rank or size < 0:
            raise ConfigError(f"fetch from rank {peer} of {self.size} (this is rank {self.rank}), size {size}")
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._lock:
            self._c.add("probes" if urgent else "fetches")
            until = self._passed.get(peer)
            if not urgent and until is not None and (peer in self._probing or time.monotonic() < until):
                self._c.add("passed_over")
                return None
            probe = until is not None and not urgent   # its pass-over ended: this fetch alone asks it again
            if probe:
                self._probing.add(peer)
        try:
            return self._fetch(peer, index, size, timeout, deadline, state, urgent)
        finally:
            if probe:
                with self._lock:
                    self._probing.discard(peer)

    def _fetch(self, peer: int, index: int, size: int, timeout: float, deadline: float,
               state: bool = False, urgent: bool = False) -> bytes | None:
        with self._lock:
            while not urgent and not self._closed and peer not in self._dead and not self._has_room(size):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._c.add("timeouts")
                    return None
                self._room.wait(left)
            if self._closed or self._thread is None or peer in self._dead:
                if not urgent:
                    self._c.add("failed")
                return None
            f = _Fetch(next(self._ids), peer, index, size, state, urgent)
            self._inflight += 1
            self._inflight_bytes += size
            self._largest = max(self._largest, size)
            self._waiting[f.id] = f
            self._outbox.append(f)
        self._wake_up()
        f.done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._waiting.pop(f.id, None) is not None:   # no answer in time
                self._release(f)
                if not urgent:
                    self._c.add("timeouts")
                if f.sent:
                    self._late[f.id] = f.peer
                    if len(self._late) > _LATE_KEPT:
                        self._late.popitem(last=False)
                    self._pass_over(peer, timeout)
                return None
        return f.result

    def probe(self, peers: list[int], timeout: float = PROBE_WAIT, piece: int = ALIVE) -> dict[int, bytes | None]:
        """Ask ``peers`` at once whether they serve, passed over or not, and again those that did not
        answer within ``timeout`` seconds: each one's answer (``alive``'s), None where neither came.
        plan/membership.py ``probed`` decides from them which are lost. ``piece``: ``ENTERED``
        asks each for its count of gathers entered instead (8 bytes)."""
        size = 8 if piece == ENTERED else 1
        got: dict[int, bytes | None] = {}
        for _ in range(2):
            ask = [p for p in peers if got.get(p) is None]
            if not ask or self._thread is None:
                break
            with concurrent.futures.ThreadPoolExecutor(len(ask), thread_name_prefix="clairvoyant-probe") as pool:
                answers = pool.map(lambda p: self.fetch(p, piece, size, timeout, state=True, urgent=True), ask)
                got.update(zip(ask, answers))
        return got

    def _wake_up(self) -> None:
        self._wake.set()
        if self._wire_waits:
            self.wire.wake()

    def counters(self) -> dict:
        """What happened so far. Each finished fetch counts once in hits, misses, timeouts,
        bad_checksum, failed or passed_over (their sum is ``fetches`` once none is in progress);
        ``passed_over`` counts fetches not sent to a peer passed over after a time-out; ``sent`` counts
        requests that went out, ``late`` replies that came after their caller gave up, ``refused``
        messages dropped unread, ``refused_keys`` connections refused in their handshake (no key of
        the job's: cluster/wire_zmq.py); ``served``/``unserved`` the requests this rank answered with a hit
        or a miss; ``errors`` MPI errors met; ``per_peer`` hits and bytes by rank; ``dead_peers``
        the ranks MPI reported failed; ``slow_peers`` the ranks passed over now; ``probes`` the asks of
        probes (:meth:`probe`), which count in none of the above."""
        with self._lock:
            out = self._c.snapshot()
            out["per_peer"] = {p: {"hits": self._peer_hits[p], "bytes": self._peer_bytes[p]}
                               for p in sorted(self._peer_hits)}
            out["refused_keys"] = int(getattr(self.wire, "refused_keys", 0))   # (ZeroMQ: handshakes refused)
            out["dead_peers"] = sorted(self._dead)
            out["slow_peers"] = sorted(p for p, until in self._passed.items() if until > time.monotonic())
            return out

    def close(self) -> None:
        """Stop: waiting fetches return None, the thread ends (see the module's notes). Idempotent."""
        with self._lock:
            self._stopping = self._closed = True
            self._fail_waiting(lambda f: True)
            thread = self._thread
        self._wake_up()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if thread is None:
            self.wire.shut_down(0.0, self._dead)
        elif thread is not threading.current_thread():
            thread.join(CLOSE_WAIT)
            if thread.is_alive():
                log.warning("clairvoyant: the peer service's thread is still inside serve() after %.0f s; "
                            "leaving it behind", CLOSE_WAIT)

    def forgive(self, peers: set[int]) -> None:
        """Ask ``peers`` again from now on (a cluster formed anew: they were started again)."""
        with self._lock:
            for p in peers:
                self._passed.pop(p, None)

    # --- caller side, under the lock -------------------------------------------------------------

    def _has_room(self, size: int) -> bool:
        if self._inflight >= self.max_inflight:
            return False
        return self._inflight == 0 or self._inflight_bytes + size <= self.max_bytes

    def _pass_over(self, peer: int, timeout: float) -> None:
        if peer not in self._passed:
            log.warning("clairvoyant: rank %d did not answer within %.3g s; passing it over for %.3g s "
                        "(its samples come from the shared store meanwhile)", peer, timeout, PASS_OVER * timeout)
        self._passed[peer] = time.monotonic() + PASS_OVER * timeout

    def _release(self, f: _Fetch) -> None:
        self._inflight -= 1
        self._inflight_bytes -= f.size
        self._room.notify_all()

    def _finish(self, f: _Fetch, result: bytes | None, outcome: str) -> bool:
        """Hand ``f`` its outcome if its caller still waits; False if it gave up."""
        if self._waiting.pop(f.id, None) is None:
            return False
        self._release(f)
        if not f.urgent:   # (a probe's ask counts in ``probes`` alone)
            self._c.add(outcome)
        if outcome != "failed":   # an answer in time: the peer is not (or no longer) slow
            self._passed.pop(f.peer, None)
        if result is not None and not f.urgent:
            self._c.add("bytes_in", len(result))
            self._peer_hits[f.peer] += 1
            self._peer_bytes[f.peer] += len(result)
        f.result = result
        f.done.set()
        return True

    def _fail_waiting(self, which: Callable[[_Fetch], bool]) -> None:
        for f in [f for f in self._waiting.values() if which(f)]:
            self._finish(f, None, "failed")

    # --- what a message means, and what a request is answered (in the service thread) -----------

    def _queue_request(self, buf: bytearray, src: int) -> None:
        magic, rid, index, size = REQUEST.unpack(buf)
        if magic not in (REQUEST_MAGIC, STATE_MAGIC) or index < 0:
            self._c.add("refused")
        else:
            self._queued.append((rid, index, size, src, magic == STATE_MAGIC))

    def _answer_queued(self) -> bool:
        """Answer the requests queued, in order, but none of a requester with ``max_bytes`` of
        replies still leaving for it."""
        waiting: deque[tuple[int, int, int, int, bool]] = deque()
        before = len(self._queued)
        while self._queued:
            q = rid, index, size, src, state = self._queued.popleft()
            if src in self._dead:
                continue
            if self._backlog[src] and self._backlog[src] + size > self.max_bytes:
                waiting.append(q)
            else:
                self._answer(rid, index, size, src, state)
        self._queued = waiting
        return len(waiting) < before

    def _answer(self, rid: int, index: int, size: int, src: int, state: bool = False) -> None:
        if self._pool is not None and not state:   # (a piece of state is at hand: answered at once)
            try:
                self._pool.submit(self._serve_apart, rid, index, size, src, state)
                return
            except RuntimeError:   # the pool is shut down: the service is closing
                return
        self._reply(rid, index, size, src, self._serve_one(index, src, state))

    def _serve_one(self, index: int, src: int, state: bool = False) -> bytes | None:
        try:
            if state:
                if index == ALIVE:
                    return self._alive()
                if index == ENTERED:
                    return None if self._entered is None else int(self._entered()).to_bytes(8, "little")
                return None if self._state is None else self._state(index)
            return self._serve(index)
        except Exception as e:   # the caller's tier failed: a miss for the peer, not our end
            level = logging.DEBUG if self._serve_failed else logging.WARNING   # the first one is shown
            self._serve_failed = True
            log.log(level, "clairvoyant: serving sample %d to rank %d failed (%s: %s); the peer reads it "
                    "from the store", index, src, type(e).__name__, e)
            return None

    def _serve_apart(self, rid: int, index: int, size: int, src: int, state: bool = False) -> None:
        """``serve`` in a pool thread; its answer goes out from the service thread."""
        data = self._serve_one(index, src, state)
        with self._lock:
            self._answers.append((rid, index, size, src, data))
        self._wake_up()

    def _send_answers(self) -> bool:
        """(The service thread) send the answers the pool has ready."""
        with self._lock:
            ready, self._answers = self._answers, deque()
        for rid, index, size, src, data in ready:
            if src not in self._dead:
                self._reply(rid, index, size, src, data)
        return bool(ready)

    def _reply(self, rid: int, index: int, size: int, src: int, data: bytes | None) -> None:
        if data is not None and len(data) > size:
            data = None   # more than was asked for
        if data is None:
            out = bytearray(REPLY.pack(REPLY_MAGIC, rid, MISS, 0, 0))
        else:
            size = len(data)   # (at most what was asked: a compressed entry is shorter)
            out = bytearray(REPLY.size + size)
            REPLY.pack_into(out, 0, REPLY_MAGIC, rid, HIT, size, xxhash.xxh3_64_intdigest(data))
            out[REPLY.size:] = data
            if index in CORRUPT_ON_SEND and size:
                out[REPLY.size + size // 2] ^= 1
        if self._isend(out, src, "reply", 0, DELAY_REPLIES):
            if data is not None:   # (one step: a snapshot sees both or neither)
                self._c.add_many(served=1, bytes_out=size)
            else:
                self._c.add("unserved")

    def _take_reply(self, buf: bytearray, src: int) -> None:
        magic, rid, status, length, checksum = REPLY.unpack_from(buf)
        with self._lock:
            if magic != REPLY_MAGIC or status not in (HIT, MISS) or \
                    len(buf) != REPLY.size + (length if status == HIT else 0):
                self._c.add("refused")
                return
            f = self._waiting.get(rid)
            if f is None or f.peer != src:
                self._c.add("late" if self._late.pop(rid, None) == src else "refused")
                return
        payload = memoryview(buf)[REPLY.size:]
        if status == MISS:
            result, outcome = None, "misses"
        elif length > f.size or xxhash.xxh3_64_intdigest(payload) != checksum:
            result, outcome = None, "bad_checksum"
        else:
            result, outcome = bytes(payload), "hits"
        with self._lock:
            if not self._finish(f, result, outcome):
                self._c.add("late")   # its caller gave up while the reply was being checked


@atexit.register
def _close_all() -> None:
    """Close services left open before mpi4py finalizes MPI (its hook runs after this one)."""
    for service in list(_LIVE):
        service.close()
