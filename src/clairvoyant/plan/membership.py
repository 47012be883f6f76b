"""POLICY, pure: what a cluster mount makes of a signal and of a probe of its peers (mount/cluster/member.py
only wires it to the processes).

- A signal to the member the launcher runs: SIGINT is Ctrl-C at the launcher (torchrun passes its
  own on as SIGINT): unmount. SIGTERM and SIGHUP are a launcher's teardown, which ``mpirun`` sends
  alike when it is interrupted and when a rank died: the service is asked to leave, and decides
  by asking its peers.
- Leaving, after the probe: every peer answers and none says its member ended without a word:
  the whole job ends, unmount. One did not answer: a node was lost and the launcher ends the job
  because of it; serve on (from the tier, the nodes that answer, the store). A peer whose member
  ended without a word: that member's loss is the reason; serve on too.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Sequence

UNMOUNT, LEAVE = "unmount", "leave"
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
