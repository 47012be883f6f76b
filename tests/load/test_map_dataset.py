"""Map-style datasets with no files (issue 30): torchvision's ``FakeData``, tensors in memory, a
dataset that synthesises its samples. The Loader runs their ``__getitem__`` in its readers, in the
plan's order, with ``len()``, resume, ranks, seeding and the verdict; nothing is staged. Each check
has a control that must fail."""

from __future__ import annotations

import logging
import os
from collections import Counter

import numpy as np
import pytest
import torch

from clairvoyant import Loader
from clairvoyant.errors import ConfigError, DecodeError, NotASource

N = 1000


class InMemory(torch.utils.data.Dataset):
    """Sample i is the vector [i, i] in float32, its label 7 i mod 1000 (its own)."""

    def __init__(self, n: int = N, bad: frozenset = frozenset()) -> None:
        self.x = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 2)
        self.bad = bad

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i in self.bad:
            raise ValueError(f"sample {i} is broken")
        return self.x[i], (7 * i) % N


class Noise(torch.utils.data.Dataset):
    """Synthesises each sample from the global generator (the readers seed it per batch)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.rand(3), i


def epoch_of(loader) -> tuple[list[int], list[int]]:
    """The indices (from the samples) and labels one pass yields, in order."""
    idx, labels = [], []
    for x, y in loader:
        idx += x[:, 0].long().tolist()
        labels += y.tolist()
    return idx, labels


def once_each(idx: list[int], n: int) -> None:
    counts = Counter(idx)
    twice = [i for i, c in counts.items() if c > 1]
    assert not twice, f"drawn twice: {twice[:5]}"
    assert len(counts) == n, f"{n - len(counts)} indices never drawn"


def test_an_in_memory_dataset_gives_every_index_once_per_epoch_with_its_label_in_a_new_order(tmp_path, caplog):
    """Control: the same epoch twice is the same order; a duplicated index is caught."""
    caplog.set_level(logging.WARNING, logger="clairvoyant")
    with Loader(InMemory(), batch_size=32, local_dir=str(tmp_path), seed=5, num_workers=2) as ld:
        assert len(ld) == 32
        orders = []
        for epoch in (0, 1, 1):
            ld.set_epoch(epoch)
            idx, labels = epoch_of(ld)
            once_each(idx, N)
            assert labels == [(7 * i) % N for i in idx]   # each sample with its own label
            orders.append(idx)
        s = ld.stats()
    assert orders[0] != orders[1] and orders[1] == orders[2]
    assert orders[0] != sorted(orders[0])   # shuffled
    assert s["verdict"] is not None and s["verdict"]["samples_per_s"] > 0 and s["samples"] == 3 * N
    assert s["usage"]["local"]["peak"] == 0   # nothing staged
    said = [r.getMessage() for r in caplog.records if "has no files" in r.getMessage()]
    assert len(said) == 1 and "InMemory" in said[0] and "nothing is staged" in said[0]
    with pytest.raises(AssertionError, match="drawn twice"):   # control
        once_each(orders[0] + orders[0][:1], N)


def test_ranks_split_the_dataset_and_resume_continues_mid_epoch(tmp_path):
    """Two ranks: disjoint halves, together every index. A state saved after 5 batches resumes
    with exactly the rest. Control: a resume from batch 4 repeats a batch."""
    halves = []
    for rank in (0, 1):
        with Loader(InMemory(), batch_size=25, local_dir=str(tmp_path / f"r{rank}"), seed=1, rank=rank,
                    world_size=2, num_workers=1) as ld:
            halves.append(epoch_of(ld)[0])
    assert not set(halves[0]) & set(halves[1])
    once_each(halves[0] + halves[1], N)

    with Loader(InMemory(), batch_size=40, local_dir=str(tmp_path / "a"), seed=2, num_workers=1) as ld:
        full, _ = epoch_of(ld)
        ld.set_epoch(0)
        it = iter(ld)
        for _ in range(5):
            next(it)
        state = ld.state_dict()
        it.close()
    with Loader(InMemory(), batch_size=40, local_dir=str(tmp_path / "b"), seed=2, num_workers=1) as ld:
        ld.load_state_dict(state)
        rest, _ = epoch_of(ld)
    assert rest == full[5 * 40:]
    with pytest.raises(AssertionError, match="drawn twice"):   # control
        once_each(full[:5 * 40] + full[4 * 40:], N)


def test_a_dataset_that_synthesises_samples_repeats_for_a_seed(tmp_path):
    """The readers seed torch's generator per batch from (seed, epoch, rank, position): the same
    seed gives the same samples whatever the reader count; another seed other samples (control)."""
    def run(seed, workers, sub):
        with Loader(Noise(), batch_size=8, local_dir=str(tmp_path / sub), seed=seed, num_workers=workers) as ld:
            return torch.cat([x for x, _ in ld])
    a, b, c = run(3, 1, "a"), run(3, 2, "b"), run(4, 1, "c")
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_fakedata_batches_hold_its_samples_and_labels(tmp_path):
    """torchvision's FakeData (what pytorch/examples' ``--dummy`` passes): every sample once, each
    batch its images and targets as the dataset makes them. Control: another FakeData's labels differ."""
    from torchvision import datasets, transforms
    ds = datasets.FakeData(96, (3, 16, 16), 10, transforms.ToTensor(), random_offset=3)
    want = {i: ds[i] for i in range(len(ds))}
    with Loader(ds, batch_size=16, local_dir=str(tmp_path), seed=0, num_workers=2) as ld:
        got = [(x, y) for x, y in ld]
    images = torch.cat([x for x, _ in got])
    labels = torch.cat([y for _, y in got]).tolist()
    assert images.shape == (96, 3, 16, 16) and images.dtype == torch.float32
    assert sorted(labels) == sorted(int(y) for _, y in want.values())
    matched = 0
    for img, label in zip(images, labels):   # each image is one of the dataset's, with its own label
        i = next(i for i, (x, _) in want.items() if torch.equal(x, img))
        assert int(want[i][1]) == label
        matched += 1
    assert matched == 96
    other = datasets.FakeData(96, (3, 16, 16), 10, transforms.ToTensor(), random_offset=4)
    assert sorted(labels) != sorted(int(other[i][1]) for i in range(96))   # control


