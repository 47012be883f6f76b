"""MECHANISM: MPI for the start-up of a job's nodes (dist/cluster.py): whether MPI can carry the
peer service here (:func:`available`), the ranks of each node (:func:`node_groups`), and a check
that every rank agrees on a fingerprint (:func:`agree`).

mpi4py is imported only inside the functions that need it, so clairvoyant imports without it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

import numpy as np

from ..errors import ConfigError

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")


def available() -> str | None:
    """None if the peer service can run here, else one line saying why not (for the loader's log).

    Initialises MPI (with MPI_THREAD_MULTIPLE) only when the process was started
    by an MPI launcher or MPI is already up; a process started otherwise would
    be a world of one, with no peers.
    """
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'clairvoyant[mpi]')"
    if "mpi4py.MPI" not in sys.modules and not any(v in os.environ for v in _LAUNCHER_VARS):
        return "the process was not started by an MPI launcher (mpirun, mpiexec, srun --mpi=pmix)"
    try:
        from mpi4py import MPI
    except Exception as e:  # mpi4py raises RuntimeError when it finds no MPI library
        return f"mpi4py cannot load an MPI library: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    try:
        if MPI.Is_finalized():
            return "MPI is already finalized"
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        level = MPI.Query_thread()
    except MPI.Exception as e:
        return f"MPI cannot be initialised: {e}"
    if level < MPI.THREAD_MULTIPLE:
        return (f"MPI runs at thread level {level} (< MPI_THREAD_MULTIPLE): the peer service's thread "
                "calls MPI beside the training loop")
    return None


def node_groups(comm: Any, name: str) -> list[list[int]]:
    """The ranks of each node (collective: every rank passes its node's name), nodes in the order
    of their lowest rank. Names travel as fixed-width UTF-8 bytes."""
    size = comm.Get_size()
    raw = name.encode()
    lengths = np.zeros(size, np.int64)
    comm.Allgather(np.array([len(raw)], np.int64), lengths)
    width = max(int(lengths.max()), 1)
    mine = np.zeros(width, np.uint8)
    mine[:len(raw)] = np.frombuffer(raw, np.uint8)
    names = np.zeros((size, width), np.uint8)
    comm.Allgather(mine, names)
    groups: dict[bytes, list[int]] = {}
    for r in range(size):
        groups.setdefault(names[r, :lengths[r]].tobytes(), []).append(r)
    return list(groups.values())


def agree(comm: Any, fingerprint: bytes, what: str) -> None:
    """Collective: ConfigError on every rank, naming the ranks that differ from the majority
    (a tie goes to the lowest rank's side), if the ranks' 32-byte fingerprints of ``what`` differ."""
    if len(fingerprint) != 32:
        raise ConfigError(f"a fingerprint is 32 bytes, got {len(fingerprint)}")
    size = comm.Get_size()
    everyone = np.zeros((size, 32), np.uint8)
    comm.Allgather(np.frombuffer(bytes(fingerprint), np.uint8), everyone)
    prints = [everyone[r].tobytes() for r in range(size)]
    counts = Counter(prints)
    if len(counts) == 1:
        return
    common = max(counts, key=counts.__getitem__)   # the first of the most frequent: the same on every rank
    odd = [r for r, p in enumerate(prints) if p != common]
    ranks = ", ".join(map(str, odd))
    raise ConfigError(f"{what} differs across ranks: rank{'s' if len(odd) > 1 else ''} {ranks} "
                      f"disagree{'' if len(odd) > 1 else 's'} with the other {size - len(odd)}; "
                      "start every rank with the same settings and data")
