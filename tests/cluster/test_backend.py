"""cluster/job.py's choice of the cluster's backend and of when it forms, from what the launcher
gives. Each case has its control."""

from __future__ import annotations

import pytest

from clairvoyant.cluster import job as cluster

pytest.importorskip("torch")
pytest.importorskip("zmq")

TORCHRUN = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}


@pytest.fixture
def env(monkeypatch):
    for var in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_NNODES",
                "CLAIRVOYANT_NODE", "TORCHELASTIC_USE_AGENT_STORE", *TORCHRUN):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_one_node_runs_alone_and_several_under_torchrun_join_through_its_store(env):
    """One node: no cluster. Several under torchrun (its agent store): the store backend, at once.
    Control: the same variables without the agent store: the cluster is put off to the first pass
    (Lightning starts the process group after the Loader is made)."""
    assert cluster.wanted("auto") is False
    for k, v in TORCHRUN.items():
        env.setenv(k, v)
    assert cluster.multi_node()
    assert cluster.wanted("auto") == "later"                        # control: no store yet
    env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert cluster.backend() == "store" and cluster.wanted("auto") is True
    assert cluster.wanted(False) is False


def test_a_cluster_put_off_warns_or_refuses_when_no_group_came(env, caplog):
    """At the first pass without a process group: cluster="auto" warns and runs node by node;
    cluster=True is a ConfigError saying what to do. Control: the warning names the way out."""
    from clairvoyant.errors import ConfigError
    with caplog.at_level("WARNING", logger="clairvoyant"):
        assert cluster.formed_late(bytes(32)) is None
    assert "init_process_group" in caplog.text and "cluster=False" in caplog.text
    with pytest.raises(ConfigError, match="cluster=True"):
        cluster.formed_late(bytes(32), insist=True)


def test_a_loader_joins_now_later_or_never_and_at_its_own_place(env, monkeypatch):
    """Joining: one node: never (the plan's fingerprint not even computed); torchrun without its
    store yet: at the first pass, asked once; a cluster whose rank differs from the Loader's is
    closed and refused, naming both. Control: at the same place it is the Loader's."""
    from types import SimpleNamespace

    from clairvoyant.errors import ConfigError
    computed = []

    def fingerprint() -> bytes:
        computed.append(1)
        return bytes(32)
    never = cluster.Joining("auto", fingerprint)
    assert not never.pending and never.now(None) is None and never.at_first_pass(None) is None and computed == []
    for k, v in TORCHRUN.items():
        env.setenv(k, v)
    closed = []
    made = SimpleNamespace(rank=1, world_size=4, close=lambda: closed.append(1))
    monkeypatch.setattr(cluster, "formed_late", lambda fp, insist=False: made)
    later = cluster.Joining("auto", fingerprint)
    assert later.pending and later.now(None) is None and computed == [1]
    with pytest.raises(ConfigError, match="rank 1 of 4 but the loader has rank 0 of 4"):
        later.at_first_pass(SimpleNamespace(rank=0, world_size=4))
    assert closed == [1] and not later.pending and later.at_first_pass(None) is None   # asked once
    again = cluster.Joining("auto", fingerprint)
    assert again.at_first_pass(SimpleNamespace(rank=1, world_size=4)) is made and closed == [1]   # control


def test_the_ranks_of_a_restarted_round_gather_under_the_same_keys(monkeypatch):
    """torchrun restarts every node's workers when one fails, but only the failing node's agent
    counts a restart (``TORCHELASTIC_RESTART_COUNT`` 1 there, 0 elsewhere): the ranks of the new
    round must still meet. Two ranks over one store, their counts differing, gather each other's
    bytes. Control: ranks of different runs (``TORCHELASTIC_RUN_ID``) do not meet (a PeerLost)."""
    import threading

    pytest.importorskip("torch")
    import torch.distributed as dist

    import itertools

    from clairvoyant.cluster import store as store_mod
    from clairvoyant.cluster.store import StoreGroup
    from clairvoyant.errors import PeerLost

    monkeypatch.setattr(store_mod, "_groups", itertools.repeat(0))   # (both ranks in this one process)

    def gather(envs, timeout):
        store = dist.HashStore()
        got: list = [None, None]

        def one(r):
            try:
                got[r] = StoreGroup(store, r, 2, timeout=timeout, env=envs[r]).allgather(bytes([r]), "a test")
            except PeerLost as e:
                got[r] = e
        threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return got

    same_run = [{"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": c} for c in ("1", "0")]
    assert gather(same_run, 20) == [[b"\0", b"\1"]] * 2
    other_runs = [{"TORCHELASTIC_RUN_ID": r} for r in ("a", "b")]
    assert all(isinstance(g, PeerLost) for g in gather(other_runs, 1))


