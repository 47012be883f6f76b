"""Where the training process's CPU goes during the first epoch through `clairvoyant mount`.

The same first and second epoch as benchmarks/mount.py's (b) at one worker count (a torchvision-style
folder dataset, PyTorch's DataLoader, clairvoyant's RandomSampler with ``mount=``, a fresh tier, the
FUSE-mounted emulated store), with the CPU of this process split by thread from /proc/self/task:
the DataLoader's main loop (MainThread), the mount's plan thread (clairvoyant-mount-orders), its
collector (clairvoyant-native-stage) and the rest, chiefly the native staging threads, whose
reads of the store go through the kernel ("other"; each of them runs for less than the kernel's
10 ms tick, so their share is the process's total less the named threads). Also the DataLoader's
workers, the store's daemon and the mount's daemon, per sample.

To compare two versions of the staging code, run it alternately on each (same machine, same
minute): the machine's own speed drifts more between runs of benchmarks/mount.py than such a
change moves it.

    python benchmarks/mount_threads.py [--workers 4] [--images 3200]
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mount import CpuMeter, FolderDataset, epoch  # noqa: E402

from clairvoyant.mount import Mount  # noqa: E402
from clairvoyant.nodeio.paths import cache_home  # noqa: E402
from clairvoyant.testing import FuseStore, make_dataset  # noqa: E402
from clairvoyant.torch import RandomSampler  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def task_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                s = f.read()
        except OSError:   # ended meanwhile
            continue
        fields = s[s.rindex(")") + 2:].split()
        out[t] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def by_thread(before: dict[str, float], after: dict[str, float], total: float, n: int) -> dict[str, float]:
    """us per sample of the named Python threads, and "other" (the rest of ``total`` seconds)."""
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    named: dict[str, float] = {}
    for t, cpu in after.items():
        name = names.get(t)
        if name is None:
            continue
        name = "clairvoyant-native-stage" if name.startswith("clairvoyant-native-stage") else name
        named[name] = named.get(name, 0.0) + cpu - before.get(t, 0.0)
    out = {k: v / n * 1e6 for k, v in named.items() if v > 0}
    out["other"] = max(0.0, total - sum(named.values())) / n * 1e6
    return out


def run(args) -> dict:
    data = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"), args.images,
                        size=256)
    work = tempfile.mkdtemp(prefix="clairvoyant-mount-threads-")
    epochs = []
    try:
        with FuseStore(data, open_latency=args.open_latency, read_latency=args.read_latency) as store:
            mnt = os.path.join(work, "mnt")
            os.makedirs(mnt)
            store.reset()   # before the mount: the sampler publishes its order when made, and staging starts
            with Mount(store.path, mnt, local_dir=os.path.join(work, "local")) as m:
                ds = FolderDataset(mnt, buffering=0 if args.unbuffered else -1)
                sampler = RandomSampler(ds, seed=args.seed, mount=mnt)
                dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler,
                                                 num_workers=args.workers)
                for k in range(2):
                    if k:
                        store.reset()
                    meter, before = CpuMeter(store=store.pid, mount=m.pid), task_cpu()
                    secs, n = epoch(dl)
                    after, cpu = task_cpu(), meter.per_sample_us(n)
                    epochs.append({"images_per_s": n / secs, "store_opens": store.counters().opens, "cpu_us": cpu,
                                   "main_by_thread_us": by_thread(before, after, cpu["main"] * n / 1e6, n)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"params": vars(args), "epochs": epochs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--open-latency", type=float, default=0.012)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--unbuffered", action="store_true",
                   help="the dataset opens files with buffering=0 (no isatty ioctl per open on Python < 3.14)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    res = run(args)
    if args.json:
        print(json.dumps(res))
        return 0
    for k, e in enumerate(res["epochs"]):
        cpu = ", ".join(f"{name} {v:.0f}" for name, v in e["cpu_us"].items())
        print(f"epoch {k + 1}: {e['images_per_s']:.0f} images/s, {e['store_opens']} store opens; "
              f"CPU us per sample: {cpu}")
        for name, v in sorted(e["main_by_thread_us"].items(), key=lambda kv: -kv[1]):
            print(f"    main: {name:32s} {v:6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
