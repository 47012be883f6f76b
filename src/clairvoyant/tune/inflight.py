"""POLICY, pure: how many requests to the store staging keeps in flight, from what it measured.

Staging is latency-bound: a request holds a store slot for its latency, so the rate is about
requests in flight / latency (Little's law) until the store saturates (its bandwidth, or its own
limit on requests in service). The right number comes from the store, not from the cores: on
2 cores and on 16 the staging threads mostly wait. So the limit is set by feedback on what the
engines themselves measured over an interval (``Load``: requests finished, the seconds they took,
the most requests seen waiting for admission, their bytes):

- **grow** while there is a backlog (requests wait for admission: the readers' lookahead wants
  more than staging delivers) and the limit is used (mean requests in flight, ``busy / interval``,
  at least 3/4 of it): x1.5, at least +4;
- **the knee**: after a growth, if the rate rose by less than a quarter of the added share
  (+50% requests, less than +12.5% rate) and each request took longer roughly in proportion to
  the added ones (queueing in the store, not the store slowing down: that makes each request
  far slower at once), the store is saturated: back to the smaller limit where the gain was
  nothing (< +5%), else hold the larger; that ceiling holds ``PROBE_AFTER`` intervals, then the
  growth may probe again, so a store that speeds up or slows down later is followed;
- **shrink** where nothing waits and the limit idles (mean in flight < 0.3 of it): to twice what
  Little's law says the observed rate needs, never below ``lo``, at most a fifth at a time;
- **within memory**: each request in flight buffers its bytes, so the limit never exceeds
  ``memory`` / mean bytes per request (a shard's range of 8 MiB is not a 29 kB JPEG).

Every decision keeps its reason (``why``), shown in ``stats()["staging"]`` and the verdict. One
policy for every door: the Loader's staging threads and native engine and the mount's copies
apply the same limit (each measures itself: ``load``; and applies it: ``limit``). In the Loader
the native threads and the Python threads each take it: where the native threads carry the
misses, the Python threads carry the planned hits and what the native threads gave back, so the
store sees about the limit, not twice it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

LO, HI = 8, 256
START = 48                 # requests in flight before anything is measured
MEMORY = 256 << 20         # bytes the requests in flight may buffer at once


class Counts(NamedTuple):
    """What an engine has carried out so far (cumulative) and what waits now: every engine's
    ``load()`` answers this, and ``tick`` takes it."""

    done: int          # requests finished
    busy_s: float      # the seconds they took, in all
    waiting: int       # requests waiting for admission now
    nbytes: int = 0    # the bytes they moved (where the engine counts them)


@dataclass(frozen=True)
class Load:
    """What the staging engines carried out over one interval."""

    interval_s: float
    done: int          # requests finished
    busy_s: float      # the seconds they took, in all (busy_s / interval_s: mean requests in flight)
    backlog: int       # requests seen waiting for admission during the interval (the most at once)
    nbytes: int = 0    # the bytes they moved


class InFlight:
    """The limit on requests in flight, one interval at a time (module docstring)."""

    GROW = 1.5
    PROBE_AFTER = 8    # intervals a knee holds

    def __init__(self, start: int = START, *, lo: int = LO, hi: int = HI, memory: int = MEMORY,
                 interval: float = 0.25) -> None:
        self.lo, self.hi, self.memory, self.interval = min(lo, hi), hi, memory, interval
        self.limit = max(self.lo, min(hi, int(start)))
        self.why = f"starting at {self.limit}: nothing measured yet"
        self.ceiling: int | None = None
        self._ttl = 0
        self._grew: tuple[int, float, float] | None = None   # (limit, rate, latency) before the last growth
        self._base: tuple[float, int, float, int] | None = None   # the last tick's cumulative counters
        self._backlog = 0   # the most requests seen waiting at a tick since the last observation
        self.rate = self.latency = self.mean_inflight = 0.0
        self.history: list[tuple[float, int]] = []   # (requests/s, limit) per interval

    def rebase(self) -> None:
        """New engines (their counters from 0): the next tick starts a new interval, and what the
        last one was measuring (a growth to judge, the backlog seen) is dropped."""
        self._base, self._backlog, self._grew = None, 0, None

    def follow(self, now: float, counts: Counts) -> int | None:
        """``tick`` on an engine's ``load()``."""
        return self.tick(now, counts.done, counts.busy_s, counts.waiting, counts.nbytes)

    def tick(self, now: float, done: int, busy_s: float, backlog: int, nbytes: int = 0) -> int | None:
        """Given cumulative counters and the backlog now, observe the interval since the last tick
        once it is long enough (its backlog: the most seen at any tick of it, since requests come
        in bursts: a batch at a time); the new limit, or None if it is not time yet."""
        self._backlog = max(self._backlog, int(backlog))
        if self._base is None:
            self._base = (now, done, busy_s, nbytes)
            return None
        t0, d0, b0, n0 = self._base
        if now - t0 < self.interval:
            return None
        self._base = (now, done, busy_s, nbytes)
        seen, self._backlog = self._backlog, 0
        return self.observe(Load(now - t0, done - d0, busy_s - b0, seen, nbytes - n0))

    def observe(self, load: Load) -> int:
        if load.interval_s <= 0:
            return self.limit
        limit = self.limit
        rate = load.done / load.interval_s
        latency = load.busy_s / load.done if load.done else self.latency
        inflight = load.busy_s / load.interval_s
        self.rate, self.latency, self.mean_inflight = rate, latency, inflight
        self.history.append((rate, limit))
        cap = self.hi
        if load.done and load.nbytes:
            per = load.nbytes / load.done
            cap = max(self.lo, min(self.hi, int(self.memory // max(1.0, per))))
        saturated = load.backlog > 0 and inflight >= 0.75 * limit
        grew, self._grew = self._grew, None
        if self.ceiling is not None:
            self._ttl -= 1
            if self._ttl <= 0:
                self.ceiling = None
        new, why = limit, (f"holding {limit}: {inflight:.1f} in flight on average, {rate:,.0f}/s at "
                           f"{latency * 1e3:.1f} ms, {load.backlog} waiting")
        if grew is not None and saturated:
            l0, r0, lat0 = grew
            added = limit / l0 - 1
            queueing = lat0 > 0 and latency <= 1.5 * lat0 * (limit / l0)
            if rate < r0 * (1 + 0.25 * added) and queueing:   # the knee: more in flight fetched (almost) nothing more
                new = l0 if rate < 1.05 * r0 else limit
                self.ceiling, self._ttl = new, self.PROBE_AFTER
                return self._set(new, f"the store's knee at {new}: {limit} in flight gave {rate:,.0f}/s, {l0} gave "
                                      f"{r0:,.0f}/s")
        if saturated and limit < min(cap, self.ceiling or cap):
            new = min(cap, self.ceiling or cap, max(limit + 4, math.ceil(limit * self.GROW)))
            self._grew = (limit, rate, latency)
            why = (f"growing to {new}: {load.backlog} requests waiting, {inflight:.1f} of {limit} in flight on "
                   f"average, {rate:,.0f}/s at {latency * 1e3:.1f} ms")
        elif limit > cap:
            new, why = cap, f"{cap} in flight: their bytes within {self.memory >> 20} MiB"
        elif load.backlog == 0 and inflight < 0.3 * limit:
            new = max(self.lo, math.ceil(2 * inflight), math.floor(limit * 0.8))
            if new < limit:
                why = (f"shrinking to {new}: nothing waits, {inflight:.1f} in flight on average "
                       f"({rate:,.0f}/s at {latency * 1e3:.1f} ms)")
        return self._set(new, why)

    def _set(self, n: int, why: str) -> int:
        self.limit, self.why = int(n), why
        return self.limit

    def describe(self) -> dict:
        """The choice and its reason, for ``stats()`` (JSON)."""
        return {"inflight": self.limit, "why": self.why, "rate_per_s": round(self.rate, 1),
                "latency_ms": round(self.latency * 1e3, 2), "mean_inflight": round(self.mean_inflight, 1),
                "knee": self.ceiling}
