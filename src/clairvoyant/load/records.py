"""What one run (load/pipeline.py) records of the batches it hands out, for those that judge them
afterwards: the epoch's per-batch waits, loop steps, samples and waiting by cause, for its verdict
(``EpochWindow``, tune/verdict.py); and each batch served, its samples' keys, where their bytes
came from and their checksums, for the loss-spike guard (``ServedBatch``, load/guard.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class EpochWindow:
    """One epoch's per-batch waits and loop steps, samples, and waiting by cause."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.steps: list[float] = []
        self.samples = 0
        self.causes: dict[str, float] = {}

    def add(self, wait: float, step: float | None, n: int, causes: dict[str, float] | None) -> None:
        self.waits.append(wait)
        if step is not None:
            self.steps.append(step)
        self.samples += n
        for c, v in (causes or {}).items():
            self.causes[c] = self.causes.get(c, 0.0) + v


class ServedSample(NamedTuple):
    key: str
    where: str       # local, ram or source: where the reader got the bytes it decoded
    digest: int      # xxh3-64 of those bytes
    mtime_ns: int    # the source file's modification time when it was fetched (RAM window)


class ServedBatch(NamedTuple):
    """The batch the loop got last, as the guard checks it (load/guard.py)."""
    epoch: int
    batch: int
    samples: list[ServedSample]
    spec: Any
    leaves: list[int]
    output: Any
