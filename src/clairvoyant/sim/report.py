"""What the simulator says, for people and scripts: the table, the JSON, the sweeps and their plots.

Two sweeps, as NoPFS draws them: the job's nodes (1 .. 1,024) at a fixed data
set, and the data set's size against a node's and the cluster's capacity,
which splits into regimes: the data set fits in every node's tier (each node
can hold all of it), only in the cluster's tiers together (the cluster cache's
regime), or not even there (the store is read again every epoch whatever the
policy). NoPFS also counts a regime where the data set fits in RAM; the
runtime's RAM tier is the staging window, not a cache, so for these policies
it behaves as the node tier's regime.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from ..units import format_bytes
from . import Simulation, simulate
from .engine import run_policy
from .model import Hardware, Job
from .policies import make_policy

LABELS = {"store-only": "shared store only", "staging": "staging window only", "node": "per-node tiers",
          "cluster": "cluster cache", "no-io": "no I/O (bound)"}


def format_table(sim: Simulation) -> str:
    j, hw = sim.job, sim.hardware
    head = (f"{j.nodes} node(s) x {j.gpus} GPU(s), batch {j.batch_size}, step {j.step_time:g} s, {j.epochs} epoch(s); "
            f"{sim.num_samples:,} samples, {format_bytes(sim.dataset_bytes)} "
            f"(mean {format_bytes(sim.dataset_bytes / max(sim.num_samples, 1))}); tier {format_bytes(hw.local_capacity)} "
            f"per node ({hw.local_capacity * j.nodes / max(sim.dataset_bytes, 1):.2f}x the data set in all), "
            f"window {format_bytes(hw.window)}; store {hw.store.name}"
            + (f"; node {j.nodes - 1} lost at epoch {j.lost_at}, the job restarted on the other {j.nodes - 1}"
               if j.lost_at is not None else ""))
    rows = [("policy", "epoch s", "stall", "p99 wait", "store / epoch", "store / job", "peers / epoch", "bound by")]
    for r in sim.runs:
        s = r.summary()
        rows.append((LABELS.get(r.policy, r.policy), " ".join(f"{x:.3g}" for x in s["epoch_seconds"]),
                     f"{s['stall_share']:.1%}", f"{s['p99_wait'] * 1e3:.0f} ms",
                     " ".join(f"{x:.3f}" for x in s["store_per_epoch"]), f"{s['store_per_job']:.2f}x",
                     " ".join(f"{x:.3f}" for x in s["peer_per_epoch"]), "/".join(_runs(s["epoch_bound_by"]))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, ""]
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("store and peers as a share of the data set; stall: the GPUs' wait over the job's time; "
                 "bound by: the busiest resource per epoch")
    return "\n".join(lines)


def _runs(xs: Sequence[str]) -> list[str]:
    """Consecutive repeats merged: [a, a, b] -> [a, b]."""
    out: list[str] = []
    for x in xs:
        if not out or out[-1] != x:
            out.append(x)
    return out


def sweep_nodes(job: Job, sizes: np.ndarray, hw: Hardware, nodes: Sequence[int], policies: Sequence[str], *,
                overhead: int = 32, progress: Callable[[str], None] | None = None) -> list[dict]:
    """The same data set and per-node hardware on ``nodes`` nodes each."""
    out = []
    for n in nodes:
        if progress:
            progress(f"{n} node(s)")
        sim = simulate(replace(job, nodes=int(n)), sizes, hw, policies, overhead=overhead)
        out.append({"nodes": int(n), **sim.to_dict()})
    return out


def sweep_dataset(job: Job, sizes: np.ndarray, hw: Hardware, ratios: Sequence[float], policies: Sequence[str], *,
                  overhead: int = 32, progress: Callable[[str], None] | None = None) -> list[dict]:
    """The data set against capacity: each node's tier set to data set / ``ratio`` (ratio 1: the
    data set just fits a node; ratio = nodes: it just fits the cluster)."""
    total = int(np.asarray(sizes, np.int64).sum()) + overhead * len(sizes)
    out = []
    for x in ratios:
        if progress:
            progress(f"data set = {x:g} x a node's tier")
        sim = simulate(job, sizes, hw.with_(local_capacity=int(total / float(x))), policies, overhead=overhead)
        out.append({"ratio": float(x), "regime": regime(float(x), job.nodes), **sim.to_dict()})
    return out


def sweep_step_times(job: Job, sizes: np.ndarray, hw: Hardware, step_times: Sequence[float],
                     policies: Sequence[str], *, overhead: int = 32,
                     progress: Callable[[str], None] | None = None) -> list[dict]:
    """The same job at each step time (how fast the GPUs consume): the traffic of each policy is
    planned once and timed at every step time (step time 0: the loading alone)."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    traffic = {}
    for p in policies:
        if progress:
            progress(f"planning {p}")
        traffic[p] = list(make_policy(p, job, sizes, hw, overhead=overhead).epochs())
        for t in traffic[p]:
            t.check()
    out = []
    for st in step_times:
        j = replace(job, step_time=float(st))
        runs = [run_policy(traffic[p], hw, j, dataset_bytes=total, num_samples=len(sizes), check=False)
                for p in policies]
        out.append({"step_time": float(st), **Simulation(j, hw, len(sizes), total, runs).to_dict()})
    return out


