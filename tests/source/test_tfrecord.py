"""TFRecord files as a source (source/tfrecord.py): records by byte range, CRCs checked, ranges,
and tf.train.Example features without TensorFlow. The files are written here by the format's
definition (an independent writer: length, masked CRC-32C, data, masked CRC-32C)."""

from __future__ import annotations

import os
import struct

import crc32c
import numpy as np
import pytest

from clairvoyant import Loader
from clairvoyant.errors import SampleReadError
from clairvoyant.source import TFRecordSource, as_source
from clairvoyant.source.tfrecord import TFRecordError, parse_example


def _masked(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _frame(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        if n < 0x80:
            return bytes(out + bytes([n]))
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _ld(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _example(image: bytes, label: int, weights: list[float]) -> bytes:
    """tf.train.Example{features{feature{"image": bytes_list}, {"label": int64_list packed},
    {"w": float_list packed}}}, encoded by the protobuf wire format."""
    def entry(name: str, feature: bytes) -> bytes:
        return _ld(1, _ld(1, name.encode()) + _ld(2, feature))
    feats = (entry("image", _ld(1, _ld(1, image)))
             + entry("label", _ld(3, _ld(1, _varint(label))))
             + entry("w", _ld(2, _ld(1, np.asarray(weights, "<f4").tobytes()))))
    return _ld(1, feats)


def _records(n: int = 60, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [_example(rng.bytes(int(rng.integers(100, 3000))) + i.to_bytes(4, "little"), i - 30, [i / 2, -1.0])
            for i in range(n)]


def _write(path, recs: list[bytes]) -> None:
    with open(path, "wb") as f:
        for r in recs:
            f.write(_frame(r))


def _epoch(source, tmp_path, **kw) -> list[bytes]:
    with Loader(source, batch_size=7, local_dir=str(tmp_path / "local"), seed=2, num_workers=1,
                decode=bytes, collate_fn=list, **kw) as ld:
        return [sample[0] for batch in ld for sample in batch]   # (record, label) pairs


def test_every_record_once_per_epoch_with_its_bytes(tmp_path):
    """Two files: an epoch gives every record once, the bytes as written, shuffled. Control: the
    order is not the files' order."""
    recs = _records()
    d = tmp_path / "tfr"
    d.mkdir()
    _write(d / "a.tfrecord", recs[:25])
    _write(d / "b.tfrecord", recs[25:])
    assert isinstance(as_source(str(d)), TFRecordSource)
    got = _epoch(str(d), tmp_path)
    assert sorted(got) == sorted(recs) and len(got) == len(recs)
    assert got != recs   # control: shuffled


def test_parse_example_reads_the_features_without_tensorflow():
    ex = parse_example(_example(b"\x00jpeg", -5, [0.5, 2.0]))
    assert ex["image"] == [b"\x00jpeg"]
    assert ex["label"].tolist() == [-5] and ex["label"].dtype == np.int64
    assert ex["w"].tolist() == [0.5, 2.0] and ex["w"].dtype == np.float32
    with pytest.raises(ValueError, match="not a serialized tf.train.Example"):
        parse_example(b"\x0a\xff")   # a length cut short
    with pytest.raises(ValueError, match="runs past the message's end"):
        parse_example(b"\x0a\x05ab")   # a length past the end


def test_a_range_read_checks_each_record(tmp_path):
    recs = _records(200)
    _write(tmp_path / "a.tfrecord", recs)
    src = TFRecordSource(str(tmp_path / "a.tfrecord"))
    keys = [k for k, _ in src.scan()]
    assert keys == sorted(keys) and [src.read(k) for k in keys] == recs
    of, nbytes = src.sample_ranges(keys, span=16384)
    assert len(nbytes) > 1
    for r in range(len(nbytes)):
        members = [k for k, o in zip(keys, of) if o == r]
        assert src.read_range(members)[0] == [src.read(k) for k in members]


def test_a_bad_crc_names_the_file_and_the_record_and_skip_goes_on(tmp_path):
    """One record's data damaged after the files were listed: reading it is a SampleReadError naming
    the file and the record's offset; on_error="skip" gives every other record. Control: the same
    read before the damage gives the record's bytes."""
    recs = _records()
    path = tmp_path / "a.tfrecord"
    _write(path, recs)
    src = TFRecordSource(str(path))
    keys = [k for k, _ in src.scan()]
    victim = keys[10]
    assert src.read(victim) == recs[10]   # control
    at = int(victim.rsplit("/", 1)[1])
    with open(path, "r+b") as f:
        f.seek(at + 12 + 5)
        b = f.read(1)
        f.seek(at + 12 + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(SampleReadError, match=rf"record at byte {at} of .*a.tfrecord is corrupt \(it fails its CRC\)"):
        src.read(victim)
    got = _epoch(src, tmp_path, on_error="skip")
    assert sorted(got) == sorted(recs[:10] + recs[11:])
    with pytest.raises(SampleReadError):
        _epoch(src, tmp_path / "again")


def test_broken_files_are_refused_at_listing(tmp_path):
    recs = _records(5)
    cut = tmp_path / "cut.tfrecord"
    _write(cut, recs)
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(cut) - 3)
    with pytest.raises(TFRecordError, match="cut.tfrecord is truncated"):
        list(TFRecordSource(str(cut)).scan())
    gz = tmp_path / "gz.tfrecord"
    import gzip
    gz.write_bytes(gzip.compress(_frame(recs[0])))
    with pytest.raises(TFRecordError, match="GZIP-compressed"):
        list(TFRecordSource(str(gz)).scan())
    junk = tmp_path / "junk.tfrecord"
    junk.write_bytes(b"this is not a tfrecord file at all")
    with pytest.raises(TFRecordError, match="fails its CRC"):
        list(TFRecordSource(str(junk)).scan())
    ok = tmp_path / "ok.tfrecord"
    _write(ok, recs)
    assert len(list(TFRecordSource(str(ok)).scan())) == 5   # control
