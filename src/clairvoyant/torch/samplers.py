"""``DistributedSampler`` and ``RandomSampler`` with PyTorch's arguments, yielding the indices of the
Loader's own order for the same seed, epoch, rank and world size (plan/order.py, plan/partition.py),
and with ``mount=`` publishing that order to a ``clairvoyant mount`` (mount/orders.py), which then
stages the files behind the indices ahead of use.

The files behind index i: ``files(i)`` (a path or a list of paths: an image and its mask), else the
dataset's ``samples[i][0]`` (torchvision's ``DatasetFolder``/``ImageFolder`` and datasets shaped
like them). Paths are taken relative to the mount; files outside it are left out of the order.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from ..errors import ConfigError
from ..plan.order import epoch_order
from ..plan.partition import rank_indices

FilesFn = Callable[[int], "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]"]


def _world() -> tuple[int, int]:
    """(world size, rank): the process group's if one is initialised, else the launcher's."""
    from ..cluster.topology import resolve
    t = resolve()
    return t.world_size, t.rank


class _Published:
    """Where a sampler publishes (the mount's orders directory) and the files behind each index."""

    def __init__(self, dataset, mount, files: FilesFn | None) -> None:
        from ..mount.fs import read_info

        self.mount = os.path.realpath(os.fspath(mount))
        self._prefix = self.mount.rstrip("/") + "/"
        self.orders = read_info(self.mount)["orders"]
        self._dataset, self._files = dataset, files
        self._cache: list[list[str]] | None = None

    def _paths(self, i: int) -> list[str]:
        if self._files is not None:
            got = self._files(i)
            paths = [got] if isinstance(got, (str, os.PathLike)) else list(got)
        else:
            samples = getattr(self._dataset, "samples", None)
            if samples is None:
                raise ConfigError(f"{type(self._dataset).__name__} has no samples list (torchvision's "
                                  "DatasetFolder shape): pass files= a function from an index to the paths it opens")
            paths = [samples[i][0]]
        out = []
        for p in paths:
            p = os.fspath(p)
            if not os.path.isabs(p):
                rel = os.path.normpath(p)
            elif p.startswith(self._prefix) and "/." not in p and "//" not in p:   # plainly under the mount
                rel = p[len(self._prefix):]
            else:   # through a link, or with . and ..: one realpath (a few system calls per component)
                rel = os.path.relpath(os.path.realpath(p), self.mount)
            if not rel.startswith(".." + os.sep) and rel != "..":
                out.append(rel.replace(os.sep, "/"))
        return out

    def groups(self, order: np.ndarray, n: int) -> list[list[str]]:
        if self._cache is None:   # the files behind each index, once: the order changes, they do not
            self._cache = [self._paths(i) for i in range(n)]
        return [self._cache[i] for i in order.tolist()]


class _OrderSampler(Sampler[int]):
    def __init__(self, dataset, *, num_replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool,
                 mount, files: FilesFn | None) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ConfigError(f"invalid rank {rank} for num_replicas {num_replicas}: need 0 <= rank < num_replicas")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
        if files is not None and not callable(files):
            raise ConfigError(f"files={files!r} is not callable: pass a function from an index to its paths")
        self.dataset = dataset
        self.num_replicas, self.rank, self.shuffle = int(num_replicas), int(rank), bool(shuffle)
        self.seed, self.drop_last, self.epoch = int(seed), bool(drop_last), 0
        n = len(dataset)
        self.total = n
        self.num_samples = n // self.num_replicas if drop_last else -(-n // self.num_replicas)
        self._pub = _Published(dataset, mount, files) if mount is not None else None
        self._announced: int | None = None
        self._announce(self.epoch)

    def _announce(self, epoch: int) -> None:
        """Publish ``epoch``'s order, and the next epoch's, as soon as they are known (at
        construction and ``set_epoch``), so that the mount stages while the DataLoader's workers
        start and weighs next uses across the epoch boundary; iterating it does not publish it
        again."""
        if self._pub is None or self._announced == epoch:
            return
        from ..mount.orders import publish_order
        publish_order(self._pub.orders, rank=self.rank, world_size=self.num_replicas, epoch=epoch, seed=self.seed,
                      groups=self._pub.groups(self.order(epoch), self.total),
                      following=self._pub.groups(self.order(epoch + 1), self.total))
        self._announced = epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._announce(self.epoch)

    def order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices of ``epoch`` (default: the current one), in the Loader's order."""
        e = self.epoch if epoch is None else int(epoch)
        mine = rank_indices(epoch_order(self.total, self.seed, e, self.shuffle), self.rank, self.num_replicas)
        return np.asarray(mine[:self.num_samples])

    def __len__(self) -> int:
        return self.num_samples

    def _iterate(self, epoch: int) -> Iterator[int]:
        order = self.order(epoch)
        pub = self._pub
        if pub is None:
            yield from order.tolist()
            return
        from ..mount.orders import PROGRESS_EVERY, publish_progress
        self._announce(epoch)
        self._announced = None   # a second pass over the same epoch publishes it again (progress from 0)
        for j, i in enumerate(order.tolist()):
            if j and j % PROGRESS_EVERY == 0:
                publish_progress(pub.orders, self.rank, epoch, j)
            yield i
        publish_progress(pub.orders, self.rank, epoch, len(order))

    def __iter__(self) -> Iterator[int]:
        return self._iterate(self.epoch)


class DistributedSampler(_OrderSampler):
    """PyTorch's ``DistributedSampler`` (same arguments, ``set_epoch``, ``__len__``; every sample once
    per epoch, padded to equal shares, or the tail dropped with ``drop_last``), in the Loader's order.
    ``mount``: a ``clairvoyant mount``'s mount point to publish each epoch's order to; ``files``: index
    to the paths it opens (default: ``dataset.samples[i][0]``)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, *, mount: str | os.PathLike[str] | None = None,
                 files: FilesFn | None = None) -> None:
        if num_replicas is None or rank is None:
            ws, r = _world()
            num_replicas = ws if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last, mount=mount, files=files)


class RandomSampler(_OrderSampler):
    """PyTorch's ``RandomSampler`` without replacement: every index once per pass, in the Loader's
    order of (seed, epoch) for a single process. Each ``iter()`` moves to the next epoch (like
    PyTorch's, which draws a new permutation each time); ``set_epoch`` sets the next one."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None, *,
                 seed: int = 0, mount: str | os.PathLike[str] | None = None, files: FilesFn | None = None) -> None:
        if replacement or num_samples is not None or generator is not None:
            raise ConfigError("clairvoyant.torch.RandomSampler draws every index once per pass from seed=: "
                              "replacement, num_samples and generator are not supported (use PyTorch's)")
        super().__init__(data_source, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=False,
                         mount=mount, files=files)
        self.data_source = data_source
        self._next = None

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._next = None

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch if self._next is None else self._next
        self.epoch, self._next = epoch, epoch + 1
        return self._iterate(epoch)
