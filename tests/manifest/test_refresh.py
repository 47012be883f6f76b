"""A directory source's manifest records its folders and file attributes (tree.py) and is checked
against the source at each start, one stat per folder, the changed folders listed again
(refresh.py). Each check comes with a control that shows it can fail."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import numpy as np
import pytest

from clairvoyant import manifest as M
from clairvoyant.errors import EmptySourceError, ManifestError
from clairvoyant.source import PosixSource, as_source
from clairvoyant.testing import EmulatedStore


@pytest.fixture
def calls(monkeypatch) -> dict[str, list[str]]:
    """What the source was asked: the folders listed and the folders stat'ed (spies)."""
    got: dict[str, list[str]] = {"listdir": [], "stat_folder": []}
    for name in got:
        real = getattr(PosixSource, name)

        def spy(self, rel, *a, _real=real, _name=name):
            got[_name].append(rel)
            return _real(self, rel, *a)

        monkeypatch.setattr(PosixSource, name, spy)
    return got


def _source(tmp_path) -> str:
    root = tmp_path / "src"
    for key in ("a/1.jpg", "a/2.jpg", "b/3.jpg", "b/deep/4.jpg", "c/5.jpg"):
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(key.encode() * 3)
    (root / "empty" / "nested").mkdir(parents=True)
    (root / ".hidden").mkdir()
    return str(root)


def _clear(calls) -> None:
    for v in calls.values():
        del v[:]


def test_folders_and_attributes_are_recorded_and_round_trip(tmp_path):
    src = _source(tmp_path)
    os.chmod(os.path.join(src, "b", "3.jpg"), 0o600)
    m = M.build(as_source(src))
    assert m.tree.dirs == ("", "a", "b", "b/deep", "c", "empty", "empty/nested")   # empty ones too, no hidden
    i = list(m.keys).index("b/3.jpg")
    st = os.stat(os.path.join(src, "b", "3.jpg"))
    assert m.tree.file_modes[i] == 0o600 and tuple(m.tree.file_times[i]) == (st.st_mtime_ns, st.st_atime_ns,
                                                                            st.st_ctime_ns)
    path = str(tmp_path / "m.manifest")
    M.save(m, path)
    back = M.load(path, verify=True)
    assert back.tree.dirs == m.tree.dirs and back.fingerprint == m.fingerprint
    for name in ("file_modes", "file_times", "dir_modes", "dir_times"):
        assert np.array_equal(getattr(back.tree, name), getattr(m.tree, name)), name
    # a manifest without folder records (a list file's, an earlier version's) is as before
    plain = M.Manifest(m.uri, m.keys, m.sizes, m.labels, m.classes)
    M.save(plain, path)
    assert M.load(path).tree is None and M.load(path).fingerprint == m.fingerprint
    # control: a tree that does not fit the keys is refused
    with pytest.raises(ValueError, match="tree"):
        M.Manifest(m.uri, m.keys[:2], m.sizes[:2], m.labels[:2], tree=m.tree)


def _header(path: str) -> tuple[bytes, dict, int]:
    with open(path, "rb") as f:
        data = f.read()
    hlen = int.from_bytes(data[12:16], "little")
    return data, json.loads(data[16:16 + hlen]), hlen


@pytest.mark.parametrize("how", ["folders", "section"])
def test_damaged_folder_records_are_refused_naming_the_path(tmp_path, how):
    path = str(tmp_path / "m.manifest")
    M.save(M.build(as_source(_source(tmp_path))), path)
    assert M.load(path).tree is not None   # control: as written it loads
    data, doc, hlen = _header(path)
    if how == "folders":
        doc["folders"] += 1
    else:
        doc["sections"]["dir_times"]["nbytes"] -= 8
    head = json.dumps(doc, separators=(",", ":")).encode().ljust(hlen)
    with open(path, "r+b") as f:
        f.seek(16)
        f.write(head)
    with pytest.raises(ManifestError, match=str(tmp_path)):
        M.load(path)


