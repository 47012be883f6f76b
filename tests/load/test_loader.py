"""The Loader end to end: same samples as a naive reference, resume, ranks, lifecycle."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import torch

from clairvoyant import Loader, WorkerDied
from clairvoyant.load.decode import decode_image
from clairvoyant.plan import plan_epoch
from clairvoyant.testing import EmulatedStore

from conftest import clairvoyant_threads, entry_count, orphan_extents, wait_until


def reference_batches(loader: Loader, epoch: int, root: str):
    """What a naive loop over the plan gives: read each file from the source, decode, stack."""
    plan = plan_epoch(len(loader.manifest), seed=loader.seed, epoch=epoch, rank=loader.rank,
                      world_size=loader.world_size, batch_size=loader.batch_size, shuffle=loader.shuffle,
                      drop_last=loader.drop_last)
    out = []
    for batch in plan.batches:
        imgs, labels = [], []
        for i in batch:
            with open(os.path.join(root, loader.manifest.keys[i]), "rb") as f:
                imgs.append(decode_image(f.read()))
            labels.append(int(loader.manifest.labels[i]))
        out.append((np.stack(imgs), np.array(labels)))
    return out


def same(batches_a, batches_b) -> bool:
    return len(batches_a) == len(batches_b) and all(
        np.array_equal(np.asarray(xa), np.asarray(xb)) and np.array_equal(np.asarray(ya), np.asarray(yb))
        for (xa, ya), (xb, yb) in zip(batches_a, batches_b))


def test_yields_what_a_naive_reference_yields(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=10, local_dir=tmp_path / "local", seed=3, num_workers=2) as loader:
        assert len(loader) == 10
        got = [(x, y) for x, y in loader]
        assert isinstance(got[0][0], torch.Tensor) and got[0][0].dtype == torch.uint8
        assert tuple(got[0][0].shape) == (10, 32, 32, 3) and got[0][1].dtype == torch.int64
        assert tuple(got[-1][0].shape) == (6, 32, 32, 3)
        assert same(got, reference_batches(loader, 0, dataset))
        # negative control: the reference of another epoch differs
        assert not same(got, reference_batches(loader, 1, dataset))
        loader.set_epoch(1)
        assert same(list(loader), reference_batches(loader, 1, dataset))


def test_a_bare_loop_draws_a_new_complete_order_every_pass(dataset, tmp_path, no_leaks):
    """``for epoch in range(3): for batch in loader:`` (no set_epoch), as with a re-shuffling
    DataLoader: three orders, each every sample once, each the plan's order of that epoch."""
    with Loader(dataset, batch_size=10, local_dir=tmp_path / "local", seed=3, num_workers=2) as loader:
        passes = [[(x, y) for x, y in loader] for _ in range(3)]
        for e, got in enumerate(passes):
            assert same(got, reference_batches(loader, e, dataset)), f"pass {e} is not epoch {e}'s order"
        # control: the first pass is not the order of another epoch
        assert not same(passes[0], reference_batches(loader, 1, dataset))
        assert loader.state_dict()["epoch"] == 2


def test_set_epoch_wins_and_a_broken_pass_starts_its_epoch_again(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=10, local_dir=tmp_path / "local", seed=3, num_workers=1) as loader:
        list(loader)
        loader.set_epoch(0)   # asked again for epoch 0: no move on
        assert same(list(loader), reference_batches(loader, 0, dataset))
        loader.sampler.set_epoch(5)   # what Lightning calls
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        del it
        assert loader.state_dict()["epoch"] == 5
        # the broken pass was not complete: the next one is epoch 5 again, from its start
        again = list(loader)
        assert same(head, again[:3]) and same(again, reference_batches(loader, 5, dataset))
        assert same(list(loader), reference_batches(loader, 6, dataset))


