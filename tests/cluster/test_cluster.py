"""The cluster cache end to end: ``mpirun -n 4``, each rank its own "node" (CLAIRVOYANT_NODE) with its
own local directory, all reading one emulated shared store whose counters they share
(tests/cluster/mpi_cluster_script.py). Every epoch must serve every sample exactly once, with the source's
bytes, whatever the peers do; the store must be read about once per job. A peer killed or slow in
the middle of an epoch costs the others at most about one peer deadline, and no sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from clairvoyant.cluster.job import PEER_TIMEOUT
from clairvoyant.testing import make_dataset
from mpi_util import ENV, MPIRUN, launch, needs_mpirun, needs_ulfm, ours

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


@needs_mpirun
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", ["compress", "compress-corrupt"])
def test_compressing_tiers_send_their_entries_over_the_wire(scenario, tmp_path):
    """4 nodes x 30% whose tiers compress (zlib) a data set of smooth float fields: peers send the
    compressed entries and the reader inflates them; every epoch serves the source's bytes exactly
    once, and the store is read about once in all. Damaged entries (every kept one, after epoch 0)
    are refused by the reader as corrupt (counted), and the store serves those samples. Control:
    the undamaged run counts no corrupt peer entry and reads the store less."""
    import numpy as np
    data = tmp_path / "fields"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(160):
        (data / f"f{i:04d}.bin").write_bytes(np.round(rng.normal(size=(8, 32, 32)).cumsum(axis=1), 1)
                                             .astype(np.float32).tobytes())
    out = run(str(data), tmp_path / "w", "30%", 3, True, scenario)
    n = out["samples"]
    assert all(out["exact"]), out["exact"]
    assert all(r["ratio"] > 1.5 for r in out["ranks"]), [r["ratio"] for r in out["ranks"]]
    corrupt = sum(r["tiers"].get("peer_corrupt", 0) for r in out["ranks"])
    if scenario == "compress":
        assert sum(out["opens"]) <= 1.05 * n and corrupt == 0, (out["opens"], corrupt)
        hits = sum(r["tiers"]["peer_hits"] for r in out["ranks"])
        sent = sum((r["cluster"] or {}).get("bytes_out", 0) for r in out["ranks"])
        assert hits >= 0.5 * n
        assert 0 < sent < 0.7 * hits * 8 * 32 * 32 * 4, (sent, hits)   # the wire carried compressed entries
    else:
        assert corrupt >= 0.5 * n and out["opens"][1] >= 0.5 * n, (out["opens"], corrupt)


# --- a peer that dies or turns slow in the middle of an epoch ---------------------------------------

VICTIM, SLOW = 2, 1   # as in tests/cluster/mpi_cluster_script.py
# Allowed extra time for an epoch with a failed peer: the 2 x the peer deadline, plus this much
# for a machine whose 2 cores run 4 ranks, their readers and other people's work (measured here: the
# killed peer costs ~0 s, MPI reports the death at once; the slow one ~2.0 s, one deadline).
MARGIN = 2.0


@pytest.fixture(scope="module")
def faults_data(tmp_path_factory) -> str:
    """192 small JPEGs: 48 per rank, 12 batches of 4 an epoch, so that a peer can fail with most of
    the epoch still to come."""
    return make_dataset(str(tmp_path_factory.mktemp("faults") / "imgs"), 192, num_classes=4, size=32)


def run_faults(dataset: str, work: Path, scenario: str) -> tuple[dict[int, dict], int, str]:
    """A fault scenario of tests/cluster/mpi_cluster_script.py on 4 ranks: what each rank that lived to the
    end wrote, mpirun's exit status, its stderr."""
    token = f"cvcluster-{uuid.uuid4().hex}"
    flags = ("--with-ft", "ulfm") if scenario == "kill" else ()
    rc, _, err = launch([sys.executable, str(SCRIPT), dataset, str(work), "30%", "2", "on", scenario, token],
                        token, *flags, timeout=120)
    out = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (work / "out").glob("rank-*.json")}
    return out, rc, err


