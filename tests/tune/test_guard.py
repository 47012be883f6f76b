"""The loss-spike guard: corruption injected at each place is found and named; clean data is a control."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from clairvoyant import Loader
from clairvoyant.cache.tiers import RAM, Tiers
from clairvoyant.load import worker as worker_mod
from clairvoyant.plan import plan_epoch
from clairvoyant.tune.spike import SpikeDetector, SpikeRule


def noisy(n, seed=0, level=2.0, noise=0.05):
    rng = np.random.default_rng(seed)
    return (level * np.exp(-np.arange(n) / 400) + rng.normal(0, noise, n)).tolist()


def test_a_noisy_decreasing_loss_raises_no_alarm_and_a_jump_does():
    d = SpikeDetector()
    series = noisy(2001)
    assert not any(d.update(x) for x in series[:2000])
    assert d.update(10.0) and d.last_score > 6
    assert not d.update(series[2000])   # the spike stayed out of the window
    assert d.update(math.nan) and d.update(math.inf)


def test_no_alarm_during_warmup_and_an_infinite_threshold_never_fires():
    d = SpikeDetector(SpikeRule(warmup=20))
    assert not any(d.update(x) for x in [1.0] * 19 + [100.0])   # the 20th loss is still warm-up
    never = SpikeDetector(SpikeRule(threshold=math.inf))        # negative control
    assert not any(never.update(x) for x in noisy(100) + [1e6])
    with pytest.raises(ValueError):
        SpikeDetector(SpikeRule(window=10, warmup=20))


def ident(b: bytes) -> np.ndarray:
    return np.frombuffer(b[:64], np.uint8).copy()


def make(dataset, tmp_path, **kw):
    kw = dict(dict(batch_size=4, local_dir=tmp_path / "l", seed=1, num_workers=1, decode=ident, shuffle=False), **kw)
    return Loader(dataset, **kw)


def first_key(ld, epoch=0):
    p = plan_epoch(len(ld.manifest), seed=ld.seed, epoch=epoch, batch_size=ld.batch_size, shuffle=ld.shuffle)
    return ld.manifest.keys[int(p.batches[0][0])]


def test_a_real_loss_spike_on_clean_data_says_intact(dataset, tmp_path, no_leaks):
    with make(dataset, tmp_path, batch_size=2) as ld:
        guard = ld.guard()
        losses = noisy(24) + [50.0]
        verdicts = [guard.step(torch.tensor(loss)) for (x, y), loss in zip(ld, losses)]
    assert verdicts[:24] == [None] * 24
    v = verdicts[24]
    assert v is not None and not v.corrupt and not v.findings and v.samples_checked == 2
    assert "reload the last checkpoint" in v.advice and v.batches == [24]


def test_a_flip_after_the_entry_check_is_found_in_the_local_tier(dataset, tmp_path, monkeypatch, no_leaks):
    with make(dataset, tmp_path) as ld:
        key = first_key(ld)
        monkeypatch.setattr(worker_mod, "FLIP_AFTER_CHECK", {key})   # before the readers fork
        guard = ld.guard()
        it = iter(ld)
        next(it)
        v = guard.check()
        del it
    assert v.corrupt and [(f.key, f.place) for f in v.findings] == [(key, "local")]
    assert "after the entry's checksum" in v.findings[0].detail


def test_a_flip_in_the_batch_buffer_after_collation_is_found(dataset, tmp_path, no_leaks):
    with make(dataset, tmp_path) as ld:
        guard = ld.guard()
        it = iter(ld)
        x, _ = next(it)
        assert not guard.check().corrupt            # control: untouched
        x[0, 0] ^= 1                                # a bit flips in the buffer the loop holds
        v = guard.check()
        del it, x
    assert v.corrupt and [f.place for f in v.findings] == ["batch buffer"]


def test_a_flip_in_the_ram_window_is_found(dataset, tmp_path, monkeypatch, no_leaks):
    stage = Tiers.stage
    bad = {}

    def flipping(self, key, size, keep, fetch):
        p = stage(self, key, size, keep, fetch)
        if p.tier == RAM and not bad:
            bad[key] = True
            return p._replace(data=bytes([p.data[0] ^ 4]) + p.data[1:])
        return p
    monkeypatch.setattr(Tiers, "stage", flipping)
    with make(dataset, tmp_path, local_capacity=2000, batch_size=96) as ld:   # nothing kept: all in RAM
        guard = ld.guard()
        it = iter(ld)
        next(it)
        v = guard.check()
        del it
    assert v.corrupt and [(f.key, f.place) for f in v.findings] == [(next(iter(bad)), "ram")]


def test_a_source_that_changed_after_staging_is_named(dataset, tmp_path, no_leaks):
    import shutil
    root = tmp_path / "data"
    shutil.copytree(dataset, root)
    with make(str(root), tmp_path) as ld:
        list(ld)                                   # epoch 0 stages everything
        key = first_key(ld, 1)
        path = root / key
        blob = bytearray(path.read_bytes())
        blob[10] ^= 0xFF
        path.write_bytes(bytes(blob))
        guard = ld.guard()
        ld.set_epoch(1)
        it = iter(ld)
        next(it)
        v = guard.check()
        del it
        assert ld.tiers.local.find(key) is None   # the copy staged before the change is gone
    assert v.corrupt and [(f.key, f.place, f.served) for f in v.findings] == [(key, "source", True),
                                                                              (key, "local", False)]


def test_a_local_entry_that_went_bad_after_serving_is_removed_and_reported(dataset, tmp_path, no_leaks):
    with make(dataset, tmp_path) as ld:
        guard = ld.guard()
        it = iter(ld)
        next(it)
        key = first_key(ld)
        loc = ld.tiers.local.find(key)
        with open(loc.path, "r+b") as f:
            f.seek(loc.offset + 5)
            c = f.read(1)
            f.seek(loc.offset + 5)
            f.write(bytes([c[0] ^ 1]))
        v = guard.check()
        del it
        assert ld.tiers.local.find(key) is None
    assert not v.corrupt and [(f.key, f.place, f.served) for f in v.findings] == [(key, "local", False)]


def fail_on_first(b: bytes) -> np.ndarray:
    if b == _FIRST[0]:
        raise ValueError("undecodable")
    return ident(b)


_FIRST = [b""]


def open_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_skipped_sample_is_not_checked_as_served(dataset, tmp_path, monkeypatch, no_leaks):
    with make(dataset, tmp_path, decode=fail_on_first, on_error="skip") as ld:
        key = first_key(ld)
        blob = open_bytes(os.path.join(dataset, key))
        _FIRST[0] = bytes([blob[0] ^ 0x10]) + blob[1:]               # what the flip below makes of it
        monkeypatch.setattr(worker_mod, "FLIP_AFTER_CHECK", {key})   # bad bytes, which fail to decode
        guard = ld.guard()
        it = iter(ld)
        x, _ = next(it)
        v = guard.check()
        del it, x
    assert v.samples_checked == 3 and not v.corrupt and not v.findings
