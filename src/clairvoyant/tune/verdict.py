"""POLICY, pure: does loading keep the GPU fed, and if not, which stage holds it back?

Each batch's wait in ``next()`` is split into its causes from the batch's own
timeline. Staging is to blame for as much of the wait as its lateness explains:
a batch staged at ``s`` that its reader spent ``r`` seconds on was ready at
``t0`` only had it been staged by ``t0 - r``, so ``s - (t0 - r)`` of the wait is
the **source fetch** (or, for the share of its staging time spent asking other
nodes' tiers, the **peer fetch**), even where the loop began waiting after ``s``:
in a pipeline a reader that started late because its batch came late is no
decode bottleneck (a cold epoch with big batches waited on staging while every
wait fell inside a reader's decode). What remains is split over the batch's
timeline inside the wait: until a reader took the batch, the **queue** (no free
reader); after that, the reader's time, shared out in proportion to what it
spent on the batch: **local read**, **decode**, **collate**; the time a reader
spent reading samples from the source itself (those no tier had room for) is the
source fetch too.

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
               worker: tuple[float, ...] | None, peer_share: float = 0.0) -> dict[str, float]:
    """The wait from ``t0`` to ``t1`` for one batch, by cause (seconds; they add up to ``t1 - t0``);
    ``worker``: the reader's (local read, decode, collate[, source read]) seconds on the batch;
    ``peer_share``: the part of the batch's staging time spent on peer nodes."""
    out = dict.fromkeys(CAUSES, 0.0)
    if t1 <= t0:
        return out
    wait = t1 - t0
    staged = t1 if staged_at is None else min(max(staged_at, t0), t1)
    dispatched = t1 if dispatched_at is None else min(max(dispatched_at, staged), t1)   # (no reader yet)
    # the reader's own time on the batch (from its dispatch, where it did not say)
    reader = float(sum(worker)) if worker is not None else \
        (0.0 if dispatched_at is None else max(0.0, t1 - dispatched_at))
    # staging's lateness: staged after t0 - reader, the batch could not be ready at t0
    late = wait if staged_at is None else min(wait, max(0.0, staged_at - (t0 - reader)))
    peer_share = min(max(peer_share, 0.0), 1.0)
    out["peer"] = late * peer_share
    out["fetch"] = late - out["peer"]
    rest = wait - late   # the queue's part inside the wait, then the reader's
    out["queue"] = min(rest, dispatched - staged)
    busy = rest - out["queue"]
    if busy > 0:
        parts = np.zeros(4)
        if worker is not None:
            parts[:len(worker)] = worker[:4]
        total = parts.sum()
        shares = parts / total if total > 0 else np.array([0.0, 1.0, 0.0, 0.0])
        for name, share in zip(("read", "decode", "collate", "fetch"), shares):
            out[name] += float(busy * share)
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
