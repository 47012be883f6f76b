"""How long the training loop waits for each batch, and how long its own step takes.

The loader records, for every batch, the time spent inside ``next()`` (the
wait) and the time between the previous ``next()`` returning and this one
being called (the loop's step: the GPU's work, seen from the loader). These
are the inputs of the loading verdict: a loop is fed when its waits stay
small against its steps. A bounded window keeps the most recent batches.
"""

from __future__ import annotations

import collections
import threading

import numpy as np

WINDOW = 4096


class Timings:
    def __init__(self, window: int = WINDOW) -> None:
        self._waits: collections.deque[float] = collections.deque(maxlen=window)
        self._steps: collections.deque[float] = collections.deque(maxlen=window)
        self._samples: collections.deque[int] = collections.deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, wait: float, step: float | None, samples: int) -> None:
        """One batch: ``step`` is None for the first batch of an iteration (no previous step)."""
        with self._lock:
            self._waits.append(wait)
            self._samples.append(samples)
            if step is not None:
                self._steps.append(step)

    def summary(self) -> dict:
        """p50/p99 of the wait, p50 of the step (seconds), and samples/s over the window."""
        with self._lock:
            waits, steps, samples = np.array(self._waits), np.array(self._steps), sum(self._samples)
        out = {"wait_p50_s": None, "wait_p99_s": None, "step_p50_s": None, "samples_per_s": None}
        if len(waits):
            out["wait_p50_s"] = float(np.percentile(waits, 50))
            out["wait_p99_s"] = float(np.percentile(waits, 99))
            elapsed = float(waits.sum() + steps.sum())
            out["samples_per_s"] = samples / elapsed if elapsed > 0 else None
        if len(steps):
            out["step_p50_s"] = float(np.percentile(steps, 50))
        return out
