"""Deadline scheduling across the ranks of a node: the shared staging frontiers."""

from __future__ import annotations

import time

from clairvoyant.stage.gate import NodeProgress


def test_a_rank_may_run_only_slack_batches_beyond_the_slowest(tmp_path):
    a = NodeProgress(str(tmp_path), 0, 2, slack=4, max_wait=0.05)
    b = NodeProgress(str(tmp_path), 1, 2, slack=4, max_wait=0.05)
    assert a.limit() is None                     # b is not staging: nothing holds a back
    b.set(10)
    assert a.limit() == 14 and b.limit() is None
    a.set(30)
    assert b.limit() == 34
    waited = []
    a.wait_for(14, lambda: waited.append(1) or False)
    assert waited == []                          # within the limit: no wait at all
    a.wait_for(15, lambda: waited.append(1) or False)
    assert waited                                # beyond it: waits (at most max_wait)
    b.set(20)
    assert a.limit() == 24
    b.close()                                    # a rank that stops no longer holds others back
    assert a.limit() is None
    a.close()


def test_a_silent_rank_stops_counting(tmp_path):
    a = NodeProgress(str(tmp_path), 0, 2, stale=0.05)
    b = NodeProgress(str(tmp_path), 1, 2, stale=0.05)
    b.set(3)
    assert a.limit() == 3 + a.slack
    time.sleep(0.1)
    assert a.limit() is None
    a.close()
    b.close()
