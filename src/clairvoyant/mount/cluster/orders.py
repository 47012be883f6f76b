"""MECHANISM: the nodes of a cluster of mounts tell each other their samplers' orders of an epoch.

A node's samplers publish their orders in its local directory (mount/orders.py); the cluster plan
(plan/cluster.py) needs every rank's, on every node, and what each node's tier holds. So each
node offers, per epoch, one **blob**: its ranks' orders as file numbers (this epoch's and the
next), its tier's capacity and residents, and the epoch its homes were fixed from (-1: none yet).
The blob is made once per epoch and set of ranks (the residents are those of its first making),
so that every node that gathers the same ranks plans from the same bytes.

The blobs travel over the cluster's link as requests of their own kind, for a piece of the node's
state (cluster/wire.py ``STATE_MAGIC``; a file is never asked for this way): piece ``1 + 2e`` answers
16 bytes, the length of the node's blob of epoch ``e`` (0: none yet) and its xxh3-64 (a gatherer
fetches a blob again only when these change), ``2 + 2e`` the blob. Piece ``HOMES`` answers the
homes a node plans with (mount/cluster/homes.py ``encode_homes``). The format is a fixed header, a JSON description and
little-endian int64 arrays; nothing is pickled. A blob that does not parse is refused (treated as
not offered), never trusted: every file number, count and size is checked against the listing.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import xxhash

from ...plan.cluster_walk import orders_complete
from ..numbering import Numbered
from ...cluster.timeouts import GATHER_WAIT, QUICK_WAIT

log = logging.getLogger("clairvoyant")
HOMES = 0                # the piece of a node's state that is the homes it plans with
MAGIC, VERSION = b"CVNORDR1", 1
_HEAD = struct.Struct("<8sII")   # magic, version, length of the JSON description
LENGTH = 16              # bytes of the answer to a request for a blob's length
GATHER_EVERY = 0.02      # seconds between its rounds of asking
_ARRAYS = ("files", "counts", "next_files", "next_counts")


@dataclass(frozen=True)
class NodeOrders:
    """What node ``node`` offered for ``epoch``: ``ranks`` (global rank -> its order as file
    numbers), the ranks' world size, its tier's ``capacity`` (bytes) and ``residents`` (file ->
    entry bytes held when the blob was made), and ``basis``: the epoch its homes came from (-1)."""

    node: int
    epoch: int
    world_size: int
    capacity: int
    ranks: dict[int, Numbered]
    residents: dict[int, int] = field(default_factory=dict)
    basis: int = -1
    homes_digest: int = 0   # xxh3-64 of the homes it plans with (where basis >= 0)


def orders_number(epoch: int, body: bool) -> int:
    """The request number of a node's blob of ``epoch`` (``body``) or of its length."""
    return 1 + 2 * int(epoch) + int(bool(body))


def encode(o: NodeOrders) -> bytes:
    """``o`` as a blob (module docstring)."""
    arrays: list[np.ndarray] = []
    ranks = []
    for r in sorted(o.ranks):
        ranks.append(int(r))
        arrays += [np.asarray(getattr(o.ranks[r], a), "<i8") for a in _ARRAYS]
    res = sorted(o.residents.items())
    arrays += [np.array([k for k, _ in res], "<i8"), np.array([v for _, v in res], "<i8")]
    desc = {"node": int(o.node), "epoch": int(o.epoch), "world_size": int(o.world_size),
            "capacity": int(o.capacity), "basis": int(o.basis), "homes": int(o.homes_digest), "ranks": ranks,
            "lengths": [int(len(a)) for a in arrays]}
    text = json.dumps(desc, separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, VERSION, len(text)) + text + b"".join(a.tobytes() for a in arrays)


def decode(blob: bytes, num_files: int) -> NodeOrders:
    """A blob back, of a listing of ``num_files`` files (ValueError naming what is wrong, for one
    that is not one of this version, or names files, counts or sizes that cannot be)."""
    if len(blob) < _HEAD.size:
        raise ValueError(f"a node's orders of {len(blob)} bytes: shorter than the header")
    magic, version, n = _HEAD.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a node's orders of version {VERSION} ({magic!r}, {version})")
    try:
        desc = json.loads(blob[_HEAD.size:_HEAD.size + n])
        ints = [desc[k] for k in ("node", "epoch", "world_size", "capacity", "basis", "homes")] + desc["ranks"] \
            + desc["lengths"]
        if not all(type(x) is int for x in ints):
            raise TypeError("a number that is not a whole number")
        ranks, lengths = list(desc["ranks"]), list(desc["lengths"])
        node, epoch, world = desc["node"], desc["epoch"], desc["world_size"]
        capacity, basis, digest = desc["capacity"], desc["basis"], desc["homes"]
    except Exception as e:   # (not JSON, a key missing, deep or odd JSON: RecursionError, OverflowError, ...)
        raise ValueError(f"a node's orders with a bad description: {type(e).__name__}: {e}") from e
    if len(set(ranks)) != len(ranks) or min(ranks, default=0) < 0 or any(r >= world for r in ranks) \
            or min(node, epoch, capacity) < 0 or basis < -1:
        raise ValueError(f"a node's orders with ranks {ranks[:8]} of a world of {world}, node {node}, epoch {epoch}")
    if len(lengths) != len(_ARRAYS) * len(ranks) + 2 or min(lengths, default=0) < 0:
        raise ValueError(f"a node's orders with {len(lengths)} arrays for {len(ranks)} ranks")
    at = _HEAD.size + n
    if len(blob) != at + 8 * sum(lengths):
        raise ValueError(f"a node's orders of {len(blob)} bytes where its description says {at + 8 * sum(lengths)}")
    arrays = []
    for k in lengths:
        arrays.append(np.frombuffer(blob, "<i8", k, at).astype(np.int64))
        at += 8 * k
    per = len(_ARRAYS)
    numbered = {r: Numbered(*arrays[per * i:per * i + per]) for i, r in enumerate(ranks)}
    for r, x in numbered.items():
        for counts, files in ((x.counts, x.files), (x.next_counts, x.next_files)):
            if int(counts.min(initial=0)) < 0 or int(counts.sum()) > len(files):
                raise ValueError(f"rank {r}'s order counts more files than it lists")
            if len(files) and (int(files.min()) < 0 or int(files.max()) >= num_files):
                raise ValueError(f"rank {r}'s order names files outside the {num_files} listed")
    keys, sizes = arrays[-2], arrays[-1]
    if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= num_files or int(sizes.min()) < 0):
        raise ValueError(f"a node's residents name files outside the {num_files} listed")
    residents = dict(zip(keys.tolist(), sizes.tolist()))
    return NodeOrders(node, epoch, world, capacity, numbered, residents, basis, digest)


