"""Shard-granular reads: the plan (plan/ranges.py) and the stager reading a range of tar shards
whole. Every check has a negative control that must fail."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.pack.tar import pack
from clairvoyant.plan.ranges import Ranges, whole_reads
from clairvoyant.plan.residency import simulate_epoch
from clairvoyant.plan.residents import Residents
from clairvoyant.source import TarShardSource
from clairvoyant.source import shards as shards_mod
from conftest import wait_until


def _plan(seq, sizes, capacity, residents, ranges, **kw):
    res = simulate_epoch(seq, seq, sizes, capacity, residents)
    return res, whole_reads(seq, res.hit, sizes, capacity, Residents.of(residents), res.residents_after, ranges, **kw)


def test_each_range_is_read_whole_at_its_first_miss_and_its_other_samples_become_hits():
    rng = np.random.default_rng(0)
    n, per = 60, 6
    of = np.repeat(np.arange(n // per), per).astype(np.int32)
    sizes = np.full(n, 1000, np.int64)
    ranges = Ranges(of=of, nbytes=np.full(n // per, per * 1100, np.int64))
    seq = rng.permutation(n)
    res, w = _plan(seq, sizes, int(sizes.sum()), {}, ranges)
    assert w is not None
    # one whole read per range, at the first access of any of its samples
    assert int(w.whole.sum()) == n // per
    firsts = {}
    for i, s in enumerate(seq.tolist()):
        firsts.setdefault(int(of[s]), i)
    assert sorted(np.flatnonzero(w.whole).tolist()) == sorted(firsts.values())
    assert sorted(w.ranges.tolist()) == list(range(n // per))
    assert [int(of[seq[i]]) for i in sorted(firsts.values())] == w.ranges.tolist()   # in read order
    # every other access is now a hit; the residency plan alone had a miss per sample
    assert int((~w.hit).sum()) == n // per and int((~res.hit).sum()) == n
    assert dict(w.residents_after) == {i: 1000 for i in range(n)}
    # negative control: the unchanged plan is not this one
    assert not np.array_equal(w.hit, res.hit)


def test_no_range_is_read_whole_where_the_tier_does_not_hold_the_data_set():
    n, per = 60, 6
    of = np.repeat(np.arange(n // per), per).astype(np.int32)
    sizes = np.full(n, 1000, np.int64)
    ranges = Ranges(of=of, nbytes=np.full(n // per, per * 1000, np.int64))
    seq = np.random.default_rng(1).permutation(n)
    _, w = _plan(seq, sizes, int(sizes.sum()) - 1, {}, ranges)
    assert w is None
    # control: one byte more and it reads ranges whole
    assert _plan(seq, sizes, int(sizes.sum()), {}, ranges)[1] is not None


def test_a_range_is_read_whole_only_where_it_pays():
    n, per = 12, 4
    of = np.repeat(np.arange(n // per), per).astype(np.int32)
    sizes = np.full(n, 1000, np.int64)
    seq = np.arange(n)
    # range 0: 3 of its 4 samples are resident: one absent sample is never worth a whole read
    residents = {0: 1000, 1: 1000, 2: 1000}
    # range 1 is small (4,000 bytes); range 2 holds a 1 MB gap: reading it whole costs more than
    # its 4 samples read one by one at 100 bytes a request
    nbytes = np.array([4000, 4000, 1_004_000], np.int64)
    _, w = _plan(seq, sizes, 10**9, residents, Ranges(of=of, nbytes=nbytes), request_bytes=100)
    assert w is not None and w.ranges.tolist() == [1]
    assert w.whole.tolist() == [False] * 4 + [True, False, False, False] + [False] * 4
    # control: where a request costs as much as 1 MB of transfer, range 2 pays too
    _, w2 = _plan(seq, sizes, 10**9, residents, Ranges(of=of, nbytes=nbytes), request_bytes=1 << 20)
    assert w2.ranges.tolist() == [1, 2]


def test_ranges_are_checked():
    with pytest.raises(ValueError, match="outside"):
        Ranges(of=np.array([0, 2], np.int32), nbytes=np.array([1, 1], np.int64))
    r = Ranges(of=np.array([1, 0, 1], np.int32), nbytes=np.array([5, 5], np.int64))
    order, cuts = r.members()
    assert [order[cuts[k]:cuts[k + 1]].tolist() for k in range(2)] == [[1], [0, 2]]


@pytest.fixture
def packed(dataset, tmp_path):
    res = pack(dataset, tmp_path / "packed", shard_size="24KiB")
    assert res.shards >= 10
    return res.dst


def test_the_source_cuts_shards_into_ranges_that_read_back_each_sample(packed):
    src = TarShardSource(packed)
    keys = [k for k, _ in src.scan()]
    r = Ranges(*src.sample_ranges(keys))
    assert r.count == len(src.paths)   # small shards: one range each
    order, cuts = r.members()
    for k in range(r.count):
        members = [keys[i] for i in order[cuts[k]:cuts[k + 1]].tolist()]
        got, mtime = src.read_range(members[::-1])   # any order, any subset of the range
        assert got == [src.read(key) for key in members[::-1]]
        assert mtime == src.index.shards[int(src.index.shard[src.index.find(members[0])])][2]
    # pieces of at most about `span` bytes: more ranges, still every sample in one
    small = Ranges(*src.sample_ranges(keys, span=4096))
    assert small.count > r.count and len(small.of) == len(keys)
    # negative control: samples of two shards are not one range
    with pytest.raises(ValueError, match="more than one shard"):
        src.read_range([keys[int(order[cuts[0]])], keys[int(order[cuts[1]])]])


def _epochs(packed, local, count, epochs=2, **kw):
    """Each epoch's sample digests (in order) and the preads of the shards it took."""
    calls: list[int] = []
    orig = shards_mod._pread
    lock = threading.Lock()

    def counting(fd, n, off):
        with lock:
            calls.append(n)
        return orig(fd, n, off)

    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731
    out = []
    shards_mod._pread = counting
    try:
        with Loader(packed, batch_size=8, local_dir=str(local), seed=3, decode=digest, num_workers=1, **kw) as L:
            for e in range(epochs):
                L.set_epoch(e)
                n0 = len(calls)
                out.append(([bytes(x) for xb, _ in L for x in xb], len(calls) - n0))
            count.update(L.stats()["tiers"])
    finally:
        shards_mod._pread = orig
    return out


