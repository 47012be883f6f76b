"""Reader processes that do not come through their fork (load/pool.py): one stuck before its
first line of Python (a lock another thread held at the fork) is killed and forked again, instead
of leaving the epoch waiting for it for ever. Control: with no second try, the error names it."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.errors import WorkerError
from clairvoyant.load import pool


def _stuck_once(flag: str):
    real = pool.worker_main

    def main(wid, conn, slots, spec):
        if wid == 0 and not os.path.exists(flag):   # the first fork of reader 0 hangs
            open(flag, "w").close()
            time.sleep(3600)
        return real(wid, conn, slots, spec)
    return main


def test_a_reader_stuck_after_its_fork_is_forked_again(dataset, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(pool, "READY_WAIT", 1.0)
    monkeypatch.setattr(pool, "worker_main", _stuck_once(str(tmp_path / "hung")))
    with caplog.at_level(logging.WARNING, "clairvoyant"):
        with Loader(dataset, batch_size=8, local_dir=str(tmp_path / "l"), num_workers=2, output="numpy",
                    decode=lambda b: np.frombuffer(b[:4], np.uint8).copy()) as L:
            n = sum(len(y) for _, y in L)
    assert n == 96 and os.path.exists(tmp_path / "hung")   # the hang happened, and the epoch came whole
    assert any("did not start" in r.getMessage() for r in caplog.records)


def test_with_no_second_try_the_stuck_reader_is_named(dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "READY_WAIT", 1.0)
    monkeypatch.setattr(pool, "FORK_TRIES", 1)
    monkeypatch.setattr(pool, "worker_main", _stuck_once(str(tmp_path / "hung")))
    with pytest.raises(WorkerError, match="reader 0 did not start"):
        with Loader(dataset, batch_size=8, local_dir=str(tmp_path / "l"), num_workers=2, output="numpy") as L:
            next(iter(L))