def length_answer(blob: bytes | None) -> bytes:
    """The answer to a request for a blob's length: its length (0: none yet) and xxh3-64."""
    if blob is None:
        return bytes(LENGTH)
    return len(blob).to_bytes(8, "little") + xxhash.xxh3_64_intdigest(blob).to_bytes(8, "little")


def homes_digest(homes: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(homes, "<u4").tobytes())


def gather(fetch: Callable[[int, int, int], bytes | None], node: int, nodes: int, epoch: int, mine: NodeOrders,
           stop: Callable[[], bool], num_files: int, wait: float = GATHER_WAIT, *,
           silent: frozenset[int] | set[int] = frozenset(), missing: set[int] | None = None,
           lost: frozenset[int] | Callable[[], frozenset[int]] = frozenset(),
           ranks_of: dict[int, int] | None = None,
           on_absent: Callable[[set[int]], None] | None = None) -> list[NodeOrders] | None:
    """Every node's orders of ``epoch`` (``mine`` for this node), asked of each peer through
    ``fetch(peer, number, size)`` round after round until the nodes' ranks together are every rank
    of the world once; None if that does not happen within ``wait`` seconds (a peer that is gone,
    or whose samplers are on another epoch), or at ``stop()``, and ``missing`` then holds the peers
    that offered nothing. Where only peers that offered nothing last time too (``silent``: a node
    without samplers) are missing, ``QUICK_WAIT`` seconds are waited, not ``wait``. Each round
    asks each peer for its blob's length and checksum, and for the blob only when those changed
    (its samplers may publish more ranks). Nodes ``lost`` (the cluster went on without them; a
    callable is asked each round) are not asked nor waited for: the others' orders, their ranks
    distinct and each node with as many as it had (``ranks_of``, node -> ranks, from the last
    gather of every node), are then the epoch's. Peers still absent after ``QUICK_WAIT`` (and not
    ``silent``) are handed once to ``on_absent``, which may find them lost (a probe)."""
    got: dict[int, NodeOrders] = {node: mine}
    seen: dict[int, bytes] = {}
    start = time.monotonic()
    deadline = start + wait
    probed = False
    while True:
        gone = lost() if callable(lost) else lost
        for peer in range(nodes):
            if peer == node or peer in gone:
                continue
            if stop():
                return None
            head = fetch(peer, orders_number(epoch, False), LENGTH)
            n = 0 if head is None else int.from_bytes(head[:8], "little")
            if not n or seen.get(peer) == head:
                continue
            o = _body(fetch, peer, epoch, n, num_files)
            if o is not None and o.node == peer and o.epoch == epoch:
                got[peer], seen[peer] = o, head
        there = [n for n in range(nodes) if n not in gone or n == node]
        if all(n in got for n in there) and orders_complete([got[n] for n in there], bool(gone), ranks_of or {}):
            return [got[n] for n in there]
        absent = {p for p in there if p not in got}
        now = time.monotonic()
        if on_absent is not None and not probed and absent - set(silent) and now - start > QUICK_WAIT:
            probed = True
            on_absent(absent - set(silent))   # (a node gone: the next round leaves it out)
            continue
        quiet = bool(absent) and absent <= set(silent) and now - start > QUICK_WAIT
        if stop() or now > deadline or quiet:
            if missing is not None:
                missing.update(absent)
            return None
        time.sleep(GATHER_EVERY)


def _body(fetch, peer: int, epoch: int, n: int, num_files: int) -> NodeOrders | None:
    blob = fetch(peer, orders_number(epoch, True), n)   # (None if it changed in between: asked again)
    if blob is None:
        return None
    try:
        return decode(blob, num_files)
    except ValueError as e:
        log.warning("clairvoyant: node %d's orders of epoch %d refused: %s", peer, epoch, e)
        return None