def test_a_round_never_reads_what_an_interrupted_round_left(monkeypatch):
    """torchrun keeps its store across a restarted job's rounds: a gather the first round began and
    never finished (rank 1 set its bytes, rank 0 was lost) must not be read by the next round, whose
    rank 0 would otherwise take rank 1's old bytes at once. Control: the first round's gather itself
    fails (PeerLost), as it must."""
    import itertools
    import threading
    import time

    pytest.importorskip("torch")
    import torch.distributed as dist

    from clairvoyant.cluster import store as store_mod
    from clairvoyant.cluster.store import StoreGroup
    from clairvoyant.errors import PeerLost

    monkeypatch.setattr(store_mod, "_groups", itertools.repeat(0))   # (every rank in this one process)
    store, env = dist.HashStore(), {"TORCHELASTIC_RUN_ID": "j"}
    first = [StoreGroup(store, r, 2, timeout=0.5, env=env) for r in range(2)]
    with pytest.raises(PeerLost):
        first[1].allgather(b"old1", "a test")   # rank 0 of that round never came
    again = [StoreGroup(store, r, 2, timeout=20, env=env) for r in range(2)]
    got: list = [None, None]

    def one(r: int) -> None:
        got[r] = again[r].allgather(b"new%d" % r, "a test")
    t = threading.Thread(target=one, args=(0,))
    t.start()
    time.sleep(0.3)   # rank 0 waits first: an old key would answer it now
    one(1)
    t.join(30)
    assert got == [[b"new0", b"new1"]] * 2, got


@pytest.mark.parametrize("launcher, spans, alone", [
    ({"JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_SIZE": "6"}, True, {"JSM_NAMESPACE_LOCAL_SIZE": "12"}),
    ({"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)"}, True, {"SLURM_NTASKS_PER_NODE": "8"}),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, True, {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}),
])
def test_every_launcher_the_layout_knows_says_whether_the_job_spans_nodes(env, launcher, spans, alone):
    """The launchers' variables are written down once (cluster/topology.py): the layout and the
    cluster's "more than one node?" read the same tuple. Control: the node holds every rank."""
    for k in ("JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_SIZE", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
              "OMPI_COMM_WORLD_LOCAL_SIZE"):
        env.delenv(k, raising=False)
    for k, v in launcher.items():
        env.setenv(k, v)
    assert cluster.multi_node() is spans
    for k, v in alone.items():
        env.setenv(k, v)
    assert cluster.multi_node() is False


def test_a_rank_absent_from_an_exchange_is_named_lost_or_stuck_by_the_one_probe(monkeypatch):
    """The Loader's cluster (cluster/job.py ``Cluster``): rank 1 does not take part in an epoch's
    exchange. While its peer service answers, the PeerLost says it is alive but stuck; once its
    service is gone, that it is lost (the one probe, cluster/peers.py, and the one decision,
    plan/membership.py, the mounts' too). Control: with rank 1 taking part, the values come."""
    import itertools
    import pickle
    import threading

    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    import torch.distributed as dist

    from clairvoyant.cluster import store as store_mod
    from clairvoyant.cluster.job import Cluster
    from clairvoyant.cluster.members import Members
    from clairvoyant.cluster.store import StoreGroup
    from clairvoyant.errors import PeerLost
    from test_wire_zmq import _services

    monkeypatch.setattr(store_mod, "_groups", itertools.repeat(0))   # (both ranks in this one process)
    services = _services(2, lambda r: (lambda i: None))
    store, env = dist.HashStore(), {"TORCHELASTIC_RUN_ID": "j"}

    def cluster(rank: int, timeout: float) -> Cluster:
        c = object.__new__(Cluster)   # (its members: a store's group and a service of this process)
        c.members = Members(rank, 2, None, StoreGroup(store, rank, 2, timeout=timeout, env=env))
        c.members.service, c.group = services[rank], c.members.group
        return c
    try:
        both = [cluster(r, 20) for r in range(2)]
        got: list = [None, None]
        threads = [threading.Thread(target=lambda r=r: got.__setitem__(r, both[r]._allgather_int(r + 5)))
                   for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [g.tolist() for g in got] == [[5, 6], [5, 6]]   # control
        with pytest.raises(PeerLost) as stuck:
            cluster(0, 0.5)._allgather_int(5)
        assert stuck.value.ranks == (1,) and "rank(s) [1] answer probes: alive" in str(stuck.value)
        services[1].close()
        with pytest.raises(PeerLost) as lost:
            cluster(0, 0.5)._allgather_int(5)
        assert lost.value.ranks == (1,) and "rank(s) [1] answer no probe: lost" in str(lost.value)
        again = pickle.loads(pickle.dumps(lost.value))   # (across processes it keeps its ranks)
        assert again.ranks == (1,) and str(again) == str(lost.value)
    finally:
        for s in services:
            s.close()
