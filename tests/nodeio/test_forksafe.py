"""nodeio/forksafe.py: a lock another thread held at a fork is free in the child."""

from __future__ import annotations

import os
import threading

import pytest

from clairvoyant.nodeio.forksafe import ForkSafeLock


def _child_exit_while_held(held, in_child) -> int:
    """The exit status of a child forked while another thread is inside ``held()`` (a context
    manager), the child running ``in_child()`` (its exit status)."""
    taken, go = threading.Event(), threading.Event()

    def hold() -> None:
        with held():
            taken.set()
            go.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    taken.wait(10)
    pid = os.fork()
    if pid == 0:   # the child: one thread, the lock as the fork left it
        os._exit(in_child())
    go.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _held_at_fork(lock) -> bool:
    """Whether a child forked while another thread holds ``lock`` can take it (within 2 s)."""
    return _child_exit_while_held(lambda: lock, lambda: 0 if lock.acquire(timeout=2) else 1) == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # (fork with threads: what this tests)
def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child():
    assert _held_at_fork(ForkSafeLock())
    assert not _held_at_fork(threading.Lock())   # control: a plain lock stays held in the child


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_emulated_store_serves_a_child_forked_while_a_thread_held_its_lock(tmp_path):
    """The hang a review found: a cluster's peer-service thread held the emulated store's lock (a
    version check) when the Loader forked its readers; a reader's first read waited for ever.
    (The store's flock still excludes across processes: the child waits until the parent's
    thread lets go, then reads.)"""
    import signal

    from clairvoyant.testing import EmulatedStore, make_dataset
    store = EmulatedStore(make_dataset(str(tmp_path / "d"), 4, size=8), open_latency=0.0, read_latency=0.0,
                          state_dir=str(tmp_path / "state"))

    def in_child() -> int:
        signal.alarm(5)   # a child stuck on the lock dies of it: exit status -14
        store.counters()
        return 0

    assert _child_exit_while_held(store._locked, in_child) == 0
