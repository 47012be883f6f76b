"""The cluster cache end to end: ``mpirun -n 4``, each rank its own "node" (CLAIRVOYANT_NODE) with its
own local directory, all reading one emulated shared store whose counters they share
(tests/mpi_cluster_script.py). Every epoch must serve every sample exactly once, with the source's
bytes, whatever the peers do; the store must be read about once per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mpi_util import ENV, MPIRUN, needs_mpirun, ours

SCRIPT = Path(__file__).with_name("mpi_cluster_script.py")


def run(dataset: str, tmp_path: Path, cap: str, epochs: int, cluster: bool, scenario: str = "plain") -> dict:
    token = f"cvcluster-{uuid.uuid4().hex}"
    cmd = [MPIRUN, "-n", "4", "--oversubscribe", "--bind-to", "none", sys.executable, str(SCRIPT), dataset,
           str(tmp_path), cap, str(epochs), "on" if cluster else "off", scenario, token]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stderr[-3000:]
    assert ours(token) == []   # no rank left behind
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_mpirun
@pytest.mark.timeout(240)
def test_cluster_reads_the_store_about_once_per_job(dataset, tmp_path):
    """4 nodes x 30% (aggregate 120%), 4 epochs: the store is read once in all (<= 1.05x), later
    epochs read <= 2% each; node by node (the control) reads about 0.7 of it again every epoch."""
    on = run(dataset, tmp_path / "on", "30%", 4, True)
    off = run(dataset, tmp_path / "off", "30%", 4, False)
    n = on["samples"]
    print("store opens per epoch, cluster:", on["opens"], "node by node:", off["opens"])
    assert all(on["exact"]) and all(off["exact"]), (on["exact"], off["exact"])
    assert sum(on["opens"]) <= 1.05 * n, on["opens"]
    assert all(o <= 0.02 * n for o in on["opens"][1:]), on["opens"]
    assert all(o >= 0.5 * n for o in off["opens"][1:]), off["opens"]   # what the cluster saves
    peer = sum(r["epochs"].get("3", {}).get("peer_files", 0) for r in on["ranks"])
    assert peer >= 0.5 * n, on["ranks"]   # served by other nodes' tiers, as counted in stats()


@needs_mpirun
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", ["corrupt-wire", "corrupt-entry"])
def test_a_corrupt_peer_is_caught_and_the_store_serves(scenario, dataset, tmp_path):
    """Bytes flipped on the wire, or in a peer's staged entry: never served; the sample comes from
    the store, and every epoch still holds the source's bytes."""
    out = run(dataset, tmp_path, "30%", 2, True, scenario)
    assert all(out["exact"]), out["exact"]
    n = out["samples"]
    assert out["opens"][1] >= 0.5 * n, out["opens"]   # the peers' copies were refused: the store served
    refused = sum((r["cluster"] or {}).get("bad_checksum", 0) for r in out["ranks"])
    misses = sum(r["tiers"]["peer_misses"] for r in out["ranks"])
    if scenario == "corrupt-wire":
        assert refused >= 0.5 * n
    assert misses >= 0.5 * n
