"""The FUSE store serves the source's bytes through the kernel, charges and counts what it says,
is read-only, and leaves no mount, process or file behind."""

from __future__ import annotations

import errno
import gc
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clairvoyant import ConfigError, Loader
from clairvoyant.errors import SourceNotFound
from clairvoyant.testing import FuseStore, fuse_available
from clairvoyant.testing import fusestore as fs_mod

from conftest import content, differing, wait_until

OK, WHY = fuse_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"FUSE store unavailable: {WHY}")

FAST = dict(open_latency=0.0, read_latency=0.0, bandwidth=1e12)


def files_of(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def mismatches(expected_root: str, mount: str) -> list[str]:
    """Files whose bytes through the mount differ from ``expected_root``'s (or are missing)."""
    if files_of(expected_root) != files_of(mount):
        return ["<file list>"]
    return differing(expected_root, mount, files_of(expected_root))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def test_every_file_reads_back_as_the_source(dataset, tmp_path):
    with FuseStore(dataset, **FAST) as store:
        assert files_of(store.path) == files_of(dataset) and len(files_of(dataset)) > 90
        assert mismatches(dataset, store.path) == []
        # negative control: a copy with one byte changed is caught
        changed = tmp_path / "changed"
        shutil.copytree(dataset, changed)
        victim = files_of(dataset)[17]
        data = bytearray(content(str(changed / victim)))
        data[len(data) // 2] ^= 0x01
        (changed / victim).write_bytes(bytes(data))
        assert mismatches(str(changed), store.path) == [victim]


def test_opens_and_bytes_counted_exactly_and_reset(dataset):
    keys = files_of(dataset)
    with FuseStore(dataset, **FAST) as store:
        os.stat(store.path)  # warm the root's lookup: not part of the reads below

        def read_set(names):
            store.reset()
            for k in names:
                content(os.path.join(store.path, k))
            return store.counters()

        first = keys[:5]
        c = read_set(first)
        assert (c.opens, c.bytes) == (5, sum(os.path.getsize(os.path.join(dataset, k)) for k in first))
        assert c.reads >= 5
        # negative control: one more file changes both figures
        more = read_set(first + [keys[5]])
        assert (more.opens, more.bytes) != (c.opens, c.bytes)
        assert (more.opens, more.bytes) == (6, c.bytes + os.path.getsize(os.path.join(dataset, keys[5])))
        store.reset()
        zero = store.counters()
        assert (zero.opens, zero.reads, zero.bytes, zero.listings, zero.peak_inflight) == (0, 0, 0, 0, 0)
        # a stat is no open; a listing is counted as one
        os.stat(os.path.join(store.path, keys[40]))
        os.listdir(os.path.join(store.path, os.path.dirname(keys[40])))
        c = store.counters()
        assert (c.opens, c.listings, c.bytes) == (0, 1, 0) and c.getattrs >= 1


def test_each_open_starts_with_a_cold_page_cache(dataset):
    key = files_of(dataset)[3]
    size = os.path.getsize(os.path.join(dataset, key))
    with FuseStore(dataset, **FAST) as store:
        path = os.path.join(store.path, key)
        store.reset()
        content(path)
        content(path)
        assert (store.counters().opens, store.counters().bytes) == (2, 2 * size)  # fetched twice
        # negative control: within one open, the page cache serves the second pass
        store.reset()
        with open(path, "rb") as f:
            f.read()
            f.seek(0)
            f.read()
        assert (store.counters().opens, store.counters().bytes) == (1, size)


def test_latency_and_bandwidth_are_charged(dataset, tmp_path):
    """Lower bounds only: sleeping and a busy machine can only add time."""
    keys = files_of(dataset)[:6]
    with FuseStore(dataset, open_latency=0.05, read_latency=0.0, bandwidth=1e12) as store:
        store.reset()
        t0 = time.monotonic()
        for k in keys:
            content(os.path.join(store.path, k))
        took = time.monotonic() - t0
        assert store.counters().opens == len(keys)  # the time is that of exactly these opens
        assert took >= len(keys) * 0.05
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(400_000))
    with FuseStore(big, open_latency=0.0, read_latency=0.03, bandwidth=2e6) as store:
        store.reset()
        t0 = time.monotonic()
        content(os.path.join(store.path, "blob"))
        took = time.monotonic() - t0
        c = store.counters()
        assert c.bytes == 400_000 and c.reads >= 1
        assert took >= 400_000 / 2e6 + 0.03  # the transfer, plus one read's latency at least
    # max_inflight=1 serializes concurrent opens: 4 at once take 4 latencies
    with FuseStore(dataset, open_latency=0.05, read_latency=0.0, bandwidth=1e12, max_inflight=1) as store:
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda k: content(os.path.join(store.path, k)), keys[:4]))
        assert time.monotonic() - t0 >= 4 * 0.05


@pytest.mark.parametrize("limit", [2, 16])
def test_max_inflight_is_honoured(dataset, limit):
    keys = files_of(dataset)[:48]
    with FuseStore(dataset, open_latency=0.03, read_latency=0.005, bandwidth=1e12, max_inflight=limit) as store:
        store.reset()
        with ThreadPoolExecutor(12) as ex:
            list(ex.map(lambda k: content(os.path.join(store.path, k)), keys))
        c = store.counters()
        assert c.opens == len(keys)
        assert 1 < c.peak_inflight <= limit
        if limit == 16:
            assert c.peak_inflight > 2  # negative control: allowed more, it takes more than the tight limit


