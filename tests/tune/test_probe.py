"""`clairvoyant probe`: it recovers the emulated store's settings, never writes to the source,
and its advice follows the budget."""

from __future__ import annotations

import json
import os

import pytest

from clairvoyant.cli.main import main
from clairvoyant.manifest import build
from clairvoyant.plan.budget import advise, loading_budget
from clairvoyant.testing import EmulatedStore
from clairvoyant.tune.probe import probe


@pytest.fixture(scope="module")
def big_files(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("big") / "data"
    root.mkdir()
    for i in range(120):
        (root / f"f{i:04d}.bin").write_bytes(os.urandom(256 << 10))
    return str(root)


def snapshot(root: str) -> dict:
    out = {}
    for r, ds, fs in os.walk(root):
        for name in fs + ds:
            st = os.stat(os.path.join(r, name))
            out[os.path.join(r, name)] = (st.st_size, st.st_mtime_ns)
    out[root] = os.stat(root).st_mtime_ns
    return out


def test_probe_recovers_latency_and_bandwidth_and_never_writes(big_files, tmp_path):
    store = EmulatedStore(big_files, open_latency=0.005, read_latency=0.001, bandwidth=20e6,
                          state_dir=str(tmp_path / "emu"))
    man = build(store)
    before = snapshot(big_files)
    res = probe(store, man, readers=(1, 4, 16), seconds=0.4, timed=24, local_dir=str(tmp_path / "local"))
    assert res.latency_s == pytest.approx(0.005, rel=0.2)
    assert res.bandwidth == pytest.approx(20e6, rel=0.2)
    # one reader: 5 ms open + 1 ms read + 256 KiB at 20 MB/s
    assert res.read_s["p50"] == pytest.approx(0.006 + (256 << 10) / 20e6, rel=0.2)
    assert snapshot(big_files) == before
    assert res.local["write_files_per_s"] > 0 and os.listdir(tmp_path / "local") == []
    # negative control: the snapshot does see a write
    with open(os.path.join(big_files, "f0000.bin"), "r+b") as f:
        f.write(b"x")
    assert snapshot(big_files) != before


def test_advice_follows_the_budget():
    b = loading_budget(batch_size=128, step_time=0.087, sample_bytes=64 << 10, gpus_per_node=4,
                       dataset_bytes=100.0, local_capacity=50.0)
    a = advise(b, 2100, 32)
    assert not a.keeps_up and round(a.need_per_node) == 5885 and round(a.miss_need) == 2943
    assert "stage to node-local storage" in a.lines[0] and "2,100 files/s at 32 readers" in a.lines[0]
    assert "still more than it gives" in a.lines[1]
    fast = advise(b, 9000, 16)
    assert fast.keeps_up and "keeps up" in fast.lines[0] and "keeps up with that" in fast.lines[1]


def test_cli_probe(big_files, tmp_path, capsys):
    rc = main(["probe", big_files, "--readers", "1,2", "--seconds", "0.2", "--emulate", "2,0,100",
               "--batch-size", "32", "--step-time", "0.1", "--gpus", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["readers"] for p in out["curve"]] == [1, 2] and out["advice"]["need_per_node"] == 640
    assert main(["probe", big_files, "--emulate", "x"]) == 2
