"""The loading verdict: 'no' with the right bottleneck on slow sources and slow decoders,
'yes' on fast ones (each with its opposite as the control)."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.testing import EmulatedStore
from clairvoyant.tune.verdict import judge, split_wait


def test_split_wait_follows_the_batch_timeline():
    # staged at 10.4, the reader's 0.4 s on it: it could be ready at t0 only if staged by 9.6, so
    # 0.8 s of the wait is staging's; the 0.1 s in the queue and the reader's 0.1 s share the rest
    c = split_wait(10.0, 11.0, staged_at=10.4, dispatched_at=10.5, worker=(0.1, 0.3, 0.0))
    assert c["fetch"] == pytest.approx(0.8) and c["queue"] == pytest.approx(0.1)
    assert c["read"] == pytest.approx(0.025) and c["decode"] == pytest.approx(0.075)
    assert sum(c.values()) == pytest.approx(1.0)
    # staged and dispatched before the wait began, in time for the reader: all of it is the reader's
    c = split_wait(10.0, 10.2, staged_at=9.0, dispatched_at=9.5, worker=(0.0, 1.0, 0.0))
    assert c["decode"] == pytest.approx(0.2) and c["fetch"] == 0 and c["queue"] == 0
    # not staged yet when the wait ended (no reader has it): all of it is the fetch
    c = split_wait(10.0, 10.5, staged_at=None, dispatched_at=None, worker=None)
    assert c["fetch"] == pytest.approx(0.5) and sum(c.values()) == pytest.approx(0.5)


def test_a_reader_that_started_late_because_staging_was_late_is_a_fetch_wait():
    """Issue 39: in a pipeline of big batches staged just in time, the loop begins to wait after the
    batch was staged, inside its reader's decode; the decode is no bottleneck (the readers are
    idle between batches): staging is. Control: the same reader times with the batch staged in
    good time are the decode's."""
    # batch staged at 9.83 (its reader took it at once), 0.25 s of decode, the loop waiting from 10.0
    c = split_wait(10.0, 10.08, staged_at=9.83, dispatched_at=9.83, worker=(0.0, 0.25, 0.0))
    assert c["fetch"] == pytest.approx(0.08) and c["decode"] == 0
    # control: staged long before (9.0), the same decode time and wait: the reader's
    c = split_wait(10.0, 10.08, staged_at=9.0, dispatched_at=9.83, worker=(0.0, 0.25, 0.0))
    assert c["fetch"] == 0 and c["decode"] == pytest.approx(0.08)
    # a reader's own reads from the source (no tier had room) are the fetch too
    c = split_wait(10.0, 10.2, staged_at=9.0, dispatched_at=9.5, worker=(0.0, 0.1, 0.0, 0.3))
    assert c["fetch"] == pytest.approx(0.15) and c["decode"] == pytest.approx(0.05)


def test_the_peer_share_of_staging_is_the_peer_fetch():
    """The cluster cache's cause: the part of a batch's staging spent asking peer nodes."""
    from clairvoyant.load.timeline import BatchTimeline
    c = split_wait(10.0, 11.0, staged_at=10.4, dispatched_at=10.5, worker=(0.1, 0.3, 0.0), peer_share=0.75)
    assert c["peer"] == pytest.approx(0.6) and c["fetch"] == pytest.approx(0.2)
    assert sum(c.values()) == pytest.approx(1.0)
    tl = BatchTimeline()
    tl.fetched(3, 0.2, 0.15)
    tl.fetched(3, 0.2, 0.0)
    tl.staged(3)
    t = time.perf_counter()
    got = tl.causes(3, t - 1.0, t + 0.001)
    assert got["peer"] == pytest.approx(got["fetch"] * 0.375 / 0.625, rel=0.01) and got["peer"] > 0
    tl.fetched(4, 0.2, 0.0)   # control: no time on peers, no peer fetch
    tl.staged(4)
    assert tl.causes(4, t - 1.0, t + 0.001)["peer"] == 0
    v = judge([0.2] * 100, [0.1] * 100, 3200, {"fetch": 1.0, "peer": 9.0})
    assert v.bottleneck == "peer" and "bottleneck: peer fetch" in v.line(1)


def test_judge_yes_and_no():
    fed = judge([0.001] * 100, [0.1] * 100, 3200, {"fetch": 0.1})
    assert fed.keeps_up and fed.bottleneck is None and "yes" in fed.line(0)
    starved = judge([0.2] * 100, [0.1] * 100, 3200, {"fetch": 1.0, "decode": 19.0})
    assert not starved.keeps_up and starved.bottleneck == "decode" and "bottleneck: decode" in starved.line(3)


def _run(tmp_path, source, decode, step, epochs=1, **kw):
    with Loader(source, batch_size=8, local_dir=tmp_path / "l", num_workers=1, output="numpy", decode=decode,
                verdict=True, **kw) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            for _ in ld:
                time.sleep(step)
        return ld.stats()["verdict"]


def tiny(b: bytes) -> np.ndarray:
    return np.frombuffer(b[:4], np.uint8).copy()


def slow_decode(b: bytes) -> np.ndarray:
    time.sleep(0.004)
    return tiny(b)


