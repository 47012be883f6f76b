"""The local tier's extents and index: extent numbers, recovery, and the descriptor cache."""

from __future__ import annotations

import errno
import os

import pytest

from clairvoyant.cache.extents import _SLOT, Index, key_digest
from clairvoyant.nodeio.fdcache import FdCache


def test_an_extent_number_is_handed_out_only_when_sealed_and_empty(tmp_path):
    index = Index(str(tmp_path / "index"), expected=10)
    first = index.new_extent()
    taken = {first} | {index.new_extent() for _ in range(index.max_extents - 1)}
    assert len(taken) == index.max_extents                 # every number once, none twice
    with pytest.raises(OSError) as e:                       # all in use (unsealed): none is free
        index.new_extent()
    assert e.value.errno == errno.ENOSPC
    index.publish(key_digest("a"), first, 0, 100)
    assert not index.seal(first)                            # sealed, but an entry lives in it
    with pytest.raises(OSError):
        index.new_extent()
    index.retract(key_digest("a"))                          # its last entry goes: free again
    assert index.new_extent() == first                      # control: a free number is found
    index.close()


def test_recovery_drops_torn_slots_and_entries_past_their_extent(tmp_path):
    index = Index(str(tmp_path / "index"), expected=10)
    for i, key in enumerate(("whole", "torn", "cut")):
        index.publish(key_digest(key), 0, i * 4096, 1000)
    i = index._find(key_digest("torn"))
    at = index._slots_at + _SLOT.size * i
    index._mm[at + 8:at + 12] = (7).to_bytes(4, "little")   # a writer killed mid-update: odd sequence
    present = index.recover(lambda n: 2 * 4096 + 500)      # the extent ends inside "cut"
    assert sorted(present["digest"].tolist()) == [key_digest("whole")]
    assert index.lookup(key_digest("whole")) is not None
    assert index.lookup(key_digest("torn")) is None and index.lookup(key_digest("cut")) is None
    assert index.live(0) == 1
    # control: with the extent long enough, "cut" would have stayed
    index.publish(key_digest("cut"), 0, 2 * 4096, 1000)
    assert len(index.recover(lambda n: 3 * 4096)) == 2
    index.close()


def test_recovery_grows_the_table_for_a_larger_data_set(tmp_path):
    index = Index(str(tmp_path / "index"), expected=10)
    small = index.slots
    index.publish(key_digest("k"), 0, 0, 100)
    index.recover(lambda n: 4096, expected=100_000)
    assert index.slots > small and index.lookup(key_digest("k")) == (0, 0, 100, index.session - 1)
    index.close()


def test_a_cached_descriptor_of_a_deleted_file_is_not_handed_out(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"old")
    for recheck, want in ((True, b"new"), (False, b"old")):   # control: without the check, the old file
        cache = FdCache(limit=4, recheck=recheck)
        with open(path, "wb") as f:
            f.write(b"old")
        with cache.using(path, path) as fd:
            assert os.pread(fd, 3, 0) == b"old"
        os.unlink(path)                                      # the name is then reused by another file
        with open(path, "wb") as f:
            f.write(b"new")
        with cache.using(path, path) as fd:
            assert os.pread(fd, 3, 0) == want
        cache.close()


def test_the_descriptor_cache_is_bounded_and_never_closes_one_in_use(tmp_path):
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / str(i)))
        with open(paths[-1], "wb") as f:
            f.write(bytes([i]))
    cache = FdCache(limit=2)
    held = cache.acquire("h", paths[0])
    for p in paths[1:]:
        with cache.using(p, p) as fd:
            assert os.pread(fd, 1, 0) == bytes([int(os.path.basename(p))])
    assert len(cache) <= 2 and os.pread(held, 1, 0) == b"\0"   # the held one survived every trim
    cache.release("h")
    cache._trim()
    assert len(cache) <= 2
    cache.close()
    assert len(cache) == 0


