"""nodeio/signals.py: a signal handler that never waits for a lock its own thread holds.

The hang it replaces is shown for real (a subprocess whose ``Event.set`` in a handler waits for
ever on the event's lock, held by the thread the handler interrupted); the flag is shown to take
a signal that lands inside its own wait."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import clairvoyant
from clairvoyant.nodeio.signals import SignalFlag

SRC = pathlib.Path(clairvoyant.__file__).parent


def _run(code: str, timeout: float) -> subprocess.CompletedProcess | None:
    """``code`` in a fresh interpreter; None if it did not end within ``timeout`` seconds."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def test_an_event_set_by_a_handler_that_interrupts_its_own_wait_hangs():
    """The failure the flag avoids, made certain: the handler runs while the main thread holds the
    event's lock (as ``Event.wait`` does for a moment): its ``set`` never returns. Control: the
    same handler with the lock free ends at once."""
    code = """
        import os, signal, threading
        ev = threading.Event()
        signal.signal(signal.SIGUSR1, lambda *a: ev.set())
        {hold}
            os.kill(os.getpid(), signal.SIGUSR1)
            x = 1   # (the handler runs at a bytecode boundary, here)
        print("ended", ev.is_set())
    """
    assert _run(code.format(hold="with ev._cond:"), 3.0) is None   # hung
    done = _run(code.format(hold="if True:"), 30.0)   # control: nothing held
    assert done is not None and done.returncode == 0 and "ended True" in done.stdout, done


def test_a_signal_inside_the_flags_wait_ends_the_wait():
    """A signal sent while the main thread waits on the flag: the wait returns True within a few
    polls and the signal is recorded. Control: no signal: the wait times out with False."""
    flag = SignalFlag()
    old = signal.getsignal(signal.SIGUSR1)
    try:
        flag.install([signal.SIGUSR1])
        assert flag.wait(0.1) is False and not flag.is_set()   # control
        killer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
        killer.start()
        t0 = time.monotonic()
        assert flag.wait(10.0) is True
        assert time.monotonic() - t0 < 2.0
        assert flag.signals == [signal.SIGUSR1]
        killer.join()
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_storm_of_signals_never_hangs_a_waiting_flag():
    """A thread sends 300 signals as fast as it can while the main thread waits on the flag again
    and again: the process ends with the flag set (signals of one kind coalesce: not each is
    counted). Control: the sender did send them all."""
    code = """
        import os, signal, threading
        from clairvoyant.nodeio.signals import SignalFlag
        flag = SignalFlag()
        flag.install([signal.SIGUSR1])
        sent = []
        def storm():
            for _ in range(300):
                os.kill(os.getpid(), signal.SIGUSR1)
                sent.append(1)
        t = threading.Thread(target=storm)
        t.start()
        while t.is_alive():
            flag.wait(0.001)
        t.join()
        flag.wait(1.0)
        print("ended", len(sent), flag.is_set())
    """
    done = _run(code, 60.0)
    assert done is not None and done.returncode == 0, done
    assert "ended 300 True" in done.stdout, done.stdout


def test_every_handler_of_the_package_is_the_flags():
    """No module but nodeio/signals.py installs a Python function as a signal handler (SIG_IGN
    and SIG_DFL aside): an Event set in one could hang. Control: the scan finds the flag's own."""
    found = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"(?<![\w.])(?:signal\.)?signal\(([^)]*)\)|add_signal_handler\(([^)]*)\)", text):
            args = m.group(1) or m.group(2) or ""
            if "SIG_IGN" not in args and "SIG_DFL" not in args:
                found.append(str(path.relative_to(SRC)))
    assert found == ["nodeio/signals.py"], found
