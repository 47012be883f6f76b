"""A thread lock that a forked child gets afresh.

A process forked while another of its threads holds a ``threading.Lock`` inherits the lock held,
with no thread left to let it go: the child's first ``with lock`` waits for ever. The Loader forks
its readers while threads may run (a cluster's peer service, a framework's), and a reader that
hung that way after saying it was ready would hold its epoch for good. Locks that a reader may
take on objects it inherits are ``ForkSafeLock``s: every one is replaced in the child at the fork
(``os.register_at_fork``), before any of its code runs.
"""

from __future__ import annotations

import os
import threading
import weakref

_ALL: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


class ForkSafeLock:
    """A ``threading.Lock`` (``with``, ``acquire``, ``release``) that is free again in a forked child."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _ALL.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for lock in list(_ALL):
        lock._renew()


os.register_at_fork(after_in_child=_after_fork_in_child)