def test_the_native_threads_read_each_sample_once_in_need_order(packed, dataset, tmp_path, monkeypatch):
    """Where the native staging threads carry the samples (a tar shard on a POSIX file system: the
    shard kept open, each sample one pread, as many at once as the store takes), no range pays
    (plan/ranges.py, issue 39): every sample is staged once by those threads, in the order the
    readers need them, none through Python's reads of the shards. Control: without the native
    threads the same epoch reads ranges whole."""
    from clairvoyant.stage.native_files import available
    if not available():
        pytest.skip("the native stager is not built here")
    stats: dict = {}
    (e0, reads0), (e1, reads1) = _epochs(packed, tmp_path / "local", stats)
    assert stats["range_reads"] == 0 and stats["staged_local"] == 96 and reads0 == 0 and reads1 == 0
    assert len(set(e0)) == 96
    monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")
    python: dict = {}
    (p0, preads0), _ = _epochs(packed, tmp_path / "python", python)
    assert p0 == e0 and python["range_reads"] >= 1 and preads0 > 0


def test_the_first_epoch_reads_each_shard_once_where_the_tier_holds_the_data_set(packed, dataset, tmp_path,
                                                                                 monkeypatch):
    """Where Python's staging threads read the shards (no native threads: they cost CPU per
    request), ranges are read whole."""
    monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")
    shards = len(TarShardSource(packed).paths)
    stats: dict = {}
    (e0, reads0), (e1, reads1) = _epochs(packed, tmp_path / "local", stats)
    # each range read once at most; a range's first sample, and one its readers need before the
    # range's read is done, go on their own; every other sample is placed from its range's read.
    # (Where the staging threads reach all of a small range's samples on their own before its
    # read, that range is not read whole: a clean clone's run without the C helpers read 13 of 14.)
    assert 1 <= stats["range_reads"] <= shards and stats["missed_hits"] == 0
    assert stats["range_placed"] + stats["staged_local"] == 96
    assert stats["range_reads"] <= stats["staged_local"]
    # fewer reads than one per sample (the control below reads 96); how many fewer depends on how
    # many samples fall due while their range is read (each then read on its own: timing)
    assert reads0 == stats["range_reads"] + stats["staged_local"] < 96 and reads1 == 0
    assert stats["range_placed"] > 0
    # the same samples, in the same order, as the tree itself gives (per-sample shuffle kept)
    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731
    with Loader(dataset, batch_size=8, local_dir=str(tmp_path / "tree"), seed=3, decode=digest,
                num_workers=1) as tree:
        want = []
        for e in range(2):
            tree.set_epoch(e)
            want.append([bytes(x) for xb, _ in tree for x in xb])
    assert [e0, e1] == want and len(set(e0)) == 96
    # negative control: a tier that holds half of it reads per sample (a read per first access)
    half: dict = {}
    (h0, hreads0), _ = _epochs(packed, tmp_path / "half", half, local_capacity="50%")
    assert h0 == e0 and hreads0 == 96 and half["range_reads"] == 0


