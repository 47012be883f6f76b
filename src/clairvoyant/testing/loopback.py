"""A cluster of mounts within one process (``Mount(..., cluster=LoopbackLink(hub, node, nodes))``):
the test double of mount/cluster/links.py's ``ServiceLink``, with the same ``ClusterLink`` contract
and no sockets, for tests of the cluster's plan and serving that need no processes."""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from ..plan.membership import SERVING, Probed, probed
from ..cluster.timeouts import PROBE_WAIT
from ..tune.counters import Counters


class LoopbackLink:
    """Mounts of one process joined directly (tests): node
    ``node`` of a ``hub`` (a dict shared by the nodes' links, node -> serve). A node answers a probe
    while its link is open and it is not in ``hub["silent"]`` (a test's node that does not answer);
    a fetch of a piece of state in ``hub["withheld"]`` (peer, number) gets no answer (a test's
    answer that came too late)."""

    def __init__(self, hub: dict, node: int, nodes: int) -> None:
        self.hub, self.node, self.nodes = hub, node, nodes
        self._c = Counters(["peer"]).space("peer")   # tune/counters.py's peer.*
        self.lost: frozenset[int] = frozenset()
        self.was_lost = False

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> Probed:
        peers = [p for p in range(self.nodes) if p != self.node] if peers is None else list(peers)
        return probed(peers, {p: SERVING for p in peers if p in self.hub and p not in self.hub.get("silent", ())})

    def mark_lost(self, peers: list[int]) -> None:
        self.lost, self.was_lost = self.lost | frozenset(peers), True

    def readmit(self, peers: list[int]) -> None:
        self.lost = self.lost - frozenset(peers)

    def rejoin(self) -> None:
        """The cluster formed again with every node (what a launcher's join does to a ServiceLink)."""
        self.lost = frozenset()

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Mounts of one process list the same source: nothing to compare across processes."""
        self.hub.setdefault("fingerprints", {})[self.node] = fingerprint
        if len(set(self.hub["fingerprints"].values())) > 1:
            raise ConfigError(f"{what} differs across the nodes of this hub: mount the same source")

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        self.hub[self.node] = (serve, state)

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
        if peer in self.lost or (state and (peer, number) in self.hub.get("withheld", ())):
            return None
        answer = self.hub.get(peer, (None, None))[int(state)]
        self._c.add("fetches")
        got = answer(number) if answer is not None else None
        got = got if got is not None and len(got) == size else None
        self._c.add("hits" if got is not None else "misses")
        return got

    def counters(self) -> dict:
        return self._c.snapshot()

    def close(self) -> None:
        self.hub.pop(self.node, None)
