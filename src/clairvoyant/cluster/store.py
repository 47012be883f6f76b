"""MECHANISM: the job's ranks as a group (cluster/group.py) over torch.distributed's key-value store,
for jobs started without MPI: torchrun (and Lightning, Accelerate and Kubernetes' PyTorchJob,
which start their ranks the same way), beside a training that uses NCCL or gloo.

Which store (:func:`job_store`): the default process group's where ``torch.distributed`` is
initialised; else the store torchrun's agent keeps for its workers (``TORCHELASTIC_USE_AGENT_STORE``
with ``MASTER_ADDR``/``MASTER_PORT``), so a Loader made before the process group (Lightning
makes the group in ``Trainer.fit``) still finds its peers. A gather sets this rank's bytes under
a key of the gather's number and waits for every rank's (``GATHER_TIMEOUT``: ranks legitimately
arrive minutes apart, at an epoch's end, after a validation); the last rank to read them deletes
them. A rank that never arrives is a ``PeerLost`` naming it and what was gathered. Keys live
under a prefix of the job's run (``TORCHELASTIC_RUN_ID``), of the group's number in this process
(each Loader's cluster is one, so a second Loader never reads another's) and of the group's
formation: torchrun's agents keep one store across the rounds of a restarted job, so a round's
ranks count themselves in (a counter per world size) and gather under ``<size>.<round>``, never
reading what an interrupted earlier round left. (Not ``TORCHELASTIC_RESTART_COUNT``: only the
agent whose worker failed counts a restart, so the ranks of one round would gather under
different keys and wait for each other for ever.) A round whose ranks did not all count
themselves in (one lost between its peers' start and its own) shifts the next round of that
size: its gathers then end as a ``PeerLost`` after the time-out.
"""

from __future__ import annotations

import datetime
import itertools
import os
from typing import Any, Mapping

from ..errors import PeerLost
from .timeouts import GATHER_TIMEOUT

_groups = itertools.count()   # groups made in this process: the n-th of every rank is one group


def job_store(env: Mapping[str, str] | None = None) -> tuple[Any, int, int] | str:
    """(store, rank, world size) of the job's rendezvous, or one line saying why there is none."""
    env = os.environ if env is None else env
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if dist.is_available() and dist.is_initialized():
        try:
            from torch.distributed.distributed_c10d import _get_default_store
            return _get_default_store(), dist.get_rank(), dist.get_world_size()
        except (ImportError, RuntimeError) as e:
            return f"torch.distributed's store cannot be had ({e})"
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        try:
            host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
            rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        except (KeyError, ValueError) as e:
            return f"torchrun's variables are incomplete ({e})"
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
        except (RuntimeError, ValueError) as e:
            return f"torchrun's store at {host}:{port} cannot be reached ({e})"
        return store, rank, size
    return ("no launcher's rendezvous: launch with torchrun (or Lightning, Accelerate), or call "
            "torch.distributed.init_process_group() before making the Loader")


class StoreGroup:
    """Rank ``rank`` of ``size`` gathering through ``store`` (module docstring)."""

    name = "torch.distributed store"

    def __init__(self, store: Any, rank: int, size: int, *, timeout: float | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        import torch.distributed as dist
        env = os.environ if env is None else env
        self.rank, self.size = int(rank), int(size)
        base = dist.PrefixStore(f"clairvoyant/{env.get('TORCHELASTIC_RUN_ID', 'job')}/{next(_groups)}", store)
        formed = (int(base.add(f"formed/{self.size}", 1)) - 1) // self.size   # this round of a group this size
        self.store = dist.PrefixStore(f"{self.size}.{formed}", base)
        self.timeout = GATHER_TIMEOUT if timeout is None else float(timeout)
        self.entered = 0   # the gathers this rank has entered (the n-th gathers under key n - 1)

    def allgather(self, blob: bytes, what: str) -> list[bytes]:
        seq, self.entered = self.entered, self.entered + 1
        keys = [f"{seq}/{r}" for r in range(self.size)]
        store = self.store
        store.set(keys[self.rank], bytes(blob))
        try:
            store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except Exception as e:   # torch's DistStoreError (a time-out) or the store itself gone
            raise self._lost(what, keys, e) from e
        got = [bytes(store.get(k)) for k in keys]
        if store.add(f"{seq}/read", 1) == self.size:   # every rank has read them: gone
            for k in [*keys, f"{seq}/read"]:
                store.delete_key(k)
        return got

    def _lost(self, what: str, keys: list[str], e: BaseException) -> PeerLost:
        try:
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
        except Exception:   # noqa: BLE001 - the store itself is gone
            missing = []
        return PeerLost.of_gather(missing, self.size, f"did not take part in {what} within {self.timeout:.0f} s "
                                  f"(rank {self.rank}; {type(e).__name__}: {e})")

    def close(self) -> None:
        self.store = None
