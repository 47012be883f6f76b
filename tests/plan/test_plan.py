"""The pure plan: every sample once per epoch, determinism, DistributedSampler semantics."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.plan import epoch_order, padding, plan_epoch


def all_ranks(n, seed, epoch, world, batch, drop_last=False):
    return [plan_epoch(n, seed=seed, epoch=epoch, rank=r, world_size=world, batch_size=batch,
                       drop_last=drop_last) for r in range(world)]


def epoch_is_complete(plans, n, seed, epoch) -> bool:
    """Every sample at least once; the extra ones are exactly the order's head, repeated
    cyclically up to a multiple of the world size (DistributedSampler's padding)."""
    seen = Counter(int(i) for p in plans for b in p.batches for i in b)
    pad = padding(n, plans[0].world_size)
    expected = Counter(int(i) for i in np.resize(epoch_order(n, seed, epoch), n + pad))
    return set(seen) == set(range(n)) and seen == expected


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 8), batch=st.integers(1, 40),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 1000))
def test_every_sample_once_per_epoch_across_ranks(n, world, batch, seed, epoch):
    plans = all_ranks(n, seed, epoch, world, batch)
    assert epoch_is_complete(plans, n, seed, epoch)
    assert len({len(p) for p in plans}) == 1, "every rank must get the same number of batches"


def test_completeness_check_can_fail():
    """Negative control: drop one batch from one rank and the check must say no."""
    plans = all_ranks(100, 1, 0, 3, 8)
    broken = plans[0].__class__(0, 0, 3, plans[0].batches[1:])
    assert not epoch_is_complete([broken] + plans[1:], 100, 1, 0)
    assert epoch_is_complete(plans, 100, 1, 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 500), seed=st.integers(0, 2**31), epoch=st.integers(0, 100))
def test_same_seed_same_order(n, seed, epoch):
    assert np.array_equal(epoch_order(n, seed, epoch), epoch_order(n, seed, epoch))


@pytest.mark.parametrize("n", [50, 1000])
def test_different_seed_or_epoch_gives_different_order(n):
    base = epoch_order(n, 7, 3)
    assert not np.array_equal(base, epoch_order(n, 8, 3))
    assert not np.array_equal(base, epoch_order(n, 7, 4))
    # control: the comparison itself is able to say "equal"
    assert np.array_equal(base, epoch_order(n, 7, 3))


def test_unshuffled_order_is_identity():
    assert np.array_equal(epoch_order(10, 5, 5, shuffle=False), np.arange(10))


def test_matches_distributed_sampler_layout():
    """Rank r takes positions r, r+W, ... of the order padded with its head, as PyTorch does."""
    n, world = 10, 4
    order = epoch_order(n, 0, 0)
    padded = np.concatenate([order, order[:padding(n, world)]])
    for r in range(world):
        p = plan_epoch(n, seed=0, epoch=0, rank=r, world_size=world, batch_size=100)
        assert np.array_equal(p.batches[0], padded[r::world])


def test_drop_last_cuts_partial_batches():
    p = plan_epoch(10, seed=0, epoch=0, batch_size=4, drop_last=True)
    assert [len(b) for b in p.batches] == [4, 4]
    p = plan_epoch(10, seed=0, epoch=0, batch_size=4)
    assert [len(b) for b in p.batches] == [4, 4, 2]


def test_the_order_is_the_generators_permutation_in_int32():
    """epoch_order shuffles an int32 arange (half the memory at 14.2 M samples): the same draws as
    ``Generator.permutation``, so every order stays what it was when it was int64."""
    for n, seed, epoch in ((10, 0, 0), (1000, 7, 3), (100_003, 2, 9)):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
        order = epoch_order(n, seed, epoch)
        assert order.dtype == np.int32 and not order.flags.writeable
        assert np.array_equal(order, rng.permutation(n))
    # control: another epoch's permutation is not it
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, 4])))
    assert not np.array_equal(epoch_order(1000, 7, 3), rng.permutation(1000))
