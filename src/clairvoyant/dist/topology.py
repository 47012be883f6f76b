"""Where this process sits: rank and world size from torchrun, SLURM or MPI variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import ConfigError

# (rank variable, world-size variable, local-rank variable), most specific launcher first.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),                                       # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),                                # MPICH / Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),                          # srun
)


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def detect(env: Mapping[str, str] | None = None) -> Topology:
    """The first launcher whose variables are set wins; none set means a single process."""
    env = os.environ if env is None else env
    for rank_var, size_var, local_var in _LAUNCHERS:
        if rank_var in env and size_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
                local = int(env.get(local_var, "0"))
            except ValueError as e:
                raise ConfigError(f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r} are not integers") from e
            return validate(rank, size, local)
    return Topology()


def validate(rank: int, world_size: int, local_rank: int = 0) -> Topology:
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
    return Topology(rank, world_size, local_rank)
