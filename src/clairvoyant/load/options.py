"""The options of one epoch's run (load/pipeline.py) that the Loader passes through as it holds
them: how many reader processes and staging threads, how far ahead staging and readers run, what
a bad sample does, how readers start, and how long a planned hit waits for another rank.

These checks are the only ones of these options: the Loader makes one from its arguments before
anything else (so a bad value fails early, with the Loader's names), and each pass's run makes one
from the Loader's attributes and the readers and threads the tuners chose.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..errors import ConfigError


_ALSO = {"num_workers": " or None (tuned)", "stage_threads": " or 'auto' (tuned)"}   # the Loader's other choices


@dataclass(frozen=True)
class RunOptions:
    """Args:
        num_workers: reader processes.
        stage_threads: I/O threads staging from the source (the tuner may move them during the run).
        prefetch: batches each reader may hold ready.
        lookahead: how many batches ahead of the training loop staging runs.
        skip_errors: skip samples that cannot be read or decoded (``on_error="skip"``) instead of
            raising.
        mp_context: how reader processes start (``"fork"``, ``"forkserver"``, ``"spawn"``).
        peer_wait: seconds a planned hit waits for another rank of the node to keep it before it
            is read from the source (0 with one rank per node).
    """

    num_workers: int
    stage_threads: int
    prefetch: int = 2
    lookahead: int = 64
    skip_errors: bool = False
    mp_context: str = "fork"
    peer_wait: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_workers", "stage_threads", "prefetch", "lookahead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1{_ALSO.get(name, '')}, got {value!r}")
        if not self.peer_wait >= 0:
            raise ConfigError(f"peer_wait must be >= 0 seconds, got {self.peer_wait!r}")
