"""The job's wire to a reader (load/worker.py send_job / recv_job): RAM-window samples' bytes go
out of band, beside a small record, never as one message of a whole batch's bytes."""

from __future__ import annotations

import threading

import pytest
from multiprocessing import Pipe

from clairvoyant.load.worker import Item, Job, recv_job, send_job


def _job(n: int = 12, size: int = 200_000) -> Job:
    items = [Item(f"k{i}", None, size, i, bytes([i]) * size if i % 3 else None, i % 3 == 0) for i in range(n)]
    return Job(7, 1, items, False)


def _sent(send) -> list[bytes]:
    """The raw messages that ``send(conn)`` puts on a pipe, read as they come."""
    a, b = Pipe()
    t = threading.Thread(target=lambda: (send(a), a.close()))
    t.start()
    out = []
    try:
        while True:
            out.append(b.recv_bytes())
    except EOFError:
        pass
    t.join()
    return out


def test_a_job_arrives_whole_with_its_bytes_and_none_stops():
    job = _job()
    a, b = Pipe()
    got = []
    t = threading.Thread(target=lambda: got.extend([recv_job(b), recv_job(b)]))
    t.start()
    send_job(a, job)
    send_job(a, None)
    t.join(30)
    assert got[0] == job and got[1] is None
    assert all(isinstance(it.data, bytes) for it in got[0].items if it.data is not None)


def test_the_record_carries_no_sample_bytes():
    job = _job()
    data = sum(len(it.data) for it in job.items if it.data is not None)
    msgs = _sent(lambda c: send_job(c, job))
    assert len(msgs) == 1 + sum(it.data is not None for it in job.items)   # the record, then each sample's bytes
    assert len(msgs[0]) < 4096 < data
    assert sorted(len(m) for m in msgs[1:]) == sorted(len(it.data) for it in job.items if it.data is not None)
    # control: the job pickled whole, as a plain send does, is one message holding every byte
    whole = _sent(lambda c: c.send(job))
    assert len(whole) == 1 and len(whole[0]) > data


def test_a_job_interrupted_half_way_marks_its_pipe_torn():
    """Ctrl-C between a job's messages leaves the reader waiting for bytes that never come: the
    pipe is marked torn (the pool then ends that reader instead of sending it a stop it would read
    as sample bytes). Control: a job sent whole leaves the pipe as it was."""
    from clairvoyant.load.worker import torn

    class Interrupted:
        def __init__(self, after: int) -> None:
            self.after, self.sent = after, 0

        def send_bytes(self, b) -> None:
            if self.sent == self.after:
                raise KeyboardInterrupt
            self.sent += 1

    whole, cut = Interrupted(10 ** 6), Interrupted(2)
    send_job(whole, _job())
    assert whole.sent == 1 + 8 and not torn(whole)
    try:
        send_job(cut, _job())
    except KeyboardInterrupt:
        pass
    assert cut.sent == 2 and torn(cut)
    first = Interrupted(0)   # the record itself cut (a large one is two writes)
    with pytest.raises(KeyboardInterrupt):
        send_job(first, _job())
    assert torn(first)
