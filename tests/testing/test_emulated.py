"""The emulated slow store charges what it says and counts every operation."""

from __future__ import annotations

import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from clairvoyant import ConfigError
from clairvoyant import manifest as manifest_mod
from clairvoyant.testing import EmulatedStore


@pytest.fixture
def store(dataset, tmp_path):
    s = EmulatedStore(dataset, open_latency=0.02, read_latency=0.005, bandwidth=1e6, max_inflight=2,
                      state_dir=str(tmp_path))
    s.reset()
    return s


def test_counts_opens_reads_bytes_and_listings(store, dataset):
    man = manifest_mod.build(store)
    assert store.counters().listings == 5  # the root and four class directories
    data = store.read(man.keys[0])
    c = store.counters()
    assert (c.opens, c.reads, c.bytes) == (6, 1, len(data))
    with open(f"{dataset}/{man.keys[0]}", "rb") as f:
        assert data == f.read()


def test_a_read_costs_at_least_its_latency_and_transfer(store):
    key = next(store.scan())[0]
    t0 = time.monotonic()
    data = store.read(key)
    took = time.monotonic() - t0
    assert took >= 0.02 + 0.005 + len(data) / 1e6 - 1e-3  # sleeping can only add time


def test_at_most_max_inflight_requests(store):
    keys = [k for k, _ in store.scan()][:12]
    store.reset()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(store.read, keys))
    assert store.counters().peak_inflight == 2  # eight readers, two served at once


def test_state_is_shared_by_copies_in_other_processes(store):
    clone = pickle.loads(pickle.dumps(store))
    clone.read(next(clone.scan())[0])
    assert store.counters().reads == 1


def test_bad_settings(dataset):
    with pytest.raises(ConfigError):
        EmulatedStore(dataset, bandwidth=0)
    with pytest.raises(ConfigError):
        EmulatedStore(dataset, max_inflight=0)


def test_first_use_from_many_threads_at_once_does_not_deadlock(store, monkeypatch):
    """Regression: two threads opening the shared state at once held the lock on a file
    description that was then replaced, and every later request waited for ever. A slow
    open widens the window that the race needs."""
    import threading
    real_open = os.open

    def slow_open(path, *args, **kwargs):
        if str(path).endswith(".state"):
            time.sleep(0.05)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", slow_open)
    keys = [k for k, _ in store.scan()][:16]
    for _ in range(5):
        fresh = pickle.loads(pickle.dumps(EmulatedStore(store.root, open_latency=0.0, read_latency=0.0,
                                                        state_dir=os.path.dirname(store.state_path))))
        start = threading.Barrier(len(keys))

        def read(key, s=fresh, b=start):
            b.wait()
            s.read(key)

        threads = [threading.Thread(target=read, args=(k,), daemon=True) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "emulated store deadlocked"
