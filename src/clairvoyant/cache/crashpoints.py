"""Named points in the publish and evict paths where a test can have the process killed.

``CLAIRVOYANT_CRASH_AT=<point>:<n>`` makes the n-th passage through ``<point>``
SIGKILL its own process (n defaults to 1), so tests can check that a kill at
each step leaves a cache that the next process finds consistent. Unset, each
point costs one global lookup.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = ("reserved", "tmp_written", "published", "unlinked")

_spec = os.environ.get("CLAIRVOYANT_CRASH_AT", "")
ARMED = bool(_spec)
_point, _, _n = _spec.partition(":")
_left = [int(_n or 1)]
_lock = threading.Lock()


def reached(point: str) -> None:
    if ARMED and point == _point:
        with _lock:
            _left[0] -= 1
            if _left[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