def test_a_failed_range_read_is_logged_and_its_samples_are_read_on_their_own(packed, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")   # ranges are read whole by Python's threads
    orig = TarShardSource.read_range
    failed = []

    def flaky(self, keys):
        if not failed:
            failed.append(keys[0])
            raise OSError(5, "Input/output error")
        return orig(self, keys)

    TarShardSource.read_range = flaky
    try:
        stats: dict = {}
        with caplog.at_level("WARNING", "clairvoyant"):
            (e0, reads), = _epochs(packed, tmp_path / "local", stats, epochs=1)
    finally:
        TarShardSource.read_range = orig
    shards = len(TarShardSource(packed).paths)
    assert len(failed) == 1   # the failure was injected (the control that the test tests something)
    assert len(e0) == 96 and len(set(e0)) == 96   # no sample lost, none twice
    assert any("whole failed" in r.getMessage() for r in caplog.records)
    # its samples: read alone; the failed range is not counted (another range whose samples the
    # staging threads all reach on their own before its read is not read whole either: timing)
    assert 1 <= stats["range_reads"] <= shards - 1 and stats["missed_hits"] >= 1
    assert stats["range_placed"] + stats["staged_local"] == 96
    assert reads == stats["range_reads"] + stats["staged_local"]


TWO_RANKS = textwrap.dedent("""
    import hashlib, json, sys, threading
    import numpy as np
    from clairvoyant import Loader
    from clairvoyant.source import shards as shards_mod
    rank = int(sys.argv[3])
    calls, lock, orig = [], threading.Lock(), shards_mod._pread
    def counting(fd, n, off):
        with lock:
            calls.append(n)
        return orig(fd, n, off)
    shards_mod._pread = counting
    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()
    out = {"epochs": []}
    with Loader(sys.argv[1], batch_size=4, local_dir=sys.argv[2], rank=rank, world_size=2, local_world_size=2,
                num_workers=1, seed=3, decode=digest) as ld:
        for e in range(2):
            ld.set_epoch(e)
            n0 = len(calls)
            got = [bytes(x).hex() for xb, _ in ld for x in xb]
            out["epochs"].append({"samples": got, "reads": len(calls) - n0})
        out["tiers"] = ld.stats()["tiers"]
    print(json.dumps(out))
""")


def test_the_ranks_of_a_node_read_each_range_once_between_them(packed, tmp_path, no_leaks):
    local = str(tmp_path / "l")
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, packed, local, str(r)], stdout=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    shards = len(TarShardSource(packed).paths)
    for e in range(2):   # every sample once per epoch across the two ranks
        both = outs[0]["epochs"][e]["samples"] + outs[1]["epochs"][e]["samples"]
        assert len(both) == 96 and len(set(both)) == 96
    reads0 = sum(o["epochs"][0]["reads"] for o in outs)
    t = {k: sum(o["tiers"][k] for o in outs) for k in ("range_reads", "range_placed", "staged_local", "local_hits")}
    assert t["range_reads"] == shards   # each range read once, by one of the two
    assert t["range_placed"] + t["staged_local"] == 96   # every sample placed once on the node
    assert reads0 == t["range_reads"] + t["staged_local"] < 96, (reads0, t)   # fewer than one per sample (timing)
    assert sum(o["epochs"][1]["reads"] for o in outs) == 0


