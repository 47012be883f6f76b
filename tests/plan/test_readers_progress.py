"""plan/progress.py: the one reading of a node's readers' progress reports."""

from __future__ import annotations

from clairvoyant.plan.progress import DONE, ReadersProgress


def test_a_rank_in_a_later_epoch_has_read_this_one_and_one_in_an_earlier_none_of_it():
    p = ReadersProgress.of([(3, 40), (4, 2), (2, 900), (-1, 0)], epoch=3)
    assert p.positions == (40, DONE, 0, 0)
    assert (p.slowest, p.fastest) == (0, 40)   # the fastest of those still in the epoch
    assert ReadersProgress.of([(4, 2), (5, 0)], epoch=3).fastest == DONE   # every rank gone on
    q = ReadersProgress.of([(3, 40), (4, 2)], epoch=3)
    assert (q.slowest, q.together) == (40, DONE)   # the rank gone on does not hold the slowest back
    r = ReadersProgress.of([(3, 40), (3, 24)], epoch=3)
    assert (r.slowest, r.fastest, r.together) == (24, 40, 64)
    assert ReadersProgress.of([], epoch=0).slowest == 0
    # control: the same reports seen from the next epoch are all behind or at its start
    assert ReadersProgress.of([(3, 40), (4, 2)], epoch=4).positions == (0, 2)
