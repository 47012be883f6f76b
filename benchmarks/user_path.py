"""Benchmark: what the PyTorch user's path costs (issue 8).

1. Float tensors from transforms collate straight into shared memory: time per
   batch of ``pack`` (each sample's float32 CHW tensor written into its place in
   the slot) and of handing it out (``unpack_shared``: a view, no copy), against
   one ``np.copyto`` of the same bytes, the single copy any collation into a
   batch must make. A ratio near 1.0 means collation adds no copy.
2. The guard's records: images/s with ``loader.guard()`` on against off
   (checksums of the decoded bytes and of the collated batch), interleaved runs
   on a warm local tier.

    python benchmarks/user_path.py [--batch 32] [--size 224] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from clairvoyant import Loader
from clairvoyant.load.collate import default_collate
from clairvoyant.load.transport import Output, Slot, pack, unpack_shared
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def collation(batch: int, size: int, repeats: int) -> None:
    samples = [(torch.rand(3, size, size), i) for i in range(batch)]
    slot, out = Slot(), Output("torch")
    nbytes = batch * 3 * size * size * 4
    dst = np.empty(nbytes, np.uint8)
    srcs = [s.numpy().view(np.uint8).ravel() for s, _ in samples]

    def one_copy():
        for i, a in enumerate(srcs):
            np.copyto(dst[i * a.size:(i + 1) * a.size], a)

    def through_slot():
        spec, used, _ = pack(default_collate(samples), slot)
        x, base = unpack_shared(spec, slot, used, out)
        assert x[0].dtype == torch.float32
        del x, base

    through_slot()   # the slot grows once
    a, b = best(through_slot, repeats), best(one_copy, repeats)
    print(f"float32 batch {batch}x3x{size}x{size} ({nbytes / 2**20:.1f} MiB): pack + hand-out {a * 1e3:.2f} ms, "
          f"one memcpy of the same bytes {b * 1e3:.2f} ms, ratio {a / b:.2f}")
    slot.close()


def images_per_s(root: str, local: str, guard: bool, epochs: int) -> float:
    with Loader(root, batch_size=32, local_dir=local, num_workers=2, output="numpy") as ld:
        if guard:
            ld.guard()
        ld.set_epoch(0)
        list(ld)
        t0, n = time.perf_counter(), 0
        for e in range(1, epochs + 1):
            ld.set_epoch(e)
            n += sum(len(y) for _, y in ld)
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--images", type=int, default=3200)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    collation(args.batch, args.size, args.repeats)
    root = make_dataset(os.path.join(cache_home(), "bench", f"user-path-{args.images}"), args.images,
                        num_classes=10, size=256)
    with tempfile.TemporaryDirectory() as tmp:
        off, on = [], []
        for r in range(args.repeats):
            off.append(images_per_s(root, os.path.join(tmp, "off"), False, args.epochs))
            on.append(images_per_s(root, os.path.join(tmp, "on"), True, args.epochs))
        print(f"guard records: {np.median(on):.0f} images/s on, {np.median(off):.0f} off (medians of "
              f"{args.repeats}), ratio on/off {np.median(on) / np.median(off):.3f}")


if __name__ == "__main__":
    main()
