"""MECHANISM: the peer service's messages over ZeroMQ (one backend of cluster/peers.py's transport),
for jobs that torchrun, Lightning, Accelerate or a Kubernetes PyTorchJob start without MPI.

Each rank binds one ROUTER socket (its requests come in there, its replies go out there, routed
by the asking rank's identity) on an ephemeral TCP port of the address its peers reach it by,
and asks each peer through a DEALER socket of its own whose identity is its rank. The addresses
are exchanged once, through the job's rendezvous (cluster/store.py), before the service starts.
pyzmq's wheels carry libzmq: nothing is compiled here. ZeroMQ was measured against MPI and
torch.distributed's gloo for this (benchmarks/transport_candidates.py, docs/benchmarks.md): a
110 KB fetch in 0.7 ms against gloo's 0.9 ms, and a dead peer costs a time-out while the socket
goes on, where gloo's group is dead for good.

**Who may connect.** Every socket speaks CURVE (ZeroMQ's authenticated encryption, RFC 26) with
the rank's key pair, derived from the job's secret (cluster/secret.py): a rank's ROUTER admits only
a connection that proves it holds one of the job's ranks' keys (a ZAP handler, pyzmq's
``ThreadAuthenticator``, whose user id for the connection is that rank), and a DEALER connects
only to the peer that proves it holds the rank's key it asked for. A connection that has no such
key is dropped in the handshake, before any message of it is read, and counted
(``refused_keys``); a request whose routing identity is not the rank its key belongs to is
refused unread (a rank cannot speak for another). Where the secret is None
(``CLAIRVOYANT_PEER_AUTH=off``) the sockets speak plain TCP and anyone who reaches them is
served.

What comes in is checked as over MPI: a request must be exactly a request's size from a rank of
the job other than this one; a reply at most its header plus the largest payload asked for. The
rest is refused unread (``MAXMSGSIZE`` also drops an oversized request's connection). Sends
never block: a full queue (a peer that does not take its messages) or a reply to a rank no
longer connected fails that one message, as a fault naming the peer, and its fetch fails at
once. ZeroMQ does not tell of a dead peer: its fetches time out, and the service passes it over.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from ..errors import ConfigError
from .wire import REPLY, REQUEST, Fault, Received

ADDR_VAR = "CLAIRVOYANT_PEER_ADDR"   # the address peers reach this node by (else found from the route)
HWM = 4096   # messages queued per socket before a send fails


def reachable_address(toward: str | None = None) -> str:
    """The IP address of this node that peers reach it by: ``CLAIRVOYANT_PEER_ADDR`` if set, else
    the address of the interface that routes toward ``toward`` (the job's rendezvous host; no
    packet is sent), else the host name's."""
    given = os.environ.get(ADDR_VAR)
    if given:
        return given
    if toward:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((toward, 9))   # a UDP socket's connect picks the route; nothing is sent
                return s.getsockname()[0]
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _admission(ctx: Any, ranks: dict[bytes, int]) -> Any:
    """A ZAP handler on ``ctx`` (started) admitting the CURVE keys of ``ranks`` (Z85 public key ->
    rank), each as its rank."""
    from zmq.auth.thread import ThreadAuthenticator
    from zmq.utils import z85

    class Admission(ThreadAuthenticator):
        def callback(self, domain: str, key: bytes) -> bool:   # (pyzmq's credentials provider)
            return key in ranks

        def curve_user_id(self, client_public_key: bytes) -> str:
            return str(ranks[z85.encode(client_public_key)])

    auth = Admission(ctx, log=logging.getLogger("clairvoyant.zap"))
    auth.start()
    auth.configure_curve_callback("clairvoyant", auth)   # (the ROUTER's zap_domain)
    return auth


