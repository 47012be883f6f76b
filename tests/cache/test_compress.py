"""Compressed staging (cache/codec.py, cache/entry.py's compressed entries, Loader(compress=...)):
entries that inflate to the sample or are refused, a tier whose capacity counts what it wrote,
the same batches as without, "auto" off for incompressible data, and a mount that never serves
a compressed entry. Each check has a control."""

from __future__ import annotations

import os

import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.cache.codec import codec, entry_parts, zstd_available
from clairvoyant.cache.entry import TRAILER, ZLIB, ZSTD, entry_size, holds, read_trailer, unseal
from clairvoyant.cache.extents import Loc
from clairvoyant.errors import ConfigError, CorruptEntry

CODECS = ["zlib"] + (["zstd"] if zstd_available() else [])


def _smooth(n: int, shape=(16, 16, 16), seed: int = 0) -> np.ndarray:
    """Float fields that compress about 2-3x (a random walk, rounded)."""
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(size=(n,) + shape).cumsum(axis=1), 1).astype(np.float32)


@pytest.mark.parametrize("name", CODECS)
def test_a_compressed_entry_inflates_to_the_sample_or_is_refused(name):
    """Round trip; a flipped byte, a cut payload, another size, a stream that inflates past the
    sample: each a CorruptEntry, never bytes. Control: incompressible bytes are stored as they are."""
    data = _smooth(1).tobytes()
    payload, trailer = entry_parts(data, 7, codec(name))
    assert len(payload) < 0.7 * len(data) and trailer[:8] == (ZSTD if name == "zstd" else ZLIB)
    blob = bytes(payload) + trailer
    assert unseal(blob, len(data), "x") == data
    bad = bytearray(blob)
    bad[len(payload) // 2] ^= 0xFF
    for broken, size in ((bytes(bad), len(data)), (blob[:10] + blob[len(payload):], len(data)),
                         (blob, len(data) - 1), (blob, len(data) + 1)):
        with pytest.raises(CorruptEntry):
            unseal(broken, size, "x")
    import tracemalloc

    import xxhash
    big = codec(name).compress(bytes(256 << 20))   # inflates to 256 MiB: refused, not made
    forged = big + TRAILER.pack(trailer[:8], xxhash.xxh3_64_intdigest(data), 7, len(data))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptEntry):
            unseal(forged, len(data), "x")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    noise = os.urandom(4096)
    p, t = entry_parts(noise, 7, codec(name))
    assert p is noise and len(p) + len(t) == entry_size(4096)   # control: stored as it is


def test_a_compressed_entry_says_its_samples_size_in_its_trailer(tmp_path):
    """``read_trailer`` gives the sample's size (what a later session checks against the source)
    and ``holds`` finds the entry for that size only. Control: a plain entry of another size is
    not taken for it."""
    data = _smooth(1).tobytes()
    payload, trailer = entry_parts(data, 11, codec("zlib"))
    path = tmp_path / "ext"
    path.write_bytes(bytes(payload) + trailer)
    loc = Loc(str(path), 0, len(payload) + TRAILER.size)
    assert read_trailer(loc) == (len(data), 11)
    assert holds(loc, len(data)) and not holds(loc, len(data) + 8)
    plain = b"z" * (len(payload) - 5)
    path.write_bytes(plain + entry_parts(plain, 11, None)[1])
    assert not holds(Loc(str(path), 0, len(plain) + TRAILER.size), len(data))


def _epochs(path, tmp_path, compress, epochs=3, capacity="30%", tag=""):
    out = []
    with Loader(str(path), batch_size=20, local_dir=str(tmp_path / f"local{tag}-{compress}"),
                local_capacity=capacity, compress=compress, num_workers=1, seed=1, cluster=False) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            out.append(np.concatenate([np.asarray(b[0]) for b in ld]))
        used, _ = ld.tiers.local.ledger.read()
        entries = ld.tiers.local.entries()
        assert used == sum(entries.values()), (used, sum(entries.values()))   # nothing reserved and left
        held = len(entries)
        st = ld.stats()
        return out, ld.compress_ratio, used, ld.tiers.local_capacity, held, st


