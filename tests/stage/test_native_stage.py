"""The native stager (cache/_stager.c driven by stage/native_files.py) on its own: entries written
and published whole, errors reported with nothing left reserved, one job per file, the key's lock
waited for and held until the publish, and a file another process staged meanwhile left alone.
Each check has a control that shows it can fail."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import threading
import time

import pytest

from clairvoyant.stage import native_files as native_stage
from clairvoyant.cache.entry import entry_size, read_sample, unseal
from clairvoyant.cache.extents import read_entry
from clairvoyant.cache.local import LocalStore

from conftest import wait_until

pytestmark = pytest.mark.skipif(not native_stage.available(), reason="the native stager is not built here")


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {f"d/f{i}.bin": os.urandom(1000 + 37 * i) for i in range(12)}
    for k, v in files.items():
        (src / k).write_bytes(v)
    return str(src), files, str(tmp_path / "local")


class Run:
    """A NativeStager (or ``engine``, of the same contract) over a LocalStore, recording what it
    reports."""

    def __init__(self, src: str, local: str, capacity: int = 1 << 30, handoff: str | None = None,
                 engine=None) -> None:
        self.store = LocalStore(local, "file://" + src, expected=64)
        self.done: dict[int, native_stage.Done] = {}
        self.reports: list[int] = []   # every token told, in order (a token told twice shows here)
        self.batches = 0
        self.cv = threading.Condition()
        self.stager = (engine or native_stage.NativeStager)(self.store, capacity, src, handoff, 4, self._on_done,
                                                             self._on_batch)

    def _on_batch(self) -> None:
        self.batches += 1

    def _on_done(self, d: native_stage.Done) -> None:
        with self.cv:
            self.reports.append(d.token)
            assert d.token not in self.done, "a job reported twice"
            self.done[d.token] = d
            self.cv.notify_all()

    def wait(self, n: int, timeout: float = 20) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.done) >= n, timeout), self.done

    def close(self) -> None:
        self.stager.close()
        self.store.close()


def test_entries_are_written_whole_and_published(tree):
    src, files, local = tree
    run = Run(src, local)
    keys = sorted(files)
    try:
        for t, k in enumerate(keys):
            assert run.stager.submit(t, k, len(files[k])) is True
        run.wait(len(keys))
        for t, k in enumerate(keys):
            d = run.done[t]
            assert d.error is None and d.loc is not None and not d.handed_over
            assert unseal(read_entry(d.loc), len(files[k]), k) == files[k]
            assert run.store.find(k) == d.loc
        assert run.store.ledger.read()[0] == sum(entry_size(len(v)) for v in files.values())
        assert locks_held(run.store, keys) == 0   # every key's lock let go once published
        # control: the check reads what is there (a flipped byte is caught)
        loc = run.done[0].loc
        with open(loc.path, "r+b") as f:
            f.seek(loc.offset)
            b = f.read(1)
            f.seek(loc.offset)
            f.write(bytes([b[0] ^ 1]))
        with pytest.raises(Exception):
            unseal(read_entry(loc), len(files[keys[0]]), keys[0])
    finally:
        run.close()


def _held(root: str, offsets: list[int], out) -> None:
    """In another process: how many of ``offsets`` (key locks) someone holds."""
    import fcntl

    fd = os.open(os.path.join(root, "locks"), os.O_RDWR)
    held = 0
    for off in offsets:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, off)
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, off)
        except OSError:
            held += 1
    out.put(held)


def locks_held(store: LocalStore, keys: list[str]) -> int:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_held, args=(store.root, [store.lock_offset(k) for k in keys], q))
    p.start()
    n = q.get(timeout=30)
    p.join(30)
    return n


def _hold(root: str, offset: int, publish: tuple | None, ready, go) -> None:
    """In another process: hold a key's lock until told, optionally publishing its entry first."""
    import fcntl

    if publish is not None:   # first: closing the store's descriptor of the locks file would drop
        local, uri, key, data = publish   # every POSIX lock this process holds on that file
        store = LocalStore(local, uri)
        store.put(key, data, 1, 1 << 30)
        store.close()
    fd = os.open(os.path.join(root, "locks"), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, offset)
    ready.set()
    go.wait(20)
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
    os.close(fd)


