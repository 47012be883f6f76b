"""``clairvoyant report RUN.jsonl``: a PNG of what a run's metrics log recorded.

Three panels: the wait of every batch, stacked by cause (source fetch, queue,
local read, decode, collate); throughput over the run (samples/s over a moving
window of batches, against what the loop would consume if it never waited); and
per epoch where samples were read from (local tier, RAM window, source).
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import ConfigError
from .verdict import CAUSES, NAMES


def load(path: str) -> tuple[list[dict], list[dict]]:
    if not os.path.exists(path):
        raise ConfigError(f"{path!r} does not exist: pass the file given to Loader(metrics=...)")
    batches, epochs = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n} is not a JSON line ({e.msg}): is this a clairvoyant metrics log?") from e
            (batches if rec.get("type") == "batch" else epochs if rec.get("type") == "epoch" else []).append(rec)
    if not batches:
        raise ConfigError(f"{path} holds no batch records: was the loader given metrics={path!r}?")
    return batches, epochs


def draw(path: str, out: str, window: int = 50) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches, epochs = load(path)
    x = np.arange(len(batches))
    fig, axes = plt.subplots(3, 1, figsize=(10, 10))
    bottom = np.zeros(len(batches))
    for c in CAUSES:
        v = np.array([(b.get("causes") or {}).get(c, 0.0) for b in batches]) * 1e3
        if v.any():
            axes[0].bar(x, v, bottom=bottom, width=1.0, label=NAMES[c])
            bottom += v
    rest = np.array([b["wait"] for b in batches]) * 1e3 - bottom
    axes[0].bar(x, np.clip(rest, 0, None), bottom=bottom, width=1.0, color="lightgrey",
                label="handing the batch over (ready before next())")
    axes[0].set(xlabel="batch (over the whole run)", ylabel="wait in next() (ms)", title="wait per batch, by cause")
    axes[0].legend(fontsize=7)
    waits = np.array([b["wait"] for b in batches])
    loops = np.array([b["loop"] if b["loop"] is not None else 0.0 for b in batches])
    samples = np.array([b["samples"] for b in batches])
    k = max(1, min(window, len(batches)))
    kern = np.ones(k)
    got = np.convolve(samples, kern, "valid") / np.maximum(np.convolve(waits + loops, kern, "valid"), 1e-9)
    need = np.convolve(samples, kern, "valid") / np.maximum(np.convolve(loops, kern, "valid"), 1e-9)
    axes[1].plot(np.arange(len(got)) + k - 1, got, label="delivered")
    axes[1].plot(np.arange(len(need)) + k - 1, need, ":", label="the loop would consume (no waits)")
    axes[1].set(xlabel="batch", ylabel="samples/s", title=f"throughput (moving window of {k} batches)")
    axes[1].legend(fontsize=7)
    if epochs:
        e = [r["epoch"] for r in epochs]
        parts = {"local tier": [r["reads"].get("from_local", 0) for r in epochs],
                 "RAM window": [r["reads"].get("from_ram", 0) for r in epochs],
                 "source (not cached)": [r["reads"].get("from_source", 0) for r in epochs]}
        base = np.zeros(len(e))
        for name, v in parts.items():
            axes[2].bar(e, v, bottom=base, label=name)
            base += np.array(v)
        fetched = [r["reads"].get("source_files", 0) for r in epochs]
        axes[2].plot(e, fetched, "ko-", label="read from the source")
        for r in epochs:
            axes[2].annotate("fed" if r["verdict"]["keeps_up"] else f"starved: {NAMES[r['verdict']['bottleneck']]}",
                             (r["epoch"], 0), fontsize=7, rotation=90, va="bottom")
        axes[2].set(xlabel="epoch", ylabel="samples", title="where samples were read from, per epoch")
        axes[2].set_xticks(e)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
