"""MECHANISM: the one counter set. Every counter has a name in a namespace, declared once in
``NAMES`` with what it counts:

- ``stage.*``: what the Loader's run did (samples read from the source, found, waited for);
- ``tier.*``: what the node's tiers did (staged, hit, evicted, found stale or corrupt, ...);
- ``mount.*``: what the mount's staging did beside that (its plans, how far along, reads it
  served from the source, ...);
- ``peer.*``: what a link to the other nodes did (the Loader's peer service over MPI, the
  mounts' links): fetches asked and how each ended, requests answered, bytes each way;
- ``cluster.*``: what the cluster mount did as a node of the cluster cache (files from peers,
  from the store for a peer, ahead of their reads, plans and homes).

The Loader's ``stats()["tiers"]`` is the ``tier`` namespace; ``clairvoyant mount --stats`` prints
the ``mount`` namespace and the ``tier`` counters the mount moved, by the same short names, so one
event has one name at both front doors. A counter both show is one line in ``NAMES`` and one
``add`` where the event happens. One lock per set; a namespace's view (``space``) adds and reads
by short names.
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping

NAMES: dict[str, str] = {
    # what the Loader's run did (Loader.stats(), top level; tune/stats.py)
    "stage.source_files": "samples read from the source by this loader",
    "stage.source_bytes": "bytes of those",
    "stage.staged_files": "samples this loader placed in a tier",
    "stage.local_hits": "samples found in the local tier (an earlier epoch, run or another rank)",
    "stage.on_demand": "samples still missing when the training loop asked for their batch",
    "stage.waits": "next() calls that had to wait for their batch",
    "stage.wait_seconds": "seconds the training loop waited inside next()",
    "stage.batches": "batches delivered",
    "stage.samples": "samples delivered",
    # what the tiers did (Loader.stats()["tiers"]; the mount's staging counts staged_local)
    "tier.local_hits": "planned hits found in the local tier",
    "tier.staged_local": "samples (files) staged into the local tier",
    "tier.staged_ram": "samples staged into the RAM window",
    "tier.bypassed": "samples no tier had room for: their readers read the source",
    "tier.promotions": "samples moved down from the RAM window to the local tier",
    "tier.evictions": "entries evicted (farthest next use)",
    "tier.dropped": "entries the plan let go",
    "tier.stale": "entries older than their source file, dropped",
    "tier.corrupt": "entries that failed their checksum, dropped",
    "tier.missed_hits": "planned hits that were not there: read again from the source",
    "tier.fetches": "reads from the source by the staging threads",
    "tier.fetch_seconds": "seconds of those reads",
    "tier.fetch_bytes": "bytes of those reads",
    "tier.peer_hits": "samples read from a peer's tier",
    "tier.peer_misses": "samples a peer did not serve: read from the source",
    "tier.late_drops": "home samples dropped once their last reader, a peer, had them",
    "tier.deferred": "kept samples whose move down waited for room",
    "tier.not_kept": "kept samples that found no room by the epoch's end",
    "tier.range_reads": "ranges read whole",
    "tier.range_placed": "samples placed from ranges read whole",
    "tier.range_early": "samples of a range found placed before their own turn",
    "tier.peer_corrupt": "entries from a peer that failed their check",
    "tier.compress_overflow": "entries that compressed worse than planned and found no room",
    # what the mount's staging did (clairvoyant mount --stats)
    "mount.plans": "plans run",
    "mount.epoch": "the current plan's epoch",
    "mount.ranks": "the current plan's ranks",
    "mount.sequence": "the current plan's length",
    "mount.following": "the following epoch's part of it",
    "mount.frontier": "how far staging is along it",
    "mount.consumed": "how far the readers are along it",
    "mount.inflight": "copies carried at once (tune/inflight.py sets it)",
    "mount.staged_bytes": "bytes staged into the local tier",
    "mount.present": "files found staged already",
    "mount.evicted": "files evicted",
    "mount.read_through": "reads served from the source while staging",
    "mount.not_staged": "files the plan or the room left to the source",
    "mount.failed": "stagings that failed",
    "mount.handed_over": "files handed over to their home",
    "mount.read_ahead": "files read ahead of their opens",
    "mount.ahead_no_room": "read-aheads given up for room",
    "mount.filled": "files handed to staging ahead of a shuffled first pass (no order known: the listing's, while the tier has room)",
    "mount.kept_reads": "files kept after a read the staging heard late",
    "mount.evicted_unread": "evicted files never read",
    "mount.not_home": "reads of files whose home is another node",
    # a link to the other nodes (cluster/peers.py, mount/cluster/node.py's links)
    "peer.fetches": "fetches asked of a peer",
    "peer.probes": "asks of a probe of who serves (not fetches)",
    "peer.sent": "requests sent",
    "peer.hits": "fetches a peer answered with the bytes",
    "peer.misses": "fetches a peer answered without them",
    "peer.timeouts": "fetches given up after the deadline",
    "peer.bad_checksum": "answers that failed their check",
    "peer.failed": "fetches the transport failed",
    "peer.passed_over": "fetches not sent to a peer passed over after a time-out",
    "peer.late": "answers that came after their caller gave up",
    "peer.refused": "messages dropped unread",
    "peer.served": "requests answered with the bytes",
    "peer.unserved": "requests answered without them",
    "peer.errors": "transport errors met",
    "peer.bytes_in": "bytes received in answers",
    "peer.bytes_out": "bytes sent in answers",
    # the cluster mount as a node of the cluster cache (mount/cluster/node.py)
    "cluster.plans": "cluster plans run",
    "cluster.gather_seconds": "seconds spent gathering the nodes' orders",
    "cluster.homes_from_epoch": "the epoch the homes were planned from",
    "cluster.plan_store": "reads the plan left to the store",
    "cluster.asked_ready": "files asked of a peer that had them ready",
    "cluster.from_peers": "files read from a peer's tier",
    "cluster.bytes_from_peers": "bytes of those",
    "cluster.peer_seconds": "seconds spent asking peers",
    "cluster.peer_misses": "files a peer did not serve: read from the store",
    "cluster.ahead": "files staged ahead of their reads at their home",
    "cluster.ahead_from_tier": "stagings ahead found in the tier",
    "cluster.ahead_from_store": "stagings ahead read from the store",
    "cluster.served_from_tier": "files served to a peer from the tier",
    "cluster.served_from_store": "files served to a peer from the store",
    "cluster.served_not_home": "files served from the tier by a node that is no longer their home",
    "cluster.served_absent": "requests for files this home does not hold",
    "cluster.taken_over": "files taken over from their former home",
    "cluster.evicted": "files dropped from this home's tier (the plan's cuts, the policy's evictions)",
}


def namespace(ns: str) -> list[str]:
    """The short names declared in namespace ``ns``."""
    return [n.split(".", 1)[1] for n in NAMES if n.startswith(ns + ".")]


class Counters:
    """Values of the counters of ``namespaces`` (all of ``NAMES`` by default), each 0 to start."""

    def __init__(self, namespaces: Iterable[str] | None = None) -> None:
        keep = None if namespaces is None else tuple(f"{ns}." for ns in namespaces)
        self.lock = threading.Lock()
        self._v: dict[str, float] = {n: 0 for n in NAMES if keep is None or n.startswith(keep)}

    def add(self, name: str, n: float = 1) -> None:
        with self.lock:
            self._v[name] += n

    def update(self, deltas: Mapping[str, float]) -> None:
        with self.lock:
            for name, n in deltas.items():
                self._v[name] += n

    def set(self, values: Mapping[str, float], add: Mapping[str, float] | None = None) -> None:
        """Set ``values`` and add ``add``, in one step (a snapshot sees all of it or none)."""
        with self.lock:
            for name, v in values.items():
                if name not in self._v:
                    raise KeyError(name)
                self._v[name] = v
            for name, n in (add or {}).items():
                self._v[name] += n

    def get(self, *names: str) -> tuple[float, ...]:
        """The values of ``names``, read together."""
        with self.lock:
            return tuple(self._v[n] for n in names)

    def snapshot(self, ns: str | None = None) -> dict[str, float]:
        """Namespace ``ns`` by short names, or every counter by full name."""
        with self.lock:
            if ns is None:
                return dict(self._v)
            cut = len(ns) + 1
            return {n[cut:]: v for n, v in self._v.items() if n.startswith(ns + ".")}

    def space(self, ns: str) -> "Space":
        return Space(self, ns)


class Space:
    """Namespace ``ns`` of a counter set, by short names."""

    def __init__(self, counters: Counters, ns: str) -> None:
        self.counters, self.ns = counters, ns

    def add(self, name: str, n: float = 1) -> None:
        self.counters.add(f"{self.ns}.{name}", n)

    def add_many(self, **deltas: float) -> None:
        self.counters.update({f"{self.ns}.{k}": v for k, v in deltas.items()})

    def set_many(self, **values: float) -> None:
        self.counters.set({f"{self.ns}.{k}": v for k, v in values.items()})

    def get(self, *names: str) -> tuple[float, ...]:
        return self.counters.get(*(f"{self.ns}.{n}" for n in names))

    def snapshot(self) -> dict[str, float]:
        return self.counters.snapshot(self.ns)

    def __getattr__(self, name: str) -> float:
        """A counter's value by its short name (``tiers.counters.deferred``)."""
        if name.startswith("_") or name in ("counters", "ns"):
            raise AttributeError(name)
        try:
            return self.counters.get(f"{self.ns}.{name}")[0]
        except KeyError:
            raise AttributeError(f"no counter {self.ns}.{name} (tune/counters.py NAMES)") from None
