"""Atomic publish and crash safety of the node-local staging directory."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from clairvoyant import LocalStorageFull, Loader
from clairvoyant.cache.local import LocalStore
from clairvoyant.testing import EmulatedStore
from clairvoyant.testing.faults import disk_full_after

from conftest import tmp_files, wait_until


def staged_entries(store: LocalStore) -> dict[str, bytes]:
    out = {}
    for root, _dirs, files in os.walk(store.data_dir):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[f] = fh.read()
    return out


def corrupt_entries(store: LocalStore, source_root: str, keys) -> list[str]:
    """Entries whose bytes differ from the source's (a staged file must be whole or absent)."""
    by_digest = {hashlib.sha1(k.encode()).hexdigest(): k for k in keys}
    bad = []
    for digest, data in staged_entries(store).items():
        with open(os.path.join(source_root, by_digest[digest]), "rb") as f:
            if f.read() != data:
                bad.append(by_digest[digest])
    return bad


def test_staged_bytes_equal_the_source(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=32, local_dir=tmp_path, num_workers=1) as ld:
        list(ld)
        assert len(staged_entries(ld.store)) == 96
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == []
        # negative control: a flipped byte is seen
        victim = ld.store.path_for(ld.manifest.keys[0])
        with open(victim, "rb") as f:
            data = bytearray(f.read())
        data[10] ^= 0xFF
        with open(victim, "wb") as f:
            f.write(data)
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == [ld.manifest.keys[0]]


def test_a_watcher_never_sees_a_partial_file(tmp_path):
    store = LocalStore(str(tmp_path), "mem://watch")
    payload = os.urandom(8 << 20)
    final = store.path_for("big")
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                with open(final, "rb") as f:
                    seen.append(len(f.read()))
            except FileNotFoundError:
                pass

    t = threading.Thread(target=watch)
    t.start()
    for _ in range(20):
        store.put("big", payload)
    stop.set()
    t.join()
    assert seen and set(seen) == {len(payload)}
    store.close()


def test_publish_failure_leaves_no_temporary_file(tmp_path):
    store = LocalStore(str(tmp_path), "mem://fail")

    def fill(fd):
        os.write(fd, b"half")
        raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        store.put_from("k", fill)
    assert not os.path.exists(store.path_for("k")) and tmp_files(str(tmp_path)) == []
    store.close()


STAGER_SCRIPT = textwrap.dedent("""
    import os, sys, threading, time
    from clairvoyant import Loader
    from clairvoyant.stage import engine
    from clairvoyant.testing import EmulatedStore

    class ByteStore(EmulatedStore):
        path_for_copy = None  # take the generic path: read the bytes, write them out

    # after 20 whole samples, every write stops half-way and hangs: the kill lands mid-write
    written, lock, real_write = [0], threading.Lock(), engine.write_all
    def hanging_write(fd, data):
        with lock:
            written[0] += 1
            n = written[0]
        if n <= 20:
            return real_write(fd, data)
        os.write(fd, data[: len(data) // 2])
        if n == 21:  # one line, from one thread, in one write: the test reads exactly this
            sys.stdout.write("writing\\n")
            sys.stdout.flush()
        time.sleep(60)
    engine.write_all = hanging_write

    store = ByteStore(sys.argv[1], open_latency=0.0, state_dir=sys.argv[3])
    ld = Loader(store, batch_size=8, local_dir=sys.argv[2], num_workers=1, stage_threads=4)
    list(ld)
""")


def test_sigkill_during_staging_then_restart_leaves_a_consistent_cache(dataset, tmp_path, no_leaks):
    local, emu = str(tmp_path / "l"), str(tmp_path / "emu")
    proc = subprocess.Popen([sys.executable, "-c", STAGER_SCRIPT, dataset, local, emu],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:  # killed whatever it printed: a stray writer must not outlive the test
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    store = EmulatedStore(dataset, open_latency=0.0, state_dir=emu)
    assert tmp_files(local), "the kill should have left a half-written temporary file"
    published = sum(len(f) for r, _, f in os.walk(local) if os.sep + "data" + os.sep in r + os.sep)
    assert 0 < published <= 20
    with Loader(store, batch_size=8, local_dir=local, num_workers=1) as ld:  # the restart
        assert ld.store.orphans_removed >= 1 and tmp_files(local) == []
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == []
        list(ld)
        assert len(staged_entries(ld.store)) == 96 and tmp_files(local) == []
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == []


def test_disk_full_raises_a_clear_error_and_leaves_no_partial_entry(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=8, local_dir=tmp_path, num_workers=1) as ld:
        with disk_full_after(5000):
            with pytest.raises(LocalStorageFull, match="is full.*local_dir"):
                list(ld)
        assert tmp_files(str(tmp_path)) == []
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {r.stderr.decode().strip()}; "
                    "test_disk_full_raises_a_clear_error covers the same path by fault injection")
    yield str(mnt)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_enospc_on_a_small_tmpfs(dataset, tmp_path, tiny_tmpfs, no_leaks):
    with Loader(dataset, batch_size=8, local_dir=tiny_tmpfs, num_workers=1) as ld:
        with pytest.raises(LocalStorageFull, match="No space left"):
            list(ld)
        assert tmp_files(tiny_tmpfs) == []
        assert corrupt_entries(ld.store, dataset, ld.manifest.keys) == []
