"""POLICY, pure: when a node counts as lost, and what the cluster makes of a signal
(mount/cluster/member.py, mount/cluster/node.py and cluster/job.py only wire it).

- A node is lost when it answers neither of two probes (the one probe: cluster/peers.py
  ``PeerService.probe``; ``probed`` decides, for both front doors). The mounts serve on without it
  (their orders gathered without it, its files homed among the others); the Loader's ranks, whose
  every epoch needs every rank, stop with a ``PeerLost`` that names it and says why
  (``why_absent``: lost, or alive and stuck), to be restarted on the nodes left.
- A signal to the member the launcher runs: SIGINT is Ctrl-C at the launcher (torchrun passes its
  own on as SIGINT): unmount. SIGTERM and SIGHUP are a launcher's teardown, which ``mpirun`` sends
  alike when it is interrupted and when a rank died: the service is asked to leave, and decides
  by asking its peers.
- Leaving, after the probe: every peer answers and none says its member ended without a word:
  the whole job ends, unmount. One did not answer: a node was lost and the launcher ends the job
  because of it; serve on (from the tier, the nodes that answer, the store). A peer whose member
  ended without a word: that member's loss is the reason; serve on too.
- A node told to drain (``DRAIN``: its node is to be taken back, a preemption notice) serves on
  until it goes, but answers a probe ``DRAINING`` and offers no orders: its peers count it lost
  (``probed``) and plan the next epochs without it, before it is gone.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

UNMOUNT, LEAVE, DRAIN = "unmount", "leave", "drain"
SERVING, ORPHANED = b"\x01", b"\x02"   # a probe's answers: serving; serving after its member ended without a word
DRAINING = b"\x03"   # serving until its node is taken back (told to drain): planned without
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # the ones a member and a service take


def told(signum: int) -> str:
    """What a signal to the member asks of its service: ``UNMOUNT`` or ``LEAVE``."""
    return UNMOUNT if signum == signal.SIGINT else LEAVE


@dataclass(frozen=True)
class Leaving:
    """A leaving service's decision: ``unmount`` (the job ends) or serve on, and why."""

    unmount: bool
    why: str


def on_leave(lost: Sequence[int], orphaned: Sequence[int]) -> Leaving:
    """The decision from a probe of every peer: ``lost``, the nodes that did not answer;
    ``orphaned``, those that answered that their member ended without a word."""
    if lost:
        return Leaving(False, f"node(s) {sorted(lost)} did not answer: a node was lost")
    if orphaned:
        return Leaving(False, f"the member of node(s) {sorted(orphaned)} ended without a word")
    return Leaving(True, "every node answers: the job ends")


class Probed(NamedTuple):
    """What a probe of ``peers`` decides: ``lost``, those that answered neither ask (the process, or
    its node, is gone) or that answered ``DRAINING`` (``draining``: going, planned without from
    now); ``orphaned``, those serving on after their member ended without a word."""

    lost: list[int]
    orphaned: list[int]
    draining: list[int] = []

    @property
    def silent(self) -> list[int]:
        """Those lost that answered neither ask (the draining answered)."""
        return [p for p in self.lost if p not in self.draining]


def probed(peers: Sequence[int], answers: Mapping[int, bytes | None]) -> Probed:
    """The decision from each peer's answer to a probe (None: none to either ask)."""
    draining = [p for p in peers if answers.get(p) == DRAINING]
    return Probed([p for p in peers if answers.get(p) is None or p in draining],
                  [p for p in peers if answers.get(p) == ORPHANED], draining)


def why_absent(missing: Sequence[int], found: Probed) -> str:
    """Why the ranks ``missing`` did not take part in an exchange, from a probe of them."""
    parts = []
    if found.silent:
        parts.append(f"rank(s) {sorted(found.silent)} answer no probe: lost (the process, or its node, is gone)")
    if found.draining:
        parts.append(f"rank(s) {sorted(found.draining)} are draining: their node is being taken back")
    alive = sorted(set(missing) - set(found.lost))
    if alive:
        parts.append(f"rank(s) {alive} answer probes: alive, but they did not reach the exchange (stuck, or far "
                     "behind)")
    return "; ".join(parts)
