"""MECHANISM: the nodes of a cluster of mounts tell each other their samplers' orders of an epoch.

A node's samplers publish their orders in its local directory (mount/orders.py); the cluster plan
(plan/cluster.py) needs every rank's, on every node, and what each node's tier holds. So each
node offers, per epoch, one **blob**: its ranks' orders as file numbers (this epoch's and the
next), its tier's capacity and residents, and the epoch its homes were fixed from (-1: none yet).
The blob is made once per epoch and set of ranks (the residents are those of its first making),
so that every node that gathers the same ranks plans from the same bytes.

The blobs travel over the cluster's link as requests for numbers past every file number
(``CONTROL``): ``CONTROL + 2e`` answers 8 bytes, the length of the node's blob of epoch ``e`` (0:
none yet), ``CONTROL + 2e + 1`` the blob. ``HOMES`` answers the homes a node plans with (8 bytes,
the epoch they came from, then 4 per file). The format is a fixed header, a JSON description and
little-endian int64 arrays; nothing is pickled. A blob that does not parse is refused (treated as
not offered), never trusted.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .numbering import Numbered

CONTROL = 1 << 40        # request numbers from here on are not files
HOMES = CONTROL - 1      # the homes a node plans with
MAGIC, VERSION = b"CVNORDR1", 1
_HEAD = struct.Struct("<8sII")   # magic, version, length of the JSON description
GATHER_WAIT = 20.0       # seconds a node waits for every node's orders of an epoch before it plans alone
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


def orders_number(epoch: int, body: bool) -> int:
    """The request number of a node's blob of ``epoch`` (``body``) or of its length."""
    return CONTROL + 2 * int(epoch) + int(bool(body))


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
            "capacity": int(o.capacity), "basis": int(o.basis), "ranks": ranks,
            "lengths": [int(len(a)) for a in arrays]}
    text = json.dumps(desc, separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, VERSION, len(text)) + text + b"".join(a.tobytes() for a in arrays)


def decode(blob: bytes) -> NodeOrders:
    """A blob back (ValueError naming what is wrong, for one that is not one of this version)."""
    if len(blob) < _HEAD.size:
        raise ValueError(f"a node's orders of {len(blob)} bytes: shorter than the header")
    magic, version, n = _HEAD.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a node's orders of version {VERSION} ({magic!r}, {version})")
    try:
        desc = json.loads(blob[_HEAD.size:_HEAD.size + n])
        ranks, lengths = [int(r) for r in desc["ranks"]], [int(x) for x in desc["lengths"]]
        node, epoch, world = int(desc["node"]), int(desc["epoch"]), int(desc["world_size"])
        capacity, basis = int(desc["capacity"]), int(desc["basis"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"a node's orders with a bad description: {e}") from e
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
        if len(x.counts) and int(x.counts.min()) < 0 or int(x.counts.sum()) > len(x.files) \
                or int(x.next_counts.sum()) > len(x.next_files):
            raise ValueError(f"rank {r}'s order counts more files than it lists")
    residents = dict(zip(arrays[-2].tolist(), arrays[-1].tolist()))
    return NodeOrders(node, epoch, world, capacity, numbered, residents, basis)


def length_answer(blob: bytes | None) -> bytes:
    """The 8-byte answer to a request for a blob's length (0: none yet)."""
    return (0 if blob is None else len(blob)).to_bytes(8, "little")


def homes_answer(homes: np.ndarray, basis: int) -> bytes:
    return int(basis).to_bytes(8, "little", signed=True) + np.asarray(homes, "<u4").tobytes()


def homes_of(answer: bytes | None, num_files: int) -> tuple[np.ndarray, int] | None:
    """``(homes, basis)`` from an answer to ``HOMES``, or None (no answer, or not one)."""
    if answer is None or len(answer) != 8 + 4 * num_files:
        return None
    basis = int.from_bytes(answer[:8], "little", signed=True)
    return np.frombuffer(answer, "<u4", num_files, 8).astype(np.int32), basis


def gather(fetch: Callable[[int, int, int], bytes | None], node: int, nodes: int, epoch: int, mine: NodeOrders,
           stop: Callable[[], bool], wait: float = GATHER_WAIT) -> list[NodeOrders] | None:
    """Every node's orders of ``epoch`` (``mine`` for this node), asked of each peer through
    ``fetch(peer, number, size)`` round after round until the nodes' ranks together are every rank
    of the world once; None if that does not happen within ``wait`` seconds (a peer that is gone,
    or whose samplers are on another epoch), or at ``stop()``."""
    got: dict[int, NodeOrders] = {node: mine}
    deadline = time.monotonic() + wait
    while True:
        for peer in range(nodes):
            if peer == node:
                continue
            o = _ask(fetch, peer, epoch)
            if o is not None and o.node == peer and o.epoch == epoch:
                got[peer] = o   # (asked again each round: its samplers may publish more ranks)
        if len(got) == nodes:
            ranks = [r for o in got.values() for r in o.ranks]
            worlds = {o.world_size for o in got.values()}
            if len(worlds) == 1 and sorted(ranks) == list(range(worlds.pop())):
                return [got[n] for n in range(nodes)]
        if stop() or time.monotonic() > deadline:
            return None
        time.sleep(GATHER_EVERY)


def _ask(fetch, peer: int, epoch: int) -> NodeOrders | None:
    size = fetch(peer, orders_number(epoch, False), 8)
    n = 0 if size is None else int.from_bytes(size, "little")
    if not n:
        return None
    blob = fetch(peer, orders_number(epoch, True), n)   # (None if it changed in between: asked again)
    if blob is None:
        return None
    try:
        return decode(blob)
    except ValueError:
        return None
