"""POLICY, pure: is this step's loss a spike?

The TACC slides (seed 003) report that silent data corruption and memory errors
during training show up as a loss spike in the next iteration. A spike is
judged against the recent past with a robust score, so that one spike does not
hide the next and a noisy loss does not cry wolf:

    score = (loss - median) / max(1.4826 * MAD, rel_floor * |median|, 1e-12)

over the last ``window`` losses that were not spikes themselves (1.4826 * MAD
estimates the standard deviation of normal noise). A loss is a spike when its
score exceeds ``threshold`` (default 6: about one false alarm in 10^9 steps of
normal noise) once ``warmup`` losses have been seen, or at once when it is not
finite (NaN or inf). ``rel_floor`` (default 2%) keeps a loss that has settled
to a near-constant value from calling a 0.1% wobble a spike.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpikeRule:
    window: int = 50
    threshold: float = 6.0
    warmup: int = 20
    rel_floor: float = 0.02


class SpikeDetector:
    def __init__(self, rule: SpikeRule = SpikeRule()) -> None:
        if rule.window < 3 or rule.warmup < 3 or rule.warmup > rule.window or not rule.threshold > 0:
            raise ValueError(f"spike rule {rule}: needs window >= warmup >= 3 and threshold > 0")
        self.rule = rule
        self._recent: collections.deque[float] = collections.deque(maxlen=rule.window)
        self.last_score: float = 0.0

    def update(self, loss: float) -> bool:
        """Take one step's loss; True if it is a spike (it is then left out of the window)."""
        loss = float(loss)
        if not math.isfinite(loss):
            self.last_score = math.inf
            return True
        if len(self._recent) >= self.rule.warmup:
            values = np.fromiter(self._recent, dtype=np.float64)
            med = float(np.median(values))
            scale = max(1.4826 * float(np.median(np.abs(values - med))), self.rule.rel_floor * abs(med), 1e-12)
            self.last_score = (loss - med) / scale
            if self.last_score > self.rule.threshold:
                return True
        else:
            self.last_score = 0.0
        self._recent.append(loss)
        return False
