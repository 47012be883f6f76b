"""What the loader counts, shared by the staging threads and the consumer: its scalar counters
are the ``stage.*`` namespace of the one counter set (tune/counters.py); beside them, what is
counted by epoch, by cause, by reader and the samples skipped, changed and read only through
these methods, under this object's own lock."""

from __future__ import annotations

import threading

from .counters import Counters
from .timings import Timings


class Stats:
    """The loader's counters: ``stage.*`` by short name (``stats.source_files``), and by epoch."""

    def __init__(self) -> None:
        self.counters = Counters(["stage"]).space("stage")
        self._lock = threading.Lock()
        self.skipped: list = []             # keys skipped with on_error="skip"
        self.epochs: dict = {}              # epoch -> source_files, source_bytes, from_local, from_ram, ...
        self.wait_by_cause: dict = {}       # seconds the loop waited, by cause (tune/verdict.py)
        self.reader: dict = {"samples": 0, "read_s": 0.0, "decode_s": 0.0, "collate_s": 0.0, "batches": 0}
        self.timings = Timings()

    def __getattr__(self, name: str) -> float:
        if name.startswith("_") or name in ("counters",):
            raise AttributeError(name)
        return getattr(self.counters, name)

    def add(self, **deltas: float) -> None:
        self.counters.add_many(**deltas)

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

    def add_worker(self, times: tuple[float, ...], samples: int) -> None:
        """A reader's batch: its (local read, decode, collate[, source read]) seconds; the source
        reads count as reading (``read_s``), as they always have."""
        with self._lock:
            r = self.reader
            r["samples"] += samples
            r["batches"] += 1
            r["read_s"] += times[0] + sum(times[3:])
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
        if peer >= 0:
            return
        if from_source:
            self.counters.add_many(source_files=1, source_bytes=size, staged_files=int(tier != "source"))
        else:
            self.counters.add("local_hits")

    def snapshot(self) -> dict:
        d = self.counters.snapshot()
        with self._lock:
            d["skipped"] = list(self.skipped)
            d["epochs"] = {e: {k: dict(v) if isinstance(v, dict) else v for k, v in c.items()}
                           for e, c in self.epochs.items()}
            d["wait_by_cause"] = dict(self.wait_by_cause)
            d["reader"] = dict(self.reader)
        d.update(self.timings.summary())
        return d
