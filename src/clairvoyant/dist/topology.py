"""Where this process sits: rank and world size from torchrun, SLURM or MPI variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import ConfigError

# (rank, world size, local rank, ranks on this node) variables, most specific launcher first.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),                   # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),                                             # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),             # MPICH / Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # srun
)


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1   # ranks on this node (they share the node's cache tiers)


def detect(env: Mapping[str, str] | None = None) -> Topology:
    """The first launcher whose variables are set wins; none set means a single process."""
    env = os.environ if env is None else env
    for rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        if rank_var in env and size_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
                local = int(env.get(local_var, "0"))
                # SLURM writes e.g. "4(x2)": the count before the parenthesis is this node's
                local_size = int(env.get(local_size_var, "1").split("(")[0].split(",")[0])
            except ValueError as e:
                raise ConfigError(f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r} are not integers") from e
            return validate(rank, size, local, local_size)
    return Topology()


def validate(rank: int, world_size: int, local_rank: int = 0, local_world_size: int = 1) -> Topology:
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
    if not 1 <= local_world_size <= world_size:
        raise ConfigError(f"local_world_size (ranks per node) must be in [1, {world_size}], got {local_world_size}")
    return Topology(rank, world_size, local_rank, local_world_size)
