"""Tar shards as a source (source/shards.py) and `clairvoyant pack` (pack/tar.py). Every check has a
negative control that must fail."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import os
import pickle
import tarfile

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant import manifest as manifest_mod
from clairvoyant.cli.main import main
from clairvoyant.errors import ConfigError, SampleReadError
from clairvoyant.pack.tar import STATE, pack
from clairvoyant.source import PosixSource, TarShardSource, as_source
from clairvoyant.source import shards as shards_mod
from clairvoyant.source import tarindex as tarindex_mod
from clairvoyant.source.shards import ShardError, split_member


def write_tar(path, members, end=True, format=tarfile.PAX_FORMAT):
    """members: (name, bytes) in order; ``end=False`` leaves out the end-of-archive blocks."""
    buf = io.BytesIO()
    tf = tarfile.open(fileobj=buf, mode="w", format=format)
    for name, data in members:
        ti = tarfile.TarInfo(name)
        if data is None:
            ti.type = tarfile.DIRTYPE
            tf.addfile(ti)
            continue
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    if end:
        tf.close()
        raw = buf.getvalue()
    else:
        raw = buf.getvalue()   # no close: no end blocks
    with open(path, "wb") as f:
        f.write(raw)
    return path


def blob(i: int, n: int = 700) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (n // 32) + bytes([i % 256]) * (n % 32)


def ranges_match(path: str, offsets: dict) -> bool:
    """Do the ranges ``offsets[key] = (offset, length)`` read back each data member's bytes?"""
    with tarfile.open(path) as tf, open(path, "rb") as f:
        for key, (off, n) in offsets.items():
            member = tf.extractfile(tf.getmember(key) if key in tf.getnames() else "./" + key).read()
            if os.pread(f.fileno(), n, off) != member:
                return False
    return True


SHARD = "24KiB"   # 7 to 9 of the test images a shard


@pytest.fixture
def packed(dataset, tmp_path):
    """The 96-image tree packed into about 12 shards."""
    res = pack(dataset, tmp_path / "packed", shard_size=SHARD)
    assert res.shards >= 10 and res.samples == 96
    return res.dst


def per_shard(d) -> list[int]:
    """Samples in each shard, in shard order."""
    src = TarShardSource(d)
    return np.bincount(src.index.shard, minlength=len(src.paths)).tolist()


# -- the index ----------------------------------------------------------------------------------

