"""Benchmark: what a reader spends per sample with the JPEG decoded by the readers (the fast path's
``apply``) and with it left to the device (``decode_on="device"``: ``defer``, the header and the
draws only), and what the batched decode then costs where it runs (here the CPU: torchvision's
``decode_jpeg``; on a GPU, nvJPEG). One thread, ``--files`` synthetic 256x256 JPEGs (the demo's kind), the
standard ImageNet training Compose; best of 3.

    python benchmarks/decode_split.py              # 400 files
    python benchmarks/decode_split.py --files 32   # a smoke size for the tests
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import glob
import os
import time

import torchvision.transforms as T

from clairvoyant.load import fast_transform as ft
from clairvoyant.load.collate import default_collate
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset

TRAIN = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                   T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=400)
    args = p.parse_args(argv)
    n = max(args.files, 64)   # (the demo's synthetic JPEGs, as many as are timed)
    root = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{n}"), n, size=256)
    datas = [open(f, "rb").read() for f in sorted(glob.glob(root + "/*/*"))[:args.files]]
    recipe = ft.recognize(TRAIN)
    torch.set_num_threads(1)
    for name, fn in (("a reader, decoding (apply)", ft.apply), ("a reader, the device decoding (defer)", ft.defer)):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for d in datas:
                fn(recipe, d)
            best = min(best, (time.perf_counter() - t) / len(datas))
        print(f"{name:40} {best * 1e6:6.0f} us per sample", flush=True)
    batch = ft.collate_deferred([(ft.defer(recipe, d), 0) for d in datas[:256]], default_collate)[0]
    t = time.perf_counter()
    out = ft.decode_batch(recipe, torch.device("cpu"), batch)
    took = time.perf_counter() - t
    print(f"{'the batch decoded on the CPU':40} {took / len(out) * 1e6:6.0f} us per sample ({len(out)} at once)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
