"""NumPy arrays as a source (source/arrays.py): rows of .npy files and .npz members as samples,
read by byte range, decoded back to their dtype and shape; bad files refused with typed errors."""

from __future__ import annotations

import os
import pickle
import zipfile

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.errors import ConfigError, SampleReadError
from clairvoyant.source import NumpySource, as_source
from clairvoyant.source.arrays import ArrayFileError


def _data(n: int = 90) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 3, 4)).astype(np.float32)
    x[:, 0, 0] = np.arange(n)   # each row says which it is
    return x, (np.arange(n) % 5).astype(np.int64)


def _epoch(source, tmp_path, epoch: int = 0, **kw) -> tuple[np.ndarray, np.ndarray]:
    with Loader(source, batch_size=8, local_dir=str(tmp_path / "local"), seed=1, num_workers=1,
                output="numpy", **kw) as ld:
        ld.set_epoch(epoch)
        xs, ys = zip(*[(np.asarray(b[0]), np.asarray(b[1])) for b in ld])
    return np.concatenate(xs), np.concatenate(ys)


def test_npy_rows_are_samples_every_one_once_per_epoch_as_in_the_files(tmp_path):
    """Two .npy files: an epoch gives every row once, bytes, dtype and shape as numpy reads them, in a
    shuffled order that changes with the epoch. Control: the epoch's order is not the files' order."""
    x, _ = _data()
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "a.npy", x[:50])
    np.save(d / "b.npy", x[50:])
    assert isinstance(as_source(str(d)), NumpySource)
    got, labels = _epoch(str(d), tmp_path)
    assert got.dtype == np.float32 and got.shape == x.shape
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(len(x)))          # every row once
    assert np.array_equal(got, x[order])                          # each with its bytes
    assert order.tolist() != list(range(len(x)))                  # control: shuffled
    again, _ = _epoch(str(d), tmp_path, epoch=1)
    assert again[:, 0, 0].astype(int).tolist() != order.tolist()  # another epoch, another order
    assert (labels == -1).all()


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_with_labels_stored_or_compressed(tmp_path, compressed):
    """An .npz with the samples in member ``x`` and their labels in ``y``: rows read by byte range
    where the member is stored, through NumPy where it is compressed; same samples, same labels."""
    x, y = _data()
    path = tmp_path / "run.npz"
    (np.savez_compressed if compressed else np.savez)(path, x=x, y=y, other=np.zeros(3))
    with zipfile.ZipFile(path) as zf:
        assert (zf.getinfo("x.npy").compress_type == zipfile.ZIP_STORED) != compressed
    src = NumpySource(str(path), dataset="x", labels="y")
    got, labels = _epoch(src, tmp_path)
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(len(x)))
    assert np.array_equal(got, x[order]) and np.array_equal(labels, y[order])


def test_one_file_per_sample(tmp_path):
    """``per_file=True``: each .npy is one sample, its whole array."""
    d = tmp_path / "vols"
    d.mkdir()
    vols = [np.full((2, 3, 4), i, np.int16) for i in range(12)]
    for i, v in enumerate(vols):
        np.save(d / f"v{i:02d}.npy", v)
    src = NumpySource(str(d), per_file=True)
    assert len(list(src.scan())) == 12
    got, _ = _epoch(src, tmp_path)
    assert got.shape == (12, 2, 3, 4) and got.dtype == np.int16
    assert sorted(int(g[0, 0, 0]) for g in got) == list(range(12))
    assert all((g == g[0, 0, 0]).all() for g in got)


