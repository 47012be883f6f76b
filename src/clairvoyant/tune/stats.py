"""Counters the loader keeps, shared by the staging threads and the consumer: changed and read
only through these methods, under this object's own lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from .timings import Timings


@dataclass
class Stats:
    source_files: int = 0        # samples read from the source by this loader
    source_bytes: int = 0
    staged_files: int = 0        # samples this loader published to local_dir
    local_hits: int = 0          # samples already in local_dir (earlier epoch, run or another rank)
    on_demand: int = 0           # samples still missing when the training loop asked for their batch
    waits: int = 0               # next() calls that had to wait for their batch
    wait_seconds: float = 0.0    # total time the training loop waited inside next()
    batches: int = 0
    samples: int = 0
    skipped: list = field(default_factory=list)  # keys skipped with on_error="skip"
    epochs: dict = field(default_factory=dict)   # epoch -> source_files, source_bytes, from_local, from_ram, ...
    wait_by_cause: dict = field(default_factory=dict)   # seconds the loop waited, by cause (tune/verdict.py)
    reader: dict = field(default_factory=lambda: {"samples": 0, "read_s": 0.0, "decode_s": 0.0, "collate_s": 0.0,
                                                  "batches": 0})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    timings: Timings = field(default_factory=Timings, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, d in deltas.items():
                setattr(self, name, getattr(self, name) + d)

    def skip(self, keys) -> None:
        """Samples skipped with ``on_error="skip"``."""
        with self._lock:
            self.skipped.extend(keys)

    def waited(self, cause: str) -> float:
        """Seconds the loop has waited for ``cause`` so far."""
        with self._lock:
            return self.wait_by_cause.get(cause, 0.0)

    def add_causes(self, causes: dict[str, float] | None) -> None:
        if causes:
            with self._lock:
                for c, v in causes.items():
                    self.wait_by_cause[c] = self.wait_by_cause.get(c, 0.0) + v

    def add_worker(self, times: tuple[float, float, float], samples: int) -> None:
        with self._lock:
            r = self.reader
            r["samples"] += samples
            r["batches"] += 1
            r["read_s"] += times[0]
            r["decode_s"] += times[1]
            r["collate_s"] += times[2]

    def count_epoch(self, epoch: int, **deltas: int) -> None:
        """Add to the counters of one epoch."""
        with self._lock:
            d = self.epochs.setdefault(epoch, {})
            for name, n in deltas.items():
                d[name] = d.get(name, 0) + n

    def count_staged(self, epoch: int, tier: str, from_source: bool, size: int, peer: int = -1) -> None:
        """One sample of ``epoch`` is placed in ``tier`` (local, ram, source): read from the source
        for this access (by the staging thread or, where no tier had room, by its reader), from
        node ``peer``'s tier, or found in the local tier. The caller holds no lock of ours."""
        with self._lock:
            d = self.epochs.setdefault(epoch, {})
            d["from_" + tier] = d.get("from_" + tier, 0) + 1
            if peer >= 0:
                d["peer_files"] = d.get("peer_files", 0) + 1
                d["peer_bytes"] = d.get("peer_bytes", 0) + size
                by = d.setdefault("from_node", {})
                by[peer] = by.get(peer, 0) + size
            elif from_source:
                d["source_files"] = d.get("source_files", 0) + 1
                d["source_bytes"] = d.get("source_bytes", 0) + size
                self.source_files += 1
                self.source_bytes += size
                self.staged_files += tier != "source"
            else:
                self.local_hits += 1

    def snapshot(self) -> dict:
        with self._lock:
            d = {f.name: getattr(self, f.name) for f in fields(self)
                 if not f.name.startswith("_") and f.name != "timings"}
            d["skipped"] = list(self.skipped)
            d["epochs"] = {e: {k: dict(v) if isinstance(v, dict) else v for k, v in c.items()}
                           for e, c in self.epochs.items()}
            d["wait_by_cause"] = dict(self.wait_by_cause)
            d["reader"] = dict(self.reader)
        d.update(self.timings.summary())
        return d
