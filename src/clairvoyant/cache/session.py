"""MECHANISM: which processes use a tier now, and what the first of them found there.

Every process that uses a tier holds a shared ``flock`` on its ``session.lock``;
``init.lock`` serialises joining and leaving. The first process to join (no
one else holds the session lock) counts the bytes on disk into the ledger,
removes stale or foreign entries, and writes the inventory: the entries
present and the session's start time, which every later process of the same
session reads, so that all ranks of the node plan from the same picture. The
last process to leave runs the tier's cleanup (the RAM tier removes itself).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Callable

from ..fileio import write_atomically
from .local import LocalStore


class Session:
    def __init__(self, store: LocalStore, on_first: Callable[[LocalStore], dict[str, int]]) -> None:
        """Join; ``on_first(store)`` returns the inventory (entry name -> bytes) when this is the first."""
        self.store = store
        root = store.root
        self._inventory_path = os.path.join(root, "inventory.json")
        self._init_fd = os.open(os.path.join(root, "init.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._session_fd = os.open(os.path.join(root, "session.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self.first = False
        fcntl.flock(self._init_fd, fcntl.LOCK_EX)
        try:
            try:
                fcntl.flock(self._session_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.first = True
            except BlockingIOError:
                pass
            if self.first:
                inventory = on_first(store)
                self.started_ns = time.time_ns()
                doc = {"started_ns": self.started_ns, "entries": inventory}
                blob = json.dumps(doc).encode()
                write_atomically(self._inventory_path, self._inventory_path + f".{os.getpid()}.tmp",
                                 lambda fd: os.write(fd, blob))
            fcntl.flock(self._session_fd, fcntl.LOCK_SH)
            with open(self._inventory_path) as f:
                doc = json.load(f)
            self.started_ns = int(doc["started_ns"])
            self.inventory: dict[str, int] = doc["entries"]
        except BaseException:
            fcntl.flock(self._init_fd, fcntl.LOCK_UN)
            self._close_fds()
            raise
        fcntl.flock(self._init_fd, fcntl.LOCK_UN)

    def _close_fds(self) -> None:
        for fd in (self._init_fd, self._session_fd):
            if fd >= 0:
                os.close(fd)
        self._init_fd = self._session_fd = -1

    def leave(self, on_last: Callable[[LocalStore], None] | None = None) -> None:
        if self._session_fd < 0:
            return
        fcntl.flock(self._init_fd, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._session_fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(self._session_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
            except BlockingIOError:
                last = False
            if last and on_last is not None:
                on_last(self.store)
        finally:
            self._close_fds()   # closing drops both locks


def in_use(root: str) -> bool:
    """Whether some process holds the tier at ``root`` now."""
    path = os.path.join(root, "session.lock")
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
