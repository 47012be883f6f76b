"""Jobs of a sweep on one node share its local tier (issue 52): a job killed in the middle of an
epoch leaves the others training on the right samples, and nothing in the shared tier lost or torn."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import time

import numpy as np

from clairvoyant import Loader

from conftest import entry_count, wait_until

PAUSE = 0.05   # seconds per batch: a training step


def _digest(b) -> np.ndarray:
    return np.frombuffer(hashlib.md5(bytes(b)).digest(), np.uint8).copy()


def _hex(xb) -> list[str]:
    return [bytes(x).hex() for x in xb]


def _job(data: str, local_dir: str, seed: int, epochs: int, out: str) -> None:
    """One job of the sweep: its epochs through the shared tier, each sample's bytes hashed; after
    each batch its count in ``out.at``; at the end, per epoch, the sorted hashes in ``out``."""
    seen: list[list[str]] = []
    n = 0
    with Loader(data, batch_size=4, local_dir=local_dir, seed=seed, decode=_digest, num_workers=1,
                output="numpy") as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            got = []
            for xb, _ in ld:
                got += _hex(xb)
                n += 1
                with open(out + ".at", "w") as f:
                    f.write(str(n))
                time.sleep(PAUSE)
            seen.append(sorted(got))
    with open(out, "w") as f:
        json.dump(seen, f)


def _at(out: str) -> int:
    try:
        with open(out + ".at") as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def test_a_job_of_a_sweep_killed_mid_epoch_leaves_the_other_training_and_the_tier_whole(dataset, tmp_path):
    """Two jobs (seeds 0 and 1) on one local_dir; job 0 is killed (SIGKILL) during its first
    epoch. Job 1 finishes its two epochs, each epoch every sample once with the source's bytes; a
    third job on the same tier then reads every sample right, most from the tier. Controls: job 0
    died by the signal before its epoch ended, while job 1 was still running; the tier held
    entries from both before the third job."""
    data = str(tmp_path / "data")
    shutil.copytree(dataset, data)
    files = [os.path.join(r, f) for r, _, fs in os.walk(data) for f in fs if not f.startswith(".")]
    want = []
    for p in files:
        with open(p, "rb") as f:
            want.append(hashlib.md5(f.read()).hexdigest())
    want.sort()
    local = str(tmp_path / "shared")
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"job{j}.json") for j in range(2)]
    jobs = [ctx.Process(target=_job, args=(data, local, j, 3 if j == 0 else 2, outs[j])) for j in range(2)]
    try:
        for p in jobs:
            p.start()
        assert wait_until(lambda: _at(outs[0]) >= 6, 120)
        os.kill(jobs[0].pid, signal.SIGKILL)
        jobs[0].join(30)
        assert jobs[0].exitcode == -signal.SIGKILL and _at(outs[0]) < len(want) // 4   # control: mid-epoch
        assert jobs[1].is_alive() and _at(outs[1]) < 2 * len(want) // 4                 # control: still running
        jobs[1].join(120)
        assert jobs[1].exitcode == 0
    finally:
        for p in jobs:
            if p.is_alive():
                p.kill()
                p.join(5)
    with open(outs[1]) as f:
        got = json.load(f)
    assert [len(g) for g in got] == [len(want)] * 2 and got == [want, want], (set(got[0]) ^ set(want), len(want))
    assert entry_count(local) >= len(want) // 2   # control: the tier held what the jobs staged
    with Loader(data, batch_size=4, local_dir=local, seed=2, decode=_digest, num_workers=1, output="numpy") as ld:
        assert sorted(x for xb, _ in ld for x in _hex(xb)) == want
        assert ld.stats()["local_hits"] >= len(want) // 2
