"""POLICY, pure: how many staging threads, from what the loader measured a moment ago.

Staging is latency-bound: a thread holds one request to the source at a time,
so the fetch rate is about threads / latency until the source saturates.
Decoding is CPU-bound and gets one reader process per core. So the tuner
moves one number, the staging threads, by feedback on what the verdict's wait
split measures:

- the loop waited on the **source fetch** (more than ``wait_share`` of the
  interval): the misses are not fetched in time; if the threads were busy,
  add threads (x1.5, at least +2): more requests in flight;
- no fetch waits and the threads mostly idle (busy < ``idle`` of them): remove
  a fifth of them, down to four times what Little's law says the observed
  fetch rate needs (misses come in bursts: a batch's worth at once) and never
  below 8; fewer threads cost less CPU and fewer GIL hand-offs;
- else keep.

The Tuner adds one memory: when more threads did not fetch more (less than
+10%) and each fetch took longer in proportion to the added threads (within
0.8-1.5x: requests queue instead of overlapping), the source is saturated
(bandwidth, or its own limit on requests in flight): it goes back to the
smaller count and does not exceed it for 10 intervals (5 s), then probes
again, so a source that speeds up or slows down later is followed. A fetch
time that jumps far beyond the added threads' share is the source slowing
down, not saturation: the growth goes on (the benchmark's latency step fell to
a third for 10 s before this distinction).

When the source's latency quadruples, fetch waits appear within one interval
and the thread count grows geometrically, so it reaches the new need in a few
intervals. Tested on recorded traces (tests/tune/test_autotune.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_THREADS, MAX_THREADS = 8, 256


@dataclass(frozen=True)
class Observation:
    interval_s: float        # wall time observed
    fetch_wait_s: float      # of which the loop waited on the source fetch
    fetches: int             # source reads completed in the interval
    fetch_busy_s: float      # sum of their durations (thread-seconds spent fetching)


def decide(obs: Observation, threads: int, *, wait_share: float = 0.02, idle: float = 0.3, margin: float = 4.0,
           lo: int = MIN_THREADS, hi: int = MAX_THREADS) -> int:
    """The staging thread count for the next interval."""
    if obs.interval_s <= 0:
        return threads
    busy = obs.fetch_busy_s / obs.interval_s          # mean requests in flight (Little's law)
    if obs.fetch_wait_s / obs.interval_s > wait_share and busy >= 0.5 * threads:
        return min(hi, max(threads + 2, math.ceil(threads * 1.5)))
    if obs.fetch_wait_s == 0 and busy < idle * threads:
        return max(lo, math.ceil(busy * margin), math.floor(threads * 0.8))
    return threads


class Tuner:
    """``decide`` plus the saturation memory; the caller measures and applies."""

    PROBE_AFTER = 10   # intervals a saturation ceiling holds

    def __init__(self, threads: int, interval: float = 0.5) -> None:
        self.threads, self.interval = threads, interval
        self._base: tuple[float, float, int, float] | None = None   # the last tick's cumulative counters
        self._prev: tuple[int, float, float] | None = None   # (threads, fetches/s, s per fetch) before
        self.ceiling: int | None = None
        self._ttl = 0
        self.history: list[tuple[float, int]] = []   # (fetches/s, threads) per interval

    def tick(self, now: float, fetch_wait_s: float, fetches: int, fetch_busy_s: float) -> int | None:
        """Given cumulative counters, observe the interval since the last tick once it is long enough;
        the new thread count, or None if it is not time yet."""
        if self._base is None:
            self._base = (now, fetch_wait_s, fetches, fetch_busy_s)
            return None
        t0, w0, f0, b0 = self._base
        if now - t0 < self.interval:
            return None
        self._base = (now, fetch_wait_s, fetches, fetch_busy_s)
        return self.observe(Observation(now - t0, fetch_wait_s - w0, fetches - f0, fetch_busy_s - b0))

    def observe(self, obs: Observation) -> int:
        rate = obs.fetches / obs.interval_s if obs.interval_s > 0 else 0.0
        latency = obs.fetch_busy_s / obs.fetches if obs.fetches else 0.0
        self.history.append((rate, self.threads))
        prev, self._prev = self._prev, (self.threads, rate, latency)
        waiting = obs.interval_s > 0 and obs.fetch_wait_s / obs.interval_s > 0.02
        grew = prev is not None and self.threads > prev[0]
        queueing = grew and prev[2] > 0 and 0.8 <= (latency / prev[2]) / (self.threads / prev[0]) <= 1.5
        if grew and waiting and rate < 1.1 * prev[1] and queueing:
            new = prev[0]            # more threads did not fetch more: saturated
            self.ceiling, self._ttl = prev[0], self.PROBE_AFTER
        else:
            new = decide(obs, self.threads)
            if self.ceiling is not None:
                new = min(new, self.ceiling)
                self._ttl -= 1
                if self._ttl <= 0:
                    self.ceiling = None
        self.threads = new
        return new


class ReaderTuner:
    """The number of reader (decode) processes, one step per epoch (the pool is made per epoch).

    Starts at one per core plus one (the extra reader fills the time the others
    wait on their pipes and local reads: on the benchmark's three profiles it is
    within 4% of the best fixed count, where one per core is up to 7% short).
    After an epoch in which loading did not keep up and
    the readers held the loop back (read, decode, collate and the queue for a
    free reader make most of the waiting), it tries one more reader, up to two
    per core: a reader waits on its pipe and its local reads between decodes,
    and a second one per core can fill that time. If the added reader did not
    raise the epoch's throughput by 2%, it goes back and stays there. The first
    epoch is not judged: its misses and cold caches make it unlike the others.
    """

    def __init__(self, cores: int, start: int | None = None) -> None:
        self.readers, self.hi = (cores + 1 if start is None else start), 2 * cores
        self.rates: dict[int, float] = {}
        self.ceiling: int | None = None
        self.history: list[tuple[int, float]] = []

    def epoch_done(self, rate: float, reader_share: float, keeps_up: bool) -> int:
        n = self.readers
        self.history.append((n, rate))
        self.rates[n] = rate
        if n - 1 in self.rates and rate < 1.02 * self.rates[n - 1] and (self.ceiling is None or n > self.ceiling):
            self.readers = self.ceiling = n - 1     # the added reader did not help
        elif not keeps_up and reader_share > 0.5 and n < self.hi and (self.ceiling is None or n < self.ceiling):
            self.readers = n + 1
        return self.readers
