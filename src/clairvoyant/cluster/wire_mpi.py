"""MECHANISM: the peer service's messages over MPI (one backend of cluster/peers.py's transport).

Non-blocking sends and receives on a private duplicate of the communicator: a message waiting is
matched (``Improbe``) and received into a buffer of the size its tag allows (a request's exact
size, a reply's header plus the largest payload asked for); anything else is received into
:data:`~clairvoyant.cluster.wire.DRAIN` bytes, the rest truncated away unread, and refused. Raw
bytes through mpi4py's buffer API: nothing pickled. An MPI error that names a failed peer (ULFM,
``mpirun --with-ft ulfm``) is acknowledged and reported with the ranks MPI lists as failed;
without ULFM, Open MPI ends the whole job when a rank dies. Shutting down lets messages in flight
finish for a while, then abandons what is left (kept alive, with its buffers, for the life of
the process: MPI may still write into them) and frees the communicator only when nothing is
outstanding and no peer has failed (MPI_Comm_free is collective in the standard's terms).
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import ConfigError
from .mpi import failed_ranks
from .wire import DRAIN, REPLY, REQUEST, Fault, Received

_ABANDONED: list[Any] = []   # (request, buffer, ...) still active when a service closed: kept alive


class MPIWire:
    """The service's messages on a duplicate of ``comm`` (collective: every rank makes one), with
    tags ``tag_base`` (requests) and ``tag_base + 1`` (replies)."""

    name = "MPI"

    def __init__(self, comm: Any, tag_base: int = 7000) -> None:
        from mpi4py import MPI
        if not 0 <= tag_base < MPI.COMM_WORLD.Get_attr(MPI.TAG_UB):
            raise ConfigError(f"tag_base={tag_base} is not a valid MPI tag")
        self._MPI = MPI
        self.comm = comm.Dup()   # private: never mixes with the caller's messages
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._tags = {"request": tag_base, "reply": tag_base + 1}
        self._recvs: list[tuple[Any, bytearray, int, str]] = []
        self._sends: list[tuple[Any, bytearray, int, int]] = []

    def post(self, buf: bytearray, dest: int, kind: str, fetch_id: int) -> Fault | None:
        """Send ``buf`` (a ``kind`` message: "request" or "reply") to ``dest``, without waiting."""
        try:
            self._sends.append((self.comm.Isend(buf, dest, self._tags[kind]), buf, dest, fetch_id))
        except self._MPI.Exception as e:
            return self._fault(e, dest, fetch_id)
        return None

    def poll(self, largest: int) -> tuple[list[Received], list[tuple[int, int]], list[Fault]]:
        """Messages received, sends completed (destination, bytes) and faults met since the last
        poll; receives are posted for up to 64 messages waiting."""
        faults: list[Fault] = []
        self._probe(largest, faults)
        got, sent = self._progress(faults)
        return got, sent, faults

    def busy(self) -> bool:
        return bool(self._sends or self._recvs)

    def _probe(self, largest: int, faults: list[Fault]) -> None:
        MPI, status = self._MPI, self._MPI.Status()
        for _ in range(64):
            try:
                msg = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            except MPI.Exception as e:
                faults.append(self._fault(e, None, 0))
                return
            if msg is None:
                return
            src, tag, n = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
            if tag == self._tags["request"] and n == REQUEST.size:
                kind = "request"
            elif tag == self._tags["reply"] and REPLY.size <= n <= REPLY.size + largest:
                kind = "reply"
            else:
                kind, n = "refused", min(max(n, 0), DRAIN)   # a count past 2**31 may read as negative
            buf = bytearray(n)
            self._recvs.append((msg.Irecv(buf), buf, src, kind))

    def _progress(self, faults: list[Fault]) -> tuple[list[Received], list[tuple[int, int]]]:
        MPI = self._MPI
        got: list[Received] = []
        recvs, self._recvs = self._recvs, []
        for item in recvs:
            req, buf, src, kind = item
            try:
                if not req.Test():
                    self._recvs.append(item)
                    continue
            except MPI.Exception as e:
                if e.Get_error_class() == MPI.ERR_TRUNCATE and kind == "refused":
                    got.append(("refused", buf, src))
                else:
                    faults.append(self._fault(e, src, 0))
                continue
            got.append((kind, buf, src))
        sent: list[tuple[int, int]] = []
        sends, self._sends = self._sends, []
        for item in sends:
            req, buf, dest, fetch_id = item
            try:
                if not req.Test():
                    self._sends.append(item)
                    continue
            except MPI.Exception as e:
                faults.append(self._fault(e, dest, fetch_id))
            sent.append((dest, len(buf)))
        return got, sent

    def _fault(self, e: Exception, peer: int | None, fetch_id: int) -> Fault:
        MPI = self._MPI
        failure = e.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING)
        dead = self._acknowledge_failures() if failure else set()
        return Fault(peer, fetch_id, frozenset(dead), peer is None and not failure, e)

    def _acknowledge_failures(self) -> set[int]:
        MPI = self._MPI
        try:
            self.comm.Ack_failed()
            return failed_ranks(self.comm)
        except (MPI.Exception, NotImplementedError, AttributeError):
            return set()

    def shut_down(self, linger: float, dead: set[int]) -> None:
        """Let messages in flight finish for up to ``linger`` seconds, then abandon the rest; the
        communicator is freed if nothing is left and no peer failed."""
        if self._MPI.Is_finalized():
            return
        deadline = time.monotonic() + linger
        while self.busy() and time.monotonic() < deadline:
            got, sent = self._progress([])
            if not (got or sent):
                time.sleep(0.001)
        for req, *_ in self._recvs:
            try:
                req.Cancel()   # works for a receive not yet matched; a matched one completes or stays
            except self._MPI.Exception:
                pass
        if self.busy():
            _ABANDONED.extend(self._sends + self._recvs)   # MPI may still touch their buffers
        elif not dead and self.comm != self._MPI.COMM_NULL:
            try:
                self.comm.Free()
            except self._MPI.Exception:
                pass
