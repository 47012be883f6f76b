"""The one counter set (tune/counters.py): names declared once, in namespaces, shown by the same
short names by both front doors (issue 31). Controls: an undeclared name is refused."""

from __future__ import annotations

import threading

import pytest

from clairvoyant import Loader
from clairvoyant.mount.counters import Counters as MountCounters
from clairvoyant.tune.counters import NAMES, Counters, namespace


def test_every_counter_is_declared_with_what_it_counts_in_a_namespace():
    assert all(n.count(".") == 1 and n.split(".")[0] in ("stage", "tier", "mount", "peer", "cluster") and NAMES[n].strip()
               for n in NAMES)
    assert not set(namespace("tier")) & set(namespace("mount"))   # a short name means one counter
    assert namespace("peer") and namespace("cluster")


def test_the_links_count_in_the_peer_namespace_and_refuse_undeclared_names():
    """The mounts' links and the peer service count through the one set (``peer.*``)."""
    from clairvoyant.testing.loopback import LoopbackLink
    hub: dict = {}
    a, b = LoopbackLink(hub, 0, 2), LoopbackLink(hub, 1, 2)
    b.start(lambda n: b"x" * 3 if n == 1 else None)
    assert a.fetch(1, 1, 3, 1.0) == b"xxx" and a.fetch(1, 2, 3, 1.0) is None
    got = a.counters()
    assert sorted(got) == sorted(namespace("peer"))
    assert (got["fetches"], got["hits"], got["misses"]) == (2, 1, 1)
    with pytest.raises(KeyError):   # control: a name declared nowhere
        a._c.add("fetched")


def test_the_loaders_tier_counters_are_the_tier_namespace(dataset, tmp_path):
    with Loader(dataset, batch_size=16, local_dir=str(tmp_path), num_workers=1, output="numpy") as ld:
        list(ld)
        tiers = ld.stats()["tiers"]
    assert sorted(tiers) == sorted(namespace("tier"))
    assert tiers["staged_local"] + tiers["staged_ram"] == 96   # every sample of the data set, once


def test_the_mount_shows_the_tier_events_it_moved_by_the_same_names(tmp_path):
    """``staged_local``: one event, one name, in stats()["tiers"] and in mount --stats."""
    c = MountCounters(str(tmp_path / "staging.json"))
    c.add(staged_local=2, staged_bytes=10, present=1)
    c.new_plan(epoch=3, ranks=2, sequence=7, following=1)
    snap = c.snapshot()
    assert snap["staged_local"] == 2 and snap["present"] == 1 and snap["plans"] == 1 and snap["epoch"] == 3
    assert "bypassed" not in snap   # tier counters the mount never moved are not shown
    with pytest.raises(KeyError, match="no counter"):   # control: a name declared nowhere
        c.add(staged=1)


def test_adds_from_many_threads_are_all_counted_and_unknown_names_refused():
    c = Counters(["tier"])
    space = c.space("tier")

    def work():
        for _ in range(2000):
            space.add("evictions")
            space.add_many(fetches=1, fetch_seconds=0.5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert space.get("evictions", "fetches", "fetch_seconds") == (8000, 8000, 4000.0)
    assert space.evictions == 8000 and c.snapshot()["tier.evictions"] == 8000
    with pytest.raises(KeyError):
        space.add("evicted")   # control: a mount counter's name is not a tier counter
    with pytest.raises(AttributeError):
        space.no_such_counter