def test_a_failing_getitem_names_the_index_and_on_error_skip_as_advised_goes_on(tmp_path):
    bad = frozenset({17})
    with Loader(InMemory(100, bad), batch_size=10, local_dir=str(tmp_path / "a"), num_workers=1) as ld:
        with pytest.raises(DecodeError, match=r"index 17 .*pass on_error='skip'") as e:
            epoch_of(ld)
    assert "\n" not in str(e.value).split(": pass")[0]
    with Loader(InMemory(100, bad), batch_size=10, local_dir=str(tmp_path / "b"), num_workers=1,
                on_error="skip") as ld:
        idx, _ = epoch_of(ld)
        skipped = ld.stats()["skipped"]
    assert sorted(idx) == [i for i in range(100) if i != 17]
    assert skipped == ["17"] or skipped == ["017"]


def test_a_transform_given_to_the_loader_is_refused_and_the_advice_works(tmp_path):
    """A dataset makes its own samples: the Loader's transform= is refused with advice (give it to
    the dataset), which then works."""
    from torchvision import datasets, transforms
    with pytest.raises(ConfigError, match="apply it there") as e:
        Loader(datasets.FakeData(8, (3, 4, 4), 2), transform=transforms.ToTensor(), local_dir=str(tmp_path))
    assert "\n" not in str(e.value)
    with Loader(datasets.FakeData(8, (3, 4, 4), 2, transform=transforms.ToTensor()), batch_size=4,
                local_dir=str(tmp_path), num_workers=1) as ld:
        assert [tuple(x.shape) for x, _ in ld] == [(4, 3, 4, 4)] * 2


def test_objects_that_are_not_datasets_are_refused_in_one_line(tmp_path):
    """NotASource stays for what is neither a dataset nor a source; no message carries a dataset's
    multi-line repr. Control: FakeData's repr has several lines."""
    from torchvision import datasets
    with pytest.raises(NotASource, match="map-style dataset") as e:
        Loader(object(), local_dir=str(tmp_path))
    assert "\n" not in str(e.value)
    fake = datasets.FakeData(8, (3, 4, 4), 2)
    assert "\n" in repr(fake)   # control
    with pytest.raises(ConfigError) as e:
        Loader(fake, dataset="x", local_dir=str(tmp_path))
    assert "\n" not in str(e.value) and "FakeData" in str(e.value)


def test_output_numpy_gives_arrays(tmp_path):
    with Loader(InMemory(64), batch_size=16, local_dir=str(tmp_path), num_workers=1, output="numpy") as ld:
        b = next(iter(ld))
    assert isinstance(b[0], np.ndarray) and b[0].shape == (16, 2) and b[1].dtype == np.int64


def test_an_iterable_only_dataset_is_refused_saying_why(tmp_path):
    """Control: the same samples as a map-style dataset load."""
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    with pytest.raises(NotASource, match="iterable only") as e:
        Loader(Stream(), local_dir=str(tmp_path))
    assert "\n" not in str(e.value)
    with Loader(InMemory(10), batch_size=5, local_dir=str(tmp_path), num_workers=1) as ld:
        assert sorted(epoch_of(ld)[0]) == list(range(10))


def test_a_subset_of_a_file_dataset_is_staged_from_its_files(dataset, tmp_path):
    """``random_split`` of an ImageFolder (a ``Subset``): the Loader takes the files the subset
    holds and stages them, with the dataset's transforms; the other split's files are not read.
    Control: the other split is another set of files."""
    from torchvision import datasets, transforms
    full = datasets.ImageFolder(dataset, transform=transforms.ToTensor())
    train, held = torch.utils.data.random_split(full, [64, 32], generator=torch.Generator().manual_seed(0))
    inner = torch.utils.data.Subset(train, list(range(0, 64, 2)))   # nested: every other of train's
    want = {i: os.path.relpath(full.samples[i][0], dataset).replace(os.sep, "/") for i in train.indices}
    with Loader(train, batch_size=16, local_dir=str(tmp_path / "a"), num_workers=1) as ld:
        assert sorted(ld.manifest.keys) == sorted(want.values())
        labels = sorted(torch.cat([y for _, y in ld]).tolist())
        staged = ld.stats()["tiers"]
    assert labels == sorted(full.samples[i][1] for i in train.indices)
    assert staged["staged_local"] + staged["staged_ram"] == 64
    with Loader(inner, batch_size=16, local_dir=str(tmp_path / "b"), num_workers=1) as ld:
        assert sorted(ld.manifest.keys) == sorted(want[train.indices[j]] for j in range(0, 64, 2))
        x, _ = next(iter(ld))
        assert x.dtype == torch.float32 and tuple(x.shape[1:]) == (3, 32, 32)   # the dataset's ToTensor
    other = {os.path.relpath(full.samples[i][0], dataset).replace(os.sep, "/") for i in held.indices}
    assert not other & set(want.values())   # control