def test_a_range_read_gives_each_rows_bytes(tmp_path):
    """Neighbouring rows form ranges of one read each; a range read gives each row's bytes as a
    read of it alone does, and the source survives a pickle (reader processes)."""
    x, _ = _data(300)
    np.save(tmp_path / "a.npy", x)
    src = NumpySource(str(tmp_path / "a.npy"))
    keys = [k for k, _ in src.scan()]
    assert keys == sorted(keys)   # zero-padded rows: sorted keys keep the rows' order
    of, nbytes = src.sample_ranges(keys, span=4096)
    assert len(nbytes) > 1 and (nbytes <= 4096).all()
    for r in range(len(nbytes)):
        members = [k for k, o in zip(keys, of) if o == r]
        datas, _ = src.read_range(members)
        assert datas == [src.read(k) for k in members]
    back = pickle.loads(pickle.dumps(src))
    assert back.read(keys[7]) == x[7].tobytes()


def test_bad_array_files_get_typed_errors_naming_them(tmp_path):
    x, _ = _data()
    np.save(tmp_path / "ok.npy", x)
    cut = tmp_path / "cut.npy"
    np.save(cut, x)
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(cut) - 100)
    with pytest.raises(ArrayFileError, match="cut.npy is truncated"):
        NumpySource(str(cut))
    objs = tmp_path / "objs.npy"
    np.save(objs, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ArrayFileError, match="objs.npy holds Python objects"):
        NumpySource(str(objs))
    fort = tmp_path / "fort.npy"
    np.save(fort, np.asfortranarray(x))
    with pytest.raises(ArrayFileError, match="Fortran order"):
        NumpySource(str(fort))
    z = tmp_path / "z.npz"
    np.savez(z, x=x)
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr("junk.npy", b"this is not an array")
    with pytest.raises(ConfigError, match=r"has no array 'nope'; it has \['junk', 'x'\]"):
        NumpySource(str(z), dataset="nope")
    with pytest.raises(ArrayFileError, match="member 'junk' of .*z.npz is not a NumPy array"):
        NumpySource(str(z), dataset="junk")
    assert len(list(NumpySource(str(z), dataset="x").scan())) == len(x)   # control: the good member
    other = tmp_path / "mixed"
    other.mkdir()
    np.save(other / "a.npy", x)
    np.save(other / "b.npy", x.astype(np.float64))
    with pytest.raises(ConfigError, match="share a dtype and a shape"):
        NumpySource(str(other))


def test_rows_cut_after_listing_name_the_sample_and_skip_goes_on(tmp_path):
    """A file cut after it was listed: reading its lost rows is a SampleReadError naming the sample
    and the file; with on_error="skip" the epoch gives every other row. Control: "raise" stops."""
    x, _ = _data()
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "a.npy", x[:50])
    np.save(d / "b.npy", x[50:])
    src = NumpySource(str(d))
    assert src.read("b.npy/35") == x[85].tobytes()   # control: whole before the cut
    path = str(d / "b.npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10 * x[0].nbytes)   # rows 30..39 of b.npy are gone
    with pytest.raises(SampleReadError, match=r"b.npy/3\d.*b.npy ends before byte"):
        src.read("b.npy/35")
    got, _ = _epoch(src, tmp_path, on_error="skip")
    assert sorted(got[:, 0, 0].astype(int).tolist()) == list(range(80))
    with pytest.raises(SampleReadError):
        _epoch(src, tmp_path / "again", on_error="raise")


def _tree_of_npy(root, n: int = 40) -> np.ndarray:
    """An ImageFolder-like tree of .npy files, one sample each (classes c0, c1)."""
    x, _ = _data(n)
    for i in range(n):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / f"s{i:03d}.npy", x[i])
    return x


