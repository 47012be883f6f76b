"""MECHANISM: a Loader's footing on its node and in its job, kept up to date between passes.

The node's tiers of the source, opened (cache/node.py) and closed; whether a kept miss goes straight
to the local tier; the node's deadline gate (``balance=True``, stage/gate.py). Where this process
sits (cluster/topology.py): the rank, world size and node layout, bound to a process group before the
first pass (one exchange of node names and manifests, never in the constructor). Each epoch's plan
for this rank (plan/rank_plan.py), from the residents the last epoch's plan left or the tier holds;
the range reader of a packing source (plan/ranges.py); the samples this node serves to peers (the
cluster cache, cluster/job.py).

``NodeSession`` is a part of the Loader (load/loader.py), made once the Loader knows its source,
manifest and sizes; it holds the tiers, the gate, the place in the job and the last epoch's plan
and run (``carry``), and nothing of the epoch's position (load/passes.py).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from ..cache.entry import entry_size, read_sample, unseal
from ..cache.extents import read_entry
from ..cache.node import open_tiers, residents
from ..cache.tiers import Tiers
from ..cluster.job import Cluster
from ..cluster.members import gather_over_group
from ..cluster.topology import digest63, local_from_env, node_name, process_group, resolve, validate
from ..errors import ConfigError, CorruptEntry
from ..manifest import Manifest
from ..plan.layout import NodeLayout
from ..plan.ranges import DEFAULT_REQUEST_BYTES, Ranges
from ..plan.rank_plan import ClusterTiers, PlanConfig, RankEpochPlan, plan_rank_epoch
from ..source import Source
from ..stage import native
from ..stage.engine import RangeReader
from ..stage.gate import NodeProgress

log = logging.getLogger("clairvoyant")


def place(local_world_size: int | None) -> NodeLayout:
    """Rank, world size and node layout when none were given (cluster/topology.py); a
    ``local_world_size=`` argument overrides the node layout."""
    t = resolve()
    return t if local_world_size is None else validate(t.rank, t.world_size, local_world_size=local_world_size,
                                                       origin=t.origin)


def compress_sample(source: Source, manifest: Manifest) -> list[bytes]:
    """A few samples read from the source, for the choice of compressed staging (``SAMPLE`` of
    them spread over the data set, ``SAMPLE_BYTES`` at most unless the first is larger)."""
    from ..plan.compression import SAMPLE_BYTES, sample_indices
    keys, sizes = manifest.keys, manifest.sizes
    out, total = [], 0
    for i in sample_indices(len(manifest)):
        if out and total + int(sizes[i]) > SAMPLE_BYTES:
            break
        out.append(source.read(keys[i]))
        total += len(out[-1])
    return out


class NodeSession:
    """The Loader's tiers, deadline gate, place in the job, epoch plans, range reader and serving."""

    def __init__(self, source: Source, manifest: Manifest, topology: NodeLayout, *, entry_sizes: np.ndarray,
                 raw_entry_sizes: np.ndarray, config: PlanConfig, cluster: Cluster | None,
                 topology_given: bool, local_world_size: int | None, balance: bool) -> None:
        self.source, self.manifest, self.topology = source, manifest, topology
        self.entry_sizes = entry_sizes            # what the plan counts per sample
        self.raw_entry_sizes = raw_entry_sizes    # an entry of the sample as it is (capacities are shares of these)
        self.config, self.cluster = config, cluster
        self.topology_given, self.local_world_size, self.balance = topology_given, local_world_size, balance
        self.agreed = False   # the ranks of a process group compared manifests and node names
        self.tiers: Tiers
        self.capacities: dict[str, Any] = {}
        self.progress: NodeProgress | None = None   # deadline scheduling across the node's ranks
        self.carry: tuple[RankEpochPlan, Any] | None = None   # the last epoch's plan and its run
        self.inventory_used = False
        self._ranges: RangeReader | bool | None = None   # see range_reader (False: none)

    def open_tiers(self, local_dir, ram_dir, local_capacity, ram_capacity) -> Tiers:
        node = open_tiers(self.source, self.raw_entry_sizes, local_dir=local_dir, local_capacity=local_capacity,
                          ram_dir=ram_dir, ram_capacity=ram_capacity, direct=self.direct)
        self.capacities = {"local": node.local, "ram": node.ram}
        log.info("clairvoyant: local tier %s holds up to %s; RAM tier %s up to %s", node.tiers.local.root,
                 node.local, node.tiers.ram.root, node.ram)
        self.tiers = node.tiers
        return self.tiers

    def direct(self, local_capacity: int) -> bool:
        """A miss to keep goes straight to the local tier when everything fits, or when this process
        is the node's only rank (no other rank's keeps to make room for)."""
        return local_capacity >= int(self.entry_sizes.sum()) or self.topology.local_world_size == 1

    def drop_carry(self) -> None:
        """Close the last epoch's run and forget its plan."""
        if self.carry is not None:
            self.carry[1].close()
        self.carry = None

    def close(self) -> None:
        """The last run closed, the deadline gate left (the tiers close with the Loader)."""
        self.drop_carry()
        if self.progress is not None:
            self.progress.close()

    def open_progress(self) -> None:
        """The node-wide deadline gate of ``balance=True``, for the current topology."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        t = self.topology
        if self.balance and t.local_world_size > 1:
            self.progress = NodeProgress(self.tiers.local.root, t.local_rank, t.local_world_size)

    # -- where this process sits ------------------------------------------------------------------

    def follows_group(self) -> bool:
        """A process group is there and its ranks have not compared notes yet (also one started
        after this Loader was made: Lightning's DDP starts it in ``Trainer.fit``)."""
        return not self.topology_given and self.cluster is None and not self.agreed and process_group() is not None

    def where(self) -> NodeLayout:
        """The topology, as the process group says now (no collective call)."""
        return place(self.local_world_size) if self.follows_group() else self.topology

    def bind(self) -> None:
        """Before the first pass under a process group (every rank iterates: a collective call is
        safe here, never in the constructor): take the group's rank and world size, and exchange
        once, over the group, each rank's node name and manifest. Ranks whose manifests differ
        (the source changed while they started, each checking it on its own) stop with an error
        instead of drawing samples twice or never; the node layout comes from the names where no
        variable gives it."""
        if not self.follows_group():
            return
        old, t = self.topology, place(self.local_world_size)
        rows = gather_over_group([digest63(node_name().encode()), len(self.manifest),
                                  digest63(self.manifest.fingerprint.encode())])
        mine = rows[t.rank][1:]
        differ = [r for r, row in enumerate(rows) if row[1:] != mine]
        if differ:
            raise ConfigError(
                f"the ranks do not agree on the data set {self.source.uri}: rank {t.rank} lists {mine[0]} samples, "
                f"ranks {differ} list {sorted({rows[r][1] for r in differ})} (or other files): the source changed "
                "while the job started. Run `clairvoyant index SRC` once before the job, then start it again")
        if self.local_world_size is None and local_from_env(os.environ, t.rank, t.world_size) is None:
            t = NodeLayout.from_names([row[0] for row in rows], rank=t.rank, origin=t.origin)
        self.agreed = True
        if t == old:
            self.topology = t   # (the same layout; where it came from may differ)
            return
        log.info("clairvoyant: rank %d of %d (node of %d ranks) from torch.distributed (it had rank %d of %d, "
                 "node of %d, from %s)", t.rank, t.world_size, t.local_world_size, old.rank, old.world_size,
                 old.local_world_size, old.origin)
        self.rebind(t)

    def rebind(self, t: NodeLayout, cluster: "Cluster | None" = None) -> None:
        """The one path by which this process's place in the job changes after the Loader was
        made (the ranks compared over the process group, or a cluster formed at the first pass):
        an epoch planned for the old layout carries nothing over, and the tiers' direct reads and
        the node's deadline gate follow the new one."""
        if cluster is not None:
            self.cluster = cluster
        self.topology = t
        self.drop_carry()
        self.tiers.direct = self.direct(self.tiers.local_capacity)
        self.open_progress()

    def residents(self) -> dict[int, int]:
        """Samples in the local tier now (the session's inventory the first time, so that all ranks of
        the node start from the same picture), as manifest index -> entry bytes."""
        entries = self.tiers.inventory if not self.inventory_used else self.tiers.local.entries()
        self.inventory_used = True
        if self.tiers.local.codec is not None:   # entries stored compressed: any length up to the raw one,
            return residents(self.manifest, entries, self.entry_sizes, self.raw_entry_sizes)   # as planned
        return residents(self.manifest, entries, self.entry_sizes)

    def plan(self, epoch: int, position: int) -> RankEpochPlan:
        """This rank's plan of the current epoch from global ``position`` on (plan/rank_plan.py),
        starting from what the last epoch's plan left in the local tier if that epoch ran to its
        end, else from what the tier holds now."""
        c = self.cluster
        last = self.carry
        carried = last is not None and last[0].epoch == epoch - 1 and position == 0 and last[1].completed
        spec = None
        if c is not None:   # every node's residents: carried over where every rank can, else exchanged
            carried = c.all_true(carried)   # (collective calls, taken alike by every rank)
            held = last[0].cluster_residents if carried else c.residents(self.residents())
            spec = ClusterTiers(c.layout, c.capacities, tuple(held), last[0].cluster_home if carried else None)
        residents = last[0].residents_after if carried else ({} if c is not None else self.residents())
        reader = self.range_reader() if spec is None else None
        # the native threads read each sample with a cheap request (the file kept open), as many at
        # once as the store takes: a request costs no more than its bytes, and the samples come
        # in the order they are needed (plan/ranges.py)
        per_sample = native.applies(self.source, self.tiers, self.progress is not None)
        return plan_rank_epoch(self.entry_sizes, self.config, self.topology, epoch=epoch,
                               capacity=self.tiers.local_capacity, residents=residents, position=position,
                               cluster=spec, ranges=None if reader is None else reader.ranges,
                               request_bytes=0 if per_sample else DEFAULT_REQUEST_BYTES)

    def range_reader(self) -> RangeReader | None:
        """A source that packs samples together, read a range at a time where the plan says it pays
        (plan/ranges.py): only where the local tier holds the data set (the plan checks) and no
        cluster cache serves samples from peers. Worked out once."""
        if self._ranges is None:
            self._ranges = False
            if self.cluster is None and self.tiers.local_capacity >= int(self.entry_sizes.sum()):
                found = self.source.sample_ranges(self.manifest.keys)
                if found is not None:
                    self._ranges = RangeReader(Ranges(of=found[0], nbytes=found[1]), self.source.read_range)
        return self._ranges or None

    def serve(self, index: int) -> bytes | None:
        """A peer asks for sample ``index``: its bytes if this node's local tier holds a sound entry;
        where the tier compresses, the entry as it lies (compressed or not, with its trailer): the
        peer checks and inflates it (``_peer_fetch``), and the wire carries the compressed bytes."""
        key, size = self.manifest.keys[index], int(self.manifest.sizes[index])
        loc = self.tiers.find_local(key, size)
        if loc is None:
            return None
        try:
            # compressing: the entry as it lies (the peer checks and inflates it)
            data = read_sample(loc, size) if self.tiers.local.codec is None else read_entry(loc)
        except (FileNotFoundError, CorruptEntry):
            return None
        carry = self.carry
        if carry is not None:
            carry[1].peer_served(index)
        return data

    def peer_fetch(self, node: int, index: int, size: int) -> bytes | None:
        """Sample ``index`` (``size`` bytes) from node ``node``'s tier, or None. Where the tiers
        compress, the peer sends its entry (``_serve``): checked and inflated here; a damaged one
        is a miss (the store serves it)."""
        if self.tiers.local.codec is None:
            data = self.cluster.fetch(node, index, size)
            return data if data is not None and len(data) == size else None
        blob = self.cluster.fetch(node, index, entry_size(size))
        if blob is None:
            return None
        try:
            return unseal(blob, size, f"node {node}'s entry of sample {index}")
        except CorruptEntry:
            self.tiers.counters.add("peer_corrupt")
            return None


def close_tiers(tiers: Tiers) -> None:
    tiers.close()
    tiers.local.close()
    tiers.ram.close()
