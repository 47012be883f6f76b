"""MECHANISM: the peer service's wire (dist/peers.py): what its messages are, and the emulated
interconnect they may travel over.

A request is :data:`REQUEST`; a reply is :data:`REPLY` followed by the payload in the same
message, with the payload's xxh3-64 in the header. Both are fixed little-endian ``struct``
headers sent as raw bytes over mpi4py's buffer API: nothing is pickled or unpickled, ever. A
message whose tag, size or magic is not ours is received into :data:`DRAIN` bytes (the rest
truncated away, unread) and refused.

For benchmarks, ``CLAIRVOYANT_PEER_LATENCY`` (seconds) and ``CLAIRVOYANT_PEER_BANDWIDTH``
(bytes per second) emulate an interconnect (:func:`emulated_link`); the service thread holds
each message back accordingly (dist/peer_thread.py).
"""

from __future__ import annotations

import math
import os
import struct
from typing import Mapping

from ..errors import ConfigError

REQUEST = struct.Struct("<8sQqQ")   # magic, request id, sample index, size in bytes
REPLY = struct.Struct("<8sQqQQ")    # magic, request id, status, payload length, xxh3-64 of the payload
REQUEST_MAGIC, REPLY_MAGIC = b"CVPEERQ1", b"CVPEERR1"
HIT, MISS = 0, 1
DRAIN = 64           # bytes a refused message is received into; the rest is truncated away unread
LATENCY_VAR, BANDWIDTH_VAR = "CLAIRVOYANT_PEER_LATENCY", "CLAIRVOYANT_PEER_BANDWIDTH"   # the emulated link


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