def test_set_epoch_between_iter_and_the_first_batch_counts_and_during_a_pass_waits(dataset, tmp_path, no_leaks,
                                                                                   caplog):
    """Lightning calls iter() and then set_epoch(): the pass is planned at its first batch. A
    set_epoch during a pass is for the next one (as a sampler's): the pass and its position stay."""
    import logging
    caplog.set_level(logging.WARNING, logger="clairvoyant")
    with Loader(dataset, batch_size=10, local_dir=tmp_path / "local", seed=3, num_workers=1) as loader:
        it = iter(loader)
        loader.set_epoch(4)
        assert same(list(it), reference_batches(loader, 4, dataset))
        loader.set_epoch(7)
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        loader.set_epoch(9)   # under way: epoch 7 goes on, and its position is kept
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (7, 20)
        rest = list(it)
        assert same(head + rest, reference_batches(loader, 7, dataset))
        assert same(list(loader), reference_batches(loader, 9, dataset))   # then the one asked for
        assert "stopped before its end" not in caplog.text   # control: complete passes say nothing
        # a pass broken off and not followed by set_epoch: the epoch starts again, and the log says so
        it = iter(loader)
        next(it)
        del it
        assert same(list(loader), reference_batches(loader, 10, dataset))
        assert "stopped before its end" in caplog.text


def test_a_state_saved_at_the_end_of_a_pass_goes_on_with_the_next_epoch(dataset, tmp_path, no_leaks):
    kw = dict(batch_size=10, local_dir=tmp_path / "local", seed=3, num_workers=1)
    with Loader(dataset, **kw) as a:
        list(a)
        state = a.state_dict()
    assert (state["epoch"], state["position"]) == (0, 96)
    with Loader(dataset, **kw) as b:   # a bare loop after the resume: epoch 1 in full
        b.load_state_dict(state)
        assert same(list(b), reference_batches(b, 1, dataset))
    with Loader(dataset, **kw) as c:   # set_epoch(0) after the resume: the (empty) rest of epoch 0
        c.load_state_dict(state)
        c.set_epoch(0)
        assert list(c) == []
        assert same(list(c), reference_batches(c, 1, dataset))


def test_labels_follow_imagefolder_class_order(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=96, local_dir=tmp_path, shuffle=False, num_workers=1, output="numpy") as ld:
        assert ld.manifest.classes == ("class_0000", "class_0001", "class_0002", "class_0003")
        (x, y), = list(ld)
        assert isinstance(x, np.ndarray)
        expected = [ld.manifest.classes.index(k.split("/")[0]) for k in ld.manifest.keys]
        assert y.tolist() == expected