def test_a_planned_hit_already_in_the_tier_never_waits_for_its_ranges_read(dataset, tmp_path, monkeypatch):
    """Found by review: a resident sample of a range whose whole read comes in a later batch waited
    for that read (with one thread: for ever behind itself) although it was in the tier all along. Control: an absent sample of the same range, after the read in need order,
    is placed by the read, not read on its own."""
    import time as _time

    from clairvoyant import manifest as manifest_mod
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.cache.node import open_tiers
    from clairvoyant.stage import engine
    from clairvoyant.stage.engine import RangeReader, Stager

    dst = pack(dataset, tmp_path / "one", shard_size="1MiB").dst   # one shard: one range
    src = TarShardSource(dst)
    man, _ = manifest_mod.obtain(src)
    node = open_tiers(src, np.asarray(man.sizes) + entry_size(0), local_dir=str(tmp_path / "local"),
                      local_capacity=None, ram=False)
    tiers = node.tiers
    try:
        rr = RangeReader(Ranges(*src.sample_ranges(man.keys)), src.read_range)
        assert rr.ranges.count == 1
        k0 = man.keys[0]
        assert tiers.local.put(k0, src.read(k0), 0, tiers.local_capacity) is not None   # resident already
        done: dict = {}
        st = Stager(src, tiers, man, threads=1, on_done=lambda b, j, out, *_: done.setdefault((b, j), (
            _time.monotonic(), out)), ranges=rr, due=lambda k: False)
        st.start()
        t0 = _time.monotonic()
        st.submit(0, [0], [True], [True], None, [False])   # a resident hit
        st.submit(1, [1], [False], [True], None, [True])   # the range's first miss: read whole after it
        st.submit(2, [2], [True], [True], None, [False])   # an absent sample of the range: a planned hit
        assert wait_until(lambda: len(done) == 3, 15), done
        st.close()
        assert done[(0, 0)][0] - t0 < 5 and done[(0, 0)][1].tier == "local"   # at once, from the tier
        assert done[(2, 0)][1].tier == "local" and not done[(2, 0)][1].fetched   # placed by the range's read
        c = tiers.counters.snapshot()
        assert c["range_early"] == 0 and c["range_reads"] == 1 and c["missed_hits"] == 0, c
    finally:
        node.tiers.close()


def test_a_sample_waiting_for_its_ranges_read_holds_no_staging_thread(dataset, tmp_path):
    """With one staging thread, a planned hit whose range is still being read (and not due) is set
    aside: a miss queued behind it is staged meanwhile, and the hit is placed by the range's read
    once it ends. Control: once its batch falls due (``advance``), the same kind of hit is read on
    its own before the range's read ends (``range_early``). Before, the thread waited on the
    range's read and the miss behind it waited too (its batch stalled for the whole read)."""
    import time as _time

    from clairvoyant import manifest as manifest_mod
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.cache.node import open_tiers
    from clairvoyant.stage.engine import RangeReader, Stager

    dst = pack(dataset, tmp_path / "two", shard_size="200KiB").dst
    src = TarShardSource(dst)
    man, _ = manifest_mod.obtain(src)
    rr = RangeReader(Ranges(*src.sample_ranges(man.keys)), None)
    assert rr.ranges.count >= 2
    of = rr.of
    r0 = [i for i in range(len(man.keys)) if of[i] == of[0]]
    other = next(i for i in range(len(man.keys)) if of[i] != of[0])
    assert len(r0) >= 3
    gate, started = threading.Event(), threading.Event()

    def slow_read(keys):   # the range's whole read, held until the test lets it go
        started.set()
        assert gate.wait(20)
        return src.read_range(keys)

    rr.read = slow_read
    node = open_tiers(src, np.asarray(man.sizes) + entry_size(0), local_dir=str(tmp_path / "local"),
                      local_capacity=None, ram=False)
    tiers = node.tiers
    due_upto = [-1]
    done: dict = {}
    st = Stager(src, tiers, man, threads=1, on_done=lambda b, j, out, *_: done.setdefault((b, j), (
        _time.monotonic(), out)), ranges=rr, due=lambda k: k <= due_upto[0])
    try:
        st.start()
        st.submit(1, [r0[0]], [False], [True], None, [True])   # the range's first miss: read whole after it
        assert started.wait(10)                                 # ... and that read is under way
        st.submit(2, [r0[1]], [True], [True], None, [False])    # a planned hit of the range, not due
        st.submit(3, [other], [False], [True], None, [False])   # a miss of another range, behind it
        assert wait_until(lambda: (3, 0) in done, 10), done     # staged although the range is not read
        assert (2, 0) not in done
        st.submit(4, [r0[2]], [True], [True], None, [False])    # control: a hit that falls due
        _time.sleep(0.2)
        assert (4, 0) not in done
        due_upto[0] = 4
        st.advance()
        assert wait_until(lambda: (4, 0) in done, 10), done     # read on its own, the range still held
        assert done[(4, 0)][1].fetched and (2, 0) in done and done[(2, 0)][1].fetched
        gate.set()
        assert wait_until(lambda: tiers.counters.snapshot()["range_reads"] == 1, 10)
        c = tiers.counters.snapshot()
        assert c["range_early"] == 2, c   # both due by then: each read on its own
    finally:
        gate.set()
        st.close()
        node.tiers.close()


