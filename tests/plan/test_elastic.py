"""Elastic resume: a state saved at world size W continues at W' with exactly the rest of the epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from clairvoyant import Loader
from clairvoyant.plan import epoch_order, plan_epoch, position_after


def split(n, seed, epoch, world, batch, drop_last, position=0):
    return [plan_epoch(n, seed=seed, epoch=epoch, rank=r, world_size=world, batch_size=batch,
                       drop_last=drop_last, position=position).batches for r in range(world)]


def check_rest(n, order, consumed, rest_batches, world2, drop_last, batch2):
    """The rest covers every unconsumed sample once; anything else is padding with consumed samples
    (or, at the very start of an epoch, DistributedSampler's padding with the epoch's head)."""
    rest = np.concatenate([b for rank in rest_batches for b in rank]) if any(rest_batches) else np.zeros(0, int)
    unconsumed = set(order.tolist()) - set(consumed)
    counts = np.bincount(rest, minlength=n)
    fresh = [i for i in rest.tolist() if i in unconsumed]
    extra = [i for i in rest.tolist() if i not in unconsumed]
    if consumed:
        assert len(fresh) == len(set(fresh)), "an unconsumed sample came twice"
    else:   # a whole epoch: DistributedSampler pads with its head
        extra = [i for i, c in zip(*np.unique(rest, return_counts=True)) for _ in range(c - 1)]
    assert len(extra) <= world2 - 1 and set(extra) <= set(order[:world2].tolist()), "more than the padding"
    missing = unconsumed - set(fresh)
    if drop_last:
        assert len(missing) < world2 * batch2
    else:
        assert not missing, f"{len(missing)} samples lost"
    assert len({len(r) for r in rest_batches}) <= 1, "ranks got different numbers of batches"
    return counts


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 9), world2=st.integers(1, 9), batch=st.integers(1, 9),
       batch2=st.integers(1, 9), frac=st.floats(0, 1), drop_last=st.booleans(), seed=st.integers(0, 99))
def test_any_position_continues_at_any_world_size(n, world, world2, batch, batch2, frac, drop_last, seed):
    before = split(n, seed, 0, world, batch, drop_last)
    k = int(frac * len(before[0]))
    consumed = [i for rank in before for b in rank[:k] for i in b.tolist()]
    position = position_after(n, 0, k, batch, world, len(before[0]))
    rest = split(n, seed, 0, world2, batch2, drop_last, position)
    if k == len(before[0]):   # the epoch is over (what drop_last dropped is not owed)
        assert position == n and not any(rest)
        return
    assert set(consumed) >= set(epoch_order(n, seed, 0)[:position].tolist())   # a prefix of the order
    check_rest(n, epoch_order(n, seed, 0), consumed, rest, world2, drop_last, batch2)


def test_same_world_size_resumes_exactly_the_uninterrupted_batches():
    full = split(101, 5, 3, 4, 6, False)
    for k in range(len(full[0]) + 1):
        rest = split(101, 5, 3, 4, 6, False, position_after(101, 0, k, 6, 4, len(full[0])))
        assert all([b.tolist() for b in rest[r]] == [b.tolist() for b in full[r][k:]] for r in range(4))


def test_carrying_the_batch_count_over_loses_samples():
    """Negative control: resuming at 'the same number of batches' at a new world size is wrong."""
    n, world, world2, batch = 96, 4, 2, 4
    before = split(n, 0, 0, world, batch, False)
    consumed = [i for rank in before for b in rank[:3] for i in b.tolist()]
    naive = split(n, 0, 0, world2, batch, False, position=3 * batch * world2)
    with pytest.raises(AssertionError):
        check_rest(n, epoch_order(n, 0, 0), consumed, naive, world2, False, batch)


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> str:
    """90 samples whose bytes are their own number."""
    root = tmp_path_factory.mktemp("numbered")
    for i in range(90):
        (root / f"{i:03d}.bin").write_bytes(np.int64(i).tobytes())
    return str(root)


def ident(b: bytes) -> np.ndarray:
    return np.frombuffer(b, np.int64).copy()


def run_ranks(root, local, world, batch, drop_last, state=None, take=None):
    """Each rank's yielded samples (all, or the first ``take`` batches) and rank 0's state after them."""
    got, state0 = [], None
    for r in range(world):
        with Loader(root, batch_size=batch, rank=r, world_size=world, local_dir=local, seed=7, num_workers=1,
                    drop_last=drop_last, decode=ident, output="numpy", stage_threads=2) as ld:
            ld.set_epoch(1)
            if state is not None:
                ld.load_state_dict(state)
            it = iter(ld)
            batches = [next(it) for _ in range(take)] if take is not None else list(it)
            got.append([x.ravel().tolist() for x, _ in batches])
            if r == 0:
                state0 = json.loads(json.dumps(ld.state_dict()))
            del it
    return got, state0


@pytest.mark.parametrize("world2", [2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_resumes_a_four_rank_state_on_another_world_size(numbered, tmp_path, world2, drop_last, no_leaks):
    batch = 4
    head, state = run_ranks(numbered, tmp_path / "c", 4, batch, drop_last, take=2)
    assert state["position"] == 2 * batch * 4 and state["epoch"] == 1
    consumed = [i for rank in head for b in rank for i in b]
    rest, _ = run_ranks(numbered, tmp_path / "c", world2, batch, drop_last, state=state)
    order = epoch_order(90, 7, 1)
    check_rest(90, order, consumed, [[np.array(b) for b in rank] for rank in rest], world2, drop_last, batch)
    # the epoch after follows the new world size from its start
    with Loader(numbered, batch_size=batch, rank=0, world_size=world2, local_dir=tmp_path / "c", seed=7,
                num_workers=1, drop_last=drop_last, decode=ident, output="numpy") as ld:
        ld.load_state_dict(state)
        list(ld)
        assert ld.state_dict()["position"] == 90
        ld.set_epoch(2)
        nxt = [x.ravel().tolist() for x, _ in ld]
    assert nxt == [b.tolist() for b in split(90, 7, 2, world2, batch, drop_last)[0]]


def test_naive_resume_at_the_new_world_size_fails_the_same_check(numbered, tmp_path, no_leaks):
    """Negative control on the loader: a state whose position counts batches of the new world size."""
    head, state = run_ranks(numbered, tmp_path / "c", 4, 4, False, take=2)
    consumed = [i for rank in head for b in rank for i in b]
    naive = dict(state, position=2 * 4 * 2)
    rest, _ = run_ranks(numbered, tmp_path / "c", 2, 4, False, state=naive)
    with pytest.raises(AssertionError):
        check_rest(90, epoch_order(90, 7, 1), consumed, [[np.array(b) for b in r] for r in rest], 2, False, 4)


def test_a_version_one_state_still_loads(numbered, tmp_path, no_leaks):
    _, state = run_ranks(numbered, tmp_path / "c", 2, 4, False, take=3)
    old = {k: v for k, v in state.items() if k != "position"}
    old["version"] = 1
    with Loader(numbered, batch_size=4, rank=0, world_size=2, local_dir=tmp_path / "c", seed=7, num_workers=1,
                decode=ident, output="numpy") as ld:
        ld.load_state_dict(old)
        assert ld.position == state["position"] == 3 * 4 * 2
