"""A loader that tunes its staging by itself, and the reader tuner (the limit on requests in
flight: tests/tune/test_inflight.py)."""

from __future__ import annotations

import time

import numpy as np

from clairvoyant import Loader
from clairvoyant.load.loader import AUTO_START_THREADS
from clairvoyant.testing import EmulatedStore


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