def test_changes_fail_with_erofs(dataset):
    with FuseStore(dataset, **FAST) as store:
        some = os.path.join(store.path, next(k for k in files_of(dataset) if k.endswith(".jpg")))
        attempts = {
            "create": lambda: open(os.path.join(store.path, "new.jpg"), "wb"),
            "write": lambda: open(some, "r+b"),
            "append": lambda: open(some, "ab"),
            "truncate": lambda: os.truncate(some, 0),
            "unlink": lambda: os.unlink(some),
            "rename": lambda: os.rename(some, some + ".moved"),
            "mkdir": lambda: os.mkdir(os.path.join(store.path, "d")),
            "rmdir": lambda: os.rmdir(os.path.dirname(some)),
            "chmod": lambda: os.chmod(some, 0o600),
        }
        for name, attempt in attempts.items():
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS, name
        assert mismatches(dataset, store.path) == []  # nothing changed
        # negative control: reading is no change, and does not fail
        with open(some, "rb") as f:
            assert f.read(3) == b"\xff\xd8\xff"


def test_close_leaves_nothing_behind(dataset):
    store = FuseStore(dataset, **FAST)
    path, pid, work = store.path, store.pid, os.path.dirname(store._counters_path)
    # negative controls: while open, each check below would fail
    assert fs_mod._mounted(path) and pid_alive(pid) and os.path.isdir(work)
    store.close()
    assert not fs_mod._mounted(path) and not pid_alive(pid) and not os.path.exists(work)
    assert not os.path.exists(path)
    store.close()  # idempotent
    assert store.counters().opens == 0  # the last figures stay readable


def test_an_exception_in_the_with_block_unmounts(dataset):
    seen = {}
    with pytest.raises(RuntimeError, match="boom"):
        with FuseStore(dataset, **FAST) as store:
            seen.update(path=store.path, pid=store.pid, mounted=fs_mod._mounted(store.path))
            raise RuntimeError("boom")
    assert seen["mounted"]  # the control: it was mounted inside
    assert not fs_mod._mounted(seen["path"]) and not pid_alive(seen["pid"]) and not os.path.exists(seen["path"])


def test_garbage_collection_and_a_busy_mount_leave_nothing(dataset, tmp_path):
    store = FuseStore(dataset, **FAST)
    path, pid = store.path, store.pid
    del store
    gc.collect()
    assert not fs_mod._mounted(path) and not pid_alive(pid) and not os.path.exists(path)
    # a file still open at close: unmounted lazily, the daemon stopped all the same
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = FuseStore(dataset, mnt, **FAST)
    f = open(os.path.join(store.path, files_of(dataset)[0]), "rb")
    try:
        store.close()
        assert not fs_mod._mounted(str(mnt)) and not pid_alive(store.pid)
        assert mnt.is_dir() and not os.listdir(mnt)  # a mount point of the caller's stays, empty
    finally:
        f.close()


def test_the_daemon_is_the_installed_one(monkeypatch, tmp_path):
    """Built with the package, beside fusestore.py; nothing is compiled or cached at run time."""
    monkeypatch.setenv("CLAIRVOYANT_CACHE", str(tmp_path / "fresh"))
    path = fs_mod.daemon_binary()
    assert path == os.path.join(os.path.dirname(os.path.abspath(fs_mod.__file__)), "emufs")
    assert os.access(path, os.X_OK) and not (tmp_path / "fresh").exists()


def test_bad_arguments_are_typed_errors(dataset, tmp_path):
    with pytest.raises(SourceNotFound, match="no such directory"):
        FuseStore(tmp_path / "missing")
    with pytest.raises(ConfigError):
        FuseStore(dataset, bandwidth=0)
    with pytest.raises(ConfigError):
        FuseStore(dataset, max_inflight=0)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConfigError, match="empty directory"):
        FuseStore(dataset, tmp_path / "full")


def test_the_loader_reads_the_mount_as_the_directory(dataset, tmp_path, no_leaks):
    def batches(root, seed, local):
        with Loader(root, batch_size=16, local_dir=tmp_path / local, seed=seed, num_workers=1,
                    decode="numpy", output="numpy") as ld:
            return [(np.asarray(x), np.asarray(y)) for x, y in ld]

    def same(a, b):
        return len(a) == len(b) and all(np.array_equal(xa, xb) and np.array_equal(ya, yb)
                                        for (xa, ya), (xb, yb) in zip(a, b))

    with FuseStore(dataset, open_latency=0.001, read_latency=0.0) as store:
        store.reset()
        through = batches(store.path, 3, "via-mount")
        c = store.counters()
    direct = batches(dataset, 3, "direct")
    assert same(through, direct)
    assert c.opens >= 96 and c.bytes >= sum(os.path.getsize(os.path.join(dataset, k)) for k in files_of(dataset)
                                            if k.endswith(".jpg"))
    # negative control: another seed gives other batches
    assert not same(through, batches(dataset, 4, "other-seed"))
    assert wait_until(lambda: not fs_mod._mounted(store.path))
