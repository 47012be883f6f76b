"""Rank and world size come from the process group, else from the launcher's variables."""

from __future__ import annotations

import json
import os
import re

import pytest

from clairvoyant import ConfigError
from clairvoyant.cluster.topology import detect
from clairvoyant.cluster.topology import validate as Topology


@pytest.mark.parametrize("env, expected", [
    ({}, Topology(0, 1, 0)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, Topology(3, 8, 1)),             # torchrun
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, Topology(3, 8, 1, 4)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_NTASKS_PER_NODE": "4(x2)"}, Topology(5, 8, 1, 4)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
      "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, Topology(5, 6, 2)),                               # Open MPI
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, Topology(1, 2, 0)),                                # MPICH
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"}, Topology(7, 16, 3)),  # srun
    ({"JSM_NAMESPACE_RANK": "5", "JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_RANK": "1",
      "JSM_NAMESPACE_LOCAL_SIZE": "6"}, Topology(5, 12, 1, 6)),                             # LSF's jsrun
    # torchrun inside a SLURM allocation: the launcher that started this process wins
    ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "9", "SLURM_NTASKS": "32"}, Topology(0, 2, 0)),
])
def test_detect(env, expected):
    assert detect(env) == expected


@pytest.mark.parametrize("env", [{"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"},
                                 {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}])
def test_bad_variables(env):
    with pytest.raises(ConfigError):
        detect(env)


def test_loader_takes_the_launcher_split(dataset, tmp_path, monkeypatch):
    from clairvoyant import Loader
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with Loader(dataset, batch_size=4, local_dir=tmp_path) as ld:
        assert (ld.rank, ld.world_size, len(ld)) == (1, 3, 8)


# -- the torch.distributed process group ------------------------------------------------------------

@pytest.fixture
def group(tmp_path):
    """A gloo process group of one process (world size 1), destroyed after the test."""
    import torch.distributed as dist
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_without_a_group_the_variables_rule():
    from clairvoyant.cluster.topology import process_group, resolve
    assert process_group() is None
    assert resolve({"RANK": "1", "WORLD_SIZE": "2"}) == Topology(1, 2, 0)


def test_the_group_wins_over_lightnings_partial_variables(group):
    """Lightning's launcher sets WORLD_SIZE and LOCAL_RANK but no RANK: the group is the truth."""
    from clairvoyant.cluster.topology import resolve
    t = resolve({"LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    assert (t.rank, t.world_size, t.origin) == (0, 1, "torch.distributed")
    # control: the variables alone (no group) would say another world size
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}).origin == "RANK/WORLD_SIZE"


@pytest.mark.parametrize("env, named", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, "RANK='1', WORLD_SIZE='2'"),
    ({"WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "WORLD_SIZE='4'"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"}, "OMPI_COMM_WORLD_SIZE='3'"),
])
def test_variables_that_contradict_the_group_are_an_error_naming_both(group, env, named):
    from clairvoyant.cluster.topology import resolve
    with pytest.raises(ConfigError, match=r"torch.distributed says rank 0 of 1.*" + re.escape(named)):
        resolve(env)


