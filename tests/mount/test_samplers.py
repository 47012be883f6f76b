"""clairvoyant.torch samplers: the Loader's order through PyTorch's sampler interface, and the
order they publish to a mount (mount/orders.py). Every check has a negative control."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch.utils.data as tud

from clairvoyant.errors import ConfigError
from clairvoyant.mount import Mount, mount_available
from clairvoyant.mount.orders import order_path, published, read_order, read_progress
from clairvoyant.plan import plan_epoch
from clairvoyant.testing import make_dataset
from clairvoyant.torch import DistributedSampler, RandomSampler


class Folder:
    """The shape of torchvision's DatasetFolder: ``samples`` of (path, class)."""

    def __init__(self, root: str, n: int) -> None:
        self.samples = [(os.path.join(root, f"c{i % 3}", f"{i:05d}.jpg"), i % 3) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)


def loader_order(n, *, seed, epoch, rank, world_size, shuffle=True):
    p = plan_epoch(n, seed=seed, epoch=epoch, rank=rank, world_size=world_size, batch_size=4, shuffle=shuffle)
    return np.concatenate(p.batches).tolist()


@pytest.mark.parametrize("n,world", [(50, 1), (50, 4), (37, 3)])
def test_distributed_sampler_draws_the_loaders_order(n, world):
    ds = Folder("/data", n)
    for rank in range(world):
        for epoch in (0, 3):
            s = DistributedSampler(ds, num_replicas=world, rank=rank, seed=7)
            s.set_epoch(epoch)
            assert list(s) == loader_order(n, seed=7, epoch=epoch, rank=rank, world_size=world)
            # negative control: another seed gives another order
            other = DistributedSampler(ds, num_replicas=world, rank=rank, seed=8)
            other.set_epoch(epoch)
            assert list(other) != list(s)
        assert len(s) == len(tud.DistributedSampler(ds, num_replicas=world, rank=rank))
    every = sorted(i for r in range(world) for i in DistributedSampler(ds, num_replicas=world, rank=r))
    assert set(every) == set(range(n)) and len(every) == -(-n // world) * world   # padded, like PyTorch's


def test_distributed_sampler_options_follow_pytorch():
    ds = Folder("/data", 37)
    for rank in range(3):
        mine = DistributedSampler(ds, num_replicas=3, rank=rank, drop_last=True)
        theirs = tud.DistributedSampler(ds, num_replicas=3, rank=rank, drop_last=True)
        assert len(mine) == len(theirs) == len(list(mine)) == 12
        assert list(DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=False)) == \
            list(tud.DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=False))
    s = DistributedSampler(ds, num_replicas=2, rank=0)
    assert list(s) == list(s)        # the same epoch twice: the same order
    s.set_epoch(1)
    assert list(s) != list(DistributedSampler(ds, num_replicas=2, rank=0))   # control: the epoch matters
    with pytest.raises(ConfigError):
        DistributedSampler(ds, num_replicas=2, rank=2)
    with pytest.raises(ConfigError):
        DistributedSampler(ds, num_replicas=2, rank=0, seed=-1)
    # a DataLoader takes it as PyTorch's
    dl = tud.DataLoader(list(range(37)), sampler=DistributedSampler(ds, num_replicas=1, rank=0), batch_size=5)
    assert sorted(int(x) for b in dl for x in b) == list(range(37))


def test_random_sampler_moves_to_the_next_epoch_each_pass():
    ds = Folder("/data", 30)
    s = RandomSampler(ds, seed=3)
    first, second = list(s), list(s)
    assert first == loader_order(30, seed=3, epoch=0, rank=0, world_size=1)
    assert second == loader_order(30, seed=3, epoch=1, rank=0, world_size=1) != first
    s.set_epoch(0)
    assert list(s) == first
    assert list(RandomSampler(ds, seed=4)) != first   # control: another seed
    with pytest.raises(ConfigError, match="replacement"):
        RandomSampler(ds, replacement=True)


_ok, _why = mount_available()


@pytest.mark.skipif(not _ok, reason=f"clairvoyant mount cannot run here: {_why}")
def test_the_published_order_round_trips(tmp_path):
    src = make_dataset(str(tmp_path / "src"), 20, num_classes=2, size=32)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Mount(src, str(mnt), local_dir=str(tmp_path / "local"), stage=False) as m:
        keys = [m.manifest.keys[i] for i in range(len(m.manifest))]

        class Dataset:
            samples = [(os.path.join(m.path, k), 0) for k in keys]

            def __len__(self):
                return len(self.samples)

        s = DistributedSampler(Dataset(), num_replicas=2, rank=1, seed=5, mount=m.path)
        s.set_epoch(2)
        it = iter(s)
        got = [next(it)]
        orders = published(m.orders_dir)
        assert list(orders) == [1] and orders[1] == order_path(m.orders_dir, 1)
        o = read_order(orders[1])
        want = loader_order(20, seed=5, epoch=2, rank=1, world_size=2)
        assert (o.rank, o.world_size, o.epoch, o.seed) == (1, 2, 2, 5)
        assert o.groups == [[keys[i]] for i in want]
        got += list(it)
        assert got == want and read_progress(m.orders_dir, 1) == (2, len(want))
        # files=: an index to several files (an image and its mask); paths outside the mount are left out
        s2 = DistributedSampler(Dataset(), num_replicas=1, rank=0, mount=m.path,
                                files=lambda i: [keys[i], os.path.join(m.path, keys[-1 - i]), "/elsewhere/x"])
        list(s2)
        o2 = read_order(order_path(m.orders_dir, 0))
        assert o2.groups == [[keys[i], keys[-1 - i]] for i in loader_order(20, seed=0, epoch=0, rank=0,
                                                                             world_size=1)]
        with open(orders[1], "rb") as f:   # plain JSON, never a pickle
            assert json.loads(f.read())["version"] == 1