def test_an_index_grown_by_another_process_is_followed(tmp_path):
    a = Index(str(tmp_path / "index"), expected=10)
    b = Index(str(tmp_path / "index"), expected=10)          # maps the small layout
    a.publish(key_digest("old"), 0, 0, 100)
    a.recover(lambda n: 4096, expected=100_000)              # a new session's first process grows it
    assert a.slots > b.slots
    assert b.lookup(key_digest("old")) is not None           # b follows before it reads
    assert b.slots == a.slots
    b.publish(key_digest("new"), 0, 4096, 100)               # and before it writes
    assert a.lookup(key_digest("new")) == (0, 4096, 100, a.session)
    a.close()
    b.close()


def test_a_slot_torn_by_a_kill_is_usable_again(tmp_path):
    index = Index(str(tmp_path / "index"), expected=10)
    index.publish(key_digest("k"), 0, 0, 100)
    i = index._find(key_digest("k"))
    at = index._slots_at + _SLOT.size * i
    index._mm[at + 8:at + 12] = (5).to_bytes(4, "little")   # a writer killed mid-update
    assert index.lookup(key_digest("k")) is None             # not trusted
    assert index.retract(key_digest("k")) is None            # nothing of it trusted, nor counted
    assert index.live(0) == 1                                # (the recovery at the next start recounts)
    index.publish(key_digest("k"), 0, 4096, 100)
    assert index.lookup(key_digest("k")) == (0, 4096, 100, index.session)   # settled again
    index.close()


def test_a_retract_for_an_entry_that_was_replaced_leaves_the_new_one(tmp_path):
    index = Index(str(tmp_path / "index"), expected=10)
    index.publish(key_digest("k"), 0, 0, 100)
    index.publish(key_digest("k"), 0, 4096, 100)                 # another process staged it again
    assert index.retract(key_digest("k"), at=(0, 0)) is None     # the stale one is gone already
    assert index.lookup(key_digest("k"))[:3] == (0, 4096, 100)
    assert index.retract(key_digest("k"), at=(0, 4096)) is not None   # control: the current one goes
    index.close()


def test_a_claim_excludes_the_other_threads_of_the_process(tmp_path):
    import threading

    from clairvoyant.cache.local import LocalStore

    store = LocalStore(str(tmp_path), "mem://claims")
    inside, most = [0], [0]
    guard = threading.Lock()

    def stage():
        for _ in range(20):
            if not store.claim("k", 5):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                threading.Event().wait(0.001)
                with guard:
                    inside[0] -= 1
                store.release("k")

    threads = [threading.Thread(target=stage) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1   # never two threads holding the key (a process-wide lockf alone let all four in)
    store.close()


def _resident_kb(path: str) -> int:
    """This process's resident kB of its mappings of ``path`` (/proc/self/smaps)."""
    total, cur = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):
                cur = parts[5] if len(parts) > 5 else None
            elif parts[0] == "Rss:" and cur == path:
                total += int(parts[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_a_pass_over_the_whole_index_leaves_its_pages_out_of_the_resident_set(tmp_path):
    """recover() and table() read every slot; the pages go back to the page cache after (a shared
    file mapping: nothing is lost), so a rank does not hold the whole index resident from its first
    pass on. Control: the same pass over the mapping without the release keeps it resident."""
    import numpy as np

    path = str(tmp_path / "index")
    idx = Index(path, expected=200_000)
    try:
        size = os.path.getsize(path) // 1024
        assert size > 4096
        digest = key_digest("a")
        n = idx.new_extent()
        idx.publish(digest, n, 0, 10)
        keep = idx.recover(lambda e: 10)
        assert len(keep) == 1 and _resident_kb(path) < size // 8
        assert len(idx.present()) == 1 and _resident_kb(path) < size // 8
        assert idx.lookup(digest) is not None   # the entry is still there: pages refault from the page cache
        np.frombuffer(idx._mm, np.uint8).sum()   # control: a pass without the release
        assert _resident_kb(path) > size // 2
    finally:
        idx.close()
