"""Benchmark: where the CPU goes per sample, end to end, against PyTorch's DataLoader and the decoder alone.

Every figure is CPU time (user and kernel, of this process and of its reader
processes) divided by the samples drawn, so it holds on a shared, noisy machine
where images/s do not. Runs, on the demo's JPEG tree (a plain local directory, or
``--fuse`` the same tree through a FuseStore mount with no latency: the kernel's
file-system path and the FUSE daemon, whose own CPU is not counted here):

- ``decode``: the default decoder alone on bytes in memory, one process (the floor);
- ``dataloader``: PyTorch's DataLoader over a dataset that opens and decodes each file
  with the same decoder, 2 workers;
- ``cold``: clairvoyant's first epoch into a fresh local tier (staging + readers);
- ``warm``: its second epoch, every sample read back from the local tier.

    python benchmarks/cpu_per_sample.py [--images 3200] [--fuse | --shards 24]

``--shards N``: the same images packed into about N tar shards (as ``packed_peers.py`` packs
them), through the FuseStore mount, cold and warm only: a range read whole per shard.
``--one-loader``: both epochs from one Loader, undecoded, so that the training process's own CPU
per sample (user and kernel) shows without each epoch's start.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import torch  # noqa: F401  (imported before any clock, as users have it)

from clairvoyant import Loader
from clairvoyant.experiments.staging import _ReadDataset, file_reader
from clairvoyant.load.decode import decode_image
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import make_dataset


def _cpu() -> tuple[float, float, float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime, s.ru_stime, c.ru_utime, c.ru_stime


def measure(name: str, fn) -> dict:
    """Run ``fn`` (returns samples drawn); CPU per sample of this process and of reaped children."""
    c0, t0 = _cpu(), time.perf_counter()
    n = fn()
    wall, c1 = time.perf_counter() - t0, _cpu()
    d = [(b - a) / n * 1e6 for a, b in zip(c0, c1)]
    row = {"run": name, "samples": n, "images_per_s": n / wall, "main_user_us": d[0], "main_sys_us": d[1],
           "readers_user_us": d[2], "readers_sys_us": d[3], "total_us": sum(d)}
    print(f"{name:12s} {row['images_per_s']:7.0f} img/s   main {d[0]:5.0f} user {d[1]:5.0f} sys   "
          f"readers {d[2]:5.0f} user {d[3]:5.0f} sys   total {row['total_us']:5.0f} us/sample", flush=True)
    return row


def files_of(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if not f.startswith("."))


def decode_alone(root: str) -> dict:
    blobs = []
    for path in files_of(root):
        with open(path, "rb") as f:
            blobs.append(f.read())
    return measure("decode", lambda: sum(1 for b in blobs if decode_image(b) is not None))


def run(root: str, batch: int, shards: bool = False, one_loader: bool = False) -> list[dict]:
    rows = []
    if not shards:   # (a tar shard is no image: the decoder and the DataLoader read the tree only)
        rows.append(decode_alone(root))

        def dataloader() -> int:
            keys = [os.path.relpath(f, root) for f in files_of(root)]
            ds = _ReadDataset(file_reader(root), keys, [0] * len(keys), decode_image)
            dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=2)
            return sum(len(y) for _, y in dl)
        rows.append(measure("dataloader", dataloader))
    work = tempfile.mkdtemp(prefix="clairvoyant-cpu-")
    try:
        # the readers are reaped (and their CPU counted) when each loader closes: one loader per epoch
        def epoch(first: bool) -> int:
            with Loader(root, batch_size=batch, local_dir=work, decode="numpy", num_workers=2) as ld:
                ld.set_epoch(0 if first else 1)
                return sum(len(y) for _, y in ld)
        if not one_loader:
            rows.append(measure("cold", lambda: epoch(True)))
            rows.append(measure("warm", lambda: epoch(False)))
        else:   # both epochs from one Loader, its start not counted: the training process's own CPU only
            with Loader(root, batch_size=batch, local_dir=work, decode=None, num_workers=2) as ld:
                for e, name in enumerate(("cold", "warm")):
                    ld.set_epoch(e)
                    rows.append(measure(name, lambda: sum(len(x) for x, _ in ld)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--fuse", action="store_true", help="read the tree through a FuseStore mount (no latency)")
    p.add_argument("--shards", type=int, default=0,
                   help="the same images packed into about this many tar shards (packed_peers.py's), through FUSE")
    p.add_argument("--one-loader", action="store_true",
                   help="both epochs from one Loader, samples not decoded: the training process's CPU alone "
                        "(the readers' is counted only when they end)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    root = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"), args.images)
    if args.shards:
        from packed_peers import prepare   # (this folder: run as a script)
        name = f"synthetic-imagenet-{args.images}"
        root = prepare(root, os.path.join(cache_home(), "bench", f"packed-peers-{name}-{args.shards}"),
                       args.shards)["dirs"]["shards"]
        args.fuse = True
    if args.fuse:
        from clairvoyant.testing import FuseStore
        with FuseStore(root, open_latency=0.0, read_latency=0.0, bandwidth=1e12) as fs:
            rows = run(fs.path, args.batch, bool(args.shards), args.one_loader)
    else:
        rows = run(root, args.batch, one_loader=args.one_loader)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cpu_per_sample.json")
    with open(path, "w") as f:
        json.dump({"images": args.images, "fuse": args.fuse, "shards": args.shards, "rows": rows}, f, indent=1)
    print(json.dumps({"json": path}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
