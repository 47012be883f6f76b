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
        if self.mp_context != "fork":
            raise ConfigError(
                f"mp_context={self.mp_context!r} is not supported yet: reader workers share batch buffers by fork; "
                "use the default 'fork' (Linux)")


@dataclass(frozen=True)
class LoaderOptions:
    """The Loader's own choices, checked once, when it is made (a bad value fails before anything
    is set up, with the Loader's names), and read from here after: the order (``batch_size``,
    ``seed``, ``shuffle``, ``drop_last``), what a bad sample does (``on_error``), ``prefetch``,
    ``lookahead``, ``mp_context``, ``persistent_workers``. ``num_workers`` (None: tuned) and ``stage_threads``
    (``"auto"``: tuned) are what was asked; the counts in use are the Loader's, which the tuners
    move. ``run`` makes a pass's RunOptions."""

    batch_size: int = 1
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    on_error: str = "raise"
    num_workers: int | None = None
    stage_threads: int | str = "auto"
    prefetch: int = 2
    lookahead: int = 64
    mp_context: str = "fork"
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        for name, low in (("batch_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error={self.on_error!r}: choose 'raise' or 'skip'")
        if isinstance(self.stage_threads, str) and self.stage_threads != "auto":
            raise ConfigError(f"stage_threads must be an integer >= 1 or 'auto' (tuned), got {self.stage_threads!r}")
        self.run(1 if self.num_workers is None else self.num_workers, 1 if self.tuned_threads else self.stage_threads)
        for name in ("batch_size", "seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "drop_last", bool(self.drop_last))
        object.__setattr__(self, "persistent_workers", bool(self.persistent_workers))

    @property
    def tuned_threads(self) -> bool:
        return isinstance(self.stage_threads, str)

    def run(self, num_workers: int, stage_threads: int, peer_wait: float = 0.0) -> RunOptions:
        """A pass's run options: these, with the readers and threads the tuners chose."""
        return RunOptions(num_workers=num_workers, stage_threads=stage_threads, prefetch=self.prefetch,
                          lookahead=self.lookahead, skip_errors=self.on_error == "skip",
                          mp_context=self.mp_context, peer_wait=peer_wait)