def test_a_slow_source_is_named(dataset, tmp_path, caplog, no_leaks):
    slow = EmulatedStore(dataset, open_latency=0.040, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    with caplog.at_level(logging.INFO, "clairvoyant"):
        v = _run(tmp_path, slow, tiny, step=0.002, stage_threads=2)
    assert not v["keeps_up"] and v["bottleneck"] == "fetch", v
    assert any("loading keeps up: NO" in r.getMessage() and "source fetch" in r.getMessage()
               and "; staging: 2 in flight" in r.getMessage() for r in caplog.records)
    assert v["staging"]["inflight"] == 2   # the requests in flight beside the verdict, and why


def test_a_fast_source_keeps_up(dataset, tmp_path, no_leaks):
    fast = EmulatedStore(dataset, open_latency=0.0, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    v = _run(tmp_path, fast, tiny, step=0.030, epochs=2)      # the second epoch: everything is local
    assert v["keeps_up"] and v["bottleneck"] is None, v


def test_a_slow_decoder_is_named_and_a_slower_loop_is_fed(dataset, tmp_path, no_leaks):
    v = _run(tmp_path, dataset, slow_decode, step=0.001, epochs=2)
    assert not v["keeps_up"] and v["bottleneck"] == "decode", v
    v = _run(tmp_path, dataset, slow_decode, step=0.120, epochs=2)   # control: the loop is the slow part
    assert v["keeps_up"], v


def test_metrics_lines_and_report(dataset, tmp_path, no_leaks):
    from clairvoyant.cli.main import main
    path = tmp_path / "run.jsonl"
    with Loader(dataset, batch_size=8, local_dir=tmp_path / "l", num_workers=1, output="numpy", decode=tiny,
                metrics=path, local_capacity="50%") as ld:
        for e in range(2):
            ld.set_epoch(e)
            for _ in ld:
                time.sleep(0.002)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    batches = [r for r in records if r["type"] == "batch"]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert len(batches) == 2 * 12 and [r["epoch"] for r in epochs] == [0, 1]
    assert "loading keeps up" in epochs[0]["line"] and epochs[1]["reads"]["source_files"] > 0
    assert main(["report", str(path), "--out", str(tmp_path / "run.png")]) == 0
    assert (tmp_path / "run.png").stat().st_size > 10_000
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2


def sleepy_decode(b: bytes) -> np.ndarray:
    time.sleep(0.004)   # a reader's 4 ms per sample that uses no core: 64 ms per batch of 16
    return tiny(b)


def test_a_pipeline_staged_just_in_time_is_named_for_its_staging(tmp_path, no_leaks):
    """Issue 39's case through the Loader: staging delivers a batch every ~40 ms (16 requests of
    40 ms at once), each reader spends ~64 ms on a batch and four readers are idle between batches,
    so staging is the bottleneck, but every batch is staged before the loop begins to wait for it
    and the waits fall inside a reader's decode (the old split named decode). Control: the next
    epoch, every sample in the tier, is decode's."""
    from clairvoyant.testing import make_dataset
    data = make_dataset(str(tmp_path / "data"), 480, num_classes=4, size=8)
    store = EmulatedStore(data, open_latency=0.040, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    with Loader(store, batch_size=16, local_dir=tmp_path / "l", num_workers=4, output="numpy",
                decode=sleepy_decode, stage_threads=16, verdict=True) as ld:
        verdicts = []
        for e in range(2):
            ld.set_epoch(e)
            for _ in ld:
                time.sleep(0.001)
            verdicts.append(ld.stats()["verdict"])
    cold, warm = verdicts
    assert not cold["keeps_up"] and cold["bottleneck"] == "fetch", cold
    assert cold["shares"]["fetch"] > 2 * cold["shares"]["decode"], cold["shares"]
    assert not warm["keeps_up"] and warm["bottleneck"] in ("decode", "queue"), warm   # the control
    assert warm["shares"]["fetch"] < 0.25, warm["shares"]   # (the epoch's first batch waits on its start)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_readers_own_reads_of_the_source_are_reported_apart(fmt):
    """A reader reads samples no tier had room for from the source itself: it reports those
    seconds apart (the verdict counts them as the fetch), where the fast path decodes the batch
    (JPEGs) and where it declines it (PNGs: its reads go on to the general path with their times).
    Control: the same batch with its bytes in hand (the RAM window) reports no source time."""
    import io
    import types

    from PIL import Image

    from clairvoyant.load import direct, worker
    from clairvoyant.load.collate import default_collate
    from clairvoyant.load.decode import decode_image
    from clairvoyant.load.transport import Slot

    if direct._simplejpeg is None:
        pytest.skip("simplejpeg is not installed")
    blobs = {}
    for i in range(4):
        out = io.BytesIO()
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(out, fmt)
        blobs[f"k{i}"] = out.getvalue()

    class SlowSource:   # 20 ms a read, as a slow store's would be
        made_in_reader = has_fields = False
        target_field = fields_of = None

        def read(self, key):
            time.sleep(0.02)
            return blobs[key]

    spec = types.SimpleNamespace(source=SlowSource(), collate_fn=None, decode=decode_image, transform=None,
                                 target_transform=None, digests=False, fast=None, fast_uint8=False)
    from_store = worker.Job(0, 0, [worker.Item(k, None, len(b), 0, None, True) for k, b in blobs.items()], False)
    got = worker._load_batch(from_store, [Slot()], spec, default_collate)
    assert isinstance(got, worker.Loaded) and got.times[3] >= 0.07 and got.times[0] < 0.02, got.times
    in_hand = worker.Job(0, 0, [worker.Item(k, None, len(b), 0, b, False) for k, b in blobs.items()], False)
    got = worker._load_batch(in_hand, [Slot()], spec, default_collate)
    assert isinstance(got, worker.Loaded) and got.times[3] == 0, got.times
