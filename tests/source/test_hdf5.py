"""HDF5 files as a source (source/hdf5.py): samples along a dataset's first axis, read by byte range
where the layout allows it (contiguous; chunks of whole samples without filters), through h5py
where it does not (compressed chunks, chunks that cut a sample); bad files refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from clairvoyant import Loader  # noqa: E402
from clairvoyant.errors import ConfigError, SampleReadError  # noqa: E402
from clairvoyant.source import HDF5Source, as_source  # noqa: E402
from clairvoyant.source.arrays import ArrayFileError  # noqa: E402


def _data(n: int = 60) -> np.ndarray:
    x = np.random.default_rng(4).standard_normal((n, 3, 4)).astype(np.float32)
    x[:, 0, 0] = np.arange(n)   # each sample says which it is
    return x


def _files(d, x: np.ndarray) -> None:
    """Three files, three layouts: contiguous, chunks of whole samples, gzip-compressed chunks."""
    d.mkdir()
    parts = np.array_split(np.arange(len(x)), 3)
    kw = [{}, {"chunks": (4, 3, 4)}, {"chunks": (4, 3, 4), "compression": "gzip"}]
    for i, (rows, opts) in enumerate(zip(parts, kw)):
        with h5py.File(d / f"part{i}.h5", "w") as f:
            f.create_dataset("x", data=x[rows], **opts)
            f.create_dataset("y", data=(rows % 7).astype(np.int64))
            f.create_dataset("meta/note", data=np.zeros(2))


def _epoch(source, tmp_path, **kw) -> tuple[np.ndarray, np.ndarray]:
    with Loader(source, batch_size=8, local_dir=str(tmp_path / "local"), seed=5, num_workers=1, output="numpy",
                **kw) as ld:
        xs, ys = zip(*[(np.asarray(a), np.asarray(b)) for a, b in ld])
    return np.concatenate(xs), np.concatenate(ys)


def test_every_sample_once_across_files_and_layouts_with_its_labels(tmp_path):
    """``Loader(dir, dataset="x", labels="y")``: every sample of the three files once per epoch, its
    bytes, dtype and shape as h5py reads them, its label, shuffled across files. Control: the order
    is not the files' order."""
    x = _data()
    _files(tmp_path / "h5", x)
    got, labels = _epoch(str(tmp_path / "h5"), tmp_path, dataset="x", labels="y")
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(len(x)))
    assert got.dtype == np.float32 and np.array_equal(got, x[order])
    assert np.array_equal(labels, order % 7)
    assert order.tolist() != list(range(len(x)))   # control


def test_byte_ranges_where_the_layout_allows_and_h5py_where_it_does_not(tmp_path):
    """Contiguous rows and rows in unfiltered whole-sample chunks have a place in the file and are read
    without h5py (it is made to fail); compressed chunks and chunks that cut a sample go through h5py.
    Control: those rows have no place, and reading them without h5py fails."""
    x = _data(24)
    _files(tmp_path / "h5", x)
    with h5py.File(tmp_path / "h5" / "cut.h5", "w") as f:
        f.create_dataset("x", data=x[:8], chunks=(4, 3, 2))
    src = HDF5Source(str(tmp_path / "h5"), dataset="x")
    placed = {name: bool((lay.offsets >= 0).all()) for name, lay in zip(src._names, src._files)}
    assert placed == {"cut.h5": False, "part0.h5": True, "part1.h5": True, "part2.h5": False}
    keys = [k for k, _ in src.scan()]
    whole = {k: src.read(k) for k in keys}
    src._dataset = lambda fi: (_ for _ in ()).throw(OSError("h5py must not be needed here"))
    for k in keys:
        if k.startswith(("part0", "part1")):
            assert src.read(k) == whole[k]
        else:
            with pytest.raises(SampleReadError):   # control
                src.read(k)
    back = HDF5Source(str(tmp_path / "h5"), dataset="x")
    of, nbytes = back.sample_ranges(keys, span=256)
    for r in range(len(nbytes)):
        members = [k for k, o in zip(keys, of) if o == r]
        assert back.read_range(members)[0] == [whole[k] for k in members]
    assert whole["part0.h5/3"] == x[3].tobytes() and whole["cut.h5/5"] == x[5].tobytes()


