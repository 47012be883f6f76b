"""The limit on requests in flight (tune/inflight.py): grown while requests wait and more in flight
fetch more, held at the store's knee, shrunk when idle, bounded by memory; each with its control.
The store is modelled as the emulated one is: ``slots`` requests in service at once, each holding
its slot ``latency`` seconds, the rest queueing."""

from __future__ import annotations

import pytest

from clairvoyant.tune.inflight import InFlight, Load


def store(limit: int, *, slots: int = 64, latency: float = 0.042, interval: float = 0.25,
          backlog: int = 500, size: int = 30_000) -> Load:
    """One interval of a store with ``slots`` slots, ``limit`` requests kept in flight (a backlog
    waiting beyond them): Little's law on the slots, queueing beyond."""
    rate = min(limit, slots) / latency
    took = latency * max(1.0, limit / slots)   # a request waits for a slot where there are more than slots
    done = int(rate * interval)
    return Load(interval, done, done * took, backlog, done * size)


def run(t: InFlight, intervals: int, **kw) -> list[int]:
    return [t.observe(store(t.limit, **kw)) for _ in range(intervals)]


def test_grows_to_the_stores_knee_and_holds_there():
    t = InFlight(16)
    limits = run(t, 12)
    assert limits[:3] == [24, 36, 54]                   # x1.5 while every added request fetches more
    assert 64 <= t.limit <= 96, limits                  # at the store's 64 slots, not far past them
    assert "knee" in t.describe()["why"] or t.ceiling is not None
    # held there for PROBE_AFTER intervals, then probes again, and comes back
    later = run(t, 3 * InFlight.PROBE_AFTER)
    assert max(later) <= 96 * 1.5 and min(later[-InFlight.PROBE_AFTER:]) >= 64


def test_a_store_with_more_slots_is_followed_further():
    """Control: the same trace against a store of 256 slots grows past 64."""
    t = InFlight(16)
    run(t, 12, slots=256)
    assert t.limit >= 180


def test_no_growth_without_a_backlog():
    """Nothing waits for admission (staging keeps up with the readers): more in flight would fetch
    nothing more. Control: the same interval with a backlog grows."""
    t = InFlight(16)
    assert t.observe(Load(0.25, 95, 95 * 0.042, backlog=0)) == 16 and "holding" in t.why
    assert InFlight(16).observe(Load(0.25, 95, 95 * 0.042, backlog=40)) == 24


def test_shrinks_when_idle_never_below_the_floor():
    t = InFlight(64)
    assert t.observe(Load(0.25, 50, 50 * 0.042, backlog=0)) == 51     # 8 in flight of 64: a fifth fewer
    assert "shrinking" in t.why
    for _ in range(20):
        t.observe(Load(0.25, 0, 0.0, backlog=0))
    assert t.limit == t.lo
    busy = InFlight(64)   # control: busy enough (half of it in flight): kept
    assert busy.observe(Load(0.25, 380, 380 * 0.042, backlog=0)) == 64


def test_a_store_that_slows_down_is_no_knee():
    """Latency quadruples just as requests were added: each takes far longer than the added share
    explains, so it is the store slowing down, and the growth goes on. Control: the same rates with
    the latency in proportion to the added requests is the knee."""
    t = InFlight(16)
    t.observe(Load(0.25, 95, 95 * 0.042, 500))          # 16 at 42 ms: grows to 24
    assert t.limit == 24
    assert t.observe(Load(0.25, 36, 36 * 0.168, 500)) == 36
    k = InFlight(16)
    k.observe(Load(0.25, 95, 95 * 0.042, 500))
    assert k.observe(Load(0.25, 97, 97 * 0.063, 500)) == 16   # +2% for +50% requests, each 1.5x longer
    assert "knee" in k.why and k.ceiling == 16


def test_requests_in_flight_stay_within_memory():
    t = InFlight(48, memory=64 << 20)
    # 8 MiB per request (a shard's range): 64 MiB hold 8 of them
    assert t.observe(Load(0.25, 10, 10 * 0.2, 50, 10 * (8 << 20))) == 8 and "MiB" in t.why
    small = InFlight(48, memory=64 << 20)   # control: 30 kB requests fit many times over
    assert small.observe(Load(0.25, 285, 285 * 0.042, 500, 285 * 30_000)) == 72


def test_tick_observes_whole_intervals_of_cumulative_counters():
    t = InFlight(16, interval=0.25)
    assert t.tick(0.0, 0, 0.0, 100) is None
    assert t.tick(0.1, 40, 1.6, 100) is None             # not a whole interval yet
    assert t.tick(0.3, 120, 4.8, 100) == 24              # 16 in flight on average, 100 waiting
    assert t.describe()["inflight"] == 24 and t.describe()["rate_per_s"] == pytest.approx(400)


def test_new_engines_start_a_new_interval():
    """A Loader's policy outlives its epochs' engines, whose counters start from 0 again: after
    ``rebase`` the next interval is measured from the new counters. Control: without it the
    interval's rate comes out negative."""
    t = InFlight(16, interval=0.25)
    t.tick(0.0, 0, 0.0, 10)
    t.tick(0.3, 120, 4.8, 10)
    t.rebase()
    assert t.tick(0.4, 5, 0.2, 0) is None          # the new engines' first counters: a new base
    t.tick(0.7, 100, 4.0, 0)
    assert t.rate > 0
    u = InFlight(16, interval=0.25)
    u.tick(0.0, 0, 0.0, 10)
    u.tick(0.3, 120, 4.8, 10)
    u.tick(0.6, 5, 0.2, 0)                          # no rebase: counters went backwards
    assert u.rate < 0
