"""The cluster cache under torchrun, no MPI: two (or four) torchrun agents on this machine, each a
"node" of 2 (or 1) ranks with its own local directory (tests/cluster/torchrun_cluster_script.py), the
ranks finding each other through torchrun's rendezvous store and serving each other over ZeroMQ.
Every epoch must serve every sample exactly once, with the source's bytes; the store must be read
about once per job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mpi_util import ours

pytest.importorskip("torch")
pytest.importorskip("zmq")
SCRIPT = Path(__file__).with_name("torchrun_cluster_script.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(dataset: str, tmp_path: Path, nodes: int, per_node: int, cap: str, epochs: int, mode: str = "auto",
        when: str = "before", timeout: float = 200, first: int = 0) -> dict:
    """The job's result (rank 0's JSON line); every process of it gone afterwards."""
    agents, token = start(dataset, tmp_path, nodes, per_node, cap, epochs, mode, when, first)
    return _result(agents, token, timeout)


def start(dataset: str, tmp_path: Path, nodes: int, per_node: int, cap: str, epochs: int, mode: str = "auto",
          when: str = "before", first: int = 0, **extra_env: str) -> tuple[list[subprocess.Popen], str]:
    """The job's agents, started, and the token its processes carry."""
    token, port = f"cvtorchrun-{uuid.uuid4().hex}", _port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "CLAIRVOYANT_NODE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra_env)
    agents = [subprocess.Popen([str(TORCHRUN), "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
                                "--node-rank", str(i), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                f"127.0.0.1:{port}", "--rdzv-id", token, str(SCRIPT), dataset, str(tmp_path), cap,
                                str(epochs), mode, when, token, str(first)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
              for i in range(nodes)]
    return agents, token


def _result(procs: list[subprocess.Popen], token: str, timeout: float) -> dict:
    """Rank 0's JSON line, once every process ended well (any left after ``timeout`` is killed with
    what it started); none of the job's processes left behind."""
    deadline, outs = time.monotonic() + timeout, []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in outs)
    time.sleep(0.5)
    assert ours(token) == []   # no rank left behind
    return json.loads([ln for out, _ in outs for ln in out.splitlines() if ln.startswith("{")][-1])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("when", ["before", "after"])
def test_torchrun_two_nodes_read_the_store_about_once_per_job(dataset, tmp_path, when):
    """2 nodes x 2 ranks, each node's tier 60% of the data set (120% together), 4 epochs: the
    store is read at most 1.1 times the data set over the job, every sample once per epoch, and
    later epochs' samples come from the other node's tier. The Loader is made before the process
    group (``before``: torchrun's agent store, as under Lightning) or after it (its store).
    Control: the same job with cluster=False (each node alone) reads the store about 2 times."""
    on = run(dataset, tmp_path / "on", 2, 2, "60%", 4, "auto", when)
    n = on["samples"]
    print("store opens per epoch:", on["opens"])
    assert all(on["exact"]), on["exact"]
    assert sum(on["opens"]) <= 1.1 * n, on["opens"]
    peer = sum((r["cluster"] or {}).get("hits", 0) for r in on["ranks"])
    assert peer >= 0.5 * n, on["ranks"]   # served by the other node's tier
    assert all("ZeroMQ" in (r["cluster"] or {}).get("transport", "") for r in on["ranks"]), on["ranks"]
    if when == "before":
        off = run(dataset, tmp_path / "off", 2, 2, "60%", 4, "off", when)
        assert all(off["exact"]), off["exact"]
        print("node by node:", off["opens"])
        assert sum(off["opens"]) >= 1.6 * n, off["opens"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("auth", ["on", "off"])
def test_an_outsider_beside_a_torchrun_job_receives_no_sample(dataset, tmp_path, auth):
    """2 nodes x 2 ranks at 60%, paused after the first epoch: an outsider that knows the wire
    finds the ports the job's ranks listen on (those that greet as ZeroMQ does), connects to each
    as every rank (plain, and with CURVE keys of its own) and asks for every sample. With the
    defaults it receives no byte of any sample, the job counts the handshakes it refused, and the
    next epoch still serves every sample once. Control (``CLAIRVOYANT_PEER_AUTH=off``): the
    outsider receives samples, the source's bytes."""
    from outsider import ask_for_every_sample, listening_ports, speaks_zmtp, with_word
    agents, token = start(dataset, tmp_path, 2, 2, "60%", 2, CLAIRVOYANT_TEST_PAUSE="6",
                          CLAIRVOYANT_PEER_AUTH=auth)
    try:
        deadline = time.monotonic() + 150
        while not (tmp_path / "probe-now").exists() and time.monotonic() < deadline \
                and all(a.poll() is None for a in agents):
            time.sleep(0.2)
        assert (tmp_path / "probe-now").exists(), "the job did not finish its first epoch"
        agents_ = with_word(ours(token), b"--rdzv-endpoint")
        ranks = [p for p in ours(token) if p not in agents_]
        ports = [p for p in listening_ports(ranks) if speaks_zmtp(p)]
        got = ask_for_every_sample(ports, 4, 96)
    finally:
        out = _result(agents, token, 200)
    assert len(ports) == 4, ports   # one peer service per rank
    assert all(out["exact"]), out["exact"]   # the job's epochs: every sample once
    files = {Path(r, f).read_bytes() for r, _, fs in os.walk(dataset) for f in fs}
    if auth == "on":
        assert got == [], f"{len(got)} answers leaked"
        assert sum((r["cluster"] or {}).get("refused_keys", 0) for r in out["ranks"]) >= 4, out["ranks"]
        assert all("CURVE" in (r["cluster"] or {}).get("transport", "") for r in out["ranks"]), out["ranks"]
    else:
        assert got and set(got) <= files, len(got)   # the control: samples leak


@pytest.mark.timeout(600)
def test_torchrun_four_nodes_at_30_percent_read_the_store_about_once(dataset, tmp_path):
    """4 nodes x 1 rank, each node's tier 30% of the data set (120% together), 4 epochs: the store
    is read at most 1.05 times the data set over the job, every sample once per epoch."""
    on = run(dataset, tmp_path, 4, 1, "30%", 4)
    print("store opens per epoch:", on["opens"])
    assert all(on["exact"]), on["exact"]
    assert sum(on["opens"]) <= 1.05 * on["samples"], on["opens"]


def run_plain(dataset: str, tmp_path: Path, nodes: int, per_node: int, cap: str, epochs: int,
              timeout: float = 200) -> dict:
    """The same job started without torchrun, as Lightning's own launcher or ``srun`` starts it:
    each process given RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
    no agent store; the Loader is made before the process group."""
    token, port = f"cvplain-{uuid.uuid4().hex}", _port()
    procs = []
    for rank in range(nodes * per_node):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC") and k != "CLAIRVOYANT_NODE"}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RANK=str(rank), WORLD_SIZE=str(nodes * per_node),
                   LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), dataset, str(tmp_path), cap, str(epochs), "auto",
                                       "before", token], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env, start_new_session=True))
    return _result(procs, token, timeout)


