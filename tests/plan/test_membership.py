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


def test_a_node_is_lost_when_it_answers_neither_probe_and_the_reason_is_said():
    """``probed``: no answer is lost, ``ORPHANED`` is serving on without its member, ``SERVING`` is
    neither. ``why_absent`` says which ranks are gone and which are alive but stuck. Control: an
    answer of any kind is not a loss."""
    from clairvoyant.plan.membership import ORPHANED, SERVING, probed, why_absent
    found = probed([1, 2, 3], {1: None, 2: ORPHANED, 3: SERVING})
    assert found == ([1], [2], [])
    assert probed([4], {}) == ([4], [], [])   # never asked or never answered: the same
    assert probed([2, 3], {2: ORPHANED, 3: SERVING}).lost == []   # control
    why = why_absent([1, 3], probed([1, 3], {1: None, 3: SERVING}))
    assert "rank(s) [1] answer no probe: lost" in why and "rank(s) [3] answer probes: alive" in why
    assert "lost" not in why_absent([3], probed([3], {3: SERVING}))   # control: alive only


def test_a_draining_node_counts_as_lost_and_is_named_as_draining():
    """``probed``: ``DRAINING`` is lost to the plan (and listed as draining), unlike ``SERVING``;
    ``why_absent`` says draining, not silent. Control: a silent node beside it is named silent."""
    from clairvoyant.plan.membership import DRAINING, SERVING, probed, why_absent
    found = probed([1, 2, 3], {1: DRAINING, 2: None, 3: SERVING})
    assert found == ([1, 2], [], [1]) and found.silent == [2]
    why = why_absent([1, 2], found)
    assert "rank(s) [1] are draining" in why and "rank(s) [2] answer no probe" in why
    assert probed([3], {3: SERVING}) == ([], [], [])   # control
