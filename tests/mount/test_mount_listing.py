"""What `clairvoyant mount` shows and notices (issue 21): every folder of the source, empty ones
included, with the source's modes and times; a source changed since its manifest was made,
noticed by a stat per folder and only the changed folders listed again, by a new mount and a new
Loader alike; `--reindex`; and opens the kernel's page cache served, counted or said to be unseen.
Each check comes with a control that shows it can fail."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from clairvoyant import Loader
from clairvoyant import manifest as manifest_mod
from clairvoyant.fuse.daemon import mounted
from clairvoyant.mount import Mount, mount_available
from clairvoyant.source import PosixSource, as_source
from clairvoyant.testing import make_dataset

from conftest import wait_until

_ok, _why = mount_available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"clairvoyant mount cannot run here: {_why}")

N = 12


@pytest.fixture
def listed(monkeypatch) -> list[str]:
    """The folders the source is asked to list, in order (a spy on PosixSource.listdir)."""
    calls: list[str] = []
    real = PosixSource.listdir

    def spy(self, rel):
        calls.append(rel)
        return real(self, rel)

    monkeypatch.setattr(PosixSource, "listdir", spy)
    return calls


def _tree(tmp_path) -> tuple[str, str, str]:
    """A data set of ``N`` JPEGs in 3 classes under train/, an empty valid/ and a nested empty
    folder, with modes and times of their own; an empty mount point; a local tier directory."""
    src = str(tmp_path / "src")
    make_dataset(os.path.join(src, "train"), N, num_classes=3, size=16)
    os.makedirs(os.path.join(src, "valid"))
    os.makedirs(os.path.join(src, "train", "empty", "nested"))
    os.chmod(os.path.join(src, "valid"), 0o750)
    os.utime(os.path.join(src, "valid"), ns=(1_500_000_000_987_654_321, 1_600_000_000_123_456_789))
    os.chmod(os.path.join(src, "train", "empty", "nested"), 0o700)
    first = sorted(os.listdir(os.path.join(src, "train", "class_0000")))[0]
    os.chmod(os.path.join(src, "train", "class_0000", first), 0o640)
    os.utime(os.path.join(src, "train", "class_0000", first), ns=(1_400_000_000_000_000_007, 1_450_000_000_000_000_009))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    return src, str(mnt), str(tmp_path / "local")


def _attrs(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_mode, st.st_mtime_ns, st.st_ctime_ns


def test_every_folder_is_shown_with_the_sources_modes_and_times(tmp_path):
    src, mnt, local = _tree(tmp_path)
    with Mount(src, mnt, local_dir=local, stage=False) as m:
        assert sorted(os.listdir(mnt)) == ["train", "valid"]
        assert os.listdir(os.path.join(mnt, "valid")) == []      # empty: there, not FileNotFoundError
        assert os.listdir(os.path.join(mnt, "train", "empty")) == ["nested"]
        assert os.listdir(os.path.join(mnt, "train", "empty", "nested")) == []
        checked = ["", "train", "valid", "train/empty", "train/empty/nested", "train/class_0001"]
        checked += [m.manifest.keys[i] for i in range(len(m.manifest))]
        for rel in checked:   # mode (type and permission bits), mtime and ctime to the nanosecond
            assert _attrs(os.path.join(mnt, rel)) == _attrs(os.path.join(src, rel)), rel
        assert stat.S_IMODE(os.stat(os.path.join(mnt, "valid")).st_mode) == 0o750
        assert os.stat(os.path.join(mnt, "valid")).st_mtime_ns == 1_600_000_000_123_456_789
        # a file's atime as the manifest recorded it (reading the source since moves the source's)
        key = next(k for k in checked if k.endswith(".jpg") and "class_0000" in k)
        assert os.stat(os.path.join(mnt, key)).st_atime_ns == 1_400_000_000_000_000_007
        assert os.stat(os.path.join(mnt, "train")).st_nlink == os.stat(os.path.join(src, "train")).st_nlink
        # control: a change at the source after the listing shows as a difference
        os.chmod(os.path.join(src, "valid"), 0o755)
        assert _attrs(os.path.join(mnt, "valid")) != _attrs(os.path.join(src, "valid"))
        assert not os.path.exists(os.path.join(mnt, "nope"))


def test_a_file_added_is_seen_by_a_new_mount_and_a_new_loader_listing_only_its_folder(tmp_path, listed, caplog):
    src, mnt, local = _tree(tmp_path)
    train = os.path.join(src, "train")
    with Mount(src, mnt, local_dir=local, stage=False) as m:
        assert len(m.manifest) == N and len(listed) == 8   # the first mount walks the whole source
        fp0 = m.manifest.fingerprint
    with open(os.path.join(train, "class_0001", "added.jpg"), "wb") as f:
        f.write(b"new bytes")
    os.makedirs(os.path.join(src, "valid", "later"))   # a new (empty) sub-folder of a changed folder
    del listed[:]
    caplog.set_level(logging.INFO, logger="clairvoyant")
    with Mount(src, mnt, local_dir=local, stage=False) as m:
        assert len(m.manifest) == N + 1 and m.manifest.fingerprint != fp0
        with open(os.path.join(mnt, "train", "class_0001", "added.jpg"), "rb") as f:
            assert f.read() == b"new bytes"
        assert os.listdir(os.path.join(mnt, "valid")) == ["later"]
        # one listing per changed folder, of nothing else (the rest: one stat per folder)
        assert sorted(listed) == ["train/class_0001", "valid", "valid/later"]
    said = caplog.text
    assert "'train/class_0001'" in said and "1 files added, 0 removed" in said, said
    # a new Loader over the same source sees it too, and lists nothing more (the mount updated the manifest)
    os.remove(os.path.join(train, "class_0002", sorted(os.listdir(os.path.join(train, "class_0002")))[0]))
    del listed[:]
    with Loader(src, batch_size=4, local_dir=tmp_path / "loader", num_workers=1, output="numpy") as ld:
        assert len(ld.manifest) == N and not ld.indexed
        assert "train/class_0001/added.jpg" in list(ld.manifest.keys)
    assert listed == ["train/class_0002"]
    # control: the same Loader with nothing changed since lists nothing
    del listed[:]
    with Loader(src, batch_size=4, local_dir=tmp_path / "loader", num_workers=1, output="numpy") as ld:
        assert len(ld.manifest) == N
    assert listed == []


def test_reindex_walks_the_source_whole_and_sees_a_file_rewritten_in_place(tmp_path, listed):
    src, mnt, local = _tree(tmp_path)
    with Mount(src, mnt, local_dir=local, stage=False) as m:
        key = m.manifest.keys[0]
    path = os.path.join(src, key)
    folder = os.path.dirname(path)
    before = os.stat(folder).st_mtime_ns
    with open(path, "r+b") as f:   # rewritten in place, longer: its folder's mtime stays
        f.seek(0, 2)
        f.write(b"tail")
    assert os.stat(folder).st_mtime_ns == before
    size = os.path.getsize(path)
    del listed[:]
    with Mount(src, mnt, local_dir=local, stage=False) as m:   # control: the folder check cannot see it
        assert os.stat(os.path.join(mnt, key)).st_size == size - 4 and listed == []
    with Mount(src, mnt, local_dir=local, stage=False, reindex=True) as m:
        assert os.stat(os.path.join(mnt, key)).st_size == size and len(listed) == 8
    # the same through the command line (a new manifest again: the folder check lists nothing)
    with open(path, "ab") as f:
        f.write(b"more")
    log = str(tmp_path / "mount.log")
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "clairvoyant.cli.main", "mount", "--reindex", "--no-stage",
                              "--local-dir", local, src, mnt], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: mounted(mnt) or p.poll() is not None, 30), open(log).read()
        assert p.poll() is None, open(log).read()
        assert os.stat(os.path.join(mnt, key)).st_size == size + 4
        assert os.listdir(os.path.join(mnt, "valid")) == []
    finally:
        p.terminate()
        assert p.wait(15) == 0
    assert not mounted(mnt)


def test_a_manifest_of_an_earlier_version_loads_and_the_mount_walks_again_once(tmp_path, listed, caplog):
    src, mnt, local = _tree(tmp_path)
    source = as_source(src)
    old = manifest_mod.build(source)
    old = manifest_mod.Manifest(old.uri, old.keys, old.sizes, old.labels, old.classes)   # no folder records
    manifest_mod.save(old, manifest_mod.default_manifest_path(source.uri))
    del listed[:]
    caplog.set_level(logging.INFO, logger="clairvoyant")
    got, built = manifest_mod.obtain(source)   # as a Loader does: used as it is, and the log says so
    assert not built and got.tree is None and listed == [] and "records no folders" in caplog.text
    with Mount(src, mnt, local_dir=local, stage=False) as m:   # the mount walks it again, once
        assert os.listdir(os.path.join(mnt, "valid")) == [] and len(listed) == 8
        assert m.manifest.tree is not None and m.manifest.fingerprint == old.fingerprint
    assert "walking the source again" in caplog.text
    del listed[:]
    with Mount(src, mnt, local_dir=local, stage=False):
        assert listed == []   # control: now it records them, nothing is walked


def _read_all(mnt: str, keys: list[str]) -> None:
    for k in keys:
        with open(os.path.join(mnt, k), "rb", buffering=0) as f:
            f.read()


def _cli_stats(mnt: str, *extra: str) -> str:
    r = subprocess.run([sys.executable, "-m", "clairvoyant.cli.main", "mount", "--stats", *extra, mnt],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("opens", [True, False])
def test_opens_the_page_cache_served_are_counted_or_said_to_be_unseen(tmp_path, monkeypatch, opens):
    src, mnt, local = _tree(tmp_path)
    if opens:
        monkeypatch.setenv("CLAIRVOYANT_MOUNT_OPENS", "1")   # one OPEN and RELEASE per open
    else:
        monkeypatch.delenv("CLAIRVOYANT_MOUNT_OPENS", raising=False)
    with Mount(src, mnt, local_dir=local, stage=False) as m:
        keys = [m.manifest.keys[i] for i in range(len(m.manifest))]
        for _ in range(4):   # 4 epochs; the kernel keeps every page after the first
            _read_all(mnt, keys)
        if opens:   # the kernel sends RELEASE after close returned, in the background
            wait_until(lambda: m.stats().opens_cached == 3 * N, 5)
        s = m.stats()
        assert s.opens_source == N and s.opens_local == 0   # files read through the daemon: once each
        text, doc = _cli_stats(mnt), json.loads(_cli_stats(mnt, "--json"))
        if opens:
            assert (s.opens, s.opens_cached) == (4 * N, 3 * N) and s.page_cache_counted
            assert f"opens {4 * N}, {3 * N} of them with no read reaching the daemon (served by the kernel's " \
                   "page cache" in text
            assert (doc["opens"], doc["opens_cached"], doc["page_cache_counted"]) == (4 * N, 3 * N, True)
            assert "note" not in doc
        else:
            assert s.opens is None and s.opens_cached is None and not s.page_cache_counted
            assert "page cache are not counted" in text and "not of opens" in text
            assert doc["opens_cached"] is None and doc["page_cache_counted"] is False and "note" in doc
        # control: pages dropped, the next pass reaches the daemon and is not counted as the cache's
        from clairvoyant.testing import drop_pages
        drop_pages(os.path.join(mnt, k) for k in keys)
        _read_all(mnt, keys)
        if opens:
            wait_until(lambda: m.stats().opens_cached == 4 * N, 5)
        s2 = m.stats()
        assert s2.opens_source == 2 * N
        if opens:   # drop_pages opens each file and reads nothing: counted with the page cache's
            assert s2.opens_cached == 4 * N and s2.opens == 6 * N


def test_the_work_directory_of_a_killed_mount_is_removed_by_the_next(tmp_path):
    import tempfile

    from clairvoyant.mount.fs import WORK_PREFIX
    src, mnt, local = _tree(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{dead.pid}.")    # as a SIGKILLed mount process leaves it
    live = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}.")  # control: a live process's stays
    try:
        with Mount(src, mnt, local_dir=local, stage=False) as m:
            assert os.path.basename(m._work).startswith(f"{WORK_PREFIX}{os.getpid()}.")
        assert not os.path.exists(left) and os.path.isdir(live)
    finally:
        os.rmdir(live)
        if os.path.exists(left):
            os.rmdir(left)


@pytest.mark.parametrize("damage", [None, "child", "dir", "count"])
def test_a_damaged_listing_is_refused_by_the_daemon_at_start(tmp_path, monkeypatch, damage):
    """The daemon checks every offset and index of the listing it maps before serving anything:
    a child pointing past the files, a folder's name past the strings, children counted past the
    end. Control: the listing as written mounts."""
    import struct

    from clairvoyant.mount import listing

    real = listing.write

    def write(path, manifest):
        real(path, manifest)
        if damage is None:
            return
        with open(path, "r+b") as f:
            blob = bytearray(f.read())
            _, _, _, nfiles, ndirs, nchildren, strings = struct.unpack_from("<8sII4Q", blob, 0)
            dirs_at = 64 + 56 * nfiles
            children_at = dirs_at + 56 * ndirs
            if damage == "child":    # the first child: a file number past the files
                struct.pack_into("<Q", blob, children_at + 8, (nfiles + 5) << 1)
            elif damage == "dir":    # the root's path: past the strings
                struct.pack_into("<Q", blob, dirs_at, strings + 1)
            else:                    # the root's children: more than there are
                struct.pack_into("<Q", blob, dirs_at + 16, nchildren + 1)
            f.seek(0)
            f.write(blob)

    monkeypatch.setattr(listing, "write", write)
    src, mnt, local = _tree(tmp_path)
    if damage is None:
        with Mount(src, mnt, local_dir=local, stage=False):
            assert os.listdir(mnt)
        return
    with pytest.raises(Exception, match="damaged listing"):
        with Mount(src, mnt, local_dir=local, stage=False):
            pass
    assert not mounted(mnt)