def test_index_offsets_read_back_exactly_the_member_bytes(tmp_path):
    long = "deep/" * 25 + "x.png"   # over 100 bytes: a PAX header before it
    path = write_tar(tmp_path / "a.tar", [
        ("c0", None), ("c0/img001.jpg", blob(1)), ("c0/img001.cls", b"3"), ("./c1/img.v2.jpg", blob(2, 1)),
        ("c1/img.cls", b" 7\n"), ("c1/nodata.txt", b"x"), ("c1/nodata.jpg", blob(3, 512)),
        ("c1/nodata.json", b'{"w": 1}'), (long, blob(4, 1500)), ("c0/zero.jpg", b""),
    ])
    src = TarShardSource(tmp_path / "a.tar", fields=True)
    keys = [k for k, _ in src.scan()]
    assert keys == sorted(["c0/img001.jpg", "c1/img.v2.jpg", "c1/nodata.jpg", long, "c0/zero.jpg"])
    offsets = {k: src.locate(k)[1:] for k in keys}
    assert ranges_match(str(path), offsets)
    with tarfile.open(path) as tf:
        assert all(src.read(k) == tf.extractfile(k).read() for k in keys if k != "c1/img.v2.jpg")
    assert dict(src.scan())[long] == 1500 and src.read("c0/zero.jpg") == b""
    assert src.labels == {"c0/img001.jpg": 3, "c1/img.v2.jpg": 7, "c1/nodata.jpg": -1, long: -1, "c0/zero.jpg": -1}
    assert src.has_fields and src.fields_of("c1/nodata.jpg") == {"w": 1} and src.fields_of("c0/img001.jpg") == {}
    # negative control: an offset one byte off is caught
    shifted = dict(offsets, **{"c0/img001.jpg": (offsets["c0/img001.jpg"][0] + 1, offsets["c0/img001.jpg"][1])})
    assert not ranges_match(str(path), shifted)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_header_reader_agrees_with_tarfile(tmp_path, fmt):
    """Long names (a ustar prefix, a GNU long name, a PAX path), non-ASCII names (GNU, PAX),
    a symbolic link and a directory between the samples."""
    names = ["a/" + "d" * 60 + "/" + "e" * 60 + f"/{i}.jpg" for i in range(3)] + ["b/x.png", "b/y.jpeg"]
    if fmt != tarfile.USTAR_FORMAT:
        names += ["c/ü.webp", "c/" + "f" * 120 + ".jpg"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, n in enumerate(names):
            ti = tarfile.TarInfo(n)
            ti.size = 300 * i
            tf.addfile(ti, io.BytesIO(blob(i, ti.size)))
            if i == 1:
                link = tarfile.TarInfo("a/link.jpg")
                link.type, link.linkname = tarfile.SYMTYPE, "x" * (50 if fmt == tarfile.USTAR_FORMAT else 150)
                tf.addfile(link)
                folder = tarfile.TarInfo("a/dir")
                folder.type = tarfile.DIRTYPE
                tf.addfile(folder)
    (tmp_path / "f.tar").write_bytes(buf.getvalue())
    src = TarShardSource(tmp_path / "f.tar")
    with tarfile.open(tmp_path / "f.tar") as tf:
        want = {m.name: (m.offset_data, m.size) for m in tf.getmembers() if m.isreg()}
    assert {k: src.locate(k)[1:] for k, _ in src.scan()} == want
    # negative control: the reader's view differs from one shifted by a block
    assert {k: (o + 512, n) for k, (o, n) in want.items()} != want


def test_a_compressed_shard_is_refused(tmp_path):
    import gzip
    write_tar(tmp_path / "plain.tar", [("a/1.jpg", blob(1))])
    (tmp_path / "z.tar").write_bytes(gzip.compress((tmp_path / "plain.tar").read_bytes()))
    with pytest.raises(ShardError, match=r"z\.tar is not an uncompressed tar.*\.tar\.gz cannot be read by range"):
        TarShardSource(tmp_path / "z.tar")
    assert TarShardSource(tmp_path / "plain.tar").read("a/1.jpg") == blob(1)


def test_labels_fall_back_to_imagefolder_then_to_minus_one(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    write_tar(d / "0.tar", [("b/1.jpg", blob(1)), ("a/2.png", blob(2))])
    src = TarShardSource(d)
    assert src.classes == ("a", "b") and src.labels == {"a/2.png": 0, "b/1.jpg": 1}
    flat = tmp_path / "f.tar"
    write_tar(flat, [("1.jpg", blob(1)), ("b/2.jpg", blob(2))])
    assert TarShardSource(flat).labels == {"1.jpg": -1, "b/2.jpg": -1}
    assert split_member("a.b/c.tar.gz") == ("a.b/c", "tar.gz")


def test_persisted_index_is_reused_and_a_changed_shard_is_read_again(dataset, tmp_path, monkeypatch):
    d = pack(dataset, tmp_path / "p", shard_size=SHARD).dst
    n = len([f for f in os.listdir(d) if f.endswith(".tar")])
    scans = []
    real = tarindex_mod._scan_shard
    monkeypatch.setattr(tarindex_mod, "_scan_shard", lambda p, k: scans.append(p) or real(p, k))
    first = TarShardSource(d)
    assert len(scans) == n   # every shard's headers, once
    again = TarShardSource(d)
    assert len(scans) == n and again._index_file == first._index_file   # none the second time
    assert [k for k, _ in again.scan()] == [k for k, _ in first.scan()]
    # a shard changes (same name, other content): its headers only are read again
    victim = os.path.join(d, "shard-000003.tar")
    with tarfile.open(victim) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
    st = os.stat(victim)
    write_tar(victim, members[2:])   # its first sample gone
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # a file system with coarse times
    changed = TarShardSource(d)
    assert scans[n:] == [victim]
    assert len(list(changed.scan())) == 95
    # negative control: no change, no scan
    TarShardSource(d)
    assert scans[n:] == [victim]


def test_a_damaged_index_file_is_rebuilt(tmp_path, monkeypatch):
    write_tar(tmp_path / "a.tar", [("x/1.jpg", blob(1)), ("x/2.jpg", blob(2))])
    src = TarShardSource(tmp_path / "a.tar")
    with open(src._index_file, "r+b") as f:
        f.truncate(100)
    scans = []
    real = tarindex_mod._scan_shard
    monkeypatch.setattr(tarindex_mod, "_scan_shard", lambda p, k: scans.append(p) or real(p, k))
    assert TarShardSource(tmp_path / "a.tar").read("x/2.jpg") == blob(2)
    assert len(scans) == 1


def test_read_many_equals_read_per_key_and_coalesces(packed, monkeypatch):
    src = TarShardSource(packed)
    keys = [k for k, _ in src.scan()]
    wanted = keys[3:20] + keys[40:45] + [keys[3]]   # three shards' worth, out of order, one twice
    wanted = wanted[::-1]
    preads = []
    real = shards_mod._pread
    monkeypatch.setattr(shards_mod, "_pread", lambda fd, n, off: preads.append(n) or real(fd, n, off))
    got = src.read_many(wanted)
    assert got == [src.read(k) for k in wanted]
    coalesced = len(preads) - len(wanted)
    shards_hit = {src.locate(k)[0] for k in wanted}
    assert coalesced == len(shards_hit) >= 3   # one pread per shard
    # negative control: with no gap allowed, neighbours (a .cls member lies between) are read one by one
    preads.clear()
    assert src.read_many(wanted, gap=0) == got
    assert len(preads) == len(set(wanted))
    # a span limit splits a run
    preads.clear()
    src.read_many(keys[:8], max_span=1)
    assert len(preads) == 8


def _child_read(src, key, out):
    calls = []
    real = tarindex_mod._open_shard
    tarindex_mod._open_shard = lambda p: calls.append(p) or real(p)
    out.put((src.read(key), src.read_many([key])[0], len(calls), len(src._fds)))


def test_reads_after_fork_use_descriptors_of_their_own(packed, monkeypatch):
    src = TarShardSource(packed, max_open=4)
    keys = [k for k, _ in src.scan()]
    opens = []
    real = tarindex_mod._open_shard
    monkeypatch.setattr(tarindex_mod, "_open_shard", lambda p: opens.append(p) or real(p))
    parent = src.read(keys[0])
    src.read(keys[1])   # same shard: no second open
    assert len(opens) == 1
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(src, keys[1], q))
    p.start()
    data, many, child_opens, child_fds = q.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0
    assert data == many == src.read(keys[1]) and parent == src.read(keys[0])
    assert child_opens == 1 and child_fds == 1   # the child opened the shard again, for itself
    # the descriptor cache stays bounded
    for k in keys[::8]:
        src.read(k)
    assert len(src._fds) <= 4
    # negative control: the parent, which has it open, opens nothing for the same shard
    before = len(opens)
    src.read(keys[::8][-1])
    assert len(opens) == before
    # a pickled copy (spawn, a reader on another node) reads the same bytes from the saved index
    copy = pickle.loads(pickle.dumps(src))
    assert copy.read(keys[5]) == src.read(keys[5]) and copy._index is not None


def test_bad_shards_give_typed_errors_naming_the_shard(tmp_path):
    good = [("a/1.jpg", blob(1)), ("a/1.cls", b"0"), ("a/2.jpg", blob(2, 3000)), ("a/2.cls", b"0")]
    d = tmp_path / "ok"
    d.mkdir()
    write_tar(d / "0.tar", good)
    assert len(list(TarShardSource(d).scan())) == 2   # negative control: the good shard loads

    (tmp_path / "junk.tar").write_bytes(b"this is no tar" * 100)
    with pytest.raises(ShardError, match=r"junk\.tar is not an uncompressed tar"):
        TarShardSource(tmp_path / "junk.tar")

    raw = (d / "0.tar").read_bytes()
    cut = raw[:512 + 1024 + 512 + 100]   # inside the second sample's data
    (tmp_path / "cut.tar").write_bytes(cut)
    with pytest.raises(ShardError, match=r"cut\.tar .*truncated"):
        TarShardSource(tmp_path / "cut.tar")
    write_tar(tmp_path / "noend.tar", good, end=False)   # cut at a member boundary: no end blocks
    with pytest.raises(ShardError, match=r"noend\.tar .*truncated"):
        TarShardSource(tmp_path / "noend.tar")

    dup = tmp_path / "dup"
    dup.mkdir()
    write_tar(dup / "0.tar", good)
    write_tar(dup / "1.tar", [("a/2.png", blob(9))])
    with pytest.raises(ShardError, match=r"'a/2' is in two shards, .*0\.tar and .*1\.tar"):
        TarShardSource(dup)

    write_tar(tmp_path / "nodata.tar", [("a/1.jpg", blob(1)), ("a/3.cls", b"1"), ("a/3.txt", b"hi")])
    with pytest.raises(ShardError, match=r"sample 'a/3' of shard .*nodata\.tar has no data member .*data_key="):
        TarShardSource(tmp_path / "nodata.tar")
    write_tar(tmp_path / "text.tar", [("a/3.cls", b"1"), ("a/3.txt", b"hi")])
    assert TarShardSource(tmp_path / "text.tar", data_key="txt").read("a/3.txt") == b"hi"

    write_tar(tmp_path / "badcls.tar", [("a/1.jpg", blob(1)), ("a/1.cls", b"cat")])
    with pytest.raises(ShardError, match="not an integer"):
        TarShardSource(tmp_path / "badcls.tar")
    for e in (ShardError, SampleReadError):
        assert issubclass(e, OSError)

    # a shard cut after it was indexed: the read says so
    d2 = tmp_path / "later"
    d2.mkdir()
    write_tar(d2 / "0.tar", good)
    src = TarShardSource(d2)
    with open(d2 / "0.tar", "r+b") as f:
        f.truncate(1500)
    with pytest.raises(SampleReadError, match=r"0\.tar ends before"):
        src.read("a/2.jpg")
    with pytest.raises(SampleReadError, match="not in the shards"):
        src.read("a/9.jpg")


def test_as_source_recognises_shards(packed, dataset, tmp_path):
    assert isinstance(as_source(packed), TarShardSource)
    assert isinstance(as_source(os.path.join(packed, "shard-000000.tar")), TarShardSource)
    assert isinstance(as_source(os.path.join(packed, "shard-00000[01].tar")), TarShardSource)   # a glob
    assert len(list(as_source(os.path.join(packed, "shard-00000[01].tar")).scan())) == sum(per_shard(packed)[:2])
    # negative control: a directory with anything besides .tar files is a tree of files
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_tar(mixed / "0.tar", [("a.jpg", b"1")])
    (mixed / "notes.txt").write_text("x")
    assert isinstance(as_source(mixed), PosixSource) and isinstance(as_source(dataset), PosixSource)


# -- pack ---------------------------------------------------------------------------------------

def _shard_bytes(d) -> dict:
    out = {}
    for n in sorted(os.listdir(d)):
        if n.endswith(".tar"):
            with open(os.path.join(d, n), "rb") as f:
                out[n] = f.read()
    return out


def _state(d) -> dict:
    with open(os.path.join(d, STATE)) as f:
        return json.load(f)


def test_pack_is_deterministic(dataset, tmp_path):
    a = pack(dataset, tmp_path / "a", shard_size=SHARD)
    b = pack(dataset, tmp_path / "b", shard_size=SHARD, threads=3)
    assert _shard_bytes(a.dst) == _shard_bytes(b.dst) and len(_shard_bytes(a.dst)) == a.shards
    assert a.bytes == sum(map(len, _shard_bytes(a.dst).values())) and a.data_key is None
    sizes = [len(v) for v in _shard_bytes(a.dst).values()]
    assert max(sizes) <= 24 * 1024 < max(sizes) + 3 * 1024   # full up to the size, never past it
    # negative control: another shard size gives other shards
    c = pack(dataset, tmp_path / "c", shard_size="48KiB")
    assert c.shards < a.shards and _shard_bytes(c.dst) != _shard_bytes(a.dst)


class Killed(Exception):
    pass


def test_pack_resumes_after_a_kill_and_keeps_the_complete_shards(dataset, tmp_path):
    whole = pack(dataset, tmp_path / "whole", shard_size=SHARD)
    ends = np.cumsum(per_shard(whole.dst)).tolist()
    dst = tmp_path / "resumed"
    done = [0]

    def kill_in_the_fourth_shard(n):
        done[0] += n
        if done[0] == ends[2] + 1:
            raise Killed()

    with pytest.raises(Killed):
        pack(dataset, dst, shard_size=SHARD, progress=kill_in_the_fourth_shard)
    left = sorted(os.listdir(dst))
    assert left == [STATE] + [f"shard-{i:06d}.tar" for i in range(3)]   # complete shards only, no temporary
    assert not _state(dst)["complete"]
    kept = {n: os.stat(dst / n).st_ino for n in left if n.endswith(".tar")}
    (dst / f".shard-000003.tar.{2**22 + 12345}.tmp").write_bytes(b"half")   # a killed writer's leftover
    counted = []
    res = pack(dataset, dst, shard_size=SHARD, progress=counted.append)
    assert (res.kept, res.written) == (3, whole.shards - 3) and sum(counted) == 96 and counted[0] == ends[2]
    assert {n: os.stat(dst / n).st_ino for n in kept} == kept   # not rewritten
    assert _shard_bytes(dst) == _shard_bytes(whole.dst)
    assert sorted(os.listdir(dst)) == [STATE] + [f"shard-{i:06d}.tar" for i in range(whole.shards)]
    assert _state(dst)["complete"]
    # negative control: the interrupted directory was not a whole pack
    assert len(kept) < whole.shards


def test_pack_refuses_a_dst_with_other_files_or_settings(dataset, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="no part of a pack"):
        pack(dataset, other)
    assert os.listdir(other) == ["notes.txt"]
    pack(dataset, tmp_path / "p", shard_size=SHARD)
    with pytest.raises(ConfigError, match="shard_size"):
        pack(dataset, tmp_path / "p", shard_size="48KiB")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    write_tar(foreign / "shard-000000.tar", [("a.jpg", b"1")])
    with pytest.raises(ConfigError, match="without a"):
        pack(dataset, foreign)
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(b"1")
    (flat / "a.png").write_bytes(b"2")
    with pytest.raises(ConfigError, match="would be one sample"):
        pack(flat, tmp_path / "flatpack")
    # negative control: the same settings again are accepted (nothing to do)
    assert pack(dataset, tmp_path / "p", shard_size=SHARD).written == 0


def test_cli_pack(dataset, tmp_path, capsys):
    assert main(["pack", dataset, str(tmp_path / "c"), "--shard-size", "64KiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples"] == 96 and out["shards"] == len(_shard_bytes(tmp_path / "c")) > 1
    assert main(["pack", dataset, str(tmp_path / "c"), "--shard-size", "1MiB"]) == 2   # other settings
    assert "other settings" in capsys.readouterr().err
    assert main(["pack", dataset, str(tmp_path / "d"), "--shard-size", "lots"]) == 2


# -- the tree and its pack: the same batches; a full per-sample shuffle -------------------------

def _batches(source, tmp, seed, epochs=2, **kw):
    out = []
    with Loader(source, batch_size=8, seed=seed, local_dir=tmp, num_workers=1, output="numpy", **kw) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            out.append([(np.array(x), np.array(y)) for x, y in ld])
    return out


def _same(a, b) -> bool:
    return all(len(ea) == len(eb) and all(np.array_equal(xa, xb) and np.array_equal(ya, yb)
                                          for (xa, ya), (xb, yb) in zip(ea, eb)) for ea, eb in zip(a, b))


def test_a_tree_and_its_pack_give_identical_batches(dataset, packed, tmp_path):
    tree = _batches(dataset, tmp_path / "t", seed=5, decode="numpy")
    shards = _batches(packed, tmp_path / "s", seed=5, decode="numpy")
    assert tree[0][0][0].shape == (8, 32, 32, 3)
    assert _same(tree, shards)
    assert not _same([tree[0]], [tree[1]])   # the epochs differ
    # negative control: another seed differs
    assert not _same(tree, _batches(packed, tmp_path / "o", seed=6, decode="numpy"))


def test_nested_keys_line_up(tmp_path):
    root = tmp_path / "tree"
    names = ["a/b/x.jpg", "a/b-c/y.jpg", "a/b.c/z.jpg", "a-b/q.jpg", "a-b/q-1.jpg", "a/deep/er/w.v2.jpg",
             "a/é/u.png", "b/s.jpeg"]
    for i, n in enumerate(names):
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(blob(i, 100 + i))
    tree = as_source(root)
    res = pack(tree, tmp_path / "p", shard_size="12KiB")
    assert res.shards > 1
    mt, _ = manifest_mod.obtain(tree)
    ms, _ = manifest_mod.obtain(as_source(res.dst))
    assert list(ms.keys) == list(mt.keys) and ms.sizes.tolist() == mt.sizes.tolist()
    assert ms.labels.tolist() == mt.labels.tolist() and ms.classes == mt.classes == ("a", "a-b", "b")
    shard_src = TarShardSource(res.dst)
    assert all(shard_src.read(k) == tree.read(k) for k in mt.keys)
    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731
    assert _same(_batches(root, tmp_path / "t", 3, epochs=1, decode=digest),
                 _batches(res.dst, tmp_path / "s", 3, epochs=1, decode=digest))
    # negative control: the bare WebDataset keys would sort otherwise (why keys are member names)
    bare = sorted(names, key=lambda k: split_member(k)[0])
    assert bare != sorted(names)


def test_the_shuffle_is_per_sample_not_per_shard(packed, tmp_path):
    src = TarShardSource(packed)
    shard_of = {hashlib.md5(src.read(k)).hexdigest(): src.locate(k)[0] for k, _ in src.scan()}
    digest = lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy()   # noqa: E731
    (epoch,) = _batches(packed, tmp_path / "l", seed=1, epochs=1, decode=digest)

    def mixed(batches) -> float:
        """The mean number of shards a batch's samples come from."""
        return float(np.mean([len({shard_of[bytes(d).hex()] for d in x}) for x, _ in batches]))

    assert mixed(epoch) >= 4   # 8 draws from about 12 shards: about 6 on average
    order = [bytes(d).hex() for x, _ in epoch for d in x]
    assert len(set(order)) == 96
    # negative control: WebDataset's order (shards shuffled, each read through, a small buffer)
    rng = np.random.default_rng(1)
    by_shard: dict = {}
    for h, s in shard_of.items():
        by_shard.setdefault(s, []).append(h)
    grouped = [h for s in rng.permutation(sorted(by_shard)) for h in by_shard[s]]
    fake = [([bytes.fromhex(h) for h in grouped[i:i + 8]], None) for i in range(0, 96, 8)]
    assert mixed(fake) <= 2
