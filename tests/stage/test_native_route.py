"""The Loader's kept misses on native threads (stage/native.py): the same batches and the same
tier as the Python staging threads give, the same typed errors, and the native engine really
used (each check against a run with it turned off)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.stage import native_files as native_stage
from clairvoyant.errors import SourceChanged
from clairvoyant.stage import native as native_mod

pytestmark = pytest.mark.skipif(not native_stage.available(), reason="the native stager is not built here")

digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731


def _run(dataset, local, monkeypatch, use_native: bool, epochs: int = 2, **kw):
    submitted: list[int] = []
    real_submit = native_mod.NativeRoute.submit

    def counting(self, items):
        submitted.append(len(items))
        return real_submit(self, items)

    monkeypatch.setattr(native_mod.NativeRoute, "submit", counting)
    if not use_native:
        monkeypatch.setattr(native_mod, "applies", lambda *a: False)
    out = []
    with Loader(dataset, batch_size=8, local_dir=str(local), seed=4, decode=digest, num_workers=1, **kw) as L:
        for e in range(epochs):
            L.set_epoch(e)
            out.append([bytes(x) for xb, _ in L for x in xb])
        stats = L.stats()["tiers"]
        entries = sorted(L.store.entries())
    monkeypatch.undo()
    return out, sum(submitted), stats, entries


def test_native_staging_gives_what_the_python_threads_give(dataset, tmp_path, monkeypatch):
    got, sent, stats, entries = _run(dataset, tmp_path / "n", monkeypatch, True)
    want, sent_py, stats_py, entries_py = _run(dataset, tmp_path / "p", monkeypatch, False)
    assert got == want and len(set(got[0])) == 96
    assert entries == entries_py and len(entries) == 96
    assert sent == 96 and stats["staged_local"] == 96 and stats["local_hits"] == 96
    # negative control: turned off, nothing goes to the native threads
    assert sent_py == 0 and stats_py["staged_local"] == 96


def test_a_partial_tier_still_goes_the_native_way_for_what_it_keeps(dataset, tmp_path, monkeypatch):
    got, sent, stats, _ = _run(dataset, tmp_path / "n", monkeypatch, True, local_capacity="50%")
    want, _, _, _ = _run(dataset, tmp_path / "p", monkeypatch, False, local_capacity="50%")
    assert got == want
    assert 0 < sent < 2 * 96 and stats["staged_local"] >= 1


def test_a_changed_file_gives_the_typed_error_naming_it(dataset, tmp_path):
    data = str(tmp_path / "data")
    shutil.copytree(dataset, data)
    with Loader(data, batch_size=8, local_dir=str(tmp_path / "l0"), num_workers=1) as L:
        keys = list(L.manifest.keys)
    grown, cut = keys[5], keys[9]
    with open(os.path.join(data, grown), "ab") as f:   # sizes change, the folders' listings do not
        f.write(b"more")
    os.truncate(os.path.join(data, cut), 10)
    with Loader(data, batch_size=8, local_dir=str(tmp_path / "l1"), num_workers=1, decode=digest,
                on_error="skip") as L:
        assert sum(len(xb) for xb, _ in L) == 94   # the two changed samples skipped, the rest served
    with pytest.raises(SourceChanged) as e:
        with Loader(data, batch_size=8, local_dir=str(tmp_path / "l2"), num_workers=1, decode=digest,
                    shuffle=False) as L:
            list(L)
    assert grown in str(e.value) or cut in str(e.value)
    # control: the untouched copy serves all 96
    with Loader(dataset, batch_size=8, local_dir=str(tmp_path / "l3"), num_workers=1, decode=digest) as L:
        assert sum(len(xb) for xb, _ in L) == 96


def test_the_environment_can_keep_staging_on_the_python_threads(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")
    got, sent, stats, _ = _run(dataset, tmp_path / "p", monkeypatch, True, epochs=1)
    assert sent == 0 and stats["staged_local"] == 96 and len(set(got[0])) == 96
    # control: without it, the same run goes native
    _, sent_native, _, _ = _run(dataset, tmp_path / "n", monkeypatch, True, epochs=1)
    assert sent_native == 96


def test_kept_samples_waiting_for_room_do_not_send_the_rest_back_to_python(dataset, tmp_path, monkeypatch):
    """While kept samples wait in the RAM window for room (owed bytes), the route still gives the
    native threads what fits beside them (the engine reserves within the room less what is owed)
    instead of handing every kept miss back to the Python threads. Control: with the room all
    owed, the route takes nothing and the Python threads stage every sample."""
    from clairvoyant.cache.tiers import Tiers

    def taken_by_native(owed):
        taken: list[int] = []
        real = native_mod.NativeRoute.submit

        def counting(self, items):
            back = real(self, items)
            taken.append(len(items) - len(back))
            return back

        monkeypatch.setattr(native_mod.NativeRoute, "submit", counting)
        monkeypatch.setattr(Tiers, "owed_bytes", property(lambda self: owed(self)))
        with Loader(dataset, batch_size=8, local_dir=str(tmp_path / f"l{len(seen)}"), seed=4, decode=digest,
                    num_workers=1) as L:
            got = [bytes(x) for xb, _ in L for x in xb]
            staged = L.stats()["tiers"]["staged_local"]
        monkeypatch.undo()
        seen.append(1)
        return sum(taken), got, staged

    seen: list[int] = []
    n, got, staged = taken_by_native(lambda t: 4096)   # a little owed all along
    assert n == 96 and staged == 96 and len(set(got)) == 96
    n, got_all, staged = taken_by_native(lambda t: t.local_capacity)   # control: the whole room owed
    assert n == 0 and sorted(got_all) == sorted(got)


def test_staging_threads_start_as_work_waits_for_them(dataset, tmp_path, monkeypatch):
    """The Loader's staging threads start as work waits for them (stage/engine.py): where the native
    threads take every file, a few start for the after-use work, not the 32 allowed. Control:
    with every file on the Python threads, the first burst of work starts several. (A read from
    the source takes 50 ms here, as from a shared store: the work waits for threads however busy
    the machine is; on a local copy, a loaded machine's threads keep up with fewer.)"""
    from clairvoyant.stage import engine

    def started(use_native: bool) -> int:
        count = [0]
        real, fetch = engine.Stager._spawn_locked, engine.Stager._fetch

        def spawn(self):
            count[0] += 1
            real(self)

        def slow_fetch(self, key, size):
            time.sleep(0.05)
            return fetch(self, key, size)
        with monkeypatch.context() as m:
            m.setattr(engine.Stager, "_spawn_locked", spawn)
            m.setattr(engine.Stager, "_fetch", slow_fetch)
            if not use_native:
                m.setattr(native_mod, "applies", lambda *a: False)
            local = tmp_path / ("n" if use_native else "p")
            with Loader(dataset, batch_size=8, local_dir=str(local), seed=4, decode=digest, num_workers=1,
                        stage_threads=32) as L:
                assert sum(len(xb) for xb, _ in L) == 96
        return count[0]
    assert started(True) <= 4      # (1-3 in 15 runs)
    assert started(False) >= 16    # control: the first burst of work starts most of the 32 allowed (32 in 10 runs)


def test_a_kept_miss_already_in_the_tier_is_not_read_from_the_store_again(dataset, tmp_path):
    """A job beside this one (a sweep sharing the node's local_dir) staged samples after this job
    planned them as misses: the native threads find each entry in the index once they hold its
    lock and do not read the source (the files are gone from it here: a read would fail); the
    Python threads then take the entry (``fallback``) as a hit (issue 52). Control: the same items
    on a tier that holds nothing are read from the source and staged by the native threads."""
    from clairvoyant.stage.native import Item

    data = str(tmp_path / "data")
    shutil.copytree(dataset, data)
    items = [Item(0, j, s, False, True, -1, False) for j, s in enumerate(range(6))]
    with Loader(data, batch_size=8, local_dir=str(tmp_path / "shared"), seed=4, num_workers=1) as a, \
            Loader(data, batch_size=8, local_dir=str(tmp_path / "empty"), seed=4, num_workers=1) as b:
        list(a)   # the job beside: every sample staged into the shared tier
        keys = [a.manifest.keys[it.sample] for it in items]
        told: list = []

        class Told(native_mod.NativeRoute):
            def _done(self, d):   # what the native threads said of each job
                told.append(d)
                super()._done(d)
        for loader, there in ((a, True), (b, False)):
            done, back, failed = [], [], []
            told.clear()
            route = Told(loader.tiers, loader.manifest, loader.source.root, 2, lambda *x: done.append(x), back.append,
                         failed.append)
            if there:
                for k in keys:
                    os.rename(os.path.join(data, k), os.path.join(data, k + ".gone"))
            try:
                assert route.submit(items) == []   # every one taken by the native threads
                deadline = time.monotonic() + 30
                while len(done) + len(back) < len(items) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if there:   # found in the index: present, not a failed read of a file that is gone
                    assert sorted(back) == items and done == [] and failed == []   # (told as they finish)
                    assert all(d.present and "meanwhile" in d.error for d in told), told
                else:   # control: read from the source and staged
                    assert len(done) == len(items) and back == [] and failed == []
            finally:
                route.close()
                if there:
                    for k in keys:
                        os.rename(os.path.join(data, k + ".gone"), os.path.join(data, k))
