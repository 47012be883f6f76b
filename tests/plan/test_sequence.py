"""plan/sequence.py: the one merge of ranks' batches into an access sequence, and its inverse,
held equal to the straightforward loop over steps and ranks, with a negative control."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.plan import plan_epoch
from clairvoyant.plan.sequence import Interleaved, cluster_sequence, epoch_sequence, interleave, node_sequence


def loop(batches: list[list[np.ndarray]]) -> tuple[list[int], list[int], list[int], list[int]]:
    """The plain merge: step by step, ranks in order, each rank's batch of the step if it has one.
    Returns (samples, rank, step) per access and the sequence's length after each step."""
    samples, rank, step, ends = [], [], [], []
    for s in range(max((len(b) for b in batches), default=0)):
        for r, b in enumerate(batches):
            if s < len(b):
                samples += b[s].tolist()
                rank += [r] * len(b[s])
                step += [s] * len(b[s])
        ends.append(len(samples))
    return samples, rank, step, ends


def agrees(got: Interleaved, batches: list[list[np.ndarray]]) -> bool:
    """Whether ``got`` is the loop's merge of ``batches``, inverse included (steps past the
    batches' are empty: a few ranks' sequence keeps the steps of the sequence it was taken from)."""
    samples, rank, step, ends = loop(batches)
    r, s = got.rank_and_step()
    if got.samples.tolist() != samples or r.tolist() != rank or s.tolist() != step:
        return False
    if got.steps < len(ends) or got.step_ends.tolist() != ends + [len(samples)] * (got.steps - len(ends)):
        return False
    for i, b in enumerate(batches):   # each rank finds its batches where they lie
        spans = got.spans(i)[:len(b)]
        if [got.samples[a:z].tolist() for a, z in spans] != [x.tolist() for x in b]:
            return False
    return True


@st.composite
def ragged(draw):
    """Per rank, a list of batches of any lengths (0 included), ranks with different step counts."""
    ranks = draw(st.integers(0, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    out = []
    for _ in range(ranks):
        lengths = draw(st.lists(st.integers(0, 5), max_size=6))
        out.append([rng.integers(0, 1000, k) for k in lengths])
    return out


@settings(max_examples=150, deadline=None)
@given(batches=ragged(), data=st.data())
def test_ragged_batches_are_the_loops_merge(batches, data):
    flat = [np.concatenate(b).astype(np.int64) if b else np.zeros(0, np.int64) for b in batches]
    lengths = [np.array([len(x) for x in b], np.int64) for b in batches]
    got = interleave(flat, lengths)
    assert agrees(got, batches) and got.steps == max((len(b) for b in batches), default=0)
    # the rank and step of chosen positions, and the accesses of some of the ranks alone
    samples, rank, step, _ = loop(batches)
    where = np.array(sorted(data.draw(st.sets(st.integers(0, max(len(samples) - 1, 0)), max_size=10)))
                     if samples else [], np.int64)
    r, s = got.rank_and_step(where)
    assert r.tolist() == [rank[i] for i in where] and s.tolist() == [step[i] for i in where]
    some = sorted(data.draw(st.sets(st.integers(0, max(len(batches) - 1, 0)), max_size=len(batches))))
    pos, sub = got.only(some)
    assert pos.tolist() == [i for i in range(len(samples)) if rank[i] in some]
    assert agrees(sub, [batches[i] for i in some])


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), world=st.sampled_from([1, 2, 3, 5, 8, 64]), batch=st.integers(1, 9),
       drop_last=st.booleans(), at=st.floats(0, 1), seed=st.integers(0, 100), data=st.data())
def test_an_epochs_sequence_is_the_loop_over_each_ranks_batches(n, world, batch, drop_last, at, seed, data):
    """DistributedSampler shares (uneven last batches, drop_last, one rank, many ranks, resumed at a
    position): the reshaping path and the general one both give the loop's merge."""
    position = int(at * n)
    kw = dict(seed=seed, epoch=1, world_size=world, batch_size=batch, drop_last=drop_last, position=position)
    per_rank = [list(plan_epoch(n, rank=r, **kw).batches) for r in range(world)]
    whole = epoch_sequence(n, **kw)
    assert agrees(whole, per_rank)
    samples, rank, step = cluster_sequence(n, **kw)
    assert (samples.tolist(), rank.tolist(), step.tolist()) == tuple(loop(per_rank)[:3])
    ranks = sorted(data.draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world)))
    node = node_sequence(n, ranks=ranks, **kw)
    assert node.dtype == np.int64 and node.tolist() == loop([per_rank[r] for r in ranks])[0]
    # the general path (a list of rows) takes the reshaping path's decisions
    lengths = whole.lengths[:, 0]
    rows = [np.concatenate(b) if b else np.zeros(0, np.int64) for b in per_rank]
    assert interleave(rows, [lengths] * world).samples.tolist() == whole.samples.tolist()


def test_a_merge_rank_by_rank_fails_the_check():
    """Negative control: rank 0's batches then rank 1's, or the ranks swapped, is not the merge."""
    rng = np.random.default_rng(0)
    batches = [[rng.integers(0, 100, 3), rng.integers(0, 100, 3), rng.integers(0, 100, 2)] for _ in range(2)]
    flat = [np.concatenate(b) for b in batches]
    lengths = np.array([3, 3, 2])
    assert agrees(interleave(flat, lengths), batches)
    rank_major = Interleaved(np.concatenate(flat), np.broadcast_to(lengths[:, None], (3, 2)))
    assert not agrees(rank_major, batches)
    assert not agrees(interleave(flat[::-1], lengths), batches)


def test_batches_longer_than_a_rank_are_refused():
    with pytest.raises(ValueError, match="rank 1's batches take 4 samples but it has 3"):
        interleave([np.arange(4), np.arange(3)], np.array([2, 2]))
    with pytest.raises(ValueError, match="one per rank"):
        interleave([np.arange(4)], [np.array([2]), np.array([2])])


def test_the_reshaping_path_copies_no_row():
    """At 4,096 ranks the cluster's sequence is one copy of the order, not one per rank."""
    import tracemalloc

    order = np.arange(4096 * 48, dtype=np.int32)
    rows = order.reshape(-1, 4096).T   # a view: (4096, 48)
    tracemalloc.start()
    try:
        interleave(rows, np.array([16, 16, 16]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 4096 * 48 + 200_000
