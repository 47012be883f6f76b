"""MECHANISM: which processes use a tier now, and what the first of them found there.

Every process that uses a tier holds a shared ``flock`` on ``<tier>.session.lock``;
``<tier>.init.lock`` serialises joining and leaving. Both live in the local
tier's directory, which is never removed, also for the RAM tier, which its last
user removes. The first process to join (no
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

from ..nodeio.fileio import write_atomically
from .local import LocalStore


class Session:
    def __init__(self, lock_root: str, name: str, setup: Callable[[], LocalStore],
                 on_first: Callable[[LocalStore], dict[str, int]]) -> None:
        """Join the session of tier ``name`` whose lock files live in ``lock_root`` (a directory that
        is never removed); ``setup()`` opens the tier's store (under the join lock, so that it never
        races with the last user removing it), ``on_first(store)`` returns the inventory (entry
        name -> bytes) when this process is the first."""
        root = lock_root
        self._inventory_path = os.path.join(root, f"{name}.inventory.json")
        self._init_fd = os.open(os.path.join(root, f"{name}.init.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._session_fd = os.open(os.path.join(root, f"{name}.session.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self.first = False
        fcntl.flock(self._init_fd, fcntl.LOCK_EX)
        try:
            self.store = setup()
            try:
                fcntl.flock(self._session_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.first = True
            except BlockingIOError:
                pass
            if self.first:
                inventory = on_first(self.store)
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


def in_use(lock_root: str, name: str) -> bool:
    """Whether some process holds the tier ``name`` whose locks are in ``lock_root`` now."""
    path = os.path.join(lock_root, f"{name}.session.lock")
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
