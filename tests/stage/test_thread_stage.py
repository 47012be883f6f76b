"""The file stager's two engines behind one interface (stage/thread_files.py): the Python threads'
twin keeps the native stager's contract, so that the mount runs the same way with or without the
C extension. Each check runs on both engines (the native one where it is built)."""

from __future__ import annotations

import os

import pytest

from clairvoyant.stage import engines, native_files as native_stage, thread_files as thread_stage
from clairvoyant.cache.entry import entry_size, unseal
from clairvoyant.cache.extents import read_entry
from clairvoyant.cache.local import LocalStore
from conftest import wait_until
from test_native_stage import Run, tree  # noqa: F401  (the same files and recorder, both engines)

ENGINES = [thread_stage.ThreadStager] + ([native_stage.NativeStager] if native_stage.available() else [])


def make(engine, src: str, local: str, **kw) -> Run:
    return Run(src, local, engine=engine, **kw)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_entries_are_published_from_the_source_or_the_handoff(engine, tree, tmp_path):
    src, files, local = tree
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    keys = sorted(files)
    (handoff / "3").write_bytes(files[keys[3]] + (123).to_bytes(8, "little"))   # a reader's open handed it over
    run = make(engine, src, local, handoff=str(handoff))
    try:
        got = run.stager.submit_many([(t, k, len(files[k])) for t, k in enumerate(keys)])
        assert got == [True] * len(keys)
        run.wait(len(keys))
        for t, k in enumerate(keys):
            d = run.done[t]
            assert d.error is None and d.loc is not None and d.handed_over == (t == 3)
            assert unseal(read_entry(d.loc), len(files[k]), k) == files[k]
            assert run.store.find(k) == d.loc
        assert run.store.ledger.read()[0] == sum(entry_size(len(v)) for v in files.values())
        assert os.listdir(handoff) == [] and run.batches >= 1 and not run.stager.in_flight()
        # control: a second submit of a staged file is told as present, not staged twice
        assert run.stager.submit(99, keys[0], len(files[keys[0]])) is True
        run.wait(len(keys) + 1)
        assert run.done[99].loc is None and run.done[99].present
    finally:
        run.close()


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_errors_come_back_worded_alike_with_nothing_reserved(engine, tree):
    src, files, local = tree
    run = make(engine, src, local)
    try:
        k = sorted(files)[0]
        assert run.stager.submit(0, "d/missing.bin", 10) is True
        assert run.stager.submit(1, k, len(files[k]) + 5) is True   # not the listed size any more
        run.wait(2)
        assert run.done[0].loc is None and "No such file" in run.done[0].error
        assert run.done[1].loc is None and "re-index" in run.done[1].error
        assert run.store.ledger.read()[0] == 0 and run.store.entries() == {}
        assert run.stager.submit(2, "d/big.bin", 1 << 40) is False   # more than the capacity: refused
        assert run.store.ledger.read()[0] == 0
    finally:
        run.close()


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_close_with_work_queued_leaves_the_ledger_right_and_no_thread(engine, tree):
    src, files, local = tree
    threads_before = len(os.listdir("/proc/self/task"))
    run = make(engine, src, local)
    keys = sorted(files)
    for t in range(200):
        k = keys[t % len(keys)]
        run.stager.submit(t, k, len(files[k]))
    run.close()
    store = LocalStore(local, "file://" + src)
    try:
        assert len(run.done) == 200   # every job told once: done, present, failed or not started
        assert store.ledger.read()[0] == sum(store.entries().values())
    finally:
        store.close()
    assert wait_until(lambda: len(os.listdir("/proc/self/task")) <= threads_before, 5)


def test_one_place_chooses_the_engine(tree, monkeypatch):
    """stage/engines.py picks for both front doors: the mount always gets an engine, the Loader
    (``native_applies``) the C one or none."""
    src, _, local = tree
    store = LocalStore(local, "file://" + src, expected=64)
    try:
        s = engines.file_engine(store, 1 << 20, src, None, 2, lambda d: None)
        assert isinstance(s, native_stage.NativeStager if native_stage.available() else thread_stage.ThreadStager)
        s.close()
        assert engines.native_applies(store, True) == native_stage.available()
        assert not engines.native_applies(store, False)   # the Loader on a store that is not plain files
        monkeypatch.setenv("CLAIRVOYANT_NATIVE_STAGE", "0")   # the switch holds for both front doors
        s = engines.file_engine(store, 1 << 20, src, None, 2, lambda d: None)
        assert isinstance(s, thread_stage.ThreadStager)
        s.close()
        assert not engines.native_applies(store, True)
        monkeypatch.delenv("CLAIRVOYANT_NATIVE_STAGE")
        monkeypatch.setattr(engines, "available", lambda: False)   # control: no extension, the twin
        s = engines.file_engine(store, 1 << 20, src, None, 2, lambda d: None)
        assert isinstance(s, thread_stage.ThreadStager)
        s.close()
    finally:
        store.close()
