"""Benchmark: does loading keep a GPU fed? A training loop through every door, against the model's
own appetite (issues 39 and 40). Prepared for a lent GPU node (one H200, 16 cores); on a CPU a tiny
model makes it a smoke test (the suite runs it with ``--tiny``).

The store: a FuseStore mount (reads through the kernel) charging ``--open-latency`` (12 ms) per
open, ``--read-latency`` (2 ms) per read, ``--bandwidth`` (400 MB/s) shared, at most
``--max-inflight`` (64) requests at once, over ``--images`` synthetic JPEGs of 256x256. The model:
torchvision's ResNet-50 (``--model``), SGD, batch ``--batch`` (256), bf16 autocast, channels_last
(what a current script runs), on ``--device`` (cuda when there is one). The transforms: the
standard ImageNet training Compose (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
Normalize), user code unchanged. For each door, ``--epochs`` epochs (the first cold: a fresh
tier), img/s per epoch:

- ``ceiling``: the same steps on one batch already on the device (the model's appetite);
- ``dataloader``: ``ImageFolder(<store>)`` through PyTorch's DataLoader (``--workers``, pinned);
- ``loader``: ``Loader(ImageFolder(<store>))``, the batch moved by the loop (the README's port);
- ``loader_device``: the same with ``device=`` (uint8 to the device, converted there);
- ``loader_decode``: the same with ``decode_on="device"`` too (the JPEGs decoded on the device,
  a batch at once: nvJPEG through torchvision's ``decode_jpeg``);
- ``mount``: ``clairvoyant mount`` of the store, ImageFolder on it, the DataLoader with the
  project's sampler.

Prints each epoch's img/s, the ceiling, and the ratios: later epochs against the ceiling (>= 0.9
wanted), the first against min(ceiling, the store's limit). Each door's result is written to
``--out``/gpu_feed.json as soon as it ends, so that a run cut short keeps what it measured.

    python benchmarks/gpu_feed.py                 # on a GPU node: 12,800 JPEGs, ResNet-50
    python benchmarks/gpu_feed.py --tiny          # a smoke size on a CPU
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import json
import os
import sys
import tempfile
import time

import torchvision
import torchvision.transforms as T

from clairvoyant import Loader
from clairvoyant.mount import Mount
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import FuseStore, fuse_available, make_dataset
from clairvoyant.torch import RandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_epoch import file_limit  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DOORS = ("dataloader", "loader", "loader_device", "mount", "loader_decode")   # (the newest last)


class TinyNet(torch.nn.Module):
    """A model for a CPU smoke run: two convolutions and a linear layer."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.body(x))


