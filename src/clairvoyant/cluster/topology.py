"""MECHANISM: where this process sits: rank, world size and the ranks of its node, found out and
given as the one layout type (plan/layout.py ``NodeLayout``).

The truth, in order: arguments given to the Loader; an initialised
``torch.distributed`` process group (what Lightning, Accelerate and torchrun
jobs train with: Lightning's DDP launcher sets ``LOCAL_RANK`` and
``WORLD_SIZE`` but no ``RANK``); the launcher's variables (torchrun, Open MPI,
MPICH, SLURM); else a single process. Launcher variables that describe a
multi-process job other than the process group's are an error naming both,
never a silent choice. The node layout under a process group comes from
``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` when both are set, else from one exchange
of node names over the group (``CLAIRVOYANT_NODE`` or the host name).
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Mapping

from ..errors import ConfigError
from ..plan.layout import NodeLayout


# (rank, world size, local rank, ranks on this node) variables, most specific launcher first.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),                   # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),                                             # Open MPI
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),             # MPICH / Intel MPI
    ("JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK",
     "JSM_NAMESPACE_LOCAL_SIZE"),                                               # LSF's jsrun (Summit, Sierra)
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # srun
)


def _launcher(env: Mapping[str, str]) -> tuple[str, str, str, str] | None:
    for names in _LAUNCHERS:
        if names[0] in env and names[1] in env:
            return names
    return None


def _node_count(value: str) -> int:
    """A launcher's count of this node's ranks (SLURM writes e.g. "4(x2)" or "4,2": the first is this node's)."""
    return int(value.split("(")[0].split(",")[0])


def spans_nodes(env: Mapping[str, str]) -> bool | None:
    """Whether the launcher's variables say the job has more ranks than this node (None: no
    launcher says how many ranks a node has)."""
    for names in _LAUNCHERS:
        if names[1] in env and names[3] in env:
            try:
                return int(env[names[1]]) > _node_count(env[names[3]])
            except ValueError:
                return False
    return None


def detect(env: Mapping[str, str] | None = None) -> NodeLayout:
    """The first launcher whose variables are set wins; none set means a single process."""
    env = os.environ if env is None else env
    names = _launcher(env)
    if names is None:
        return NodeLayout(((0,),), 0, "single process")
    rank_var, size_var, local_var, local_size_var = names
    try:
        rank, size = int(env[rank_var]), int(env[size_var])
        local = int(env.get(local_var, "0"))
        local_size = _node_count(env.get(local_size_var, "1"))
    except ValueError as e:
        raise ConfigError(f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r} are not integers") from e
    return validate(rank, size, local, local_size, origin=f"{rank_var}/{size_var}")


def process_group() -> tuple[int, int] | None:
    """(rank, world size) of the initialised default ``torch.distributed`` process group, else None
    (torch not installed, not built with distributed support, or no group initialised yet)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def resolve(env: Mapping[str, str] | None = None) -> NodeLayout:
    """This process's place in the job, from the process group if one is initialised (checked
    against the launcher's variables), else from the variables (``detect``). Never a collective
    call: under a group without the node's variables the layout is this rank alone until
    ``cluster/members.gather_over_group`` (the Loader's first pass) says otherwise."""
    env = os.environ if env is None else env
    group = process_group()
    if group is None:
        return detect(env)
    rank, size = group
    _check_agrees(env, rank, size)
    local = local_from_env(env, rank, size)
    if local is not None:
        return validate(rank, size, *local, origin="torch.distributed")
    return validate(rank, size, 0, 1, origin="torch.distributed")


def _check_agrees(env: Mapping[str, str], rank: int, size: int) -> None:
    """Variables that describe a multi-process job must describe the process group's."""
    names = _launcher(env)
    claims: list[tuple[str, str, int]] = []
    if names is not None:
        claims = [(names[0], env[names[0]], rank), (names[1], env[names[1]], size)]
    elif "WORLD_SIZE" in env:   # Lightning's launcher sets WORLD_SIZE and LOCAL_RANK, not RANK
        claims = [("WORLD_SIZE", env["WORLD_SIZE"], size)]
    try:
        told = {var: int(value) for var, value, _ in claims}
    except ValueError:
        told = {}
    if not claims or (names is not None and told.get(names[1]) == 1):
        return   # no launcher, or a launcher of one process that started a group of its own
    wrong = [(var, value) for var, value, truth in claims if told.get(var) != truth]
    if wrong:
        said = ", ".join(f"{var}={value!r}" for var, value in wrong)
        raise ConfigError(
            f"torch.distributed says rank {rank} of {size} but the environment says {said}: the launcher "
            "and the process group disagree; fix the launcher's variables, or pass rank= and world_size= "
            "to the Loader")


def local_from_env(env: Mapping[str, str], rank: int, size: int) -> tuple[int, int] | None:
    """(local rank, ranks on the node) from torchrun's ``LOCAL_*``, or from the variables of a
    launcher that agrees with the group (Open MPI, MPICH, srun); None if none says."""
    if "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        try:
            return int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        except ValueError as e:
            raise ConfigError(f"LOCAL_RANK={env['LOCAL_RANK']!r} / LOCAL_WORLD_SIZE={env['LOCAL_WORLD_SIZE']!r} "
                              "are not integers") from e
    for names in _LAUNCHERS[1:]:
        if all(v in env for v in names):
            t = detect({v: env[v] for v in names})
            if (t.rank, t.world_size) == (rank, size):
                return int(env[names[2]]) if names[2] in env else 0, t.local_world_size
    return None


def node_name() -> str:
    """This node's name: ``CLAIRVOYANT_NODE`` if set (to split one machine into nodes), else the host name."""
    return os.environ.get("CLAIRVOYANT_NODE") or socket.gethostname()


def digest63(data: bytes) -> int:
    """A non-negative int64 digest of ``data``, for exchanging names and fingerprints as tensors."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1


def validate(rank: int, world_size: int, local_rank: int = 0, local_world_size: int = 1, *,
             origin: str = "given") -> NodeLayout:
    """The layout a launcher's numbers describe: ranks in node blocks of ``local_world_size``. The
    launcher's ``local_rank`` is not kept: a rank's place on its node follows from the blocks (as
    the plan has always taken it)."""
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
    if not 1 <= local_world_size <= world_size:
        raise ConfigError(f"local_world_size (ranks per node) must be in [1, {world_size}], got {local_world_size}")
    return NodeLayout.blocks(world_size, local_world_size, rank=rank, origin=origin)
