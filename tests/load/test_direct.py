"""The readers' fast path: JPEGs decoded straight into the batch give the batch the general path gives."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from clairvoyant import Loader
from clairvoyant.load import direct
from clairvoyant.load.collate import default_collate
from clairvoyant.load.decode import decode_image
from clairvoyant.load.transport import Output, Slot, pack, unpack_copy
from clairvoyant.load.worker import keep_heap

pytestmark = pytest.mark.skipif(direct._simplejpeg is None, reason="simplejpeg is not installed")


def _jpeg(seed: int, size=(48, 40), fmt="JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(out, fmt)
    return out.getvalue()


def _general(blobs, labels):
    slot = Slot()
    spec, size, _ = pack(default_collate([(decode_image(b), y) for b, y in zip(blobs, labels)]), slot)
    return spec, unpack_copy(spec, slot, size, Output("numpy"))


def test_direct_batch_equals_the_general_path():
    blobs, labels = [_jpeg(i) for i in range(6)], [3, 1, 4, 1, 5, 9]
    slot = Slot()
    spec, size, _ = direct.decode_batch(blobs, labels, slot)
    got = unpack_copy(spec, slot, size, Output("numpy"))
    want_spec, want = _general(blobs, labels)
    assert spec == want_spec
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # control: the general path on another batch differs, so the comparison can fail
    _, other = _general(blobs[1:] + blobs[:1], labels)
    assert not np.array_equal(got[0], other[0])


@pytest.mark.parametrize("case", ["mixed sizes", "png", "not an image", "empty"])
def test_batches_that_do_not_qualify_take_the_general_path(case):
    blobs = [_jpeg(i) for i in range(3)]
    if case == "mixed sizes":
        blobs[1] = _jpeg(1, size=(40, 48))
    elif case == "png":
        blobs[2] = _jpeg(2, fmt="PNG")
    elif case == "not an image":
        blobs[0] = b"\xff\xd8\xff" + b"junk" * 10
    else:
        blobs = []
    assert direct.decode_batch(blobs, [0] * len(blobs), Slot()) is None
    # control: the same batch with every image a JPEG of one size qualifies
    assert direct.decode_batch([_jpeg(i) for i in range(3)], [0] * 3, Slot()) is not None


def test_loader_batches_are_the_same_through_either_path(dataset, tmp_path):
    def batches(decode, seed=0):
        with Loader(dataset, batch_size=8, local_dir=str(tmp_path / f"l{seed}{decode is None}"), decode=decode or "numpy",
                    seed=seed, num_workers=2, output="numpy") as loader:
            return [(x.copy(), y.copy()) for x, y in loader]
    fast = batches(None)                        # decode="numpy": the fast path
    slow = batches(lambda b: decode_image(b))   # a user function: the general path
    assert len(fast) == len(slow)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(fast, slow))
    other = batches(None, seed=1)               # control: another order is told apart
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(fast, other))


def test_readers_keep_their_heap():
    if not os.path.exists("/lib/x86_64-linux-gnu/libc.so.6") and not os.path.exists("/lib64/libc.so.6"):
        pytest.skip("not glibc")
    assert keep_heap() is True


def test_a_batch_that_falls_back_is_read_once(monkeypatch, tmp_path):
    """A PNG in the batch sends it to the general path, which goes on from the bytes the fast path
    read: every sample is read once (control: reading again would count each twice)."""
    from clairvoyant.load import worker
    from clairvoyant.load.decode import resolve
    from clairvoyant.source import Source as SourceBase

    blobs = {"a": _jpeg(1), "b": _jpeg(2, fmt="PNG")}
    reads = []

    class Source(SourceBase):
        def scan(self):
            return ((k, len(b)) for k, b in blobs.items())

        def read(self, key):
            reads.append(key)
            return blobs[key]

    spec = worker.ReaderSpec(decode=resolve("numpy", has_transform=False), transform=None, target_transform=None,
                             collate_fn=None, source=Source(), seed=0, epoch=0, rank=0, num_workers=1, position=0,
                             stride=2)
    items = [worker.Item(k, None, len(b), 0, None, True) for k, b in blobs.items()]
    out = worker._load_batch(worker.Job(0, 0, items, False), [Slot()], spec, default_collate)
    assert isinstance(out, worker.Loaded)
    assert sorted(reads) == ["a", "b"]
