"""MECHANISM: MPI for a job's nodes (cluster/job.py): whether MPI can carry the cluster here
(:func:`available`), and the job's ranks as a group (cluster/group.py) over a communicator
(:class:`MPIGroup`: non-blocking collectives watched for lost ranks and bounded by the same
``GATHER_TIMEOUT`` as the torch store's gathers, so that a rank that is alive but stuck ends
every other rank's collective with a ``PeerLost`` naming it, never a hang).

mpi4py is imported only inside the functions that need it, so clairvoyant imports without it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

from ..errors import PeerLost
from .timeouts import GATHER_TIMEOUT

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


def failed_ranks(comm: Any) -> set[int]:
    """The ranks of ``comm`` that MPI knows have failed (ULFM's ``Get_failed``; raises where this
    MPI has no ULFM)."""
    from mpi4py import MPI
    failed, mine = comm.Get_failed(), comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), mine) if failed.Get_size() else []
    finally:
        failed.Free()
        mine.Free()
    return {r for r in ranks if r != MPI.UNDEFINED}


class MPIGroup:
    """The ranks of ``comm`` as a group (cluster/group.py), on a duplicate of it (``dup``) so that its
    gathers never mix with the caller's. A gather not complete within ``timeout`` seconds
    (``GATHER_TIMEOUT``) is abandoned and every rank raises ``PeerLost``. Set by the members
    formed over it (cluster/members.py ``Members.form``): ``dead()``, the ranks known to be gone
    from elsewhere (the peer service met them), and ``behind(entered)``, the ranks that did not
    enter a gather (the one probe, asked for each rank's count of gathers entered); unset, none is
    known. ``entered``: the gathers this rank has entered."""

    name = "MPI"

    def __init__(self, comm: Any, dup: bool = True, *, timeout: float | None = None) -> None:
        self.comm = comm.Dup() if dup else comm
        self._own = dup
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.dead: Callable[[], set[int]] = set
        self.behind: Callable[[int], list[int]] = lambda entered: []
        self.timeout = GATHER_TIMEOUT if timeout is None else float(timeout)
        self.entered = 0
        self.abandoned = False   # a collective was left unfinished: the communicator is not freed

    def allgather(self, blob: bytes, what: str) -> list[bytes]:
        from mpi4py import MPI
        self.entered += 1
        deadline = time.monotonic() + self.timeout   # (the whole gather: its two collectives)
        counts = np.zeros(self.size, np.int64)
        self._collective(what, deadline, "Iallgather", np.array([len(blob)], np.int64), counts)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        out = np.zeros(int(counts.sum()), np.uint8)
        self._collective(what, deadline, "Iallgatherv", np.frombuffer(bytes(blob), np.uint8), [out, counts, displs, MPI.BYTE])
        return [out[d:d + c].tobytes() for d, c in zip(displs.tolist(), counts.tolist())]

    def _collective(self, what: str, deadline: float, name: str, *args: object) -> None:
        """A non-blocking MPI collective, waited for while watching for lost ranks: a rank that
        knows of one (its peer service met the death, or MPI's failure detector did) revokes the
        communicator, so that every rank's collective ends at once instead of hanging (ULFM,
        ``mpirun --with-ft ulfm``; plain MPI ends the job), and each raises ``PeerLost`` saying
        what to do. Past ``deadline`` the collective is abandoned (revoked where ULFM is there) and
        the ranks that did not enter it are named (``behind``)."""
        from mpi4py import MPI
        revoked_at = None
        dead = self.known_dead()
        if dead:   # known already (the peer service met it): start nothing that cannot finish
            raise self._lost(what, dead, "")
        try:
            req = getattr(self.comm, name)(*args)
            pause = 0.0005
            while not req.Test():
                if revoked_at is None and self.known_dead():
                    self._revoke()   # the others' collectives end too; this one ends with an error
                    revoked_at = time.monotonic()
                elif revoked_at is not None and time.monotonic() - revoked_at > 10.0:
                    break            # abandoned: MPI never ended it
                elif revoked_at is None and time.monotonic() > deadline:
                    self.abandoned = True   # (the request stays with the communicator, which is not freed)
                    self._revoke()
                    absent = sorted(set(self.behind(self.entered)) | set(self.known_dead()))
                    raise self._lost(what, absent, f"not complete within {self.timeout:.0f} s")
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        except MPI.Exception as e:
            self._revoke()
            self.abandoned = True
            raise self._lost(what, self.known_dead(), f"MPI: {e.Get_error_string().strip()}") from e
        if revoked_at is not None:
            self.abandoned = True
            raise self._lost(what, self.known_dead(), "")

    def known_dead(self) -> list[int]:
        """Ranks this rank knows are gone: ``dead()``'s, and MPI's own list (ULFM)."""
        dead = set(self.dead())
        try:
            dead |= failed_ranks(self.comm)
        except Exception:   # noqa: BLE001 - no ULFM in this MPI: only the peer service's knowledge
            pass
        return sorted(dead)

    def _revoke(self) -> None:
        try:
            self.comm.Revoke()
        except Exception:   # noqa: BLE001 - no ULFM, or revoked already
            pass

    def _lost(self, what: str, dead: list[int], detail: str) -> PeerLost:
        return PeerLost.of_gather(dead, self.size, f"can no longer take part in {what} on rank {self.rank}"
                                  f"{f' ({detail})' if detail else ''}", ". End this process with os._exit() or "
                                  "comm.Abort(): Open MPI's MPI_Finalize can wait forever for a dead rank")

    def close(self) -> None:
        if not self._own or self.comm is None:
            return
        try:
            if not self.abandoned and not self.known_dead():
                self.comm.Free()
        except Exception:   # noqa: BLE001 - MPI finalized, or the communicator revoked
            pass
        self.comm = None