def test_a_launcher_of_one_process_may_start_a_group_of_its_own(group):
    from clairvoyant.cluster.topology import resolve
    assert resolve({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).origin == "torch.distributed"


def test_a_loader_follows_a_group_started_after_it(dataset, tmp_path, monkeypatch):
    """Made under variables that say rank 1 of 3; a group of one process appears before the first
    pass (as Lightning's does inside fit): the Loader takes the group's numbers."""
    import torch.distributed as dist
    from clairvoyant import Loader
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    with Loader(dataset, batch_size=4, local_dir=tmp_path / "l", num_workers=1) as ld:
        assert (ld.rank, ld.world_size, len(ld)) == (1, 3, 8)     # control: before the group
        monkeypatch.setenv("SLURM_NTASKS", "1")
        monkeypatch.setenv("SLURM_PROCID", "0")
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
        try:
            assert (ld.rank, ld.world_size, len(ld)) == (0, 1, 24)
            assert sum(len(y) for _, y in ld) == 96
            assert ld.topology.origin == "torch.distributed"
        finally:
            dist.destroy_process_group()


_EXCHANGE = """
import json, os, sys
import torch.distributed as dist
from clairvoyant.cluster.members import gather_over_group
from clairvoyant.cluster.topology import NodeLayout, digest63
rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 4), rank=rank, world_size=4)
rows = gather_over_group([digest63(sys.argv[3 + rank].encode())])
t = NodeLayout.from_names([r[0] for r in rows], rank=rank)
print(json.dumps([rank, 4, t.local_rank, t.local_world_size]))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("nodes, expected", [
    ("aabb", [[0, 4, 0, 2], [1, 4, 1, 2], [2, 4, 0, 2], [3, 4, 1, 2]]),
    ("aaaa", [[0, 4, 0, 4], [1, 4, 1, 4], [2, 4, 2, 4], [3, 4, 3, 4]]),
    ("abab", None),   # a node's ranks not in one block: refused
])
def test_the_node_layout_is_exchanged_over_the_group(tmp_path, nodes, expected):
    """No LOCAL_WORLD_SIZE (Lightning sets none): every rank's node name is gathered over the group."""
    from clairvoyant.cluster.topology import NodeLayout
    with pytest.raises(ConfigError, match=r"ranks \[0, 2\] share a node"):   # the pure half, on its own
        NodeLayout.from_names([7, 8, 7, 9])
    t = NodeLayout.from_names([7, 7, 8, 8, 8], rank=4)
    assert (t.local_rank, t.local_world_size) == (2, 3)
    import subprocess
    import sys
    script = tmp_path / "x.py"
    script.write_text(_EXCHANGE)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), *nodes],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(4)]
    outs = [p.communicate(timeout=100) for p in procs]
    if expected is None:   # every rank raises alike: none goes on into a collective alone
        assert all(p.returncode != 0 for p in procs)
        assert all("not consecutive" in err for _, err in outs)
    else:
        assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
        assert [json.loads(out) for out, _ in outs] == expected


_TWO = """
import os, sys, time
import torch.distributed as dist
from clairvoyant import ConfigError, Loader
rank, store, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
from clairvoyant.cluster import members
members.GATHER_TIMEOUT = 3.0
src = sys.argv[4 + rank] if mode == "differ" else sys.argv[4]
if mode == "alone" and rank == 1:   # makes no Loader: rank 0 must not hang
    time.sleep(6)
    os._exit(0)
import numpy as np
with Loader(src, batch_size=4, local_dir=sys.argv[6] + str(rank), num_workers=1, output="numpy",
            decode=lambda b: np.frombuffer(b, np.uint8).copy()) as ld:
    try:
        n = sum(len(y) for _, y in ld)
        print("drew", n, ld.topology.local_world_size, flush=True)
    except ConfigError as e:
        print("ConfigError", e, flush=True)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["same", "differ", "alone"])
def test_the_ranks_compare_their_manifests_once_and_a_missing_rank_is_an_error(tmp_path, mode):
    """Two ranks under a gloo group: the same data set gives each half (control); data sets that
    differ (the source changed between the ranks' starts) stop both with an error naming them;
    a rank that makes no Loader leaves the other with an error after the exchange's time-out."""
    import subprocess
    import sys
    for name, n in (("a", 8), ("b", 9)):
        (tmp_path / name).mkdir()
        for i in range(n):
            (tmp_path / name / f"{i}.bin").write_bytes(bytes([i]) * 4)
    script = tmp_path / "two.py"
    script.write_text(_TWO)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), mode, str(tmp_path / "a"),
                               str(tmp_path / "b"), str(tmp_path / "local")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = [p.communicate(timeout=100)[0] for p in procs]
    if mode == "same":
        assert outs == ["drew 4 2\n", "drew 4 2\n"], outs   # a half each; one node of two ranks
    elif mode == "differ":
        assert all("do not agree" in o for o in outs), outs
    else:
        assert "did not hear from every other rank" in outs[0], outs
