"""The loading budget: what storage must deliver so that the GPUs never wait for data.

A batch of n samples must be ready within the step time t, so every GPU needs
throughput >= n / t samples per second and a p99 batch latency <= t. Read IOPS
are samples/s (one read per sample, unpacked) and bandwidth is mean sample
size x samples/s. With a node-local cache holding a fraction f of the data set
and eviction by farthest next use, the hit rate per epoch after the first is f
(the offline optimum under a fresh permutation each epoch, and what the loader
measures: docs/benchmarks.md), so the shared storage is left with (1 - f) of
the reads. The loader's RAM tier is the staging window of the samples about to
be read, not a cache, so only the local capacity counts. Pure arithmetic, no I/O.
"""

from __future__ import annotations

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
    hit_rate: float | None = None           # per epoch after the first
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
    fraction = hit = shared_iops = shared_bw = None
    if dataset_bytes is not None:
        if dataset_bytes <= 0:
            raise ConfigError("the data set size must be > 0")
        fraction = min(1.0, local_capacity / dataset_bytes)
        hit = fraction
        shared_iops, shared_bw = iops * (1 - hit), bw * (1 - hit)
    return Budget(batch_size, step_time, sample_bytes, gpus_per_node, nodes, experiments, per_gpu, total,
                  step_time, iops, bw, fraction, hit, shared_iops, shared_bw)


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
            lines.append(f"with a {budget.hit_rate:.0%} cache the miss stream needs {miss:,.0f}/s: {tail}")
    return Advice(keeps, need, got_files_per_s, readers, miss, tuple(lines))
