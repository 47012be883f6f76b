"""``persistent_workers=True``: the readers kept from one pass to the next (load/pool.py ``reusable``,
``next_pass``). Each check has a control."""

from __future__ import annotations

import gc
import multiprocessing as mp

import numpy as np
import pytest

from clairvoyant import Loader
from conftest import wait_until

torch = pytest.importorskip("torch")
T = pytest.importorskip("torchvision.transforms")


def _random_tf():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])


def _epochs(ld: Loader, n: int) -> tuple[list, list]:
    """``n`` passes: each pass's batches (copied) and the pids of the readers that made them."""
    batches, pids = [], []
    for _ in range(n):
        got, seen = [], set()
        for x, y in ld:
            got.append((x.numpy().copy(), y.numpy().copy()))
            seen.update(p.pid for p in mp.active_children())
        batches.append(got)
        pids.append(seen)
    return batches, pids


def test_kept_readers_serve_every_pass_with_the_batches_new_ones_would(dataset, tmp_path, no_leaks):
    """Three epochs with a random transform: with ``persistent_workers`` the same two readers make
    every pass, and every batch is byte for byte the one a Loader that forks readers each pass
    makes (the readers seed themselves per pass and per batch). Control: without it, each pass
    has readers of its own."""
    out = {}
    for persist in (False, True):
        with Loader(dataset, batch_size=8, num_workers=2, seed=3, transform=_random_tf(),
                    persistent_workers=persist, local_dir=str(tmp_path / f"l{persist}")) as ld:
            out[persist] = _epochs(ld, 3)
    (fresh, fresh_pids), (kept, kept_pids) = out[False], out[True]
    assert len(kept_pids[0]) == 2 and kept_pids[0] == kept_pids[1] == kept_pids[2], kept_pids
    assert len(fresh_pids[0] | fresh_pids[1] | fresh_pids[2]) == 6, fresh_pids   # control: new each pass
    assert [len(e) for e in kept] == [len(e) for e in fresh] == [12, 12, 12]
    for a, b in zip(fresh, kept):
        assert all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not np.array_equal(kept[0][0][0], kept[1][0][0])   # (the epochs' orders differ)


def test_a_pass_left_early_ends_its_readers_and_the_next_pass_forks_new_ones(dataset, tmp_path, no_leaks):
    """A loop that breaks out after two batches: that pass's readers end (they may hold a batch
    half made); the next pass forks two new ones and reads every sample. Control: a pass run to
    its end keeps its readers for the next."""
    with Loader(dataset, batch_size=8, num_workers=2, persistent_workers=True, local_dir=str(tmp_path / "l")) as ld:
        _, whole = _epochs(ld, 1)
        _, again = _epochs(ld, 1)
        assert whole[0] == again[0]   # control
        for i, _ in enumerate(ld):
            if i == 1:
                break
        left = set(whole[0])
        assert wait_until(lambda: not left & {p.pid for p in mp.active_children()}), "the readers did not end"
        batches, after = _epochs(ld, 1)
        assert len(after[0]) == 2 and not after[0] & left
        assert sum(len(y) for _, y in batches[0]) == 96


def test_a_transform_given_anew_forks_readers_that_use_it(dataset, tmp_path, no_leaks):
    """``loader.transform`` replaced between epochs: the next pass's readers are new ones and apply
    it (the kept ones were forked with the old one). Control: the same transform keeps them."""
    with Loader(dataset, batch_size=8, num_workers=2, transform=T.Compose([T.Resize(16), T.ToTensor()]),
                persistent_workers=True, local_dir=str(tmp_path / "l")) as ld:
        first, p1 = _epochs(ld, 2)
        assert p1[0] == p1[1]   # control
        ld.transform = T.Compose([T.Resize(20), T.ToTensor()])
        later, p2 = _epochs(ld, 1)
        assert not p2[0] & p1[0]
        assert first[0][0][0].shape[-1] == 16 and later[0][0][0].shape[-1] == 20


def test_a_batch_held_from_the_last_pass_keeps_its_slot(dataset, tmp_path, no_leaks):
    """The loop keeps the last batch of epoch 0 (lent without a copy: it views a reader's slot)
    while epoch 1 runs on the same readers: its values do not change, and once it is let go its
    slot comes back to the pool. Control: readers handed the slots out on loan (a pool that forgot
    what it lent) overwrite it in the next pass."""
    with Loader(dataset, batch_size=8, num_workers=2, persistent_workers=True, seed=1,
                local_dir=str(tmp_path / "l")) as ld:
        held = None
        for x, _ in ld:
            held = x
        del x
        pool = ld._readers[0]
        assert pool.lent >= 1
        before = held.clone()
        for _ in ld:
            pass
        assert torch.equal(held, before)
        for w in pool.workers:   # control: only the slots out on loan are offered
            w.free = [s for s in range(len(w.slots)) if s not in w.free]
        for _ in ld:
            pass
        assert not torch.equal(held, before)
        n = len(pool.returned)
        del held
        gc.collect()
        assert len(pool.returned) > n   # let go of: its slot is the pool's again


def test_kept_readers_end_with_the_loader_closed_or_collected(dataset, tmp_path, no_leaks):
    """After a pass the kept readers wait for the next; ``close`` ends them, and so does the
    Loader's collection without a close. Control: they were alive after the pass."""
    ld = Loader(dataset, batch_size=16, num_workers=2, persistent_workers=True, local_dir=str(tmp_path / "a"))
    for _ in ld:
        pass
    assert len(mp.active_children()) == 2   # control
    ld.close()
    assert wait_until(lambda: not mp.active_children())
    ld = Loader(dataset, batch_size=16, num_workers=2, persistent_workers=True, local_dir=str(tmp_path / "b"))
    for _ in ld:
        pass
    assert len(mp.active_children()) == 2
    del ld
    gc.collect()
    assert wait_until(lambda: not mp.active_children())
