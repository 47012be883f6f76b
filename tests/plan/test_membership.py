"""plan/membership.py: what a cluster mount makes of a signal and of a probe of its peers."""

from __future__ import annotations

import signal

from clairvoyant.plan.membership import LEAVE, UNMOUNT, on_leave, told


def test_ctrl_c_unmounts_and_a_launchers_teardown_asks_the_service_to_leave():
    assert told(signal.SIGINT) == UNMOUNT
    assert told(signal.SIGTERM) == told(signal.SIGHUP) == LEAVE   # mpirun: interrupted, or a rank died


def test_a_leaving_service_unmounts_only_when_every_peer_answers_and_none_lost_its_member():
    assert on_leave([], []).unmount
    lost = on_leave([3], [])
    assert not lost.unmount and "node(s) [3] did not answer" in lost.why
    orphaned = on_leave([], [1, 0])
    assert not orphaned.unmount and "member of node(s) [0, 1]" in orphaned.why
    assert "did not answer" in on_leave([2], [1]).why   # a silent node is the reason before an orphaned one