def test_flat_tree_gives_every_file_with_label_minus_one(tmp_path, no_leaks):
    root = tmp_path / "flat"
    root.mkdir()
    for i in range(5):
        (root / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    with Loader(root, batch_size=5, local_dir=tmp_path / "l", shuffle=False, num_workers=1,
                decode=lambda b: np.frombuffer(b, np.uint8)[:1].copy(), output="numpy") as ld:
        (x, y), = list(ld)
    assert x.ravel().tolist() == [0, 1, 2, 3, 4] and y.tolist() == [-1] * 5


def test_mid_epoch_resume_yields_exactly_the_remaining_batches(dataset, tmp_path, no_leaks):
    kw = dict(batch_size=8, local_dir=tmp_path, seed=11, num_workers=2)
    with Loader(dataset, **kw) as a:
        a.set_epoch(2)
        full = list(a)
    with Loader(dataset, **kw) as b:
        b.set_epoch(2)
        it = iter(b)
        head = [next(it) for _ in range(5)]
        state = json.loads(json.dumps(b.state_dict()))  # must survive JSON
        del it
    assert state["batches_done"] == 5 and state["epoch"] == 2 and state["position"] == 5 * 8
    with Loader(dataset, **kw) as c:
        c.load_state_dict(state)
        c.set_epoch(2)  # a training loop calls set_epoch again after resuming: the position stays
        rest = list(c)
        assert len(rest) == len(full) - 5
        assert same(head + rest, full)
        # negative control: resuming one batch later misses a batch
        c.load_state_dict(dict(state, position=6 * 8))
        assert not same(head + list(c), full)


def test_resume_with_a_bounded_tier_yields_the_same_batches_and_stays_within_capacity(dataset, tmp_path, no_leaks):
    import hashlib
    kw = dict(batch_size=8, seed=3, num_workers=1, local_capacity="40%", output="numpy",
              decode=lambda b: np.frombuffer(hashlib.md5(b).digest(), np.uint8).copy())   # the bytes' identity
    with Loader(dataset, local_dir=tmp_path / "a", **kw) as a:
        full = []
        for e in range(3):
            a.set_epoch(e)
            full.append([(x.copy(), y.copy()) for x, y in a])
    with Loader(dataset, local_dir=tmp_path / "b", **kw) as b:
        b.set_epoch(0)
        list(b)
        b.set_epoch(1)
        it = iter(b)
        head = [(x.copy(), y.copy()) for x, y in (next(it) for _ in range(4))]
        state = b.state_dict()
        del it
    with Loader(dataset, local_dir=tmp_path / "b", **kw) as c:   # a new job, warm tier, mid-epoch
        c.load_state_dict(state)
        rest = list(c)
        assert same(head + rest, full[1]) and not same(head + rest, full[2])
        c.set_epoch(2)
        assert same(list(c), full[2])
        s = c.stats()
        assert s["usage"]["local"]["peak"] <= s["usage"]["local"]["capacity"]
        assert s["tiers"]["local_hits"] > 0                         # the warm tier was used


def test_state_from_another_configuration_is_refused(dataset, tmp_path):
    with Loader(dataset, batch_size=8, local_dir=tmp_path, num_workers=1) as a:
        state = a.state_dict()
    with Loader(dataset, batch_size=8, local_dir=tmp_path, num_workers=1, seed=1) as b:
        with pytest.raises(ValueError, match="seed"):
            b.load_state_dict(state)
        with pytest.raises(ValueError, match="outside"):
            b.load_state_dict(dict(state, seed=1, position=97))
        b.load_state_dict(dict(state, seed=1, batch_size=9))   # another batch size is fine (elastic resume)


def test_second_epoch_and_second_run_read_nothing_from_the_source(dataset, tmp_path, no_leaks):
    store = EmulatedStore(dataset, open_latency=0.001, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    store.reset()
    with Loader(store, batch_size=16, local_dir=tmp_path / "l", num_workers=1) as ld:
        list(ld)
        first = store.counters()
        assert first.bytes == ld.manifest.total_bytes and ld.stats()["source_files"] == 96
        ld.set_epoch(1)
        list(ld)
        assert store.counters().bytes == first.bytes and store.counters().reads == first.reads
    # a new job on the same local_dir: no listing (persisted manifest), no read (staged copies),
    # one metadata operation per cached sample (is it still what the source holds?)
    store.reset()
    with Loader(store, batch_size=16, local_dir=tmp_path / "l", num_workers=1) as ld:
        assert not ld.indexed
        list(ld)
        assert ld.stats()["local_hits"] == 96
        ld.set_epoch(1)
        list(ld)   # checked once per job: the second epoch asks the source nothing
    c = store.counters()
    assert (c.listings, c.opens, c.reads, c.bytes) == (0, 96, 0, 0)


def _rank_main(rank, world, dataset, local_dir, state_dir, out):
    store = EmulatedStore(dataset, open_latency=0.002, read_latency=0.0, state_dir=state_dir)
    with Loader(store, batch_size=6, local_dir=local_dir, rank=rank, world_size=world, num_workers=1,
                output="numpy", seed=5) as ld:
        ys = [y.tolist() for _, y in ld]
        s = ld.stats()
    with open(out, "w") as f:
        json.dump({"n": len(ys), "copied": s["source_files"], "hits": s["local_hits"]}, f)


def _run_ranks(tmp_path, dataset, ranks_and_worlds):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    store = EmulatedStore(dataset, state_dir=str(tmp_path / "emu"))
    store.reset()
    Loader(store, batch_size=6, local_dir=tmp_path / "l", num_workers=1).close()  # index once
    procs = [ctx.Process(target=_rank_main, args=(r, w, dataset, str(tmp_path / "l"), str(tmp_path / "emu"),
                                                  str(tmp_path / f"r{i}.json")))
             for i, (r, w) in enumerate(ranks_and_worlds)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in procs:  # a hung rank must fail the test, not hang the interpreter's exit
            if p.is_alive():
                p.kill()
                p.join(5)
    res = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(len(procs))]
    data_files = entry_count(str(tmp_path / "l"))
    return res, store.counters(), data_files


def test_two_ranks_share_one_local_dir_and_copy_each_sample_once(dataset, tmp_path, no_leaks):
    res, counters, data_files = _run_ranks(tmp_path, dataset, [(0, 2), (1, 2)])
    assert res[0]["n"] == res[1]["n"] == 8
    assert res[0]["copied"] + res[1]["copied"] == 96          # each sample copied once in all
    assert counters.reads == 96 and data_files == 96           # and read once from the source


def test_two_jobs_wanting_the_same_samples_at_once_copy_each_once(dataset, tmp_path, no_leaks):
    """Same plan, same moment: the node-wide lock per sample lets one copy and the other hit."""
    res, counters, data_files = _run_ranks(tmp_path, dataset, [(0, 1), (0, 1)])
    assert res[0]["n"] == res[1]["n"] == 16
    assert res[0]["copied"] + res[1]["copied"] == 96
    assert res[0]["hits"] + res[1]["hits"] == 96
    assert counters.reads == 96 and data_files == 96


def test_early_break_leaves_nothing_behind(dataset, tmp_path, no_leaks):
    store = EmulatedStore(dataset, open_latency=0.02, state_dir=str(tmp_path / "emu"))
    ld = Loader(store, batch_size=4, local_dir=tmp_path / "l", num_workers=2, stage_threads=8)
    for i, _ in enumerate(ld):
        if i == 1:
            break
    assert wait_until(lambda: not clairvoyant_threads())
    ld.close()
    assert orphan_extents(str(tmp_path / "l")) == []


def test_early_break_gives_back_the_ram_window_it_staged(dataset, tmp_path, no_leaks):
    """A pass stopped after its second batch gives back what it staged ahead into the RAM window
    and never used: the node's RAM ledger (shared by its processes, kept for the job) reads 0
    after the break. Control: while the pass runs, the window holds staged samples."""
    ld = Loader(dataset, batch_size=4, local_dir=tmp_path / "l", num_workers=1, stage_threads=4,
                local_capacity=0, seed=1)
    ledger = ld.tiers.ram.ledger
    held = []
    for i, _ in enumerate(ld):
        held.append(ledger.read()[0])
        if i == 1:
            break
    assert max(held) > 0, held   # control: the window was in use
    assert wait_until(lambda: ledger.read()[0] == 0), ledger.read()
    ld.close()


def test_exception_in_loop_and_gc_release_everything(dataset, tmp_path, no_leaks):
    ld = Loader(dataset, batch_size=4, local_dir=tmp_path, num_workers=2)
    with pytest.raises(RuntimeError, match="boom"):
        for _ in ld:
            raise RuntimeError("boom")
    it = iter(ld)
    next(it)
    del it  # garbage collection of a half-consumed iterator
    ld.close()


def test_killed_worker_raises_within_seconds(dataset, tmp_path, no_leaks):
    store = EmulatedStore(dataset, open_latency=0.05, state_dir=str(tmp_path / "emu"))
    ld = Loader(store, batch_size=4, local_dir=tmp_path / "l", num_workers=2, stage_threads=2)
    it = iter(ld)
    next(it)
    victim = it._run._pool.workers[0].process
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match=r"reader worker 0 .*SIGKILL"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 10
    ld.close()


def test_lent_batches_stay_intact_and_their_buffers_come_back(dataset, tmp_path, no_leaks):
    """Batches are handed out without a copy; a held batch must never be overwritten, and a
    dropped one must give its buffer back to its reader."""
    import gc
    with Loader(dataset, batch_size=4, local_dir=tmp_path, num_workers=2, seed=1) as ld:
        ref = reference_batches(ld, 0, dataset)
        it = iter(ld)
        held_x, held_y = next(it)
        held_sum = int(held_x.sum())
        run = it._run
        assert run._pool.lent == 1  # lent, not copied
        for k, (x, y) in enumerate(it, start=1):
            assert np.array_equal(np.asarray(x), ref[k][0])  # dropped at once: buffers recycle
            assert run._pool.lent - len(run._pool.returned) == 2  # the held batch and this one
            del x, y
            gc.collect()
        assert int(held_x.sum()) == held_sum and np.array_equal(np.asarray(held_x), ref[0][0])
        del held_x, held_y


def test_a_loop_that_keeps_every_batch_does_not_starve_the_readers(dataset, tmp_path, no_leaks):
    with Loader(dataset, batch_size=2, local_dir=tmp_path, num_workers=1, prefetch=1) as ld:
        kept = list(ld)  # 48 batches held at once, far more than the readers' buffers
        assert len(kept) == 48
        assert same(kept, reference_batches(ld, 0, dataset))


CTRL_C_SCRIPT = """
import sys
from clairvoyant import Loader
from clairvoyant.testing import EmulatedStore
store = EmulatedStore(sys.argv[1], open_latency=0.05, state_dir=sys.argv[3])
ld = Loader(store, batch_size=4, local_dir=sys.argv[2], num_workers=2, stage_threads=4)
it = iter(ld)
next(it)
print(" ".join(str(w.process.pid) for w in it._run._pool.workers), flush=True)
for _ in it:
    pass
"""


def test_ctrl_c_leaves_no_process_or_temporary_file(dataset, tmp_path):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, dataset, str(tmp_path / "l"),
                             str(tmp_path / "emu")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too: only its exit status is left
            return f.read().split(") ")[1].startswith("Z")

    assert wait_until(lambda: all(gone(p) for p in pids), timeout=10)
    assert orphan_extents(str(tmp_path / "l")) == []


def test_default_decoder_matches_pillow_on_jpeg_grey_and_png():
    import io as _io
    from PIL import Image
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
    for mode, fmt in (("RGB", "JPEG"), ("L", "JPEG"), ("RGB", "PNG"), ("P", "PNG")):
        img = Image.fromarray(rgb).convert(mode)
        buf = _io.BytesIO()
        img.save(buf, format=fmt)
        got = decode_image(buf.getvalue())
        with Image.open(_io.BytesIO(buf.getvalue())) as ref:
            want = np.asarray(ref.convert("RGB"))
        assert got.shape == (20, 30, 3) and got.dtype == np.uint8
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, (mode, fmt)


def test_stats_time_the_loop_step_and_the_wait(dataset, tmp_path, no_leaks):
    """Lower bounds only (sleeping can only add time): a loop that works 20 ms per step shows a
    step of at least that; a store that gives one sample per 50 ms makes every batch wait."""
    with Loader(dataset, batch_size=8, local_dir=tmp_path / "fast", num_workers=1) as ld:
        for _ in ld:
            time.sleep(0.02)
        s = ld.stats()
    assert s["step_p50_s"] >= 0.019 and s["wait_p50_s"] is not None and s["samples_per_s"] > 0
    slow = EmulatedStore(dataset, open_latency=0.05, read_latency=0.0, state_dir=str(tmp_path / "emu"))
    with Loader(slow, batch_size=4, local_dir=tmp_path / "slow", num_workers=1, stage_threads=1) as ld:
        it = iter(ld)
        for _ in range(6):
            next(it)
        s = ld.stats()
        del it
    assert s["wait_p50_s"] >= 0.1 and s["samples_per_s"] < 4 / 0.1
