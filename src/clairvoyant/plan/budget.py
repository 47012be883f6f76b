"""The loading budget: what storage must deliver so that the GPUs never wait for data.

A batch of n samples must be ready within the step time t, so every GPU needs
throughput >= n / t samples per second and a p99 batch latency <= t. Read IOPS
are samples/s (one read per sample, unpacked) and bandwidth is mean sample
size x samples/s. With a node-local cache holding a fraction f of the data set
and eviction by farthest next use, the hit rate per epoch is bounded twice:
by f (the offline optimum under a fresh permutation each epoch, and what the
loader measures on one node: docs/benchmarks.md), and by what the node has
read so far, since a node's tier holds only samples that node read. On N nodes
a node reads a random 1/N of each epoch, so after k epochs it has seen
1 - (1 - 1/N)^k of the data set; and what its tier can carry from one epoch to
the next is bounded by f (``steady_hit_rate``). Epoch k's hit rate is the
lesser of the two: 1/N (or less, for a small f) in the second epoch, the
steady rate only after many epochs when N is large (the simulator found the
budget's old "f from the second epoch on" wrong by 60x at 64 nodes). The shared storage is left with the
misses of the second epoch, the worst after the first. The loader's RAM tier
is the staging window of the samples about to be read, not a cache, so only
the local capacity counts. Pure arithmetic, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Budget:
    batch_size: int
    step_time: float             # seconds per batch on one GPU
    sample_bytes: float          # mean sample size
    gpus_per_node: int
    nodes: int
    experiments: int
    samples_per_s_per_gpu: float
    samples_per_s: float         # all GPUs of all nodes of all experiments
    latency_budget_s: float      # p99 of one batch's wait must stay below this
    iops: float
    bytes_per_s: float
    cache_fraction: float | None = None     # of the data set held per node (the local tier)
    hit_rate: float | None = None           # in the second epoch (the lowest after the first)
    hit_rate_limit: float | None = None     # what later epochs approach (steady_hit_rate)
    epochs_to_limit: int | None = None      # epochs until within 1% of the limit
    shared_iops: float | None = None        # what is left on the shared storage
    shared_bytes_per_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def loading_budget(*, batch_size: int, step_time: float, sample_bytes: float, gpus_per_node: int = 1,
                   nodes: int = 1, experiments: int = 1, dataset_bytes: float | None = None,
                   local_capacity: float = 0, ram_capacity: float = 0) -> Budget:
    """The budget for ``experiments`` jobs of ``nodes`` x ``gpus_per_node`` GPUs each."""
    for name, value in (("batch_size", batch_size), ("gpus_per_node", gpus_per_node), ("nodes", nodes),
                        ("experiments", experiments)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if step_time <= 0 or sample_bytes <= 0:
        raise ConfigError("step_time and sample_size must be > 0")
    per_gpu = batch_size / step_time
    total = per_gpu * gpus_per_node * nodes * experiments
    iops, bw = total, total * sample_bytes
    fraction = hit = limit = epochs = shared_iops = shared_bw = None
    if dataset_bytes is not None:
        if dataset_bytes <= 0:
            raise ConfigError("the data set size must be > 0")
        fraction = min(1.0, local_capacity / dataset_bytes)
        hit, limit = epoch_hit_rate(fraction, nodes, 1), steady_hit_rate(fraction, nodes)
        epochs = epochs_to_reach(fraction, nodes)
        shared_iops, shared_bw = iops * (1 - hit), bw * (1 - hit)
    return Budget(batch_size, step_time, sample_bytes, gpus_per_node, nodes, experiments, per_gpu, total,
                  step_time, iops, bw, fraction, hit, limit, epochs, shared_iops, shared_bw)


def epoch_hit_rate(fraction: float, nodes: int, epoch: int) -> float:
    """The per-node tier's hit rate in ``epoch`` (0: the first, nothing cached), for farthest next
    use with the next epoch in view: what the node has seen of the data set by then, or what the
    tier can carry, whichever is less (``steady_hit_rate``)."""
    if epoch <= 0:
        return 0.0
    return min(1.0 - (1.0 - 1.0 / nodes) ** epoch, steady_hit_rate(fraction, nodes))


def steady_hit_rate(fraction: float, nodes: int) -> float:
    """What the tier carries from epoch to epoch on ``nodes`` nodes, as a share of a node's reads.

    A node reads 1/N of an epoch. Of what it reads, 1/N^2 of the data set is read by it again in
    the next epoch: the planner keeps that (up to the capacity f), and each such sample is a hit.
    Room left over (f - 1/N^2) holds samples it read before, each read by it in a later epoch with
    chance 1/N. Hits over reads: N min(f, 1/N^2) + max(0, f - 1/N^2), at most 1; on one node, f.
    Checked against the planner itself on 1-32 nodes (tests/plan/test_budget.py)."""
    q = 1.0 / nodes ** 2
    return min(1.0, nodes * min(fraction, q) + max(0.0, fraction - q))


def epochs_to_reach(fraction: float, nodes: int) -> int:
    """Epochs until the hit rate is within 1% (of a node's reads) of the steady rate."""
    target = max(0.0, steady_hit_rate(fraction, nodes) - 0.01)
    if target <= 0 or nodes == 1:
        return 1
    return max(1, math.ceil(math.log(1.0 - target) / math.log(1.0 - 1.0 / nodes)))


@dataclass(frozen=True)
class Advice:
    keeps_up: bool               # the source alone delivers what the node's GPUs need
    need_per_node: float         # samples/s the node's GPUs consume
    got: float                   # files/s the source gave this node (best number of readers)
    readers: int
    miss_need: float | None      # files/s still asked of the source with the cache, per node
    lines: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def advise(budget: Budget, got_files_per_s: float, readers: int) -> Advice:
    """Hold what the source gave one node (``clairvoyant probe``) against the node's budget."""
    need = budget.samples_per_s_per_gpu * budget.gpus_per_node
    keeps = got_files_per_s >= need
    head = (f"the source gives {got_files_per_s:,.0f} files/s at {readers} reader{'s' if readers > 1 else ''}; "
            f"the {budget.gpus_per_node} GPU(s) of a node need {need:,.0f}/s")
    lines = [head + (f": it keeps up ({got_files_per_s / need:.1f}x)" if keeps else ": stage to node-local storage")]
    miss = None
    if budget.hit_rate is not None:
        miss = need * (1 - budget.hit_rate)
        if miss == 0:
            lines.append("the whole data set fits in the local tier: after the first epoch the source is not read")
        else:
            tail = ("the source keeps up with that" if got_files_per_s >= miss else
                    f"still more than it gives: expect about {got_files_per_s / (1 - budget.hit_rate):,.0f} "
                    "samples/s per node, bound by the source")
            lines.append(f"with {budget.hit_rate:.0%} of a node's reads served by its local tier (the second "
                         f"epoch), the misses need {miss:,.0f}/s: {tail}")
    return Advice(keeps, need, got_files_per_s, readers, miss, tuple(lines))