def test_pack_npz_gives_shards_read_back_by_byte_range_with_the_trees_samples(tmp_path):
    """`clairvoyant pack --format npz`: a tree of .npy files into .npz shards of stored members (x the
    samples, y their labels), the same bytes twice over (deterministic), and Loader(DST) gives every
    sample once with its label, as the tree does. Control: a rerun keeps the shards; a shard size
    that is smaller gives more shards."""
    from clairvoyant.pack.arrays import pack_arrays

    x = _tree_of_npy(tmp_path / "tree")
    a = pack_arrays(str(tmp_path / "tree"), tmp_path / "a", shard_size=10 * x[0].nbytes)
    b = pack_arrays(str(tmp_path / "tree"), tmp_path / "b", shard_size=10 * x[0].nbytes)
    assert a.shards == 4 and a.samples == 40
    for s in sorted(os.listdir(tmp_path / "a")):
        if s.endswith(".npz"):
            assert (tmp_path / "a" / s).read_bytes() == (tmp_path / "b" / s).read_bytes()
            with zipfile.ZipFile(tmp_path / "a" / s) as zf:
                assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    again = pack_arrays(str(tmp_path / "tree"), tmp_path / "a", shard_size=10 * x[0].nbytes)
    assert again.written == 0 and again.kept == 4
    assert pack_arrays(str(tmp_path / "tree"), tmp_path / "c", shard_size=5 * x[0].nbytes).shards == 8
    src = as_source(str(tmp_path / "a"))
    assert isinstance(src, NumpySource) and src.dataset == "x"
    got, labels = _epoch(str(tmp_path / "a"), tmp_path / "la")
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(40)) and np.array_equal(got, x[order])
    assert np.array_equal(labels, order % 2)   # ImageFolder's classes, from the tree
    tree_x, tree_y = _epoch(str(tmp_path / "tree"), tmp_path / "lt", decode=lambda b: np.load(__import__("io").BytesIO(b)))
    assert np.array_equal(tree_x, got) and np.array_equal(tree_y, labels)   # the tree's batches, the same


def test_pack_npz_refuses_samples_that_are_not_alike_or_not_arrays(tmp_path):
    from clairvoyant.pack.arrays import pack_arrays

    _tree_of_npy(tmp_path / "tree", 6)
    np.save(tmp_path / "tree" / "c0" / "s999.npy", np.zeros((2, 2), np.float64))
    with pytest.raises(ConfigError, match=r"s999.npy' is float64 \(2, 2\).*share a dtype and a shape"):
        pack_arrays(str(tmp_path / "tree"), tmp_path / "out")
    (tmp_path / "t2" / "c0").mkdir(parents=True)
    (tmp_path / "t2" / "c0" / "a.npy").write_bytes(b"not an array at all")
    with pytest.raises(ConfigError, match="is not a NumPy array"):
        pack_arrays(str(tmp_path / "t2"), tmp_path / "out2")


def test_a_rewritten_file_or_other_labels_are_listed_again_not_read_from_an_old_manifest(tmp_path):
    """The source's identity covers each file's size and time and the options that shape the listing:
    a file rewritten with more rows is listed again (every row served), and labels asked for after a
    run without them are served. Control: the same files and options keep their identity."""
    x, y = _data()
    path = tmp_path / "run.npz"
    np.savez(path, x=x[:10], y=y[:10])
    first = NumpySource(str(path), dataset="x")
    assert NumpySource(str(path), dataset="x").uri == first.uri   # control
    got, labels = _epoch(first, tmp_path / "a")
    assert len(got) == 10 and (labels == -1).all()
    _, labels = _epoch(NumpySource(str(path), dataset="x", labels="y"), tmp_path / "b")
    assert sorted(labels.tolist()) == sorted(y[:10].tolist())
    os.utime(path, ns=(1, 1))
    np.savez(path, x=x, y=y)
    got, _ = _epoch(NumpySource(str(path), dataset="x"), tmp_path / "c")
    assert len(got) == len(x)


def test_compressed_members_are_inflated_once_while_they_fit(tmp_path, monkeypatch):
    """Shuffled reads across three compressed .npz files inflate each member once (kept, least
    recently read dropped past the bound). Control: with a bound of one byte the members are inflated
    again and again."""
    from clairvoyant.source import arrays as arrays_mod

    x, _ = _data(60)
    for i in range(3):
        np.savez_compressed(tmp_path / f"p{i}.npz", x=x[20 * i:20 * (i + 1)])
    loads = []
    real = np.load
    monkeypatch.setattr(arrays_mod.np, "load", lambda *a, **k: (loads.append(a[0]), real(*a, **k))[1])
    for bound, most in ((1 << 30, 3), (1, None)):
        monkeypatch.setattr(arrays_mod, "INFLATED", bound)
        loads.clear()
        src = NumpySource(str(tmp_path), dataset="x")
        keys = [k for k, _ in src.scan()]
        order = np.random.default_rng(0).permutation(len(keys))
        assert all(src.read(keys[i]) == x[i].tobytes() for i in order)
        if most is not None:
            assert len(loads) == most
        else:
            assert len(loads) > 10   # control