@pytest.mark.parametrize("check", ["index", "publish", "none"])
def test_a_job_waits_for_the_lock_and_leaves_alone_what_another_process_staged(tree, monkeypatch, check):
    """Another process of the node has staged the file and holds its lock: the job waits for the
    lock (a second submit of it is refused as in flight), then finds the entry there and leaves
    it: the C thread looks the key up in the index once it holds the lock, and does not read the
    source at all (the source file is gone by then here: a read would fail); without that lookup
    (no digest given), the check before publishing finds it after the read. Control (both checks
    skipped): the job replaces that entry."""
    if check != "index":
        monkeypatch.setattr(native_stage, "key_digest", lambda key: 0)   # (0: no lookup in C)
    if check == "none":
        monkeypatch.setattr(native_stage.NativeStager, "_published_meanwhile", lambda self, key, n: False)
    src, files, local = tree
    run = Run(src, local)
    k = sorted(files)[3]
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(run.store.root, run.store.lock_offset(k),
                                            (local, "file://" + src, k, files[k]), ready, go))
    other.start()
    try:
        assert ready.wait(20)
        assert locks_held(run.store, [k]) == 1   # control of locks_held: it sees a lock held
        theirs = run.store.find(k)
        assert theirs is not None
        assert run.stager.submit(7, k, len(files[k])) is True
        time.sleep(0.3)
        assert 7 not in run.done                               # waiting for the lock
        assert run.stager.submit(7, k, len(files[k])) is None  # one job per file
        if check == "index":
            os.rename(os.path.join(src, k), os.path.join(src, k + ".gone"))   # a read of it would fail now
        go.set()
        run.wait(1)
        d = run.done[7]
        if check != "none":
            assert d.loc is None and d.present and "meanwhile" in d.error and run.store.find(k) == theirs
            assert run.store.ledger.read()[0] == entry_size(len(files[k]))
        else:
            assert d.loc is not None and run.store.find(k) != theirs
    finally:
        go.set()
        other.join(20)
        run.close()


class OneBatch:
    """The engine, its finished jobs handed to the collector all at once when ``n`` are in."""

    def __init__(self, engine, n: int) -> None:
        self.engine, self.n, self.got, self.batches = engine, n, [], []

    def submit_many(self, jobs):
        return self.engine.submit_many(jobs)

    def close(self):
        return self.engine.close()

    def limit(self, n: int):
        return self.engine.limit(n)

    def load(self):
        return self.engine.load()

    def collect(self, timeout: float):
        self.got += self.engine.collect(timeout)
        if len(self.got) < self.n:
            return []
        out, self.got = self.got, []
        self.batches.append(len(out))
        return out


def test_a_job_that_fails_to_finish_leaves_the_rest_of_its_batch_whole(tree, monkeypatch):
    """Twelve jobs finished in one batch; letting go of one's lock fails, and its owner's callback
    raises for another: every job is still published, reported once and forgotten, and every
    other lock let go. Control: the failures did happen, in one batch of twelve."""
    src, files, local = tree
    keys = sorted(files)
    bad_unlock, bad_report = keys[3], 5
    raised = []
    real_engine = native_stage._Engine
    monkeypatch.setattr(native_stage, "_Engine", lambda *a, **kw: OneBatch(real_engine(*a, **kw), len(keys)))
    run = Run(src, local)
    engine = run.stager._engine
    real_unlock, real_done = run.store.unlock, run._on_done

    def unlock(key):
        if key == bad_unlock:
            raised.append("unlock")
            raise OSError("injected: cannot let go")
        return real_unlock(key)

    def on_done(d):
        real_done(d)
        if d.token == bad_report:
            raised.append("report")
            raise RuntimeError("injected: the owner's callback failed")

    monkeypatch.setattr(run.store, "unlock", unlock)
    run.stager._on_done = on_done
    try:
        for t, k in enumerate(keys):
            assert run.stager.submit(t, k, len(files[k])) is True
        run.wait(len(keys))
        assert engine.batches == [len(keys)] and sorted(raised) == ["report", "unlock"]   # control
        assert all(run.done[t].loc is not None and run.store.find(k) == run.done[t].loc for t, k in enumerate(keys))
        assert run.stager._jobs == {}   # every token forgotten: a new submit of a file is not refused
        assert locks_held(run.store, [k for k in keys if k != bad_unlock]) == 0
        assert run.store.ledger.read()[0] == sum(entry_size(len(v)) for v in files.values())
    finally:
        real_unlock(bad_unlock)
        run.close()