@pytest.mark.timeout(600)
def test_a_loader_made_before_the_group_without_torchrun_forms_the_cluster_at_its_first_pass(dataset, tmp_path):
    """Lightning's own launcher (or srun) starts each rank with the job's variables but no
    rendezvous store, and Lightning starts the process group in Trainer.fit, after the Loader is
    made: the cluster forms at the first pass, through the group's store. 2 nodes x 2 ranks at 60%,
    4 epochs: the store read once, every sample once per epoch. (The control, each node alone,
    reads it 1.99 times: the first test.)"""
    out = run_plain(dataset, tmp_path, 2, 2, "60%", 4)
    print("store opens per epoch:", out["opens"])
    assert all(out["exact"]), out["exact"]
    assert sum(out["opens"]) <= 1.1 * out["samples"], out["opens"]
    assert all("ZeroMQ" in (r["cluster"] or {}).get("transport", "") for r in out["ranks"]), out["ranks"]


@pytest.mark.timeout(600)
def test_a_job_restarted_on_three_of_its_four_nodes_reuses_their_tiers(dataset, tmp_path):
    """4 nodes x 1 rank at 30% run epochs 0-1; the job restarts on 3 of them (the same local
    directories) at epoch 2, as an elastic restart after a node's loss does: their tiers are the
    new run's homes for what they hold, so epoch 2 reads from the store about the lost node's share
    (a quarter) and epoch 3 about what 3 tiers of 30% cannot hold; every sample once per epoch.
    Control: the same 3 nodes with empty tiers read far more (each epoch at least 0.4 of the data)."""
    first = run(dataset, tmp_path / "job", 4, 1, "30%", 2)
    assert all(first["exact"]) and first["opens"][1] == 0, first["opens"]
    total = first["bytes"][0]   # epoch 0 read the data set once
    again = run(dataset, tmp_path / "job", 3, 1, "30%", 2, first=2)
    fresh = run(dataset, tmp_path / "fresh", 3, 1, "30%", 2, first=2)
    print("bytes from the store, epochs 2-3: restarted", again["bytes"], "fresh tiers", fresh["bytes"], "of", total)
    assert all(again["exact"]) and all(fresh["exact"])
    assert again["bytes"][0] <= 0.35 * total and again["bytes"][1] <= 0.25 * total, again["bytes"]
    assert fresh["bytes"][0] >= 0.9 * total and fresh["bytes"][1] >= 0.4 * total, fresh["bytes"]   # control