def test_an_unchanged_source_costs_one_stat_per_folder_and_no_listing(tmp_path, calls):
    src = _source(tmp_path)
    m, built = M.obtain(as_source(src))
    assert built and len(calls["listdir"]) == 7
    _clear(calls)
    again, built = M.obtain(as_source(src))
    assert not built and calls["listdir"] == [] and sorted(calls["stat_folder"]) == sorted(m.tree.dirs)
    assert list(again.keys) == list(m.keys) and again.fingerprint == m.fingerprint
    # control: a file added is noticed by the same check, its folder alone listed again
    (tmp_path / "src" / "b" / "deep" / "6.jpg").write_bytes(b"x")
    _clear(calls)
    again, built = M.obtain(as_source(src))
    assert not built and calls["listdir"] == ["b/deep"] and len(again) == len(m) + 1
    assert again.fingerprint != m.fingerprint


def test_folders_added_removed_and_renamed(tmp_path, calls, caplog):
    src = _source(tmp_path)
    root = tmp_path / "src"
    m, _ = M.obtain(as_source(src))
    shutil.rmtree(root / "b" / "deep")                       # gone, with its file
    os.rename(root / "c", root / "c2")                        # renamed: gone and new
    (root / "empty" / "nested" / "x" / "y").mkdir(parents=True)   # new folders, nested, one file
    (root / "empty" / "nested" / "x" / "y" / "7.jpg").write_bytes(b"7")
    (root / "a" / "1.jpg").unlink()
    _clear(calls)
    caplog.set_level(logging.INFO, logger="clairvoyant")
    got, built = M.obtain(as_source(src))
    assert not built
    assert list(got.keys) == ["a/2.jpg", "b/3.jpg", "c2/5.jpg", "empty/nested/x/y/7.jpg"]
    assert got.tree.dirs == ("", "a", "b", "c2", "empty", "empty/nested", "empty/nested/x", "empty/nested/x/y")
    assert sorted(calls["listdir"]) == ["", "a", "b", "c2", "empty/nested", "empty/nested/x", "empty/nested/x/y"]
    assert got.classes == ("a", "b", "c2", "empty") and got.labels.tolist() == [0, 1, 2, 3]
    text = caplog.text
    assert "2 files added, 3 removed" in text and "'b/deep'" in text and "'c'" in text, text
    # what was saved is what a fresh walk gives
    walked = M.build(as_source(src))
    assert list(walked.keys) == list(got.keys) and walked.fingerprint == got.fingerprint
    assert walked.tree.dirs == got.tree.dirs
    saved = M.load(M.default_manifest_path(got.uri)).tree
    assert np.array_equal(walked.tree.dir_times[:, [0, 2]], saved.dir_times[:, [0, 2]])   # mtime, ctime
    # control: everything gone is an error that names the source
    for d in ("a", "b", "c2", "empty"):
        shutil.rmtree(root / d)
    with pytest.raises(EmptySourceError, match=str(root)):
        M.obtain(as_source(src))


def test_a_whole_second_mtime_next_to_its_listing_is_listed_again_once(tmp_path, calls):
    src = _source(tmp_path)
    a = os.path.join(src, "a")
    second = int(time.time())
    os.utime(a, ns=(second * 10 ** 9, second * 10 ** 9))   # as a file system with whole seconds shows it
    os.utime(os.path.join(src, "c"), ns=(second * 10 ** 9 + 5, second * 10 ** 9 + 5))   # control: not whole
    M.obtain(as_source(src))
    while time.time() < second + 1.05:   # a change still in that second would not move the mtime
        time.sleep(0.05)
    _clear(calls)
    M.obtain(as_source(src))
    assert calls["listdir"] == ["a"]   # its mtime could not vouch for its listing
    _clear(calls)
    M.obtain(as_source(src))
    assert calls["listdir"] == []       # listed after that second: now it can


