"""The cluster simulator (``clairvoyant simulate``): the loader's own plan functions over N nodes x G
GPUs, with models of the shared store, local tiers, interconnect and decoding.

- ``sim/model.py``: what each resource costs (store curve vs readers, SSD, link, decode, step);
- ``sim/policies.py``: where each access is served, per policy, by the plan functions of ``plan/``;
- ``sim/engine.py``: the bulk-synchronous per-step timing, epoch by epoch;
- ``sim/report.py``: the table, the JSON, the sweeps and their plots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .engine import EpochResult, RunResult, run_policy
from .model import Hardware, Job, StoreModel, dataset_sizes, nopfs_store
from .policies import POLICIES, EpochTraffic, make_policy

__all__ = ["Hardware", "Job", "StoreModel", "dataset_sizes", "nopfs_store", "POLICIES", "EpochTraffic",
           "EpochResult", "RunResult", "Simulation", "simulate"]


@dataclass
class Simulation:
    """Every policy asked for, on one job, hardware and data set."""

    job: Job
    hardware: Hardware
    num_samples: int
    dataset_bytes: int
    runs: list[RunResult]

    def run(self, policy: str) -> RunResult:
        for r in self.runs:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    def to_dict(self) -> dict:
        return {"job": self.job.to_dict(), "hardware": self.hardware.to_dict(), "samples": self.num_samples,
                "dataset_bytes": self.dataset_bytes, "policies": [r.summary() for r in self.runs]}


def simulate(job: Job, sizes: np.ndarray, hardware: Hardware, policies: Sequence[str] = POLICIES, *,
             overhead: int = 32, check: bool = True) -> Simulation:
    """Simulate ``job`` over a data set of ``sizes`` (bytes per sample) on ``hardware``, once per policy.
    ``overhead``: bytes a tier adds per entry (the runtime's 32-byte trailer)."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    runs = [run_policy(make_policy(p, job, sizes, hardware, overhead=overhead).epochs(), hardware, job,
                       dataset_bytes=total, num_samples=len(sizes), check=check) for p in policies]
    return Simulation(job, hardware, len(sizes), total, runs)
