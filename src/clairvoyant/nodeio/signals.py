"""MECHANISM: a flag that a signal handler sets and the main thread waits on, with no lock.

A Python signal handler runs in the main thread, between two of its bytecodes. ``threading.Event``
is the wrong tool there: ``set`` takes the event's lock, and when the handler interrupts the main
thread inside a ``wait`` on that same event (which holds the lock for a moment as it goes to
sleep), ``set`` waits for a lock its own thread holds, for ever. `clairvoyant mount` hung so on
Ctrl-C (once in a suite run; its stack showed ``on_signal -> Event.set`` under ``Event.wait``).
:class:`SignalFlag` is set by appending to a list (no lock of Python's threading), and its wait
sleeps in steps of ``POLL`` seconds, so a signal is acted on within that.
"""

from __future__ import annotations

import signal
import time
from typing import Iterable

POLL = 0.02   # seconds between looks at the flag while waiting


class SignalFlag:
    """The signals received so far (``signals``, in order); ``install`` makes this flag their
    handler."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def install(self, signums: Iterable[int]) -> None:
        for signum in signums:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signals.append(signum)   # (the only thing a handler does here: no lock is taken)

    def is_set(self) -> bool:
        return bool(self.signals)

    def wait(self, timeout: float) -> bool:
        """Whether a signal came, waiting up to ``timeout`` seconds for one."""
        end = time.monotonic() + timeout
        while not self.signals:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, POLL))
        return True
