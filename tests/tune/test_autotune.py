"""The tuner's pure decision, on recorded rate traces, and a loader that tunes itself."""

from __future__ import annotations

import time

import numpy as np

from clairvoyant import Loader
from clairvoyant.load.loader import AUTO_START_THREADS
from clairvoyant.testing import EmulatedStore
from clairvoyant.tune.autotune import Observation, Tuner, decide


def obs(wait=0.0, fetches=0, busy=0.0, interval=0.5):
    return Observation(interval_s=interval, fetch_wait_s=wait, fetches=fetches, fetch_busy_s=busy)


def test_more_threads_when_the_loop_waits_on_busy_fetchers():
    assert decide(obs(wait=0.1, fetches=100, busy=7.5), 16) == 24
    assert decide(obs(wait=0.1, fetches=10, busy=1.0), 2) == 4
    assert decide(obs(wait=0.1, fetches=10, busy=2.0), 4) == 6
    assert decide(obs(wait=0.1, fetches=10, busy=3.0), 8) == 12
    # waits but idle fetchers: the threads are not the limit
    assert decide(obs(wait=0.1, fetches=100, busy=1.0), 16) == 16


def test_fewer_threads_when_they_idle_but_not_below_what_the_rate_needs():
    assert decide(obs(fetches=400, busy=2.0), 32) == 25           # a fifth fewer
    assert decide(obs(fetches=400, busy=1.0), 12) == 9            # 2 in flight: 4x that is 8, a fifth fewer is 9
    assert decide(obs(fetches=400, busy=2.0), 12) == 12           # 4 in flight: not idle enough to shrink
    assert decide(obs(fetches=0, busy=0.0), 9) == 8                 # never below the floor
    assert decide(obs(fetches=400, busy=4.5), 16) == 16             # busy enough: keep


def test_saturated_source_stops_the_growth():
    t = Tuner(16)
    # a bandwidth-bound trace: waits persist, but 24 threads fetch no more than 16 did, each fetch
    # taking 1.5x as long (queueing)
    assert t.observe(obs(wait=0.2, fetches=500, busy=8.0)) == 24
    assert t.observe(obs(wait=0.2, fetches=510, busy=12.0)) == 16      # back to what sufficed
    for _ in range(Tuner.PROBE_AFTER - 1):
        assert t.observe(obs(wait=0.2, fetches=505, busy=8.0)) == 16   # held at the ceiling
    assert t.observe(obs(wait=0.2, fetches=505, busy=8.0)) == 16
    assert t.observe(obs(wait=0.2, fetches=505, busy=8.0)) == 24       # then probes again
    # negative controls: the rate grew, or each fetch took no longer (the rate lags a change): grow
    g = Tuner(16)
    g.observe(obs(wait=0.2, fetches=500, busy=8.0))
    assert g.observe(obs(wait=0.2, fetches=700, busy=12.0)) == 36
    h = Tuner(16)
    h.observe(obs(wait=0.2, fetches=500, busy=8.0))
    assert h.observe(obs(wait=0.2, fetches=510, busy=8.2)) == 36
    # the source slowed 4x just as threads were added: fetch time far beyond the threads' share: grow
    j = Tuner(16)
    j.observe(obs(wait=0.2, fetches=500, busy=8.0))                    # 16 ms per fetch
    assert j.observe(obs(wait=0.3, fetches=180, busy=11.5)) == 36      # 64 ms per fetch with 24 threads


def test_latency_quadrupling_trace_recovers_in_a_few_intervals():
    """Replay: a source at 10 ms, then 40 ms; the loop needs 1,600 fetches/s."""
    t, need = Tuner(16), 1600.0
    for step in range(30):
        latency = 0.010 if step < 10 else 0.040
        threads = t.threads
        rate = min(need, threads / latency)           # what the threads can fetch
        waiting = max(0.0, 1 - rate / need) * 0.5      # the share of the interval the loop waited
        t.observe(obs(wait=waiting, fetches=int(rate * 0.5), busy=rate * 0.5 * latency))
        if step == 9:
            before = t.threads
    assert t.threads * (1 / 0.040) >= 0.9 * need and before < t.threads
    grown_at = next(i for i, (_, th) in enumerate(t.history) if i > 10 and th / 0.040 >= 0.9 * need)
    assert grown_at - 10 <= 6                          # intervals of 0.5 s: within about 3 s


def test_auto_grows_threads_for_a_slow_source(dataset, tmp_path, no_leaks):
    slow = EmulatedStore(dataset, open_latency=0.100, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    with Loader(slow, batch_size=4, local_dir=tmp_path / "l", num_workers=1, output="numpy", lookahead=24,
                local_capacity="10%", decode=lambda b: np.zeros(1, np.uint8)) as ld:
        assert ld.stats()["stage_threads"] == AUTO_START_THREADS
        for e in range(6):
            ld.set_epoch(e)
            for _ in ld:
                time.sleep(0.001)
        assert ld.stats()["stage_threads"] > AUTO_START_THREADS


def test_reader_tuner_adds_readers_while_it_helps_and_goes_back_when_not():
    from clairvoyant.tune.autotune import ReaderTuner
    assert ReaderTuner(2).readers == 3                                   # one per core, and one more
    t = ReaderTuner(2, start=2)
    assert t.epoch_done(650, reader_share=0.9, keeps_up=False) == 3     # readers hold the loop back
    assert t.epoch_done(690, reader_share=0.9, keeps_up=False) == 4     # +6%: keep climbing
    assert t.epoch_done(700, reader_share=0.9, keeps_up=False) == 3     # +1.4%: back
    assert t.epoch_done(690, reader_share=0.9, keeps_up=False) == 3     # and stays
    assert t.epoch_done(695, reader_share=0.9, keeps_up=False) == 3
    # controls: fed loops, or waits that are not the readers', add nothing
    assert ReaderTuner(2, start=2).epoch_done(650, reader_share=0.9, keeps_up=True) == 2
    assert ReaderTuner(2, start=2).epoch_done(650, reader_share=0.2, keeps_up=False) == 2
    capped = ReaderTuner(1)
    assert capped.readers == 2
    assert capped.epoch_done(150, 0.9, False) == 2                      # at most two per core