def test_the_emulated_store_charges_a_stat_per_folder_for_the_check(tmp_path):
    store = EmulatedStore(_source(tmp_path), open_latency=0.0, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    store.reset()
    M.obtain(store)
    assert store.counters().listings == 7
    store.reset()
    M.obtain(store)   # a stat per folder, counted as such (metadata requests, not opens of files)
    c = store.counters()
    assert (c.listings, c.opens, c.getattrs) == (0, 0, 7)
    (tmp_path / "src" / "a" / "new.jpg").write_bytes(b"n")
    M.obtain(store)
    assert store.counters().listings == 1   # control: a changed folder's listing is charged


def test_a_list_file_source_records_no_folders(tmp_path, calls):
    src = _source(tmp_path)
    lst = tmp_path / "src" / "l.csv"
    lst.write_text("path,label\na/1.jpg,0\nb/3.jpg,1\n")
    m, _ = M.obtain(as_source(str(lst)))
    assert m.tree is None and calls["stat_folder"] == [] and calls["listdir"] == []
    assert M.obtain(as_source(str(lst)))[0].tree is None
    assert M.obtain(as_source(src))[0].tree is not None   # control: the directory itself does


def test_a_subclass_with_a_scan_of_its_own_keeps_it(tmp_path):
    class OnlyA(PosixSource):
        def scan(self):
            return ((k, s) for k, s in super().scan() if k.startswith("a/"))

    src = _source(tmp_path)
    m = M.build(OnlyA(src))
    assert list(m.keys) == ["a/1.jpg", "a/2.jpg"] and m.tree is None
    assert M.build(PosixSource(src)).tree is not None   # control: the plain directory walks its tree


def test_a_manifest_the_user_gave_is_checked_but_never_rewritten(tmp_path, caplog):
    """``manifest=PATH`` pins the data set (for reproducibility): a change of the source is logged,
    the file stays as it was and the manifest is used as it is. Control: the default manifest
    follows the source."""
    src = _source(tmp_path)
    pinned = str(tmp_path / "pinned.manifest")
    first, built = M.obtain(as_source(src), pinned)
    assert built and len(first) == 5
    before = (tmp_path / "pinned.manifest").read_bytes()
    time.sleep(0.01)
    (tmp_path / "src" / "a" / "new.jpg").write_bytes(b"new")
    caplog.set_level(logging.WARNING, logger="clairvoyant")
    again, built = M.obtain(as_source(src), pinned)
    assert not built and len(again) == 5 and again.fingerprint == first.fingerprint
    assert (tmp_path / "pinned.manifest").read_bytes() == before
    assert "is used as it is" in caplog.text
    followed, _ = M.obtain(as_source(src))   # control: the default place follows the source
    assert len(followed) == 6
    rebuilt, built = M.obtain(as_source(src), pinned, reindex=True)
    assert built and len(rebuilt) == 6 and (tmp_path / "pinned.manifest").read_bytes() != before


def test_a_damaged_manifest_of_ours_is_listed_again_and_a_pinned_one_is_an_error(tmp_path, caplog):
    """A crash of an older version could leave a torn manifest at the default place: it is listed
    again, with a warning; a damaged manifest the user gave stays theirs to fix (control)."""
    src = _source(tmp_path)
    M.obtain(as_source(src))
    default = M.default_manifest_path(as_source(src).uri)
    with open(default, "r+b") as f:
        f.truncate(100)
    caplog.set_level(logging.WARNING, logger="clairvoyant")
    again, built = M.obtain(as_source(src))
    assert built and len(again) == 5 and "cannot be read" in caplog.text
    mine = tmp_path / "mine.manifest"
    mine.write_bytes(b"\x89CVYMAN\n" + b"\0" * 40)
    with pytest.raises(ManifestError):
        M.obtain(as_source(src), str(mine))
