"""MECHANISM: the peer service's wire (cluster/peers.py): what its messages are, what a backend
that carries them reports, and the emulated interconnect they may travel over.

A request is :data:`REQUEST` (its magic says its kind: a sample, or, :data:`STATE_MAGIC`, a piece
of the node's state such as the mount's orders and homes); a reply is :data:`REPLY` followed by the
payload in the same message, with the payload's xxh3-64 in the header. Both are fixed little-endian ``struct``
headers sent as raw bytes: nothing is pickled or unpickled, ever. A message whose kind, size or
magic is not ours is refused unread (over MPI it is received into :data:`DRAIN` bytes, the rest
truncated away).

Two backends carry them, with one interface (``post``, ``poll``, ``shut_down``;
``rank``, ``size``, ``name``): cluster/wire_mpi.py (MPI, under ``mpirun``/``srun``) and
cluster/wire_zmq.py (ZeroMQ over TCP, for jobs that torchrun and its kin start). ``poll`` reports
what arrived (:data:`Received`), which sends completed and any :class:`Fault`.

For benchmarks, ``CLAIRVOYANT_PEER_LATENCY`` (seconds) and ``CLAIRVOYANT_PEER_BANDWIDTH``
(bytes per second) emulate an interconnect (:func:`emulated_link`); the service thread holds
each message back accordingly (cluster/peer_thread.py).
"""

from __future__ import annotations

import math
import os
import struct
from typing import Mapping, NamedTuple, Tuple

from ..errors import ConfigError

REQUEST = struct.Struct("<8sQqQ")   # magic, request id, sample index, size in bytes
REPLY = struct.Struct("<8sQqQQ")    # magic, request id, status, payload length, xxh3-64 of the payload
REQUEST_MAGIC, REPLY_MAGIC = b"CVPEERQ1", b"CVPEERR1"
STATE_MAGIC = b"CVPEERS1"   # a request for a node's state (the mount's orders and homes), not a sample
HIT, MISS = 0, 1
DRAIN = 64           # bytes a refused message is received into; the rest is truncated away unread
LATENCY_VAR, BANDWIDTH_VAR = "CLAIRVOYANT_PEER_LATENCY", "CLAIRVOYANT_PEER_BANDWIDTH"   # the emulated link

# a message a backend received: its kind ("request", "reply" or "refused"), its bytes, its sender's rank
Received = Tuple[str, bytearray, int]


class Fault(NamedTuple):
    """An error a backend met: the peer involved (None: none to blame), the fetch whose message
    failed (0: none), the ranks the backend now knows are dead, and whether the service must stop
    (an error with no peer to blame)."""

    peer: int | None
    fetch_id: int
    dead: frozenset
    fatal: bool
    error: BaseException


def emulated_link(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """The emulated interconnect: (latency in seconds, bandwidth in bytes/s, 0 for unlimited), from
    ``CLAIRVOYANT_PEER_LATENCY`` and ``CLAIRVOYANT_PEER_BANDWIDTH``; (0, 0) when they are unset."""
    env = os.environ if env is None else env
    out = []
    for var, unit in ((LATENCY_VAR, "seconds, e.g. 20e-6"), (BANDWIDTH_VAR, "bytes per second, e.g. 10e9")):
        raw = env.get(var, "").strip()
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            value = -1.0
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{var}={raw!r}: give a non-negative number ({unit}), or unset it")
        out.append(value)
    return out[0], out[1]
