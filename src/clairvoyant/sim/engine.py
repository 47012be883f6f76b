"""The simulation: bulk-synchronous per step, as NoPFS's simulator is.

Every rank of the job trains in lockstep (a collective at every step), so step
``s`` starts when the previous step is done *and* every node has its batch
ready. Each node's loading is a two-stage pipeline per step:

1. **fetch**: the step's samples from the store, from peers and from the local
   tier, the three at once (separate threads and devices), so the step's fetch
   takes the longest of the three (sim/model.py prices each);
2. **decode**: the node's cores turn the samples into tensors (and write the
   entries the tier keeps: checksum, create, rename).

Each stage serves steps in order, one after the other. Fetching step ``s`` may
start once step ``s - L`` has started training (``L``: the policy's lookahead
in batches; 1 for a plain DataLoader, the RAM window for the stager). The
shared store is one resource for the whole job (and ``jobs`` identical jobs):
its time for a step is that of serving every node's store reads of the step
together, with all the nodes' readers at once.

The result per epoch: its wall time, the time the GPUs waited (stall), each
step's wait (p99), bytes by source, and which resource binds (the one whose
busy time is the largest share of the epoch). The no-I/O policy charges
nothing, so its epoch is the steps' compute alone: the lower bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

import numpy as np

from .model import Hardware, Job
from .policies import EpochTraffic

RESOURCES = ("compute", "store", "peers", "local", "decode")


@dataclass
class EpochResult:
    policy: str
    epoch: int
    seconds: float               # wall time of the epoch
    compute: float               # steps x step time
    stall: float                 # seconds the GPUs waited for data
    p99_wait: float              # of the per-step waits
    max_wait: float
    steps: int
    store_bytes: int
    store_samples: int
    peer_bytes: int              # over the interconnect
    local_bytes: int
    accesses: int
    bound_by: str                # the resource with the largest busy share
    busy: dict = field(default_factory=dict)   # resource -> busy seconds (on the slowest node)

    @property
    def stall_share(self) -> float:
        return self.stall / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stall_share"] = self.stall_share
        return d


def step_times(t: EpochTraffic, hw: Hardware, nodes_reading: int | None = None) -> dict[str, np.ndarray]:
    """Seconds per (step, node) for each resource."""
    if t.policy == "no-io":
        z = np.zeros(t.samples.shape)
        return {"store": z, "peers": z, "local": z, "decode": z}
    jobs = hw.jobs
    n_all = t.store_n.sum(axis=1) * jobs            # the store serves every node (and job) at once
    b_all = t.store_b.sum(axis=1) * jobs
    active = (t.store_n > 0).sum(axis=1) * jobs
    store_step = hw.store.service_time(n_all, b_all, np.maximum(active, 1) * t.readers)
    store = np.where(t.store_n > 0, store_step[:, None], 0.0)
    peers = hw.link_time(t.peer_n, t.peer_b, t.sent_b)
    local = hw.local_time(t.local_b, t.write_b)
    decode = hw.decode_time(t.samples, t.write_n)
    return {"store": store, "peers": peers, "local": local, "decode": decode}


def simulate_epoch_time(t: EpochTraffic, hw: Hardware, job: Job) -> EpochResult:
    """One epoch of one policy, from its traffic (sim/policies.py)."""
    S, N = t.samples.shape
    times = step_times(t, hw)
    fetch = np.maximum(np.maximum(times["store"], times["peers"]), times["local"])
    decode = times["decode"]
    L = max(1, int(t.lookahead))
    step = float(job.step_time)
    start = np.zeros(S)
    waits = np.zeros(S)
    fetch_end = np.zeros(N)
    dec_end = np.zeros(N)
    end_prev = 0.0
    for s in range(S):
        release = start[s - L] if s >= L else 0.0
        fetch_end = np.maximum(fetch_end, release) + fetch[s]
        dec_end = np.maximum(dec_end, fetch_end) + decode[s]
        ready = float(dec_end.max()) if N else 0.0
        start[s] = max(end_prev, ready)
        waits[s] = start[s] - end_prev
        end_prev = start[s] + step
    seconds = end_prev
    busy = {"compute": S * step}
    for k, v in times.items():   # the slowest node's busy time per resource
        busy[k] = float(v.sum(axis=0).max()) if N else 0.0
    bound = max(RESOURCES, key=lambda k: busy[k])
    return EpochResult(policy=t.policy, epoch=t.epoch, seconds=seconds, compute=S * step,
                       stall=float(waits.sum()), p99_wait=float(np.percentile(waits, 99)) if S else 0.0,
                       max_wait=float(waits.max()) if S else 0.0, steps=S,
                       store_bytes=int(t.store_b.sum()), store_samples=int(t.store_n.sum()),
                       peer_bytes=int(t.peer_b.sum()), local_bytes=int(t.local_b.sum()),
                       accesses=int(t.samples.sum()), bound_by=bound, busy=busy)


@dataclass
class RunResult:
    """One policy over the job's epochs."""

    policy: str
    epochs: list[EpochResult]
    dataset_bytes: int
    num_samples: int
    plan_seconds: float = 0.0    # the simulator's own time in the plan functions (not simulated time)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.epochs)

    @property
    def stall(self) -> float:
        return sum(e.stall for e in self.epochs)

    @property
    def stall_share(self) -> float:
        return self.stall / self.seconds if self.seconds > 0 else 0.0

    @property
    def store_bytes(self) -> int:
        return sum(e.store_bytes for e in self.epochs)

    @property
    def peer_bytes(self) -> int:
        return sum(e.peer_bytes for e in self.epochs)

    @property
    def p99_wait(self) -> float:
        return max((e.p99_wait for e in self.epochs), default=0.0)

    @property
    def bound_by(self) -> str:
        """The resource with the largest busy time over the job."""
        tot = {k: sum(e.busy.get(k, 0.0) for e in self.epochs) for k in RESOURCES}
        return max(RESOURCES, key=lambda k: tot[k])

    def summary(self) -> dict:
        d = self.dataset_bytes or 1
        return {"policy": self.policy, "seconds": self.seconds, "epoch_seconds": [e.seconds for e in self.epochs],
                "stall_share": self.stall_share, "epoch_stall_share": [e.stall_share for e in self.epochs],
                "p99_wait": self.p99_wait, "store_bytes": self.store_bytes,
                "store_per_epoch": [e.store_bytes / d for e in self.epochs], "store_per_job": self.store_bytes / d,
                "peer_bytes": self.peer_bytes, "peer_per_epoch": [e.peer_bytes / d for e in self.epochs],
                "bound_by": self.bound_by, "epoch_bound_by": [e.bound_by for e in self.epochs],
                "plan_seconds": self.plan_seconds, "epochs": [e.to_dict() for e in self.epochs]}


def run_policy(traffic: Iterable[EpochTraffic], hw: Hardware, job: Job, *, dataset_bytes: int, num_samples: int,
               check: bool = True) -> RunResult:
    """Every epoch of one policy's traffic through the timing model (conservation checked)."""
    import time

    epochs = []
    plan_s = 0.0
    it: Iterator[EpochTraffic] = iter(traffic)
    name = "?"
    while True:
        t0 = time.perf_counter()
        try:
            t = next(it)
        except StopIteration:
            break
        plan_s += time.perf_counter() - t0
        if check:
            t.check()
        name = t.policy
        epochs.append(simulate_epoch_time(t, hw, job))
    return RunResult(name, epochs, int(dataset_bytes), int(num_samples), plan_s)
