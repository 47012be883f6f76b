"""POLICY, pure: which files to stage next when no sampler says, from the files programs open.

Without a published order (``clairvoyant.torch``'s samplers), the mount sees only opens. Two
orders can still be guessed from them:

- **the listing's** (file ``f`` is followed by ``f + 1``, files numbered in path order): ``tar``,
  ``find``, ``md5sum`` over a glob, a preprocessing tool, a DataLoader with ``shuffle=False`` over a
  sorted ``ImageFolder``;
- **the order the files were first opened in**, when a later pass repeats it (a validation loop
  over an unsorted list, a tool run twice).

An open of ``f`` *hits* an order when the file before ``f`` in that order was opened recently (within
``recent`` opens) and after ``f``'s own last open (so in this pass). DataLoader workers and several
programs each reading a run of their own interleave, and each of their opens still hits. Once at
least three of the last four opens hit an order, the files after ``f`` in that order are staged, up
to a window that starts at ``min_window`` files, doubles each time an open keeps the run going and
halves at a miss, up to ``max_window`` (the kernel's page read-ahead does the same with pages).
64 files keep the stager's threads busy against a store's latency, and bound what a scan that
stops reads for nothing.
A shuffled order hits about as often as ``recent`` / number of files, too rarely to stage anything
much. A **shuffled first pass** is told by that: once ``fill_after`` files have been opened for the
first time and at most a quarter of the last 32 first opens hit either order, the program is taken
to read the data set whole in an order of its own (a training epoch, MLPerf Storage's DLIO), and
:meth:`Readahead.fill` hands out the files never opened nor handed out, in the listing's order,
for the stager to read at the store's concurrency instead of the program's (whose few readers
each wait out a whole request). The mechanism stages them while the tier has room and never makes
room for them; each file is read from the store once either way. A pass that reads only part of
the data set may so read more of it than it opens (at most what the tier holds): ``fill_after``
waits for evidence of a whole pass first. The fill helps where the store's latency binds (the
program's readers each wait out a whole request while the store could serve many more); where its
bandwidth binds, the fill's reads would only take bandwidth from the program's own, which it needs
now (measured with DLIO: the first epoch fell from 66% to 47% of the accelerator's time). So the
fill is paced by the program: it keeps ``fill_limit`` files in flight, 8 at first, and every 16
first opens compares the program's pace (first opens per second) with its pace before the fill:
at least 0.8 of it, the limit doubles (up to ``max_outstanding``); less, the fill stops for good.

At most ``max_outstanding`` files handed out in the last ``horizon`` opens are not yet opened,
however many readers run (each has its window). A file handed out earlier and never opened (the
kernel kept its pages, so no read reported it; or a scan stopped) stops counting then, and may be
handed out again a pass later. When the tier is full, the file opened last gives way first
(``give_way``), save the last ``busy`` opens (they may still be being read): in a scan that
repeats, the file read last is the one wanted again farthest away (the offline optimum for a
cyclic order), so the tier keeps the files the scan read first and turns over a window of the
rest.

What it does not decide: whether a file fits (the tier's ledger does) and whether it is staged
already (the stager looks).
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

import numpy as np

NEVER = -(1 << 62)
FILL_START, FILL_WINDOW, FILL_SLOWER = 8, 16, 0.8   # the fill's first limit; its window of first opens;
                                                   # the pace below which it stops (of the pace before it)


class Readahead:
    """Feed ``opened(f)`` each first read of file ``f`` (its number in the listing); it answers the
    files to stage now, in the order they will be wanted."""

    def __init__(self, num_files: int, min_window: int = 8, max_window: int = 64,
                 recent: int | None = None, max_outstanding: int | None = None, busy: int = 16,
                 fill_after: int | None = None) -> None:
        self.n = int(num_files)
        # first opens before a shuffled first pass may start the fill: 1% of the files, at least 32
        self.fill_after = int(fill_after) if fill_after is not None else max(32, self.n // 100)
        self._firsts: deque[bool] = deque(maxlen=32)   # the last first opens: whether each hit an order
        self._fill_at = 0                               # the fill's cursor: files before it were looked at
        self.filled = np.zeros(self.n, dtype=bool)      # handed out by the fill (apart from ``asked``)
        self.fill_limit = FILL_START   # files the fill keeps in flight; 0: stopped for good
        self._times: deque[float] = deque(maxlen=17)   # when the last first opens came
        self._pace0 = 0.0              # first opens per second before the fill began (0: not begun)
        self._window_from = 0          # ``recorded`` at the start of the fill's current window
        self.max_window = max(1, int(max_window))
        self.min_window = max(1, min(int(min_window), self.max_window))
        # files handed out and not opened yet, at most: however many readers run, read-ahead never
        # asks for more than the tier can hold beside what is being read
        self.max_outstanding = int(max_outstanding) if max_outstanding is not None else 16 * self.max_window
        self.outstanding = 0
        self._asked_q: deque[tuple[int, int]] = deque()   # (when, file) of each hand-out, oldest first
        # the last ``busy`` files opened may still be being read (one per reader): they never give way
        self.busy = int(busy)
        # how far back a predecessor's open counts: enough for dozens of interleaved readers, far
        # less than a pass, so that a shuffled order rarely hits
        self.recent = int(recent) if recent is not None else max(4, min(256, self.n // 16))
        # a file handed out and not opened within this many opens counts no more (it may never be
        # reported: the kernel kept its pages, or the scan stopped); long enough for a file asked by
        # one reader's window to be reached by another's
        self.horizon = max(2 * self.max_outstanding, 64)
        self.count = 0                                     # opens so far
        self.last_open = np.full(self.n, NEVER, dtype=np.int64)
        self.asked = np.full(self.n, NEVER, dtype=np.int64)  # when a file was last handed out to stage
        self.record = np.full(self.n, -1, dtype=np.int64)  # files in first-open order
        self.rank = np.full(self.n, -1, dtype=np.int64)    # each file's place in the record
        self.recorded = 0
        self._hits = {"listing": [], "record": []}          # the last four opens: hit or not
        self.window = {"listing": self.min_window, "record": self.min_window}
        self.staged = 0                                     # files handed out, in all
        self._opened: deque[int] = deque(maxlen=4096)       # the last opens, newest last

    # -- the two orders -------------------------------------------------------------------------

    def _before(self, order: str, f: int) -> int:
        if order == "listing":
            return f - 1
        r = int(self.rank[f])
        return int(self.record[r - 1]) if r > 0 else -1

    def _after(self, order: str, f: int, k: int) -> np.ndarray:
        if order == "listing":
            return np.arange(f + 1, min(f + 1 + k, self.n), dtype=np.int64)
        r = int(self.rank[f])
        return self.record[r + 1:min(r + 1 + k, self.recorded)]

    def _hit(self, order: str, f: int, prev_open: int) -> bool:
        if order == "record" and prev_open == NEVER:
            return False   # a first open is in the record's order by construction: no evidence
        b = self._before(order, f)
        if b < 0:
            return False
        t = int(self.last_open[b])
        return t > prev_open and t >= self.count - self.recent

    # -- feeding ----------------------------------------------------------------------------------

    def opened(self, f: int, now: float | None = None) -> list[int]:
        """Note the first read of file ``f`` (``now``: its time, in seconds, for the fill's pace);
        the files to stage now (possibly none)."""
        f = int(f)
        if not 0 <= f < self.n:
            return []
        prev_open = int(self.last_open[f])
        if self._counted(self.asked[f], prev_open):   # handed out, and now here
            self.outstanding -= 1
        q = self._asked_q
        while q and q[0][0] < self.count - self.horizon:   # handed out too long ago: counts no more
            t, g = q.popleft()
            if self.asked[g] == t and self.last_open[g] < t:
                self.outstanding -= 1
        if prev_open == NEVER:
            self.rank[f] = self.recorded
            self.record[self.recorded] = f
            self.recorded += 1
        out: list[int] = []
        first_hit = False
        for order in ("listing", "record"):
            hits = self._hits[order]
            hit = self._hit(order, f, prev_open)
            first_hit = first_hit or hit
            hits.append(hit)
            del hits[:-4]
            if not hit:   # a run broke (or another reader's started): shrink, as the kernel does
                self.window[order] = max(self.min_window, self.window[order] // 2)
                continue
            if sum(hits) < 3:
                continue
            ahead = self._after(order, f, self.window[order])
            # each file once per pass: not if handed out since its last open, nor if opened in this
            # pass already (by another reader whose run is ahead of this one)
            last = self.last_open[ahead]
            fresh = ahead[(self.asked[ahead] <= last) & (last < self.count - self.n // 2)]
            fresh = fresh[:max(0, self.max_outstanding - self.outstanding)]
            self.asked[fresh] = self.count
            self.outstanding += len(fresh)
            q.extend((self.count, g) for g in fresh.tolist())
            out.extend(fresh.tolist())
            self.window[order] = min(2 * self.window[order], self.max_window)
        if prev_open == NEVER:
            self._firsts.append(first_hit)
            if now is not None:
                self._pace(float(now))
        self.last_open[f] = self.count
        self.count += 1
        self.staged += len(out)
        self._opened.append(f)
        if self.count % max(64, self.n // 4) == 0:
            self._expire()
        return out

    def _pace(self, now: float) -> None:
        """A first open at ``now``: the fill's window ends every ``FILL_WINDOW`` of them."""
        self._times.append(now)
        if not self._pace0 or self.fill_limit == 0 or self.recorded - self._window_from < FILL_WINDOW:
            return
        self._window_from = self.recorded
        if self._first_opens_per_s() < FILL_SLOWER * self._pace0:
            self.fill_limit = 0   # the program slowed: the fill takes what it needs (module notes)
        else:
            self.fill_limit = min(2 * self.fill_limit, max(self.max_outstanding, FILL_START))

    def _first_opens_per_s(self) -> float:
        """The program's pace over the last first opens timed (inf: fewer than two)."""
        times = self._times
        return (len(times) - 1) / max(times[-1] - times[0], 1e-9) if len(times) > 1 else float("inf")

    @property
    def shuffled(self) -> bool:
        """Whether the opens look like a shuffled first pass over the whole data set (module notes)."""
        firsts = self._firsts
        return self.recorded >= self.fill_after and len(firsts) == firsts.maxlen and sum(firsts) <= 8

    def fill(self, k: int) -> list[int]:
        """Up to ``k`` files to stage in a shuffled first pass (:attr:`shuffled`): never opened nor
        handed out, in the listing's order; [] otherwise. Each is handed out once (again after
        ``not_filled``)."""
        k = min(k, self.fill_limit)
        if k <= 0 or not self.shuffled:
            return []
        if not self._pace0:   # the fill begins: the program's pace before it
            self._pace0 = self._first_opens_per_s()
            self._window_from = self.recorded
        out: list[int] = []
        i = self._fill_at
        while i < self.n and len(out) < k:
            j = min(self.n, i + 4 * k)
            free = np.flatnonzero((self.last_open[i:j] == NEVER) & (self.asked[i:j] == NEVER)
                                  & ~self.filled[i:j])[:k - len(out)] + i
            out += free.tolist()
            i = j if len(out) < k else int(free[-1]) + 1
        self._fill_at = i
        self.filled[out] = True
        self.staged += len(out)
        return out

    def not_filled(self, files) -> None:
        """``files``, handed out by :meth:`fill`, were not staged (no slot free): hand them out again."""
        idx = np.asarray(list(files), dtype=np.int64)
        if len(idx):
            self.filled[idx] = False
            self._fill_at = min(self._fill_at, int(idx.min()))

    def _counted(self, asked, last_open):
        """Whether a file (or each of an array) counts as outstanding: handed out since its last
        open, within the last ``horizon`` opens."""
        return (asked > last_open) & (asked >= self.count - self.horizon)

    def _expire(self) -> None:
        """Files handed out a pass ago (``n`` opens) and never opened may be handed out again."""
        gone = (self.asked > self.last_open) & (self.asked < self.count - self.n)
        self.outstanding -= int(np.count_nonzero(gone & self._counted(self.asked, self.last_open)))
        self.asked[gone] = NEVER

    def not_staged(self, files) -> None:
        """``files``, handed out, were not staged after all (no room): hand them out again later."""
        idx = np.asarray(list(files), dtype=np.int64)
        self.outstanding -= int(np.count_nonzero(self._counted(self.asked[idx], self.last_open[idx])))
        self.asked[idx] = NEVER

    def give_way(self) -> Iterator[int]:
        """Files to evict for read-ahead, the one opened last first, but never one of the last
        ``busy`` opens (it may still be being read) nor one handed out and not opened since
        (read-ahead wants it); each at most once."""
        seen: set[int] = set(list(self._opened)[-self.busy:]) if self.busy > 0 else set()
        for f in reversed(self._opened):
            if f not in seen and self.asked[f] <= self.last_open[f]:
                seen.add(f)
                yield f