def test_bad_hdf5_input_gets_typed_errors_naming_the_file(tmp_path):
    x = _data()
    _files(tmp_path / "h5", x)
    one = str(tmp_path / "h5" / "part0.h5")
    with pytest.raises(ConfigError, match=r"has no dataset 'nope'; it has \['meta/note', 'x', 'y'\]"):
        HDF5Source(one, dataset="nope")
    with pytest.raises(ConfigError, match="'meta' in .*part0.h5 is a group"):
        HDF5Source(one, dataset="meta")
    with pytest.raises(ConfigError, match="holds datasets"):
        as_source(one)   # three datasets: which one is not guessed
    vl = tmp_path / "vl.h5"
    with h5py.File(vl, "w") as f:
        f.create_dataset("s", data=np.array([b"a", b"bc"], dtype=object), dtype=h5py.string_dtype())
    with pytest.raises(ArrayFileError, match="variable-length"):
        HDF5Source(str(vl), dataset="s")
    cut = tmp_path / "cut.h5"
    with open(one, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[: os.path.getsize(one) // 2])
    with pytest.raises(ArrayFileError, match="cut.h5"):
        HDF5Source(str(cut), dataset="x")
    assert len(list(HDF5Source(one, dataset="x").scan())) == 20   # control: the whole file


def test_samples_lost_after_listing_name_themselves_and_skip_goes_on(tmp_path):
    """A contiguous file cut after listing: its lost samples are SampleReadErrors naming the sample
    and the file; on_error="skip" gives the rest. Control: "raise" stops the epoch."""
    x = _data(40)
    d = tmp_path / "h5"
    d.mkdir()
    for i, rows in enumerate((slice(0, 20), slice(20, 40))):
        with h5py.File(d / f"p{i}.h5", "w") as f:
            f.create_dataset("x", data=x[rows])
    src = HDF5Source(str(d), dataset="x")
    row = int(src._files[1].offsets[15])
    with open(d / "p1.h5", "r+b") as f:
        f.truncate(row)   # samples 15..19 of p1.h5 are gone
    with pytest.raises(SampleReadError, match=r"p1.h5/17.*p1.h5 ends before"):
        src.read("p1.h5/17")
    got, _ = _epoch(src, tmp_path, on_error="skip")
    assert sorted(got[:, 0, 0].astype(int).tolist()) == list(range(35))
    with pytest.raises(SampleReadError):
        _epoch(src, tmp_path / "again")


def test_float_targets_travel_with_their_samples_as_fields(tmp_path):
    """CosmoFlow's four float targets per volume: ``fields=["y"]`` reads them once and hands each
    sample's with it (the batch's third element), matched to the right sample across shuffled files.
    Control: without fields a batch has two elements."""
    x = _data(30)
    d = tmp_path / "h5"
    d.mkdir()
    y = np.random.default_rng(9).standard_normal((30, 4)).astype(np.float32)
    for i, rows in enumerate((slice(0, 12), slice(12, 30))):
        with h5py.File(d / f"p{i}.h5", "w") as f:
            f.create_dataset("x", data=x[rows])
            f.create_dataset("y", data=y[rows])
    src = HDF5Source(str(d), dataset="x", fields=["y"])
    with Loader(src, batch_size=4, local_dir=str(tmp_path / "local"), seed=3, num_workers=1, output="numpy") as ld:
        batches = list(ld)
    assert all(len(b) == 3 for b in batches)
    got = np.concatenate([np.asarray(b[0]) for b in batches])
    targets = np.concatenate([np.asarray(b[2]["y"]) for b in batches])
    order = got[:, 0, 0].astype(int)
    assert sorted(order.tolist()) == list(range(30)) and np.array_equal(targets, y[order])
    with Loader(HDF5Source(str(d), dataset="x"), batch_size=4, local_dir=str(tmp_path / "l2"), num_workers=1,
                output="numpy") as ld:
        assert all(len(b) == 2 for b in ld)   # control


def test_float_vector_targets_through_labels_and_the_loaders_fields(tmp_path):
    """CosmoFlow's layout, as issue 30 tried it: ``Loader("run.h5", dataset="x", labels="y")`` with
    ``y`` float32 (n, 4): the batch's targets are the file's rows, float32 [B, 4], as PyTorch collates
    them. ``Loader(..., fields=["y"])`` (the old error's advice) gives ``(x, label, {"y": ...})``.
    Control: integer labels still become the manifest's labels; shuffled rows would not match."""
    torch = pytest.importorskip("torch")
    x = _data(40)
    y = np.random.default_rng(2).standard_normal((40, 4)).astype(np.float32)
    path = tmp_path / "run.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
        f.create_dataset("c", data=np.arange(40) % 3)
    with Loader(str(path), dataset="x", labels="y", batch_size=8, local_dir=str(tmp_path / "a"), seed=1,
                num_workers=1) as ld:
        batches = list(ld)
    assert all(len(b) == 2 for b in batches)
    assert all(b[1].dtype == torch.float32 and tuple(b[1].shape) == (8, 4) for b in batches)
    order = torch.cat([b[0] for b in batches])[:, 0, 0].long().numpy()
    targets = torch.cat([b[1] for b in batches]).numpy()
    assert sorted(order.tolist()) == list(range(40)) and np.array_equal(targets, y[order])
    assert not np.array_equal(targets, y)   # control: the order is shuffled, the rows follow it
    with Loader(str(path), dataset="x", fields=["y"], batch_size=8, local_dir=str(tmp_path / "b"), seed=1,
                num_workers=1) as ld:
        batches = list(ld)
    assert all(len(b) == 3 for b in batches)
    order = torch.cat([b[0] for b in batches])[:, 0, 0].long().numpy()
    assert np.array_equal(torch.cat([b[2]["y"] for b in batches]).numpy(), y[order])
    with Loader(str(path), dataset="x", labels="c", batch_size=8, local_dir=str(tmp_path / "c"), seed=1,
                num_workers=1) as ld:   # control: class indices
        assert ld.source.target_field is None and ld.manifest.labels.tolist() == (np.arange(40) % 3).tolist()
        b = next(iter(ld))
        assert b[1].dtype == torch.int64 and np.array_equal(b[1].numpy(), b[0][:, 0, 0].long().numpy() % 3)


def test_fields_on_a_source_that_has_none_names_the_source_in_one_line(tmp_path, dataset):
    with pytest.raises(ConfigError, match="fields= name arrays") as e:
        Loader(dataset, fields=["y"], local_dir=str(tmp_path))
    assert "\n" not in str(e.value)


def test_open_hdf5_files_are_bounded_by_max_open(tmp_path):
    """Compressed datasets are read through h5py; the files it holds open per process stay within
    ``max_open``, the least recently read closed first. Control: with room for all, all stay open."""
    x = _data(40)
    d = tmp_path / "z"
    d.mkdir()
    for i in range(5):
        with h5py.File(d / f"p{i}.h5", "w") as f:
            f.create_dataset("x", data=x[8 * i:8 * (i + 1)], chunks=(4, 3, 4), compression="gzip")
    for most, want in ((2, 2), (10, 5)):
        src = HDF5Source(str(d), dataset="x", max_open=most)
        keys = [k for k, _ in src.scan()]
        assert [src.read(k) for k in keys] == [x[i].tobytes() for i in range(40)]
        assert len(src._h5._items) == want
        src.close()


def test_one_volume_per_file_with_its_parameters_as_fields(tmp_path):
    """CosmoFlow's own layout: each file one volume (``full``) and its four parameters (``unitPar``):
    ``per_file=True`` makes each file one sample, its parameters its field. Control: without
    per_file the volume's first axis would be taken for samples."""
    d = tmp_path / "univ"
    d.mkdir()
    vols = [np.full((4, 4, 4, 2), i, np.int16) for i in range(9)]
    pars = [np.arange(4, dtype=np.float32) + i for i in range(9)]
    for i in range(9):
        with h5py.File(d / f"u{i}.h5", "w") as f:
            f.create_dataset("full", data=vols[i], **({"compression": "gzip"} if i % 2 else {}))
            f.create_dataset("unitPar", data=pars[i])
    src = HDF5Source(str(d), dataset="full", fields=["unitPar"], per_file=True)
    assert len(list(src.scan())) == 9
    with Loader(src, batch_size=3, local_dir=str(tmp_path / "local"), num_workers=1, output="numpy") as ld:
        batches = list(ld)
    x = np.concatenate([np.asarray(b[0]) for b in batches])
    p = np.concatenate([np.asarray(b[2]["unitPar"]) for b in batches])
    assert x.shape == (9, 4, 4, 4, 2)
    ids = x[:, 0, 0, 0, 0].astype(int)
    assert sorted(ids.tolist()) == list(range(9)) and np.array_equal(p, np.stack(pars)[ids])
    assert len(list(HDF5Source(str(d), dataset="full").scan())) == 36   # control: rows of each volume
