"""What the loader writes for dashboards (JSON lines) and the per-stage rates of ``stats()``."""

from __future__ import annotations

import json
import threading


class MetricsLog:
    """Appends one JSON object per line to ``path``: batch records and epoch records."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f = open(path, "a", buffering=1 << 16)
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            if not self._f.closed:
                self._f.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def stage_rates(tiers: dict, reader: dict) -> dict:
    """Rate of each stage for one thread or process doing only that (per second), from the counters:
    source fetch per staging thread, and local read, decode and collate per reader process."""
    def rate(n: float, s: float) -> float | None:
        return n / s if s > 0 else None
    return {"source_fetch_per_thread": rate(tiers.get("fetches", 0), tiers.get("fetch_seconds", 0.0)),
            "local_read_per_reader": rate(reader["samples"], reader["read_s"]),
            "decode_per_reader": rate(reader["samples"], reader["decode_s"]),
            "collate_batches_per_reader": rate(reader["batches"], reader["collate_s"])}
