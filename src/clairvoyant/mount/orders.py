"""The orders samplers publish to a mount, through the node's local directory (never pickled).

A sampler of rank r writes ``<orders>/rank-<r>.order.json`` once per epoch: its rank, the world
size, the epoch, the seed and, in the order it will yield its indices, the files behind each index
as paths relative to the mount (``groups``: one list per index, e.g. an image and its mask), and
the same for the epoch after (``following``; empty if unknown), so that the mount can weigh next
uses across the epoch boundary and stage the next epoch once this one is staged. As it
yields, it writes ``rank-<r>.progress.json`` (the epoch and how many indices it has handed out),
every ``PROGRESS_EVERY`` indices. Both are written under a temporary name and renamed: a reader
sees a whole file or the previous one. ``<orders>`` is named by the mount's ``.clairvoyant.json``.
"""

from __future__ import annotations

import json
import os
import re
from typing import NamedTuple

from ..errors import ConfigError
from .listing import publish_bytes

VERSION = 1
PROGRESS_EVERY = 32
WATCH_EVERY = 0.01   # seconds between the mount's looks at the orders directory and the progress files
_ORDER = re.compile(r"^rank-(\d+)\.order\.json$")


class PublishedOrder(NamedTuple):
    rank: int
    world_size: int
    epoch: int
    seed: int
    groups: list[list[str]]   # per yielded index, the files behind it (relative to the mount)
    stamp: int                # when it was written (ns): a new publication of the same epoch differs
    following: list[list[str]] = []   # the same for the next epoch (empty: not known)


def order_path(orders: str, rank: int) -> str:
    return os.path.join(orders, f"rank-{rank}.order.json")


def progress_path(orders: str, rank: int) -> str:
    return os.path.join(orders, f"rank-{rank}.progress.json")


def publish_order(orders: str, *, rank: int, world_size: int, epoch: int, seed: int,
                  groups: list[list[str]], following: list[list[str]] | None = None) -> str:
    doc = {"version": VERSION, "rank": int(rank), "world_size": int(world_size), "epoch": int(epoch),
           "seed": int(seed), "pid": os.getpid(), "stamp": time_ns(), "groups": groups,
           "following": following or []}
    path = order_path(orders, rank)
    publish_bytes(path, json.dumps(doc, separators=(",", ":")).encode())
    publish_progress(orders, rank, epoch, 0)
    return path


def publish_progress(orders: str, rank: int, epoch: int, position: int) -> None:
    blob = json.dumps({"version": VERSION, "epoch": int(epoch), "position": int(position)}).encode()
    publish_bytes(progress_path(orders, rank), blob)


def time_ns() -> int:
    import time
    return time.time_ns()


def read_order(path: str) -> PublishedOrder:
    """A published order, checked field by field (ConfigError naming the file otherwise)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the published order {path}: {e}") from e
    try:
        if doc["version"] != VERSION:
            raise ValueError(f"version {doc['version']}")
        groups, following = doc["groups"], doc.get("following", [])
        for name, g in (("groups", groups), ("following", following)):
            if not isinstance(g, list) or not all(isinstance(x, list) and all(isinstance(k, str) for k in x)
                                                  for x in g):
                raise ValueError(f"{name} is not a list of lists of paths")
        return PublishedOrder(int(doc["rank"]), int(doc["world_size"]), int(doc["epoch"]), int(doc["seed"]),
                              groups, int(doc["stamp"]), following)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path} is not a published order of this version ({e}): delete it") from e


def read_progress(orders: str, rank: int) -> tuple[int, int]:
    """``(epoch, position)`` the sampler of ``rank`` reported last, or (-1, 0)."""
    try:
        with open(progress_path(orders, rank), "rb") as f:
            doc = json.loads(f.read())
        return int(doc["epoch"]), int(doc["position"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1, 0


def published(orders: str) -> dict[int, str]:
    """rank -> path of every published order in ``orders``."""
    try:
        names = os.listdir(orders)
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        m = _ORDER.match(name)
        if m:
            out[int(m.group(1))] = os.path.join(orders, name)
    return out
