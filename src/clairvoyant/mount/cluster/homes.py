"""MECHANISM: a cluster node's homes (each file's home node) where its daemon and a later mount find
them: the homes file the daemon maps (it asks each file's home by it), and a copy beside the tier
(``HOMES_FILE``, written whole under a temporary name and renamed), so that a mount started again
plans with the job's homes (mount/cluster/node.py); the same bytes answer a peer that asks for
them."""

from __future__ import annotations

import os

import numpy as np

from ..listing import publish_bytes

HOMES_FILE = "cluster-homes"   # beside the tier: the planned homes, for a mount started again
_HEAD = 24   # the encoding's header: the epoch the homes came from, the nodes, the files (<i8 each)


def tell_daemon(mount, homes: np.ndarray) -> None:
    """``homes`` into the homes file the mount's daemon maps (it asks each file's home by it)."""
    path = getattr(mount, "homes_path", None)
    if path:
        with open(path, "r+b") as f:
            os.pwrite(f.fileno(), np.asarray(homes, "<u4").tobytes(), 0)


def encode_homes(homes: np.ndarray, basis: int, nodes: int) -> bytes:
    """The homes as they are kept beside the tier and sent to a peer (``HOMES``,
    mount/cluster/orders.py): a header of the epoch they came from, the nodes and the files (<i8
    each), then 4 bytes per file."""
    return np.array([int(basis), int(nodes), len(homes)], "<i8").tobytes() + np.asarray(homes, "<u4").tobytes()


def encoded_size(num_files: int) -> int:
    """Bytes of ``encode_homes``'s encoding of this many files' homes."""
    return _HEAD + 4 * num_files


def decode_homes(blob: bytes | None, num_files: int, nodes: int) -> tuple[np.ndarray, int] | None:
    """``(homes, basis)`` from ``encode_homes``'s bytes for this many files and nodes, else None
    (none, or not of this listing and cluster)."""
    if blob is None or len(blob) != encoded_size(num_files):
        return None
    basis, n, files = np.frombuffer(blob, "<i8", 3).tolist()
    homes = np.frombuffer(blob, "<u4", num_files, _HEAD)
    if n != nodes or files != num_files or basis < 0 or (num_files and int(homes.max()) >= nodes):
        return None
    return homes.astype(np.int32), int(basis)


def save_homes(path: str, homes: np.ndarray, basis: int, nodes: int) -> None:
    """The planned homes beside the tier, written whole under a temporary name and renamed."""
    publish_bytes(path, encode_homes(homes, basis, nodes))


def load_homes(path: str, num_files: int, nodes: int) -> tuple[np.ndarray, int] | None:
    """``(homes, basis)`` kept by ``save_homes`` for this many files and nodes, else None."""
    try:
        with open(path, "rb") as f:
            return decode_homes(f.read(), num_files, nodes)
    except OSError:
        return None