class ZmqWire:
    """Rank ``rank`` of ``size``: its ROUTER bound on ``host`` (``address`` is where peers reach
    it); ``connect`` with every rank's address before the service starts. ``secret``: the job's
    (cluster/secret.py), whose keys every socket proves itself with; None: no authentication."""

    name = "ZeroMQ"

    def __init__(self, rank: int, size: int, host: str, *, secret: Any) -> None:
        import zmq
        self._zmq = zmq
        self.rank, self.size = int(rank), int(size)
        self._ctx = zmq.Context(io_threads=1)
        self._auth, self._keys = None, None
        try:
            self._start(secret, host)
        except BaseException:   # nothing left running: the authenticator's thread, the context
            if self._auth is not None:
                self._auth.stop()
            self._ctx.destroy(linger=0)
            raise

    def _start(self, secret: Any, host: str) -> None:
        zmq = self._zmq
        if secret is not None:
            if not zmq.has("curve"):
                raise ConfigError(f"this pyzmq's libzmq ({zmq.zmq_version()}) has no CURVE security, which the "
                                  "cluster's peers need: install pyzmq's wheel (pip install --force-reinstall pyzmq), "
                                  "or set CLAIRVOYANT_PEER_AUTH=off on a network only the job reaches")
            from .secret import rank_keys
            self._keys = [rank_keys(secret, r) for r in range(self.size)]
            self._auth = _admission(self._ctx, {pub: r for r, (pub, _) in enumerate(self._keys)})
        self.name = "ZeroMQ, CURVE" if secret is not None else "ZeroMQ, not authenticated"
        self._router = self._socket(zmq.ROUTER)
        if self._keys is not None:
            self._router.curve_server = True
            self._router.curve_publickey, self._router.curve_secretkey = self._keys[self.rank]
            self._router.zap_domain = b"clairvoyant"
        # handshakes that failed (no CURVE, or a key not the job's): counted, never read
        self._monitor = self._router.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.refused_keys = 0
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)    # a reply to a rank not connected: an error, not a silent drop
        self._router.setsockopt(zmq.MAXMSGSIZE, 4096)   # a peer that sends more is cut off (the handshake counts too)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)   # a rank started again takes its identity over
        port = self._router.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._addresses: list[str] = []
        self._dealers: dict[int, Any] = {}
        self._dealt: dict[int, str] = {}   # peer -> the address its dealer is connected to
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        # ``wake`` from any thread ends the service thread's ``wait`` (a pipe the poller watches)
        self._wake_r, self._wake_w = os.pipe()
        self._wake_lock = threading.Lock()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._of: dict[Any, int] = {}   # dealer socket -> its peer's rank
        self._sent: list[tuple[int, int]] = []
        self._closed = False

    def _socket(self, kind: int) -> Any:
        s = self._ctx.socket(kind)
        s.setsockopt(self._zmq.LINGER, 0)
        s.setsockopt(self._zmq.SNDHWM, HWM)
        s.setsockopt(self._zmq.RCVHWM, HWM)
        return s

    def connect(self, addresses: list[str]) -> None:
        """Every rank's address, by rank (sockets to peers are made at the first message to each).
        Called again (a cluster formed anew around a running mount): a peer whose address changed
        is reached at its new one from its next message on."""
        if len(addresses) != self.size:
            raise ValueError(f"{len(addresses)} addresses for {self.size} ranks")
        self._addresses = list(addresses)   # (one assignment: the service thread reads it)

    def _dealer(self, dest: int) -> Any:
        d = self._dealers.get(dest)
        address = self._addresses[dest]
        if d is not None and self._dealt[dest] != address:   # the peer was started again elsewhere
            self._poller.unregister(d)
            del self._of[d]
            d.close(linger=0)
            d = None
        if d is None:
            zmq = self._zmq
            d = self._socket(zmq.DEALER)
            d.setsockopt(zmq.IDENTITY, str(self.rank).encode())
            if self._keys is not None:   # it reaches only the peer that holds ``dest``'s key
                d.curve_serverkey = self._keys[dest][0]
                d.curve_publickey, d.curve_secretkey = self._keys[self.rank]
            d.connect(address)
            self._dealers[dest], self._dealt[dest] = d, address
            self._of[d] = dest
            self._poller.register(d, zmq.POLLIN)
        return d

    def post(self, buf: bytearray, dest: int, kind: str, fetch_id: int) -> Fault | None:
        zmq = self._zmq
        try:
            if kind == "request":
                self._dealer(dest).send(buf, zmq.NOBLOCK)
            else:
                self._router.send_multipart([str(dest).encode(), buf], zmq.NOBLOCK)
        except zmq.ZMQError as e:   # its queue is full, or (a reply) it is not connected any more
            return Fault(dest, fetch_id, frozenset(), False, e)
        self._sent.append((dest, len(buf)))   # (ZeroMQ has it now)
        return None

    def poll(self, largest: int) -> tuple[list[Received], list[tuple[int, int]], list[Fault]]:
        zmq = self._zmq
        got: list[Received] = []
        for sock, _ in self._poller.poll(0):
            if sock == self._wake_r:
                self._drain_wake()
                continue
            for _ in range(64):
                try:
                    if sock is self._monitor:
                        sock.recv_multipart(zmq.NOBLOCK)   # (an event: its number, its endpoint)
                        self.refused_keys += 1
                        continue
                    if sock is self._router:   # (frames: the connection's key's rank is on them)
                        got.append(self._request(sock.recv_multipart(zmq.NOBLOCK, copy=False)))
                        continue
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                else:
                    src = self._of[sock]
                    ok = len(frames) == 1 and REPLY.size <= len(frames[0]) <= REPLY.size + largest
                    got.append(("reply" if ok else "refused", frames[-1], src))
        sent, self._sent = self._sent, []
        return got, sent, []

    def _request(self, frames: list) -> Received:
        ident = frames[0].bytes.decode("ascii", "replace") if frames else ""
        src = int(ident) if ident.isdigit() else -1
        if self._keys is not None and len(frames) == 2 and frames[1].get("User-Id") != ident:
            src = -1   # a rank's identity claimed by a connection with another rank's key
        if len(frames) == 2 and len(frames[1]) == REQUEST.size and 0 <= src < self.size and src != self.rank:
            return "request", frames[1].bytes, src
        return "refused", b"", max(src, 0)

    def wake(self) -> None:
        """End the service thread's ``wait`` now (any thread: a caller queued a request)."""
        with self._wake_lock:   # (never a write to a descriptor closed and given to another file)
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:   # full: a wake is pending already
                pass

    def wait(self, timeout: float) -> None:
        """Block the service thread until a message arrives, ``wake`` is called, or ``timeout``
        seconds pass (so that a reply is taken when it comes, not at the next look)."""
        # (whole milliseconds: a pause under one is a look, not a sleep. Rounding it up to a sleep of
        # 1 ms was tried: fetches took 1.6 ms instead of 0.55 at their median)
        if self._poller.poll(max(0, int(timeout * 1000))):
            self._drain_wake()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def shut_down(self, linger: float, dead: set[int]) -> None:
        """Close the sockets, letting what is queued leave for up to ``linger`` seconds."""
        if self._closed:
            return
        self._closed = True
        ms = max(0, int(linger * 1000))
        self._router.disable_monitor()
        for s in [self._monitor, self._router, *self._dealers.values()]:
            s.close(linger=ms)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        with self._wake_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