def check(yielded: list[str], expected: list[str]) -> list[str]:
    """What is wrong with one rank's epoch (md5s of the samples it yielded against those of its share
    of the order, read from the files): samples missing, or yielded too often or not in its share."""
    got, want = Counter(yielded), Counter(expected)
    return [f"missing {h}" for h in want - got] + [f"extra {h}" for h in got - want]


@pytest.fixture(scope="module")
def steady(faults_data, tmp_path_factory) -> dict[int, dict]:
    """The control: the same job with no fault."""
    out, rc, err = run_faults(faults_data, tmp_path_factory.mktemp("steady"), "steady")
    assert rc == 0 and sorted(out) == [0, 1, 2, 3], err[-3000:]
    for r in out.values():
        assert [check(y, x) for y, x in zip(r["yielded"], r["expected"])] == [[], []], r["rank"]
        assert r["cluster"]["timeouts"] == r["cluster"]["failed"] == 0, r["cluster"]
    return out


@needs_mpirun
@pytest.mark.timeout(300)
def test_an_outsider_beside_an_mpirun_job_finds_no_port_of_its_peers(faults_data, tmp_path):
    """Under mpirun the Loader's peers talk over MPI: an outsider that looks at the ports the
    running job's ranks listen on while it pauses after epoch 0 finds none that speaks ZeroMQ (no
    peer service of clairvoyant's to ask), and the job's epochs give every rank its share once.
    (Its control, ports found and refused, is the torchrun test's: 4 ports, 0 samples.)"""
    from outsider import listening_ports, speaks_zmtp
    token = f"cvcluster-{uuid.uuid4().hex}"
    proc = subprocess.Popen([MPIRUN, "-n", "4", "--oversubscribe", "--bind-to", "none", sys.executable, str(SCRIPT),
                             faults_data, str(tmp_path), "30%", "2", "on", "steady", token],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV, "CLAIRVOYANT_TEST_PAUSE": "4"})
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "probe-now").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert (tmp_path / "probe-now").exists(), "the job did not finish its first epoch"
        ranks = [p for p in ours(token) if p != proc.pid and Path(f"/proc/{p}/comm").read_text().startswith("python")]
        ports = listening_ports(ranks)
        assert len(ranks) == 4 and [w for w in ports if speaks_zmtp(w)] == [], ports
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    out = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (tmp_path / "out").glob("rank-*.json")}
    assert sorted(out) == [0, 1, 2, 3]
    for r in out.values():
        assert [check(y, x) for y, x in zip(r["yielded"], r["expected"])] == [[], []], r["rank"]
        assert "MPI" in r["cluster"].get("transport", "MPI"), r["cluster"]


@needs_mpirun
def test_the_checker_catches_a_lost_a_twice_and_a_wrong_sample(steady):
    """Negative control for ``check``: on a real epoch, one sample dropped, one yielded twice and one
    with other bytes are each caught."""
    got, want = steady[0]["yielded"][1], steady[0]["expected"][1]
    assert check(got, want) == [] and len(got) == 48
    assert check(got[1:], want) == [f"missing {got[0]}"]
    assert check(got + got[:1], want) == [f"extra {got[0]}"]
    assert len(check(got[1:] + ["0" * 32], want)) == 2
    assert check(steady[1]["yielded"][1], want) != []   # another rank's share is not this one's


def slowest_epoch(out: dict[int, dict], ranks, epoch: int = 1) -> float:
    return max(out[r]["epoch_s"][epoch] for r in ranks)


