"""The persisted manifest: the binary format (version 2), the JSON one (version 1) still read, the
lazy keys, the fingerprint, and the lookup of cache entry names (Loader._residents)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant import manifest as M
from clairvoyant.cache.extents import key_digest
from clairvoyant.errors import ManifestError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def old_fingerprint(keys, sizes, labels) -> str:
    """The fingerprint as versions before the binary format computed it."""
    h = hashlib.sha1()
    for k in keys:
        h.update(k.encode())
        h.update(b"\0")
    h.update(np.ascontiguousarray(sizes, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()[:20]


def sample(n: int = 300, seed: int = 0) -> M.Manifest:
    rng = np.random.default_rng(seed)
    entries = [(f"c{i % 5}/é{i}_{rng.integers(1e6)}.jpg", int(rng.integers(1, 10 ** 6))) for i in range(n)]
    return M.Manifest.from_entries("file:///data", entries)


def same(a: M.Manifest, b: M.Manifest) -> bool:
    return (a.uri == b.uri and list(a.keys) == list(b.keys) and np.array_equal(a.sizes, b.sizes)
            and np.array_equal(a.labels, b.labels) and a.classes == b.classes and a.created == b.created)


def test_round_trip_v2(tmp_path):
    m = sample()
    path = str(tmp_path / "m.manifest")
    M.save(m, path)
    with open(path, "rb") as f:
        assert f.read(8) == M.MAGIC
    back = M.load(path, verify=True)
    assert same(back, m) and back.fingerprint == m.fingerprint and back.labels.dtype == np.int32
    assert not back.sizes.flags.writeable and not back.labels.flags.writeable
    assert not same(back, sample(seed=1))   # control: another manifest differs


def test_v1_json_still_loads_with_the_same_fingerprint(tmp_path):
    m = sample()
    v1 = tmp_path / "m.json"   # what earlier versions wrote
    v1.write_text(json.dumps({"format": "clairvoyant-manifest", "version": 1, "uri": m.uri, "created": m.created,
                              "classes": list(m.classes),
                              "samples": [[k, int(s), int(l)] for k, s, l in zip(m.keys, m.sizes, m.labels)]}))
    old = M.load(str(v1))
    M.save(old, str(tmp_path / "m.manifest"))
    new = M.load(str(tmp_path / "m.manifest"))
    want = old_fingerprint(list(m.keys), m.sizes, m.labels)
    assert same(old, m) and old.fingerprint == new.fingerprint == m.fingerprint == want
    M.save(m, str(tmp_path / "again.json"), version=1)
    assert json.loads((tmp_path / "again.json").read_text())["version"] == 1
    assert same(M.load(str(tmp_path / "again.json")), m)


@pytest.mark.parametrize("change", ["size", "label", "key"])
def test_fingerprint_changes_with_content(tmp_path, change):
    m = sample()
    keys, sizes, labels = list(m.keys), m.sizes.copy(), m.labels.copy()
    if change == "size":
        sizes[7] += 1
    elif change == "label":
        labels[7] = (labels[7] + 1) % 5
    else:
        keys[7] = keys[7] + "x"
    other = M.Manifest(m.uri, keys, sizes, labels, m.classes)
    assert other.fingerprint != m.fingerprint   # each field counts
    assert other.fingerprint == old_fingerprint(keys, sizes, labels)
    M.save(other, str(tmp_path / "o.manifest"))
    assert M.load(str(tmp_path / "o.manifest")).fingerprint == other.fingerprint


def test_keys_behave_like_the_tuple():
    raw = ("a/1", "a/2", "b/ü", "b/with\0nul", "c/" + "x" * 300)
    keys = M.Keys.from_strings(raw)
    assert len(keys) == len(raw) and list(keys) == list(raw) and tuple(keys) == raw
    assert [keys[i] for i in range(len(raw))] == list(raw) and keys[-1] == raw[-1] and keys[-5] == raw[0]
    assert list(keys[1:4]) == list(raw[1:4]) and keys[::2] == list(raw[::2]) and list(keys[3:1]) == []
    assert list(enumerate(keys)) == list(enumerate(raw)) and list(zip(keys, raw)) == list(zip(raw, raw))
    assert keys == raw and keys == list(raw) and "b/ü" in keys and keys.index("b/ü") == 2
    assert keys != raw[:-1] + ("c/y",) and "zz" not in keys   # control
    for bad in (5, -6):
        with pytest.raises(IndexError):
            keys[bad]
    assert pickle.loads(pickle.dumps(keys)) == keys
    many = M.Keys.from_strings(f"k{i}" for i in range(70000))   # iteration crosses its chunks
    assert list(many) == [f"k{i}" for i in range(70000)]


def test_manifest_from_a_key_slice(tmp_path):
    m = sample()
    part = M.Manifest(m.uri, m.keys[10:20], m.sizes[10:20], m.labels[10:20], m.classes)
    assert list(part.keys) == list(m.keys)[10:20]
    assert part.fingerprint == old_fingerprint(list(m.keys)[10:20], m.sizes[10:20], m.labels[10:20])
    M.save(part, str(tmp_path / "p.manifest"))
    assert same(M.load(str(tmp_path / "p.manifest")), part)


def test_empty_manifest_round_trip(tmp_path):
    m = M.Manifest.from_entries("file:///empty", [])
    M.save(m, str(tmp_path / "e.manifest"))
    back = M.load(str(tmp_path / "e.manifest"), verify=True)
    assert len(back) == 0 and list(back.keys) == [] and back.fingerprint == old_fingerprint([], [], [])


def _header(path):
    data = Path(path).read_bytes()
    _, _, hlen = struct.unpack_from("<8sII", data)
    return data, json.loads(data[16:16 + hlen]), hlen


def _rewrite_header(path, doc, hlen):
    """Put ``doc`` in place of the header, padded to its length (the sections stay where they are)."""
    data = bytearray(Path(path).read_bytes())
    doc["created"] = 1   # room for the change
    new = json.dumps(doc, separators=(",", ":")).encode()
    assert len(new) <= hlen
    data[16:16 + hlen] = new + b" " * (hlen - len(new))
    Path(path).write_bytes(bytes(data))


def damage(path, how):
    data, doc, hlen = _header(path)
    secs = doc["sections"]
    base = -(-(16 + hlen) // 64) * 64
    if how == "truncated":
        Path(path).write_bytes(data[:len(data) - 100])
    elif how == "truncated-header":
        Path(path).write_bytes(data[:12])
    elif how == "magic":
        Path(path).write_bytes(b"\x89XXXXXX\n" + data[8:])
    elif how == "version":
        Path(path).write_bytes(data[:8] + struct.pack("<I", 3) + data[12:])
    elif how == "header-json":
        Path(path).write_bytes(data[:16] + b"[" + data[17:])
    elif how == "offsets":   # key 3 starts before key 2
        a = bytearray(data)
        o = base + secs["key_offsets"]["offset"]
        dt = np.dtype(secs["key_offsets"]["dtype"])
        off = np.frombuffer(data, dtype=dt, count=doc["count"] + 1, offset=o).copy()
        off[3] = off[2] - 1
        a[o:o + off.nbytes] = off.tobytes()
        Path(path).write_bytes(bytes(a))
    elif how == "bounds":
        secs["sizes"]["offset"] = len(data)
        _rewrite_header(path, doc, hlen)
    elif how == "count":
        doc["count"] += 1
        _rewrite_header(path, doc, hlen)
    elif how == "dtype":
        secs["labels"]["dtype"] = "|O"
        _rewrite_header(path, doc, hlen)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "truncated-header", "magic", "version", "header-json", "offsets",
                                 "bounds", "count", "dtype"])
def test_damaged_v2_file_is_refused_naming_the_path(tmp_path, how):
    path = str(tmp_path / "m.manifest")
    M.save(sample(), path)
    assert len(M.load(path)) == 300   # control: the file as written loads
    damage(path, how)
    with pytest.raises(ManifestError, match=str(tmp_path)) as e:
        M.load(path)
    assert "delete it" in str(e.value) or "index --force" in str(e.value)


def test_verify_catches_a_changed_key_byte(tmp_path):
    path = str(tmp_path / "m.manifest")
    m = sample()
    M.save(m, path)
    data, doc, hlen = _header(path)
    at = -(-(16 + hlen) // 64) * 64 + doc["sections"]["keys"]["offset"]
    assert data[at:at + 2] == b"c0"
    Path(path).write_bytes(data[:at] + b"d" + data[at + 1:])
    assert M.load(path).keys[0].startswith("d0")   # the layout is sound: only the fingerprint tells
    with pytest.raises(ManifestError, match="fingerprint"):
        M.load(path, verify=True)


def test_unreadable_file_names_the_path(tmp_path):
    p = tmp_path / "m.json"
    p.write_bytes(b"\x00\x01 not a manifest")
    with pytest.raises(ManifestError, match=str(p)):
        M.load(str(p))


def test_legacy_json_at_the_default_place_is_read_and_saved_binary(dataset):
    from clairvoyant.source import as_source
    source = as_source(dataset)
    m, built = M.obtain(source)
    assert built and os.path.exists(M.default_manifest_path(source.uri))
    os.remove(M.default_manifest_path(source.uri))
    M.save(m, M.legacy_manifest_path(source.uri), version=1)   # an earlier version's cache
    again, built = M.obtain(source)
    assert not built and same(again, m) and again.fingerprint == m.fingerprint
    assert M.load(M.default_manifest_path(source.uri)).fingerprint == m.fingerprint


# -- the local tier index's digests -> manifest indices (Loader._residents) --------------------------

def test_find_digests_equals_the_dict(tmp_path):
    m = sample(2000)
    rng = np.random.default_rng(3)
    keys = list(m.keys)
    picked = rng.choice(len(keys), 500, replace=False).tolist()
    ask = [key_digest(keys[i]) for i in picked] + [key_digest("not/a/key"), 12345]
    want = picked + [-1, -1]
    M.save(m, str(tmp_path / "m.manifest"))
    for man in (m, M.load(str(tmp_path / "m.manifest"))):
        assert man.find_digests(np.array(ask, dtype=np.uint64)).tolist() == want
    # control: another key's digest finds another index
    assert m.find_digests(np.array([key_digest(keys[picked[0] + 1 if picked[0] + 1 < 2000 else 0])],
                                   dtype=np.uint64)).tolist() != [picked[0]]


def test_find_digests_trusts_no_digest_two_keys_share():
    m = M.Manifest("file:///d", ["a", "b", "b", "c"], [1, 2, 3, 4], [0, 0, 0, 0])
    got = m.find_digests(np.array([key_digest(k) for k in ("b", "a", "c")], dtype=np.uint64))
    assert got.tolist() == [-1, 0, 3]


def test_loader_residents_come_from_the_index(dataset, tmp_path):
    with Loader(dataset, batch_size=8, local_dir=tmp_path / "l", num_workers=1, output="numpy",
                decode=len, rank=0, world_size=1) as ld:
        for _ in ld:
            pass
        ld._inventory_used = True   # from now on _residents reads the tier's index
        keys = list(ld.manifest.keys)
        sizes = {i: int(ld._entry_sizes[i]) for i in range(len(keys))}
        assert ld._residents() == sizes
        store = ld.tiers.local
        store.delete(keys[1])                                   # gone
        loc = store.find(keys[2])                               # listed with the wrong size
        store.index.publish(key_digest(keys[2]), int(os.path.basename(loc.path)), loc.offset, loc.length + 1)
        got = ld._residents()
        assert got == {i: n for i, n in sizes.items() if i not in (1, 2)}
        assert 2 in {int(ld.manifest.find_digests(np.array([int(k, 16)], dtype=np.uint64))[0])
                     for k in store.entries()}                   # control: found, then refused by size


def test_plan_scale_benchmark_tiny():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plan_scale.py"), "--samples", "5000",
                        "--nodes", "2", "--lookups", "1000", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["samples"] == 5000 and out["v2"]["plan1_batches"] >= 1 and out["v2"]["lookups"] == 1000