def make_model(name: str, classes: int, device: torch.device):
    model = TinyNet(classes) if name == "tiny" else getattr(torchvision.models, name)(num_classes=classes)
    model = model.to(device).to(memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


class Trainer:
    """One training step at a time: bf16 autocast, channels_last, SGD."""

    def __init__(self, model, opt, device: torch.device) -> None:
        self.model, self.opt, self.device = model, opt, device
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, x, y) -> None:
        x = x.to(self.device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def epoch(self, it) -> tuple[float, int]:
        self.sync()
        t0, n = time.perf_counter(), 0
        for x, y in it:
            self.step(x, y)
            n += len(y)
        self.sync()
        return time.perf_counter() - t0, n


def ceiling(trainer: Trainer, batch: int, crop: int, classes: int, steps: int) -> float:
    """img/s of the steps alone, on one batch already on the device."""
    x = torch.randn(batch, 3, crop, crop, device=trainer.device)
    y = torch.randint(0, classes, (batch,), device=trainer.device)
    for _ in range(3):
        trainer.step(x, y)
    trainer.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step(x, y)
    trainer.sync()
    return steps * batch / (time.perf_counter() - t0)


def run_door(door: str, args, data: str, store: dict, work: str, trainer: Trainer, transform) -> list[dict]:
    out = []
    with FuseStore(data, **store) as fs:
        if door == "mount":
            mnt = os.path.join(work, "mnt")
            os.makedirs(mnt)
            with Mount(fs.path, mnt, local_dir=os.path.join(work, "local")) as m:
                ds = torchvision.datasets.ImageFolder(mnt, transform=transform)
                sampler = RandomSampler(ds, seed=0, mount=mnt)
                dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler,
                                                 num_workers=args.workers, pin_memory=trainer.device.type == "cuda",
                                                 persistent_workers=args.persistent and args.workers > 0)
                for e in range(args.epochs):
                    sampler.set_epoch(e)
                    fs.reset()
                    secs, n = trainer.epoch(dl)
                    out.append({"epoch": e, "img_per_s": n / secs, "store_opens": fs.counters().opens})
                out[-1]["mount"] = m.stats()._asdict()
            return out
        ds = torchvision.datasets.ImageFolder(fs.path, transform=transform)
        if door == "dataloader":
            dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                             pin_memory=trainer.device.type == "cuda", drop_last=True,
                                             persistent_workers=args.persistent and args.workers > 0)
            for e in range(args.epochs):
                fs.reset()
                secs, n = trainer.epoch(dl)
                out.append({"epoch": e, "img_per_s": n / secs, "store_opens": fs.counters().opens})
            return out
        extra = {"device": trainer.device} if door in ("loader_device", "loader_decode") else {}
        if door == "loader_decode":
            extra["decode_on"] = "device"
        with Loader(ds, batch_size=args.batch, local_dir=os.path.join(work, "local"), drop_last=True,
                    persistent_workers=args.persistent, **extra) as ld:
            for e in range(args.epochs):
                ld.set_epoch(e)
                fs.reset()
                secs, n = trainer.epoch(ld)
                s = ld.stats()
                out.append({"epoch": e, "img_per_s": n / secs, "store_opens": fs.counters().opens,
                            "verdict": (s.get("verdict") or {}).get("summary"), "transform": s.get("transform"),
                            "readers": s.get("readers"), "staging": s.get("staging")})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=12800)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="the DataLoader's (the Loader tunes its own)")
    p.add_argument("--doors", default=",".join(DOORS))
    p.add_argument("--open-latency", type=float, default=0.012)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--bandwidth", type=float, default=400e6)
    p.add_argument("--max-inflight", type=int, default=64)
    p.add_argument("--ceiling-steps", type=int, default=20)
    p.add_argument("--tiny", action="store_true", help="a smoke size on a CPU")
    p.add_argument("--persistent", action="store_true",
                   help="readers kept across epochs, for every door (persistent_workers=True)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.batch, args.crop, args.epochs, args.model = 96, 16, 32, 2, "tiny"
        args.workers, args.ceiling_steps = 2, 3
    ok, why = fuse_available()
    if not ok:
        print(f"gpu_feed: skipped, the FUSE store is unavailable here: {why}")
        return 0
    device = torch.device(args.device)
    classes = min(100, max(1, args.images // 16))   # (every class holds files: ImageFolder insists)
    name = f"synthetic-imagenet-{args.images}" + ("" if classes == 100 else f"-{classes}c")
    data = make_dataset(os.path.join(cache_home(), "demo", name), args.images, num_classes=classes)
    classes = len([d for d in os.listdir(data) if not d.startswith(".")])
    sizes = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(data) for f in fs if not f.startswith(".")]
    store = dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth,
                 max_inflight=args.max_inflight)
    import numpy as np
    limit = file_limit(np.asarray(sizes), store)
    transform = T.Compose([T.RandomResizedCrop(args.crop), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    model, opt = make_model(args.model, classes, device)
    trainer = Trainer(model, opt, device)
    result = {"params": {**vars(args), "classes": classes, "store_limit": limit,
                         "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                         "torch": torch.__version__, "cpus": os.cpu_count()}, "doors": {}}
    path = os.path.join(args.out, "gpu_feed.json")
    os.makedirs(args.out, exist_ok=True)

    def save() -> None:
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    result["ceiling"] = ceiling(trainer, args.batch, args.crop, classes, args.ceiling_steps)
    save()
    print(f"gpu_feed: {args.model} on {device}, batch {args.batch}, bf16 channels_last: ceiling "
          f"{result['ceiling']:,.0f} img/s; the store's limit {limit:,.0f} files/s", flush=True)
    for door in [d for d in DOORS if d in args.doors.split(",")]:
        try:   # a door that fails is written down, and the others still run (one try on a lent node)
            with tempfile.TemporaryDirectory(prefix="clairvoyant-gpu-feed-") as work:
                epochs = run_door(door, args, data, store, work, trainer, transform)
        except Exception as e:   # noqa: BLE001 - recorded, not hidden
            result.setdefault("failed", {})[door] = f"{type(e).__name__}: {e}"
            save()
            print(f"{door:14} FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        first_limit = min(result["ceiling"], limit)
        for r in epochs:
            r["ratio"] = r["img_per_s"] / (first_limit if r["epoch"] == 0 else result["ceiling"])
        result["doors"][door] = epochs
        save()
        print(f"{door:14} " + "  ".join(f"epoch {r['epoch']}: {r['img_per_s']:8,.0f} img/s ({r['ratio']:.2f})"
                                        for r in epochs), flush=True)
    print(json.dumps({"json": path}))
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