def regime(ratio: float, nodes: int) -> str:
    """Where a data set of ``ratio`` x one node's tier fits."""
    if ratio <= 1:
        return "fits every node"
    if ratio <= nodes:
        return "fits the cluster"
    return "exceeds the cluster"


def _policy(entry: dict, name: str) -> dict | None:
    for p in entry["policies"]:
        if p["policy"] == name:
            return p
    return None


def plot_sweeps(path: str, nodes: list[dict] | None = None, dataset: list[dict] | None = None,
                title: str = "") -> str:
    """Draw the sweeps (either or both) into one PNG: per sweep, the job's time against the no-I/O
    bound and the store's bytes per job (share of the data set). matplotlib (the ``plot`` extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in (("nodes", nodes), ("dataset", dataset)) if p[1]]
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.6 * len(panels)), squeeze=False)
    styles = {"store-only": ("s--", "tab:gray"), "staging": ("d--", "tab:brown"), "node": ("o-", "tab:green"),
              "cluster": ("^-", "tab:blue"), "no-io": (":", "black")}
    for row, (kind, entries) in zip(axes, panels):
        xs = [e["nodes"] if kind == "nodes" else e["ratio"] for e in entries]
        names = [p["policy"] for p in entries[0]["policies"]]
        for name in names:
            fmt, color = styles.get(name, ("x-", None))
            got = [_policy(e, name) for e in entries]
            row[0].plot(xs, [g["seconds"] for g in got], fmt, color=color, label=LABELS.get(name, name))
            if name != "no-io":
                row[1].plot(xs, [g["store_per_job"] for g in got], fmt, color=color, label=LABELS.get(name, name))
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        row[0].set_yscale("log")
        row[0].set_ylabel("job time, s (simulated)")
        row[1].set_ylabel("shared-store bytes per job / data set")
        if kind == "nodes":
            for ax in row:
                ax.set_xlabel("nodes")
        else:
            n = entries[0]["job"]["nodes"]
            for ax in row:
                ax.set_xlabel(f"data set / one node's tier ({n} nodes)")
                ax.axvline(1, color="k", lw=0.8, alpha=0.5)
                ax.axvline(n, color="k", lw=0.8, alpha=0.5)
            top = row[1].get_ylim()[1]
            for x, label in ((min(xs), "fits every node"), (2 ** ((np.log2(max(n, 2))) / 2), "fits the cluster"),
                             (max(xs), "exceeds the cluster")):
                row[1].text(x, top * 0.95, label, fontsize=7, ha="center", va="top")
        row[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_sweep(entries: list[dict], key: str) -> str:
    """One line per sweep point: per policy, the job's seconds, stall share and store bytes per job."""
    lines = []
    for e in entries:
        x = f"{key} {e[key]:g}" + (f" ({e['regime']})" if "regime" in e else "")
        parts = [f"{p['policy']}: {p['seconds']:.3g} s, stall {p['stall_share']:.0%}, store {p['store_per_job']:.2f}x"
                 for p in e["policies"]]
        lines.append(f"{x}: " + "; ".join(parts))
    return "\n".join(lines)