def test_structured_and_damaged_array_files_are_refused_by_name(tmp_path):
    rec = np.zeros(4, dtype=[("a", "<f4"), ("b", "<i4")])
    np.save(tmp_path / "rec.npy", rec)
    with pytest.raises(ArrayFileError, match="rec.npy holds records"):
        NumpySource(str(tmp_path / "rec.npy"))
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ArrayFileError, match="bad.npz is not a readable .npz"):
        NumpySource(str(tmp_path / "bad.npz"))


def test_pack_npz_of_a_flat_folder_of_npy_files(tmp_path):
    """A folder of .npy files with no class folders (which as_source would read as rows) packs its
    files whole. Control: the pack's samples are the files' arrays."""
    from clairvoyant.pack.arrays import pack_arrays

    x, _ = _data(12)
    (tmp_path / "flat").mkdir()
    for i in range(12):
        np.save(tmp_path / "flat" / f"s{i:02d}.npy", x[i])
    res = pack_arrays(str(tmp_path / "flat"), tmp_path / "out", shard_size="1MiB")
    assert res.samples == 12
    got, _ = _epoch(str(tmp_path / "out"), tmp_path / "l")
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(12)) and np.array_equal(got, x[order])


def test_pack_hdf5_gives_contiguous_shards_read_back_by_byte_range(tmp_path):
    """`clairvoyant pack --format hdf5`: the same tree into .h5 shards of contiguous, unfiltered
    datasets x and y, byte-equal twice over; Loader(DST) finds x and y by itself, reads every
    sample by byte range (no chunk through h5py) and gives the tree's batches. Control: the npz
    pack of the same tree gives the same batches, and a rerun keeps the shards."""
    pytest.importorskip("h5py")
    import h5py

    from clairvoyant.pack.arrays import pack_arrays
    from clairvoyant.source import HDF5Source

    x = _tree_of_npy(tmp_path / "tree")
    a = pack_arrays(str(tmp_path / "tree"), tmp_path / "a", shard_size=10 * x[0].nbytes, layout="hdf5")
    b = pack_arrays(str(tmp_path / "tree"), tmp_path / "b", shard_size=10 * x[0].nbytes, layout="hdf5")
    assert a.shards == 4 and a.samples == 40
    shards = sorted(s for s in os.listdir(tmp_path / "a") if s.endswith(".h5"))
    assert len(shards) == 4
    for s in shards:
        assert (tmp_path / "a" / s).read_bytes() == (tmp_path / "b" / s).read_bytes()
        with h5py.File(tmp_path / "a" / s) as f:
            assert f["x"].chunks is None and f["x"].compression is None and f["y"].dtype == np.int64
    assert pack_arrays(str(tmp_path / "tree"), tmp_path / "a", shard_size=10 * x[0].nbytes,
                       layout="hdf5").kept == 4
    src = as_source(str(tmp_path / "a"))
    assert isinstance(src, HDF5Source) and src.dataset == "x" and src.labels_name == "y"
    assert all((lay.offsets >= 0).all() for lay in src._layouts)   # every sample by byte range
    got, labels = _epoch(str(tmp_path / "a"), tmp_path / "la")
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(40)) and np.array_equal(got, x[order])
    pack_arrays(str(tmp_path / "tree"), tmp_path / "n", shard_size=10 * x[0].nbytes)
    npz_x, npz_y = _epoch(str(tmp_path / "n"), tmp_path / "ln")
    assert np.array_equal(npz_x, got) and np.array_equal(npz_y, labels)
