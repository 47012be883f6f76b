"""Rank and world size come from the launcher's variables."""

from __future__ import annotations

import pytest

from clairvoyant import ConfigError
from clairvoyant.dist.topology import Topology, detect


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
