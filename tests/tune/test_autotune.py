"""A loader that tunes its staging by itself, and the reader tuner (the limit on requests in
flight: tests/tune/test_inflight.py)."""

from __future__ import annotations

import time

import numpy as np

from clairvoyant import Loader
from clairvoyant.testing import EmulatedStore


def _settled(tmp_path, data, slots: int, name: str) -> dict:
    """The Loader's requests in flight after three cold epochs of a store of ``slots`` slots (20 ms
    per open; the tier holds a fifth of the data set, so every epoch reads the store), starting
    from 8."""
    store = EmulatedStore(data, open_latency=0.020, read_latency=0.0, max_inflight=slots,
                          state_dir=str(tmp_path / f"emu-{name}"))
    with Loader(store, batch_size=8, local_dir=tmp_path / name, num_workers=1, output="numpy", lookahead=64,
                local_capacity="20%", decode=lambda b: np.zeros(1, np.uint8)) as ld:
        assert ld.stats()["stage_threads"] == 8
        for e in range(3):
            ld.set_epoch(e)
            for _ in ld:
                pass
        return ld.stats()["staging"]


def test_the_requests_in_flight_follow_the_store(tmp_path, no_leaks, monkeypatch):
    """Issue 39: the Loader's choice against an emulated store, from a start of 8: with 16 slots it
    grows to the store's knee and holds about there (the store takes no more); control: the same
    job against a store of 128 slots grows well past that."""
    from clairvoyant.load import loader as loader_mod
    from clairvoyant.testing import make_dataset
    monkeypatch.setattr(loader_mod, "AUTO_START_THREADS", 8)
    data = make_dataset(str(tmp_path / "data"), 1200, num_classes=4, size=8)
    narrow = _settled(tmp_path, data, 16, "narrow")
    wide = _settled(tmp_path, data, 128, "wide")
    assert 12 <= narrow["inflight"] <= 40, narrow
    assert wide["inflight"] >= 60, wide
    assert narrow["why"] and wide["why"]


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