@needs_mpirun
@needs_ulfm
@pytest.mark.timeout(300)
def test_a_peer_killed_mid_epoch(faults_data, tmp_path, steady):
    """Rank 2 SIGKILLs itself after 3 of its 12 batches of epoch 1 (under ``mpirun --with-ft ulfm``;
    plain Open MPI would end the job). The others finish the epoch, each with every sample of its
    share exactly once and the source's bytes, those the dead node would have served from the store,
    and the epoch takes them at most 2 x the peer deadline longer than without the kill. Starting the
    next epoch then raises PeerLost on every survivor (the control, steady, starts it: not asked)."""
    out, rc, err = run_faults(faults_data, tmp_path, "kill")
    survivors = [r for r in range(4) if r != VICTIM]
    assert sorted(out) == survivors, err[-3000:]   # the job's exit status may tell of the death: not checked
    killed_at = json.loads((tmp_path / "out" / "victim.json").read_text())["killed_at"]
    for r in survivors:
        o, c = out[r], out[r]["cluster"]
        assert [check(y, x) for y, x in zip(o["yielded"], o["expected"])] == [[], []], r
        assert o["finished_at"] > killed_at
        # the kill hit in mid-epoch: this rank asked the dead one, MPI said it died, the store served
        assert c["dead_peers"] == [VICTIM] and c["failed"] >= 1, (r, c)
        store, control = o["epochs"]["1"].get("source_files", 0), steady[r]["epochs"]["1"].get("source_files", 0)
        assert store >= c["failed"] and store > control, (r, o["epochs"]["1"], steady[r]["epochs"]["1"])
        # the next epoch's exchange needs every rank: a typed error that names the dead rank and the way on
        assert o["next_epoch"].startswith("PeerLost: rank(s) [2]") and "state_dict" in o["next_epoch"], o["next_epoch"]
    extra = slowest_epoch(out, survivors) - slowest_epoch(steady, survivors)
    print(f"epoch 1 with rank {VICTIM} killed: {[round(out[r]['epoch_s'][1], 2) for r in survivors]} s, "
          f"without: {[round(steady[r]['epoch_s'][1], 2) for r in survivors]} s; extra {extra:.2f} s "
          f"(deadline {PEER_TIMEOUT} s); fetches failed: {[out[r]['cluster']['failed'] for r in survivors]}")
    assert extra <= 2 * PEER_TIMEOUT + MARGIN, extra


@needs_mpirun
@pytest.mark.timeout(300)
def test_a_slow_peer(faults_data, tmp_path, steady):
    """From epoch 1 on, rank 1's replies leave PEER_TIMEOUT + 1 s late (peers.DELAY_REPLIES). The
    others give up on it after the deadline, read its samples from the store and pass it over for a
    while: every rank yields every sample of its share once with the source's bytes, none from node
    1, and the epoch costs about one deadline more (it cost one per sample before rank 1 was passed
    over: 8-12 s here)."""
    out, rc, err = run_faults(faults_data, tmp_path, "slow")
    assert rc == 0 and sorted(out) == [0, 1, 2, 3], err[-3000:]
    askers = [r for r in range(4) if r != SLOW]
    for r in range(4):
        assert [check(y, x) for y, x in zip(out[r]["yielded"], out[r]["expected"])] == [[], []], r
    for r in askers:
        c, e1 = out[r]["cluster"], out[r]["epochs"]["1"]
        assert c["timeouts"] >= 1 and c["passed_over"] >= 1, (r, c)
        assert e1.get("from_node", {}).get(str(SLOW), 0) == 0, (r, e1)   # all its replies came too late
        assert steady[r]["epochs"]["1"]["from_node"].get(str(SLOW), 0) > 0   # control: it serves when not slow
        assert e1.get("source_files", 0) >= c["timeouts"] + c["passed_over"], (r, e1, c)
    extra = slowest_epoch(out, askers) - slowest_epoch(steady, askers)
    print(f"epoch 1 with rank {SLOW} slow: {[round(out[r]['epoch_s'][1], 2) for r in askers]} s, without: "
          f"{[round(steady[r]['epoch_s'][1], 2) for r in askers]} s; extra {extra:.2f} s (deadline {PEER_TIMEOUT} s)")
    assert extra <= 2 * PEER_TIMEOUT + MARGIN, extra
