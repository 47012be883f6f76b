"""Read-ahead without a sampler (plan/readahead.py): the files a program will open next, guessed
from the listing's order or from the order of an earlier pass. Each check has a shuffled control."""

from __future__ import annotations

import numpy as np

from clairvoyant.plan.readahead import Readahead

N = 3200


def run(ra: Readahead, opens) -> tuple[float, int]:
    """Feed ``opens``; the share of opens whose file was handed out before it was opened, and how
    many files were handed out twice without an open in between."""
    asked: set[int] = set()
    ahead = twice = 0
    for f in opens:
        f = int(f)
        ahead += f in asked
        asked.discard(f)
        for g in ra.opened(f):
            twice += g in asked
            asked.add(g)
    return ahead / len(opens), twice


def interleaved(n: int, workers: int, batch: int) -> list[int]:
    """The opens of a DataLoader with ``shuffle=False``: worker k reads batches k, k + workers, ...,
    the workers one file each in turn."""
    batches = [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
    out: list[int] = []
    for r in range(0, len(batches), workers):
        group = batches[r:r + workers]
        for j in range(batch):
            out.extend(b[j] for b in group if j < len(b))
    return out


def test_a_scan_in_listing_order_is_staged_ahead_and_a_shuffled_one_is_not():
    seq, twice = run(Readahead(N), range(N))
    assert seq > 0.99 and twice == 0
    shuffled, _ = run(Readahead(N), np.random.default_rng(0).permutation(N))
    assert shuffled < 0.02, shuffled   # control


def test_dataloader_workers_reading_interleaved_runs_each_hit():
    opens = interleaved(N, workers=4, batch=32)
    assert sorted(opens) == list(range(N))
    share, twice = run(Readahead(N), opens)
    assert share > 0.95 and twice == 0, share
    share16, _ = run(Readahead(N), interleaved(N, workers=16, batch=32))
    assert share16 > 0.9, share16


def test_a_pass_that_repeats_the_first_passs_order_is_staged_ahead():
    rng = np.random.default_rng(1)
    first = rng.permutation(N)
    ra = Readahead(N)
    run(ra, first)
    again, twice = run(ra, first)
    assert again > 0.99 and twice == 0, again
    ra2 = Readahead(N)
    run(ra2, first)
    other, _ = run(ra2, rng.permutation(N))
    assert other < 0.02, other   # control: a new shuffle is not the record's order


def test_each_file_is_handed_out_once_per_pass_and_a_second_scan_again():
    ra = Readahead(N)
    out1 = [g for f in range(N) for g in ra.opened(f)]
    out2 = [g for f in range(N) for g in ra.opened(f)]
    assert len(out1) == len(set(out1)) and len(out2) == len(set(out2))
    assert len(out2) > 0.99 * N   # a second pass: each file is fresh again after its open
    assert all(0 <= g < N for g in out1 + out2)


def test_a_file_another_reader_opened_in_this_pass_is_not_handed_out_again():
    """Interleaved readers: a window reaching into another reader's run, behind that reader,
    hands out nothing that reader opened already (it would only be found staged)."""
    for workers in (4, 16):
        ra = Readahead(N)
        opened: set[int] = set()
        again = 0
        for f in interleaved(N, workers=workers, batch=32):
            opened.add(f)
            again += sum(g in opened for g in ra.opened(f))
        assert again == 0, (workers, again)
        assert ra.staged < N, ra.staged   # each file at most once in the pass


def test_the_file_opened_last_gives_way_first_and_never_one_the_window_waits_for():
    ra = Readahead(100, max_window=8, busy=4)
    handed: list[int] = []
    for f in range(20):
        handed += ra.opened(f)
    waiting = [g for g in handed if g >= 20]        # handed out, not opened yet
    assert waiting                                  # control: the window is ahead of the opens
    order = list(ra.give_way())
    assert order[:3] == [15, 14, 13]                # the last opened first, the last 4 (busy) spared
    assert not set(order) & (set(waiting) | {16, 17, 18, 19})
    twin = Readahead(100, max_window=8, busy=4)     # control: the same opens, nothing given back
    for f in range(20):
        twin.opened(f)
    ra.not_staged(waiting)                          # no room after all: handed out again later
    again = [g for f in range(20, 22) for g in ra.opened(f)]
    assert set(waiting) - {20, 21} <= set(again), (waiting, again)
    assert not (set(waiting) - {20, 21}) & {g for f in range(20, 22) for g in twin.opened(f)}


def test_what_is_handed_out_and_not_opened_stays_under_the_cap():
    """Sixteen interleaved readers each get a window; together they never have more than
    ``max_outstanding`` files handed out in the last ``horizon`` opens and not yet opened (the
    policy's count agrees with one kept here). Control: without the cap (as large as the data set)
    they do."""
    def peak(cap: int) -> int:
        ra = Readahead(N, max_outstanding=cap)
        asked: dict[int, int] = {}   # file -> when handed out, until opened
        top = 0
        for t, f in enumerate(interleaved(N, workers=16, batch=32)):
            asked.pop(f, None)
            asked.update((g, t) for g in ra.opened(f))
            counted = sum(1 for when in asked.values() if when >= t - ra.horizon)
            assert ra.outstanding == counted, (t, ra.outstanding, counted)
            top = max(top, counted)
        return top
    assert peak(100) <= 100
    assert peak(N) > 100


def test_files_never_reported_stop_counting_and_read_ahead_goes_on():
    """The kernel keeps the pages of some files, so their reads never reach the daemon: files
    handed out and never reported stop counting after ``horizon`` opens, and read-ahead keeps
    staging ahead of the opens that are reported. Control: a horizon as long as a pass lets the
    unreported files fill the cap and read-ahead stalls."""
    def share(horizon: int | None) -> float:
        ra = Readahead(4000, max_window=50, max_outstanding=50)
        if horizon is not None:
            ra.horizon = horizon
        rng = np.random.default_rng(3)
        for p in range(3):
            silent = set(rng.choice(4000, 1200, replace=False).tolist()) if p else set()
            asked: set[int] = set()
            hits = opens = 0
            for f in range(4000):
                if f in silent:
                    continue
                opens += 1
                hits += f in asked
                asked.update(ra.opened(f))
        return hits / opens   # the last pass
    assert share(None) > 0.5      # 0.72 here
    assert share(10 ** 9) < 0.15  # 0.04 here


def test_a_shuffled_first_pass_fills_in_the_listings_order_and_an_ordered_one_does_not():
    """``fill``: after ``fill_after`` first opens that follow no order, the files never opened nor
    handed out, in the listing's order, each once (again after ``not_filled``). Control: a scan in
    the listing's order, or a second pass, is never taken for a shuffled first pass."""
    opens = np.random.default_rng(0).permutation(N)
    ra = Readahead(N)
    for f in opens[:ra.fill_after - 1]:
        ra.opened(int(f))
    assert not ra.shuffled and ra.fill(8) == []   # not enough evidence yet
    ra.opened(int(opens[ra.fill_after - 1]))
    assert ra.shuffled
    first = ra.fill(8)
    seen = set(opens[:ra.fill_after].tolist())
    want = [f for f in range(N) if f not in seen][:8]
    assert first == want
    ra.not_filled(first[4:])                            # no slot for the last four
    again = ra.fill(8)
    assert again[:4] == first[4:] and not set(again) & set(first[:4])
    handed = first[:4] + again
    while True:                                         # each file once, none opened ever handed out
        more = ra.fill(64)
        if not more:
            break
        handed += more
    assert len(handed) == len(set(handed)) and sorted(handed) == sorted(set(range(N)) - seen)
    ordered = Readahead(N)                              # control: a scan in the listing's order
    for f in range(N // 2):
        ordered.opened(f)
    assert not ordered.shuffled and ordered.fill(8) == []
    again_pass = Readahead(N)                           # control: a second shuffled pass fills nothing new
    for f in opens:
        again_pass.opened(int(f))
    assert again_pass.fill(8) == []


def test_the_fill_doubles_while_the_program_keeps_its_pace_and_stops_when_it_slows():
    """The fill keeps 8 files in flight at first; every 16 first opens it compares the program's
    pace with its pace before the fill: kept (or faster: the fill's files are hits), the limit
    doubles; slower than 0.8 of it (the store's bandwidth binds and the fill took it), the fill
    stops for good. Control: the same opens at the same pace double the limit."""
    opens = [int(f) for f in np.random.default_rng(3).permutation(N)]

    def run_at(slowdown: float) -> list[int]:
        ra, t, limits = Readahead(N), 0.0, []
        for i, f in enumerate(opens[:ra.fill_after + 3 * 16]):
            filling = ra._pace0 > 0
            t += (1 / 100) * (slowdown if filling else 1.0)   # 100 first opens a second before the fill
            ra.opened(f, t)
            if ra.shuffled:
                ra.fill(ra.fill_limit)
                limits.append(ra.fill_limit)
        return limits

    kept = run_at(1.0)
    assert kept[0] == 8 and kept[-1] == 64, kept   # doubled each window: 8, 16, 32, 64
    slowed = run_at(2.0)                            # half the pace once the fill began
    assert slowed[-1] == 0 and 0 < slowed[0], slowed
    ra = Readahead(N)
    ra.fill_limit = 0
    for f in opens[:ra.fill_after + 1]:
        ra.opened(f)
    assert ra.fill(8) == []   # stopped: nothing handed out
