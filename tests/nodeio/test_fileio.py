"""nodeio/fileio.py's one check of whether a process runs (temporary files' writers, a mount's
member and daemon)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from clairvoyant.nodeio.fileio import process_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not_even_before_it_is_reaped():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert process_alive(child.pid)   # control: running
        child.stdin.close()
        deadline = time.monotonic() + 10
        while process_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(f"/proc/{child.pid}/stat") as f:   # exited and not reaped: a zombie, still in /proc
            assert f.read().rsplit(")", 1)[-1].split()[0] == "Z"
        assert not process_alive(child.pid)
    finally:
        child.wait()
    assert not process_alive(child.pid)
