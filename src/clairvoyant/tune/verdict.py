"""POLICY, pure: does loading keep the GPU fed, and if not, which stage holds it back?

Each batch's wait in ``next()`` is split into its causes from the batch's own
timeline: until its last sample was staged, the wait was the **source fetch**,
or, for the share of its staging time spent asking other nodes' tiers (the
cluster cache), the **peer fetch**;
from then until a reader took the batch, the **queue** (no free reader); after
that, the reader's time, shared out in proportion to what it spent on the
batch: **local read**, **decode**, **collate**.

The verdict over a window of batches (an epoch): loading keeps up when the
loader's throughput is at least what the loop consumes (n / t, t the loop's
own step between batches) and the p99 wait is at most t. If not, the
bottleneck is the cause with the largest share of the waiting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

CAUSES = ("fetch", "peer", "queue", "read", "decode", "collate")
NAMES = {"fetch": "source fetch", "peer": "peer fetch", "queue": "queue (no free reader)", "read": "local read",
         "decode": "decode", "collate": "collate"}


def split_wait(t0: float, t1: float, staged_at: float | None, dispatched_at: float | None,
               worker: tuple[float, float, float] | None, peer_share: float = 0.0) -> dict[str, float]:
    """The wait from ``t0`` to ``t1`` for one batch, by cause (seconds; they add up to ``t1 - t0``);
    ``peer_share``: the part of the batch's staging time spent on peer nodes."""
    out = dict.fromkeys(CAUSES, 0.0)
    if t1 <= t0:
        return out
    staged = t1 if staged_at is None else min(max(staged_at, t0), t1)
    dispatched = t1 if dispatched_at is None else min(max(dispatched_at, staged), t1)
    peer_share = min(max(peer_share, 0.0), 1.0)
    out["peer"] = (staged - t0) * peer_share
    out["fetch"] = (staged - t0) - out["peer"]
    out["queue"] = dispatched - staged
    rest = t1 - dispatched
    if rest > 0:
        parts = np.asarray(worker if worker is not None else (0.0, 1.0, 0.0), dtype=float)
        total = parts.sum()
        shares = parts / total if total > 0 else np.array([0.0, 1.0, 0.0])
        for name, share in zip(("read", "decode", "collate"), shares):
            out[name] = float(rest * share)
    return out


@dataclass(frozen=True)
class Verdict:
    keeps_up: bool
    samples_per_s: float          # what the loader delivered over the window
    needed_per_s: float           # what the loop would consume if it never waited: n / t
    wait_p99_s: float
    step_p50_s: float             # the loop's own step (GPU work), t
    bottleneck: str | None        # a key of CAUSES when loading does not keep up
    shares: dict                  # cause -> share of all waiting in the window

    def line(self, epoch: int | None = None) -> str:
        head = f"epoch {epoch}: " if epoch is not None else ""
        nums = (f"{self.samples_per_s:,.0f} samples/s {'>=' if self.samples_per_s >= self.needed_per_s else '<'} "
                f"{self.needed_per_s:,.0f} the loop consumes; p99 wait {self.wait_p99_s * 1e3:.1f} ms "
                f"{'<=' if self.wait_p99_s <= self.step_p50_s else '>'} step {self.step_p50_s * 1e3:.1f} ms")
        if self.keeps_up:
            return f"{head}loading keeps up: yes ({nums})"
        share = self.shares.get(self.bottleneck, 0.0)
        return (f"{head}loading keeps up: NO ({nums}); bottleneck: {NAMES[self.bottleneck]} "
                f"({share:.0%} of the waiting)")

    def to_dict(self) -> dict:
        return asdict(self)


def judge(waits, steps, samples: int, causes: dict[str, float]) -> Verdict | None:
    """The verdict over a window: per-batch ``waits`` and loop ``steps`` (seconds), the samples
    delivered, and the waiting by cause. None without a step to compare with."""
    waits = np.asarray(waits, dtype=float)
    steps = np.asarray(steps, dtype=float)
    if len(waits) == 0 or len(steps) == 0:
        return None
    elapsed = float(waits.sum() + steps.sum())
    rate = samples / elapsed if elapsed > 0 else 0.0
    step = float(np.percentile(steps, 50))
    per_batch = samples / len(waits)
    needed = per_batch / step if step > 0 else float("inf")
    p99 = float(np.percentile(waits, 99))
    keeps = p99 <= step and rate >= 0.95 * needed   # 5%: the loop's own jitter is not loading's fault
    total = sum(causes.values())
    shares = {c: (causes.get(c, 0.0) / total if total > 0 else 0.0) for c in CAUSES}
    bottleneck = None if keeps else max(CAUSES, key=lambda c: shares[c])
    return Verdict(keeps, rate, needed, p99, step, bottleneck, shares)
