"""MODEL, pure: how long a node's resources take to serve what one step asks of them.

The simulator (sim/engine.py) asks, for every step and node, how many samples
and bytes come from each place (sim/policies.py decides that with the loader's
own plan functions); this module turns those counts into seconds. Nothing here
decides *what* is read, only what it costs:

- **the shared store** (``StoreModel``): an aggregate throughput curve against
  the number of concurrent readers, as NoPFS writes it (t(1), t(2), ... t(k)),
  or as ``clairvoyant probe --json`` measures it, plus a per-request latency.
  ``n`` requests of ``X`` bytes in all, with ``k`` readers, take
  ``max(X / t(k), n x latency / k, latency)``: the bandwidth or the latency
  binds (readers keep their requests back to back across steps, so the
  latency is counted as a flow, with one latency as the floor);
- **the node's local tier** (SSD) and **RAM**: a bandwidth each;
- **the interconnect**: a latency per message and a bandwidth per node and
  direction (a node receiving ``r`` and sending ``s`` bytes is busy
  ``max(r, s) / bandwidth``, plus one round trip per request over its threads);
- **the node's cores**: decoding (samples per second per core) and writing the
  entries the tier keeps (entries per second per core), over the node's cores;
- **the step**: seconds of compute per batch.

All rates are bytes (or samples) per second; all numbers are per node unless
named otherwise.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..plan.layout import NodeLayout

MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class StoreModel:
    """The shared store: aggregate bytes/s against concurrent readers, and a latency per request.

    ``curve``: (readers, bytes/s) points, ascending in readers. Between points the rate is
    interpolated linearly; below the first it scales with the readers (one reader gets
    ``t(r0) / r0``); beyond the last it stays flat (the store is saturated). ``max_inflight``
    caps the readers the store serves at once (None: no cap)."""

    curve: tuple[tuple[int, float], ...]
    latency: float = 0.0
    max_inflight: int | None = None
    name: str = "store"

    def __post_init__(self) -> None:
        pts = tuple(sorted((int(r), float(b)) for r, b in self.curve))
        if not pts or any(r < 1 or b <= 0 for r, b in pts) or len({r for r, _ in pts}) != len(pts):
            raise ConfigError(f"the store's curve needs distinct readers >= 1 and rates > 0, got {self.curve!r}")
        if self.latency < 0 or (self.max_inflight is not None and self.max_inflight < 1):
            raise ConfigError(f"store latency must be >= 0 and max_inflight >= 1, got {self.latency}, "
                              f"{self.max_inflight}")
        object.__setattr__(self, "curve", pts)

    def effective_readers(self, readers: int | np.ndarray) -> np.ndarray:
        k = np.maximum(np.asarray(readers, dtype=np.float64), 1.0)
        return np.minimum(k, self.max_inflight) if self.max_inflight is not None else k

    def bandwidth(self, readers: int | np.ndarray) -> np.ndarray:
        """Aggregate bytes/s with ``readers`` concurrent readers."""
        k = self.effective_readers(readers)
        rs = np.array([r for r, _ in self.curve], dtype=np.float64)
        bs = np.array([b for _, b in self.curve], dtype=np.float64)
        out = np.interp(k, rs, bs)               # flat beyond the last point
        low = k < rs[0]
        return np.where(low, bs[0] * k / rs[0], out)

    def service_time(self, requests: np.ndarray, nbytes: np.ndarray, readers: np.ndarray) -> np.ndarray:
        """Seconds to serve ``requests`` reads of ``nbytes`` in all with ``readers`` concurrent
        readers (arrays broadcast); 0 where nothing is asked."""
        n = np.asarray(requests, dtype=np.float64)
        x = np.asarray(nbytes, dtype=np.float64)
        k = np.minimum(self.effective_readers(readers), np.maximum(n, 1.0))
        t = np.maximum(np.maximum(x / self.bandwidth(k), n * self.latency / k), self.latency)
        return np.where(n > 0, t, 0.0)

    # -- where a curve comes from ---------------------------------------------------------------

    @classmethod
    def from_points(cls, points: Mapping[int, float] | Sequence[tuple[int, float]], *, latency: float = 0.0,
                    max_inflight: int | None = None, name: str = "store") -> StoreModel:
        items = points.items() if isinstance(points, Mapping) else points
        return cls(tuple((int(r), float(b)) for r, b in items), latency, max_inflight, name)

    @classmethod
    def from_probe(cls, probe: Mapping[str, Any] | str, *, name: str | None = None) -> StoreModel:
        """From ``clairvoyant probe --json``'s output (a dict, or the path of a file holding it):
        the measured curve (bytes/s per number of readers) and the median metadata latency."""
        if isinstance(probe, str):
            with open(probe) as f:
                probe = json.load(f)
        try:
            curve = tuple((int(p["readers"]), float(p["bytes_per_s"])) for p in probe["curve"])
            latency = float(probe.get("latency_s", probe["stat_s"]["p50"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"not the JSON of `clairvoyant probe --json`: {e!r} (it needs 'curve' with readers "
                              "and bytes_per_s, and 'latency_s')") from None
        return cls(curve, latency, None, name or str(probe.get("uri", "probed store")))

    @classmethod
    def emulated(cls, *, open_latency: float = 0.010, read_latency: float = 0.002, bandwidth: float = 400e6,
                 max_inflight: int = 64, sample_bytes: float) -> StoreModel:
        """``clairvoyant.testing.EmulatedStore``'s behaviour: each request holds one of
        ``max_inflight`` slots for its latency, then its bytes pass through one shared pipe. With
        ``k`` readers of ``sample_bytes`` each the store gives ``min(bandwidth, k x size /
        (latency + size / bandwidth))``."""
        lat = open_latency + read_latency
        one = sample_bytes / (lat + sample_bytes / bandwidth)
        pts = {}
        for k in sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, max_inflight}):
            if k <= max_inflight:
                pts[k] = min(bandwidth, k * one)
        return cls.from_points(pts, latency=lat, max_inflight=max_inflight, name="emulated store")

    def to_dict(self) -> dict:
        return {"name": self.name, "curve": [list(p) for p in self.curve], "latency": self.latency,
                "max_inflight": self.max_inflight}


# NoPFS (SC'21), section 6.1: the simulated parallel file system's aggregate throughput t(k) for
# k concurrent readers, MB/s, at its two ends as issue 10 quotes them: t(1) = 330 and t(8) = 2,870.
# Between them the rate is interpolated linearly; beyond 8 readers it stays flat (a curve known up
# to 8 clients says nothing more, and a saturated store is the pessimistic reading).
NOPFS_PFS_MBS = {1: 330.0, 8: 2_870.0}


def nopfs_store() -> StoreModel:
    return StoreModel.from_points({k: v * MB for k, v in NOPFS_PFS_MBS.items()}, name="NoPFS PFS (t(1)..t(8))")


@dataclass(frozen=True)
class Hardware:
    """What a node has and what it costs to use it. Capacities in bytes per node.

    ``local_capacity``: the node's cache tier (the runtime's local tier: SSD); ``window``: the
    staging window (the runtime's RAM tier: misses wait there for their batch; it is not a cache);
    ``ssd_bandwidth``: reads from the local tier; ``link_*``: the interconnect; ``decode_rate``:
    samples/s per core, over ``cores`` per node (0: decoding costs nothing); ``write_rate``: cache
    entries a core writes per second (checksum, file create, rename; 0: only the SSD's bandwidth
    is charged for them); ``stage_threads``:
    store readers per node (the stager); ``loader_workers``: readers per GPU of a plain
    DataLoader (the store-only policy); ``lookahead``: the most batches staging runs ahead."""

    store: StoreModel = field(default_factory=nopfs_store)
    local_capacity: int = 900 * 10**9
    window: int = 5 * 10**9
    ssd_bandwidth: float = 2_000 * MB
    ram_bandwidth: float = 20_000 * MB
    link_bandwidth: float = 12_500 * MB
    link_latency: float = 2e-6
    decode_rate: float = 0.0
    write_rate: float = 0.0
    cores: float = 16
    stage_threads: int = 16
    loader_workers: int = 4
    lookahead: int = 64
    jobs: int = 1

    def __post_init__(self) -> None:
        for name in ("local_capacity", "window"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 bytes, got {getattr(self, name)}")
        for name in ("ssd_bandwidth", "ram_bandwidth", "link_bandwidth"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 bytes/s, got {getattr(self, name)}")
        if self.link_latency < 0 or self.decode_rate < 0 or self.write_rate < 0:
            raise ConfigError("link_latency, decode_rate and write_rate must be >= 0")
        if self.cores <= 0:
            raise ConfigError(f"cores must be > 0 (a share of a core is allowed), got {self.cores}")
        for name in ("stage_threads", "loader_workers", "lookahead", "jobs"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def with_(self, **changes: Any) -> Hardware:
        return replace(self, **changes)

    # -- seconds per step, vectorised over nodes ------------------------------------------------

    def local_time(self, nbytes: np.ndarray, written: np.ndarray | int = 0) -> np.ndarray:
        """The local tier's device: entries read and written share its bandwidth."""
        return (np.asarray(nbytes, dtype=np.float64) + np.asarray(written, dtype=np.float64)) / self.ssd_bandwidth

    def link_time(self, recv_n: np.ndarray, recv_bytes: np.ndarray, sent_bytes: np.ndarray) -> np.ndarray:
        """A node's interconnect: the larger direction over the bandwidth, plus one round trip per
        request, ``stage_threads`` requests in flight."""
        rn = np.asarray(recv_n, dtype=np.float64)
        busy = np.maximum(np.asarray(recv_bytes, np.float64), np.asarray(sent_bytes, np.float64)) / self.link_bandwidth
        return busy + np.ceil(rn / self.stage_threads) * 2 * self.link_latency

    def decode_time(self, samples: np.ndarray, writes: np.ndarray | int = 0) -> np.ndarray:
        """The node's cores: decoding every sample, and writing the entries the tier keeps."""
        t = np.zeros(np.shape(samples))
        if self.decode_rate > 0:
            t = t + np.asarray(samples, dtype=np.float64) / (self.decode_rate * self.cores)
        if self.write_rate > 0:
            t = t + np.asarray(writes, dtype=np.float64) / (self.write_rate * self.cores)
        return t

    def to_dict(self) -> dict:
        d = asdict(self)
        d["store"] = self.store.to_dict()
        return d


@dataclass(frozen=True)
class Job:
    """The training job: ``nodes`` x ``gpus`` ranks (one per GPU, in node blocks), a batch of
    ``batch_size`` per rank every ``step_time`` seconds, ``epochs`` epochs of the order of ``seed``."""

    nodes: int
    gpus: int
    batch_size: int
    step_time: float
    epochs: int = 3
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    lost_at: int | None = None   # the last node lost at the start of this epoch: the job restarted on the others

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus", "batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.step_time < 0:
            raise ConfigError(f"step_time must be >= 0 seconds, got {self.step_time}")
        if self.lost_at is not None and not (self.nodes > 1 and 0 < self.lost_at < self.epochs):
            raise ConfigError(f"a node lost at epoch {self.lost_at}: give an epoch from 1 to {self.epochs - 1} of a "
                              f"job of several nodes ({self.nodes} here)")

    def at(self, epoch: int) -> "Job":
        """The job that runs ``epoch``: this one, or after ``lost_at`` the same on one node fewer
        (restarted elastically on the survivors, ranks renumbered in node blocks)."""
        if self.lost_at is None or epoch < self.lost_at:
            return self
        return replace(self, nodes=self.nodes - 1, lost_at=None)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus

    @property
    def layout(self) -> NodeLayout:
        """The job's ranks in node blocks of ``gpus``."""
        return NodeLayout.blocks(self.world_size, self.gpus)

    def steps(self, num_samples: int) -> int:
        per_rank = math.ceil(num_samples / self.world_size)
        return per_rank // self.batch_size if self.drop_last else math.ceil(per_rank / self.batch_size)

    def to_dict(self) -> dict:
        return asdict(self)


def dataset_sizes(samples: int, mean_bytes: float, *, sigma: float = 0.0, seed: int = 0,
                  overhead: int = 0) -> np.ndarray:
    """Bytes per sample: ``samples`` of ``mean_bytes`` each (``sigma`` 0), or log-normal around
    that mean with shape ``sigma`` (ImageNet's JPEGs: about 0.5), each plus ``overhead`` (the
    cache entry's trailer: 32 bytes in the runtime)."""
    if samples < 1 or mean_bytes <= 0:
        raise ConfigError(f"give samples >= 1 and a sample size > 0, got {samples}, {mean_bytes}")
    if sigma <= 0:
        return np.full(int(samples), int(round(mean_bytes)) + overhead, dtype=np.int64)
    rng = np.random.default_rng(seed)
    mu = math.log(mean_bytes) - sigma**2 / 2
    z = rng.lognormal(mu, sigma, int(samples))
    return np.maximum(1, np.rint(z)).astype(np.int64) + overhead