@pytest.mark.parametrize("name", CODECS)
def test_compressed_staging_gives_the_same_batches_and_keeps_more_within_the_capacity(tmp_path, name):
    """400 float samples, the local tier at 30% of the raw data set: with compression the batches
    of every epoch are the same as without, the tier's bytes stay within its capacity, and it holds
    about ratio times more samples, so later epochs read the source less. Control: without
    compression the tier holds at most 30% of the samples."""
    x = _smooth(400)
    np.save(tmp_path / "x.npy", x)
    plain, r0, used0, cap0, held0, _ = _epochs(tmp_path / "x.npy", tmp_path, None)
    packed, r1, used1, cap1, held1, _ = _epochs(tmp_path / "x.npy", tmp_path, name)
    for a, b in zip(plain, packed):
        assert a.shape == (400, 16, 16, 16) and (a == b).all()
    assert not (plain[0] == plain[1]).all()   # (control: the epochs differ: the check compares something)
    assert r0 == 1.0 and r1 > 1.8, r1
    assert used1 <= cap1 and used0 <= cap0 and cap0 == cap1
    assert held0 <= 0.31 * 400 and held1 > 1.5 * held0, (held0, held1)


def test_auto_leaves_incompressible_samples_as_they_are(tmp_path):
    """compress="auto" over random bytes (as JPEGs are): no codec, ratio 1, entries as they are.
    Control: over smooth floats it compresses."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "noise.npy", rng.integers(0, 255, (200, 4096), dtype=np.uint8))
    np.save(tmp_path / "x.npy", _smooth(200))
    with Loader(str(tmp_path / "noise.npy"), batch_size=10, local_dir=str(tmp_path / "l1"), compress="auto",
                num_workers=1, cluster=False) as ld:
        assert ld.compress_ratio == 1.0 and ld.tiers.local.codec is None
    with Loader(str(tmp_path / "x.npy"), batch_size=10, local_dir=str(tmp_path / "l2"), compress="auto",
                num_workers=1, cluster=False) as ld:
        assert ld.compress_ratio > 1.5 and ld.tiers.local.codec is not None


def test_a_bad_compress_choice_is_a_config_error(tmp_path):
    np.save(tmp_path / "x.npy", _smooth(10))
    with pytest.raises(ConfigError, match="compress="):
        Loader(str(tmp_path / "x.npy"), batch_size=2, local_dir=str(tmp_path / "l"), compress="lzma", cluster=False)


def test_a_mount_never_serves_a_compressed_entry(tmp_path):
    """A Loader compresses what it stages from a folder of files; a mount of the same folder on the
    same local directory reads each file with the right bytes, from the source: its daemon takes
    only entries as they are. Control: entries staged without compression are served from the
    tier (opens_local)."""
    from clairvoyant.mount import Mount, mount_available
    ok, why = mount_available()
    if not ok:
        pytest.skip(why)
    src = tmp_path / "src"
    src.mkdir()
    x = _smooth(40, (8, 8, 8))
    for i in range(40):
        (src / f"s{i:03d}.bin").write_bytes(x[i].tobytes())
    for compress, mnt in (("zlib", "m1"), (None, "m2")):
        local = tmp_path / f"local-{compress}"
        with Loader(str(src), batch_size=8, local_dir=str(local), local_capacity="100%", compress=compress,
                    num_workers=1, cluster=False, decode=len) as ld:
            for _ in ld:
                pass
            assert len(ld.tiers.local.entries()) == 40
        (tmp_path / mnt).mkdir()
        with Mount(str(src), str(tmp_path / mnt), local_dir=str(local), stage=False) as m:
            for i in range(40):
                assert (tmp_path / mnt / f"s{i:03d}.bin").read_bytes() == x[i].tobytes()
            s = m.stats()
        if compress is None:
            assert s.opens_local == 40, s   # control
        else:
            assert s.opens_local == 0 and s.opens_source == 40, s


def test_a_compressing_tier_that_holds_the_data_set_stages_by_ranges(tmp_path):
    """The tier at 60% of the raw data set, which compresses to less than that: the plan keeps
    every sample, so samples are staged by ranges (one read for many neighbours, each its own
    compressed entry), the batches are those of an uncompressed run, the ledger counts the entries
    and later epochs read nothing. Control: uncompressed, 60% does not hold the data set (no
    ranges)."""
    x = _smooth(300)
    np.save(tmp_path / "x.npy", x)
    plain, _, _, _, held0, st0 = _epochs(tmp_path / "x.npy", tmp_path, None, capacity="60%", tag="r")
    packed, ratio, used, cap, held1, st1 = _epochs(tmp_path / "x.npy", tmp_path, CODECS[-1], capacity="60%", tag="r")
    for a, b in zip(plain, packed):
        assert (a == b).all()
    assert ratio > 1.8 and held1 == 300 and used <= cap, (ratio, held1, used, cap)
    assert st1["tiers"]["range_placed"] > 0 and st0["tiers"]["range_placed"] == 0, (st0["tiers"], st1["tiers"])
    assert held0 < 300
