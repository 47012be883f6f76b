"""Benchmark: torchvision's standard ImageNet transforms through the Loader against PyTorch's
DataLoader on the same cores (issue 40).

A local copy of the demo's JPEGs (``--images`` of 256x256), ``ImageFolder(root, transform=t)``
with the standard training Compose (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
Normalize) or the validation one (``--val``: Resize(256), CenterCrop(224), ToTensor, Normalize),
user code unchanged, batch ``--batch``; the second epoch of each (the first warms the page cache
and the Loader's tier alike):

- DataLoader(dataset, shuffle=True, num_workers=w) for w in ``--dl-workers`` (2,4): its best;
- Loader(dataset) with its defaults (the fast path: load/fast_transform.py);
- Loader(dataset) with ``CLAIRVOYANT_FAST_TRANSFORM=0`` (the transform run as given, per sample).

Prints samples/s, the ratio to the DataLoader's best, and each output's channel means and stds
over the epoch (they must match); writes benchmarks/results/transform_path.json.

    python benchmarks/transform_path.py            # 3,200 JPEGs
    python benchmarks/transform_path.py --tiny     # a smoke size for CI
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import json
import os
import tempfile
import time

import torchvision
import torchvision.transforms as T

from clairvoyant import Loader
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def compose(val: bool, size: int) -> T.Compose:
    if val:
        return T.Compose([T.Resize(size * 8 // 7), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def epoch(it) -> tuple[float, int, list[float], list[float]]:
    """Seconds, samples, and the output's per-channel mean and std over the epoch (its first 4
    images of each batch)."""
    t0, n = time.perf_counter(), 0
    s = torch.zeros(3, dtype=torch.float64)
    s2 = torch.zeros(3, dtype=torch.float64)
    px = 0
    for x, _ in it:
        n += len(x)
        x = x[:4].double()   # (4 images a batch: the statistics must not cost what is measured)
        s += x.sum(dim=(0, 2, 3))
        s2 += (x ** 2).sum(dim=(0, 2, 3))
        px += x.shape[0] * x.shape[2] * x.shape[3]
    secs = time.perf_counter() - t0
    mean = s / px
    std = (s2 / px - mean ** 2).sqrt()
    return secs, n, [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]


def run(args) -> dict:
    data = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"), args.images,
                        size=256)
    ds = torchvision.datasets.ImageFolder(data, transform=compose(args.val, args.crop))
    rows = {}
    for w in args.dl_workers:
        dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=w)
        epoch(dl)
        secs, n, mean, std = epoch(dl)
        rows[f"DataLoader({w})"] = {"samples_per_s": n / secs, "mean": mean, "std": std}
    for name, env in (("Loader", "1"), ("Loader, transform as given", "0")):
        os.environ["CLAIRVOYANT_FAST_TRANSFORM"] = env
        with tempfile.TemporaryDirectory() as work, Loader(ds, batch_size=args.batch,
                                                           local_dir=os.path.join(work, "l")) as ld:
            ld.set_epoch(0)
            epoch(ld)
            ld.set_epoch(1)
            secs, n, mean, std = epoch(ld)
            rows[name] = {"samples_per_s": n / secs, "mean": mean, "std": std, "readers": ld.stats()["readers"],
                          "transform": ld.stats()["transform"]}
    os.environ.pop("CLAIRVOYANT_FAST_TRANSFORM", None)
    best = max(v["samples_per_s"] for k, v in rows.items() if k.startswith("DataLoader"))
    for v in rows.values():
        v["ratio"] = v["samples_per_s"] / best
    return {"params": {"images": args.images, "batch": args.batch, "val": args.val, "crop": args.crop,
                       "cpus": os.cpu_count(), "torch": torch.__version__}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--val", action="store_true", help="Resize + CenterCrop instead of RandomResizedCrop + flip")
    p.add_argument("--dl-workers", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    p.add_argument("--tiny", action="store_true", help="a smoke size for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.batch, args.crop, args.dl_workers = 128, 16, 64, [2]
    got = run(args)
    print(f"{got['params']['images']} JPEGs of 256x256, batch {args.batch}, {'val' if args.val else 'train'} "
          f"transforms to {args.crop}, second epoch, {os.cpu_count()} CPUs")
    for name, r in got["rows"].items():
        print(f"{name:28} {r['samples_per_s']:8,.0f} samples/s  {r['ratio']:5.2f}x  mean {r['mean']} std {r['std']}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "transform_path.json")
    with open(path, "w") as f:
        json.dump(got, f, indent=1)
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
