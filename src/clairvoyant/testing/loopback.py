"""A cluster of mounts within one process (``Mount(..., cluster=LoopbackLink(hub, node, nodes))``):
the test double of mount/cluster/links.py's ``ServiceLink``, with the same ``ClusterLink`` contract
and no sockets, for tests of the cluster's plan and serving that need no processes."""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from ..plan.membership import Probed
from ..cluster.timeouts import PROBE_WAIT
from ..tune.counters import Counters


class LoopbackLink:
    """Mounts of one process joined directly (tests): node
    ``node`` of a ``hub`` (a dict shared by the nodes' links, node -> serve). No node of one
    process is ever lost: nothing to probe."""

    lost: frozenset[int] = frozenset()
    was_lost = False

    def probe(self, peers: list[int] | None = None, timeout: float = PROBE_WAIT) -> Probed:
        return Probed([], [])

    def mark_lost(self, peers: list[int]) -> None:
        pass

    def __init__(self, hub: dict, node: int, nodes: int) -> None:
        self.hub, self.node, self.nodes = hub, node, nodes
        self._c = Counters(["peer"]).space("peer")   # tune/counters.py's peer.*

    def agree(self, fingerprint: bytes, what: str) -> None:
        """Mounts of one process list the same source: nothing to compare across processes."""
        self.hub.setdefault("fingerprints", {})[self.node] = fingerprint
        if len(set(self.hub["fingerprints"].values())) > 1:
            raise ConfigError(f"{what} differs across the nodes of this hub: mount the same source")

    def start(self, serve: Callable[[int], bytes | None], state: Callable[[int], bytes | None] | None = None) -> None:
        self.hub[self.node] = (serve, state)

    def fetch(self, peer: int, number: int, size: int, timeout: float, state: bool = False) -> bytes | None:
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