def test_submit_many_stages_each_once_and_falls_back_where_room_is_short(tree):
    """submit_many: every file written whole with one reservation; a token twice in one call, or
    one already under way, is reported as under way (None) and staged once; where the tier has no
    room for them all, each is tried on its own (those that fit go, the rest False with nothing
    reserved); after close the call raises."""
    src, files, local = tree
    keys = sorted(files)
    cap = sum(entry_size(len(files[k])) for k in keys[:6]) + entry_size(len(files[keys[6]])) // 2
    run = Run(src, local, capacity=cap)
    try:
        items = [(t, k, len(files[k])) for t, k in enumerate(keys[:4])]
        assert run.stager.submit_many(items + [items[1]]) == [True, True, True, True, None]
        run.wait(4)
        assert all(run.done[t].loc is not None for t in range(4)) and len(run.done) == 4
        for t, k in enumerate(keys[:4]):
            assert unseal(read_entry(run.done[t].loc), len(files[k]), k) == files[k]
        # room for two more, not three: the call falls back file by file
        more = [(t, keys[t], len(files[keys[t]])) for t in (4, 5, 6)]
        assert run.stager.submit_many(more) == [True, True, False]
        run.wait(6)
        assert 6 not in run.done and run.store.find(keys[6]) is None
        assert run.store.ledger.read()[0] == sum(entry_size(len(files[k])) for k in keys[:6])
        assert locks_held(run.store, keys) == 0
    finally:
        run.close()
    assert sorted(run.reports) == list(range(6))   # each told once, the duplicate too
    with pytest.raises(RuntimeError, match="closed"):
        run.stager.submit_many([(9, keys[9], len(files[keys[9]]))])


def test_submit_many_goes_on_past_an_item_whose_own_submit_fails(tree, monkeypatch):
    """With room for two of three, each is submitted on its own; the second one's place cannot be
    taken (an error): it comes back as that error, nothing of it reserved, and the third still goes
    (before, the error ended the call with the first already under way and unreported)."""
    src, files, local = tree
    keys = sorted(files)[:3]
    cap = sum(entry_size(len(files[k])) for k in (keys[0], keys[2])) + 8
    run = Run(src, local, capacity=cap)
    real_place, calls = run.store.place, []

    def place(n):
        calls.append(n)
        if len(calls) == 2:
            raise OSError(24, "Too many open files")
        return real_place(n)

    monkeypatch.setattr(run.store, "place", place)
    try:
        got = run.stager.submit_many([(t, k, len(files[k])) for t, k in enumerate(keys)])
        assert got[0] is True and isinstance(got[1], OSError) and got[2] is True, got
        run.wait(2)
        assert sorted(run.done) == [0, 2] and all(run.done[t].loc is not None for t in (0, 2))
        assert not run.stager.in_flight()
        assert run.store.ledger.read()[0] == sum(entry_size(len(files[k])) for k in (keys[0], keys[2]))
    finally:
        run.close()


def test_submit_many_hands_back_every_place_when_the_engine_refuses(tree, monkeypatch):
    """The engine refusing a batch (closed under it): every place given back, every token free
    again (control: the same batch goes through once the engine takes it)."""
    src, files, local = tree
    keys = sorted(files)[:3]
    run = Run(src, local)
    try:
        items = [(t, k, len(files[k])) for t, k in enumerate(keys)]
        real = run.stager._engine

        class Refuses:
            def submit_many(self, jobs):
                raise RuntimeError("the stager is closed")

            def __getattr__(self, name):
                return getattr(real, name)

        run.stager._engine = Refuses()
        with pytest.raises(RuntimeError):
            run.stager.submit_many(items)
        assert run.store.ledger.read()[0] == 0 and not run.stager.in_flight()
        run.stager._engine = real
        assert run.stager.submit_many(items) == [True, True, True]
        run.wait(3)
        assert all(run.done[t].loc is not None for t in range(3))
    finally:
        run.close()


@pytest.mark.parametrize("engine", ["native", "thread"])
def test_the_room_may_be_a_function_read_at_each_submission(tree, engine):
    """The Loader's route gives the engine its tier's room less what kept samples waiting in the RAM
    window are owed (stage/native.py): read at each submission, so that the engine takes files
    while such samples wait, within the room they leave. Control: the same file refused while
    the room is taken."""
    from clairvoyant.stage.thread_files import ThreadStager
    src, files, local = tree
    room = [0]
    run = Run(src, local, capacity=lambda: room[0], engine=None if engine == "native" else ThreadStager)
    try:
        keys = sorted(files)
        assert run.stager.submit(0, keys[0], len(files[keys[0]])) is False   # control: no room now
        room[0] = entry_size(len(files[keys[0]]))
        assert run.stager.submit(1, keys[0], len(files[keys[0]])) is True
        run.wait(1)
        assert run.done[1].loc is not None
        assert run.stager.submit(2, keys[1], len(files[keys[1]])) is False   # the room is used now
    finally:
        run.close()


