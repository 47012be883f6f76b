"""Benchmark: later epochs with the readers kept across passes (``persistent_workers=True``) against
readers forked for every pass (the default), side by side.

Every pass forks its readers from the training process and ends them after its last batch. A fork
copies the parent's page tables, so its cost grows with the training process's memory (a model,
its optimizer state, a CUDA context): ``--ballast-gib`` touches that much memory in this process
first, as a training process holds it. The data: ``--images`` synthetic JPEGs of 256x256 on local
disk, decoded and cropped by the readers (``RandomResizedCrop(--crop)``, uint8 out), a warm epoch
(everything in the local tier) after one untimed epoch. For each mode, ``--epochs`` warm epochs
are timed; the modes alternate ``--repeats`` times. Prints img/s per epoch, the medians, and the
ratio kept/forked (> 1: keeping them pays).

    python benchmarks/warm_readers.py                    # 3,200 images, 1 GiB ballast
    python benchmarks/warm_readers.py --ballast-gib 0    # a small process
"""

from __future__ import annotations

import torch  # imported before any clock  # noqa: F401

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torchvision.transforms as T

from clairvoyant import Loader
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset


def warm_epochs(data: str, local: str, persist: bool, args) -> list[float]:
    """img/s of each timed warm epoch of one Loader."""
    tf = T.Compose([T.RandomResizedCrop(args.crop), T.PILToTensor()])
    out = []
    with Loader(data, batch_size=args.batch, num_workers=args.workers, transform=tf, local_dir=local,
                persistent_workers=persist) as ld:
        for epoch in range(args.epochs + 1):
            t0 = time.perf_counter()
            n = sum(len(y) for _, y in ld)
            if epoch:   # (the first fills the local tier)
                out.append(n / (time.perf_counter() - t0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--crop", type=int, default=128)
    p.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ballast-gib", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    data = make_dataset(os.path.join(cache_home(), "bench", f"warm-readers-{args.images}"), args.images, size=256)
    ballast = np.ones(int(args.ballast_gib * (1 << 30)) // 8)   # touched: its pages are the process's
    runs: dict[str, list[float]] = {"forked": [], "kept": []}
    with tempfile.TemporaryDirectory(prefix="cv-warm-readers-") as work:
        for r in range(args.repeats):
            for mode in ("forked", "kept"):
                got = warm_epochs(data, os.path.join(work, f"{mode}{r}"), mode == "kept", args)
                runs[mode] += got
                print(f"{mode:6} run {r + 1}: " + ", ".join(f"{x:,.0f}" for x in got) + " img/s", flush=True)
    forked, kept = statistics.median(runs["forked"]), statistics.median(runs["kept"])
    print(f"warm epochs, {args.images} images, {args.workers} readers, batch {args.batch}, "
          f"{ballast.nbytes / (1 << 30):.1f} GiB touched in the training process")
    print(f"median img/s: forked every pass {forked:,.0f}, kept {kept:,.0f}; ratio kept/forked {kept / forked:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "warm_readers.json"), "w") as f:
        json.dump({"args": vars(args), "runs": runs, "ratio": kept / forked}, f, indent=1)


if __name__ == "__main__":
    main()
