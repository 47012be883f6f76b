"""The mount's policies without a sampler (plan/unplanned.py) and their simulation: homes spread
evenly and computed alike everywhere, a file read from the store once while its home has room,
the least recently read across the cluster evicted first. Every check has a negative control."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.plan.unplanned import STORE, HomesLRU, ReadThrough, hash_homes
from clairvoyant.sim import Hardware, Job, dataset_sizes
from clairvoyant.sim.policies import make_policy


def test_homes_are_balanced_stable_and_depend_on_the_salt():
    h = hash_homes(100_000, 4)
    counts = np.bincount(h, minlength=4)
    assert counts.min() > 24_000 and counts.max() < 26_000
    assert np.array_equal(h, hash_homes(100_000, 4))          # the same on every node
    assert np.array_equal(h[:1000], hash_homes(1000, 4))      # a file's home is its own, not the count's
    other = hash_homes(100_000, 4, salt=1)
    assert (other != h).mean() > 0.7                          # control: another salt, other homes
    assert not np.array_equal(h % 2, np.arange(100_000) % 2)  # control: not the file number's parity
    with pytest.raises(ValueError):
        hash_homes(10, 0)


def test_a_file_is_read_from_the_store_by_its_home_once_and_then_served_by_it():
    homes = np.array([0, 1, 1, 0])
    c = HomesLRU(homes, [100, 100], np.full(4, 10))
    assert c.read(0, 1) == (STORE, True, ())   # node 0 reads file 1: the store, kept at node 1
    assert c.read(1, 1).by == 1                 # its home now serves it, to itself...
    assert c.read(0, 1).by == 1                 # ...and to a peer
    assert c.read(1, 0) == (STORE, True, ())
    assert c.read(0, 0).by == 0                 # file 0's home is node 0: its own tier
    assert c.holds(0) and c.holds(1) and not c.holds(2)
    # control: one tier per node, each reading on its own, reads file 1 from the store twice
    t0, t1 = ReadThrough(100, np.full(4, 10)), ReadThrough(100, np.full(4, 10))
    assert t0.read(0, 1).by == STORE and t1.read(1, 1).by == STORE


def test_the_least_recently_read_across_the_cluster_goes_first():
    homes = np.zeros(4, np.int32)   # all at node 0, room for two
    c = HomesLRU(homes, [20, 20], np.full(4, 10))
    c.read(0, 0)
    c.read(1, 1)
    c.read(1, 0)                     # a peer's read makes file 0 the most recent
    got = c.read(0, 2)
    assert got == (STORE, True, (1,))   # file 1 goes, not file 0
    assert c.holds(0) and c.holds(2) and not c.holds(1)
    # control: without that peer read, file 0 would have gone
    d = HomesLRU(homes, [20, 20], np.full(4, 10))
    d.read(0, 0)
    d.read(1, 1)
    assert d.read(0, 2).evicted == (0,)


def test_read_through_keeps_while_there_is_room_and_for_good():
    t = ReadThrough(25, np.full(5, 10))
    assert [t.read(0, f).kept for f in range(4)] == [True, True, False, False]
    assert t.read(0, 0).by == 0 and t.read(0, 2).by == STORE   # kept, and never turned over
    assert HomesLRU(np.zeros(5, np.int32), [25], np.full(5, 10)).read(0, 4).kept   # control: a home evicts


def test_a_file_larger_than_its_homes_tier_is_read_from_the_store_and_kept_nowhere():
    c = HomesLRU(np.array([0, 0]), [15], np.array([10, 20]))
    assert c.read(0, 1) == (STORE, False, ())
    assert c.read(0, 0).kept and not c.holds(1)


def _store_ratio(name, nodes=4, capacity=0.3, epochs=4):
    sizes = dataset_sizes(3200, 29000, seed=0)
    job = Job(nodes=nodes, gpus=1, batch_size=32, step_time=0.0, epochs=epochs, seed=0)
    hw = Hardware(local_capacity=int(capacity * (sizes + 32).sum()))
    runs = list(make_policy(name, job, sizes, hw).epochs())
    for t in runs:   # every access served once, by someone
        assert (t.local_n + t.peer_n + t.store_n == t.samples).all()
        assert t.peer_n.sum() == t.sent_n.sum()
    return sum(int(t.store_b.sum()) for t in runs) / sizes.sum(), runs


def test_the_issues_four_nodes_read_the_store_about_once_with_a_cluster_and_without_a_sampler():
    """Issue 23's setting: 4 nodes of 30% each, a quarter of every shuffled epoch each, 4 epochs.
    The cluster without a sampler reads the store once per file; node by node, the mount keeps
    its first 30% and reads about 0.7 of the data set again every epoch."""
    lru, runs = _store_ratio("cluster-lru")
    assert lru <= 1.0 + 1e-9
    assert runs[1].store_n.sum() == 0 and runs[1].peer_n.sum() > 2 * runs[1].local_n.sum()   # 3 of 4 at a peer
    alone, _ = _store_ratio("read-through")
    assert alone > 2.5   # control: node by node, today's mount without a sampler
    assert _store_ratio("cluster-lru", capacity=0.15)[0] > 2.0   # control: a cluster that holds 60% re-reads


def test_a_keep_that_failed_is_forgotten_and_frees_its_room():
    c = HomesLRU(np.zeros(3, np.int32), [20], np.full(3, 10))
    c.read(0, 0)
    c.read(0, 1)
    c.forget(1)                         # its entry could not be written after all
    assert not c.holds(1) and c.read(0, 2).evicted == ()   # room for file 2 without evicting file 0
    d = HomesLRU(np.zeros(3, np.int32), [20], np.full(3, 10))
    d.read(0, 0)
    d.read(0, 1)
    assert d.read(0, 2).evicted == (0,)   # control: not forgotten, file 0 gives way