def test_a_parked_sample_is_placed_by_its_ranges_read(dataset, tmp_path):
    """The other way out: a parked hit that never falls due is delivered from the tier once its
    range's read ends, not read on its own. Control: nothing is delivered while the read is held."""
    import time as _time

    from clairvoyant import manifest as manifest_mod
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.cache.node import open_tiers
    from clairvoyant.stage.engine import RangeReader, Stager

    dst = pack(dataset, tmp_path / "one", shard_size="1MiB").dst
    src = TarShardSource(dst)
    man, _ = manifest_mod.obtain(src)
    gate = threading.Event()
    rr = RangeReader(Ranges(*src.sample_ranges(man.keys)), lambda keys: (gate.wait(20), src.read_range(keys))[1])
    node = open_tiers(src, np.asarray(man.sizes) + entry_size(0), local_dir=str(tmp_path / "local"),
                      local_capacity=None, ram=False)
    tiers = node.tiers
    done: dict = {}
    st = Stager(src, tiers, man, threads=1, on_done=lambda b, j, out, *_: done.setdefault((b, j), out),
                ranges=rr, due=lambda k: k == 0)
    try:
        st.start()
        st.submit(0, [0], [False], [True], None, [True])
        assert wait_until(lambda: (0, 0) in done, 10)
        st.submit(1, [1, 2], [True, True], [True, True], None, [False, False])
        _time.sleep(0.3)
        assert (1, 0) not in done and (1, 1) not in done   # control: parked while the read is held
        gate.set()
        assert wait_until(lambda: (1, 0) in done and (1, 1) in done, 10), done
        assert all(done[(1, j)].tier == "local" and not done[(1, j)].fetched for j in (0, 1))
        c = tiers.counters.snapshot()
        assert c["range_early"] == 0 and c["range_reads"] == 1, c
    finally:
        gate.set()
        st.close()
        node.tiers.close()


def test_the_tuner_starts_lower_where_the_plan_reads_ranges_whole(packed, dataset, tmp_path, monkeypatch):
    from clairvoyant.load import loader as loader_mod
    monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")   # ranges are read whole by Python's threads

    started: list[int] = []
    real = loader_mod.EpochRun

    def recording(*a, **kw):
        started.append(kw["options"].stage_threads)
        return real(*a, **kw)

    monkeypatch.setattr(loader_mod, "EpochRun", recording)
    for src, local in ((packed, "s"), (dataset, "t")):
        with Loader(src, batch_size=8, local_dir=str(tmp_path / local), num_workers=1) as L:
            next(iter(L))
    assert started == [loader_mod.RANGE_START_THREADS, loader_mod.AUTO_START_THREADS]   # control: the tree


def test_a_shard_changed_since_the_manifest_is_a_typed_error_not_wrong_bytes(dataset, tmp_path):
    """The native threads read a tar member at its indexed offset: where the shards were packed
    again since the manifest was made (a sample of another size now), the sample is not read there
    (its bytes would run into the next member) but raises SourceChanged naming it, as the Python
    path does. Control: the shards as they were give every sample's bytes."""
    import shutil

    from clairvoyant.errors import SourceChanged
    from clairvoyant.stage.native_files import available
    if not available():
        pytest.skip("the native stager is not built here")
    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    shards = pack(str(data), tmp_path / "packed", shard_size="24KiB").dst
    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731
    with Loader(shards, batch_size=8, local_dir=str(tmp_path / "l0"), decode=digest, num_workers=1) as L:
        assert len({bytes(x) for xb, _ in L for x in xb}) == 96   # the control: whole and right
    victim = sorted(p for p in data.rglob("*.jpg"))[5]
    victim.write_bytes(victim.read_bytes() + b"\0" * 700)   # another size, packed again under the same names
    shutil.rmtree(tmp_path / "packed")
    pack(str(data), tmp_path / "packed", shard_size="24KiB", reindex=True)
    with pytest.raises(SourceChanged, match=victim.name):
        with Loader(shards, batch_size=8, local_dir=str(tmp_path / "l1"), decode=digest, num_workers=1) as L:
            for _ in L:
                pass