def test_a_packing_file_is_opened_once_and_a_failed_open_is_tried_again_in_its_place(tree, monkeypatch):
    """Samples packed in one file (a tar shard's members: ``span`` gives the file, the offset and
    its mtime) are read with one descriptor kept for the file; while the file is missing, each job
    fails (ENOENT) and the next one tries the open again in the same place, so failures hold no
    descriptor; once it is there, its jobs succeed. Control: the bytes read are those at each
    offset, and the mtime check refuses the file once it changed."""
    src, files, local = tree
    pack_path = os.path.join(src, "pack.bin")
    blob = bytes(range(256)) * 64   # 16 KiB: sample k is 1 KiB at 1 KiB * k
    spans = {f"s{k}": (pack_path, 1024 * k) for k in range(16)}
    mtime = [-1]
    span = lambda key, size: (spans[key][0], spans[key][1], mtime[0])   # noqa: E731
    monkeypatch.setattr(native_stage.NativeStager, "__init__", functools.partialmethod(
        native_stage.NativeStager.__init__, span=span))
    run = Run(src, local)
    def fds() -> int:   # this process's descriptors open on the packing file (or on where it will be)
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == pack_path
            except OSError:
                pass
        return n
    try:
        assert all(run.stager.submit(k, f"s{k}", 1024) for k in range(8))   # the file is not there yet
        run.wait(8)
        assert all(run.done[k].loc is None for k in range(8)) and fds() == 0
        with open(pack_path, "wb") as f:
            f.write(blob)
        mtime[0] = os.stat(pack_path).st_mtime_ns
        assert all(run.stager.submit(k, f"s{k}", 1024) for k in range(8, 16))
        run.wait(16)
        assert all(run.done[k].loc is not None for k in range(8, 16))
        assert fds() == 1   # one descriptor for the packing file, kept
        for k in range(8, 16):
            assert read_sample(run.done[k].loc, 1024) == blob[1024 * k:1024 * (k + 1)]
        os.utime(pack_path, ns=(mtime[0], mtime[0] + 10**9))   # changed since it was indexed
        assert run.stager.submit(16, "s3", 1024)
        run.wait(17)
        assert run.done[16].loc is None and "re-index" in run.done[16].error
    finally:
        run.close()


def _engine_threads() -> int:
    """The native stager's threads alive in this process (cache/_stager.c names them)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "cv-native-stage"
        except OSError:   # (a thread that ended meanwhile: ENOENT or ESRCH)
            pass
    return n


def test_threads_start_as_files_wait_for_them(tree, tmp_path):
    """An engine allowed 64 threads starts one at once and another only where a file waits with
    none idle: files staged one after the other take one thread. Control: 12 files held at their
    open (named pipes with no writer yet) start a thread each."""
    src, files, local = tree
    store = LocalStore(local, "file://" + src, expected=64)
    before = _engine_threads()
    done: list[native_stage.Done] = []
    pipes = [os.path.join(src, f"p{i}") for i in range(12)]
    writers: list[int] = []

    def release() -> None:   # a writer at each pipe, kept open: every open of it goes on
        while not writers and all(os.path.exists(p) for p in pipes):
            writers.extend(os.open(p, os.O_RDWR | os.O_NONBLOCK) for p in pipes)
    stager = native_stage.NativeStager(store, 1 << 30, src, None, 64, done.append)
    try:
        assert wait_until(lambda: _engine_threads() - before == 1, 5)   # its first thread (named once it runs)
        for t, k in enumerate(sorted(files)):
            assert stager.submit(t, k, len(files[k])) is True
            assert wait_until(lambda: len(done) == t + 1, 10)
        assert _engine_threads() - before == 1   # (the thread counts itself idle before its file is told)
        for p in pipes:
            os.mkfifo(p)
        for i in range(12):
            assert stager.submit(100 + i, f"p{i}", 10) is True
        assert wait_until(lambda: _engine_threads() - before >= 12, 10), _engine_threads() - before   # control
        release()
        assert wait_until(lambda: len(done) == len(files) + 12, 10)
        stager.close()
        assert wait_until(lambda: _engine_threads() == before, 5)   # every one joined
    finally:
        release()   # (a thread held at a pipe's open would hold the close for ever)
        stager.close()
        store.close()
        for w in writers:
            os.close(w)


def test_an_engine_closed_cannot_be_started_again(tree):
    """The C engine's ``__init__`` called again after its close is refused: it started a thread
    that no stop would join (its stop had run). Control: a fresh engine starts, and closes twice."""
    from clairvoyant.cache._stager import Stager
    src, _, local = tree
    store = LocalStore(local, "file://" + src, expected=64)
    try:
        engine = Stager(src, store.lock_fd, None, 4)   # control
        engine.close()
        engine.close()
        with pytest.raises(RuntimeError, match="already started"):
            engine.__init__(src, store.lock_fd, None, 4)
    finally:
        store.close()
