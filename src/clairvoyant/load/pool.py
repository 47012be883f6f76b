"""MECHANISM: the reader worker processes, their pipes and their shared slots.

Workers are forked before any staging thread starts. Each has ``slots`` shared
buffers; a batch occupies one until the training process has copied it out.
A worker that dies is noticed through its process sentinel at once.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from multiprocessing.connection import Connection, wait
from dataclasses import replace

from ..errors import ConfigError
from .transport import Slot
from .worker import ReaderSpec, worker_main


class Worker:
    def __init__(self, wid: int, process: mp.process.BaseProcess, conn: Connection, slots: list[Slot]) -> None:
        self.wid, self.process, self.conn, self.slots = wid, process, conn, slots
        self.free = list(range(len(slots)))

    def describe_exit(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"


class WorkerPool:
    def __init__(self, num_workers: int, slots_per_worker: int, spec: ReaderSpec, mp_context: str = "fork") -> None:
        if mp_context != "fork":
            raise ConfigError(
                f"mp_context={mp_context!r} is not supported yet: reader workers share batch buffers by fork; "
                "use the default 'fork' (Linux)")
        ctx = mp.get_context(mp_context)
        self.workers: list[Worker] = []
        try:
            for wid in range(num_workers):
                slots = [Slot() for _ in range(slots_per_worker)]
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=worker_main, args=(wid, child, slots, replace(spec, num_workers=num_workers)),
                                   name=f"clairvoyant-reader-{wid}", daemon=True)
                proc.start()
                child.close()
                self.workers.append(Worker(wid, proc, parent, slots))
        except BaseException:
            self.close()
            raise

    def wait(self, timeout: float) -> list:
        """Connections with a message and sentinels of workers that exited."""
        handles = [w.conn for w in self.workers] + [w.process.sentinel for w in self.workers]
        return wait(handles, timeout)

    def close(self, timeout: float = 5.0) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in self.workers:
            w.process.join(timeout)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout)
            w.conn.close()
            for s in w.slots:
                s.close()
            w.process.close()
        self.workers = []
