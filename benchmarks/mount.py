"""Benchmark: `clairvoyant mount` with the swapped sampler, for scripts that open files by path (issue 12).

A torchvision-style folder dataset (``samples`` = (path, class); each item opened by path and decoded
with clairvoyant's decoder) read by PyTorch's DataLoader, batch 32, the best of each worker count:
  (a) on the slow store directly (a FuseStore mount: 12 ms per open, 2 ms per read, 400 MB/s, 64 in
      flight), PyTorch's RandomSampler: first epoch;
  (b) on a ``clairvoyant mount`` of that store, a fresh local tier, ``clairvoyant.torch.RandomSampler``
      with ``mount=``: first (cold) and second epoch, with the store's opens and bytes per epoch;
  (c) on a local copy, PyTorch's RandomSampler.
Then the mount's own cost per file: open + read + close of every staged file through the mount
(with the kernel's pages of the files dropped first, so that the daemon serves each; and with them
kept), against the same on the local copy, one thread, wall time and the CPU of this process and of the
mount daemon. CPU per sample of each epoch, by process: this one (the DataLoader's main loop, and
the mount's staging threads), the DataLoader's workers, the store's and the mount's daemons.
Writes benchmarks/results/mount.json.

    python benchmarks/mount.py [--images 3200] [--workers 2,4,8,16]
    python benchmarks/mount.py --tiny
"""

from __future__ import annotations

import torch  # imported before any clock

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from fusebench import run_and_report

from clairvoyant.load.decode import decode_image
from clairvoyant.mount import Mount
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import FuseStore, drop_pages, make_dataset
from clairvoyant.torch import RandomSampler


class FolderDataset(torch.utils.data.Dataset):
    """What ImageFolder looks like to a sampler and a DataLoader: ``samples`` of (path, class).
    Each item is opened as torchvision's loader opens it, ``open(path, "rb")``; ``buffering=0``
    opens it unbuffered instead, which on Python before 3.14 saves the isatty() that a buffered
    open asks (an ioctl: on a FUSE mount, a request to its daemon per file)."""

    def __init__(self, root: str, buffering: int = -1) -> None:
        classes = sorted(d for d in os.listdir(root) if not d.startswith("."))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c))) if not f.startswith(".")]
        self.buffering = buffering

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        with open(path, "rb", buffering=self.buffering) as f:
            return torch.from_numpy(decode_image(f.read())), label


def epoch(loader) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for _, y in loader:
        n += len(y)
    return time.perf_counter() - t0, n


class CpuMeter:
    """CPU seconds per sample of this process (its threads: the mount's staging too), of the
    DataLoader's workers (children reaped at the end of the epoch) and of given daemons."""

    def __init__(self, **daemons: int | None) -> None:
        self.daemons = {k: v for k, v in daemons.items() if v}
        self.t0 = self._now()

    def _now(self) -> dict:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"main": me.ru_utime + me.ru_stime, "workers": kids.ru_utime + kids.ru_stime,
                **{k: _daemon_cpu(p) for k, p in self.daemons.items()}}

    def per_sample_us(self, n: int) -> dict:
        t1 = self._now()
        return {k: (t1[k] - self.t0[k]) / n * 1e6 for k in t1}


def plain(root: str, workers: int, batch: int, seed: int, shuffle: bool = True) -> dict:
    ds = FolderDataset(root)
    g = torch.Generator()
    g.manual_seed(seed)
    sampler = torch.utils.data.RandomSampler(ds, generator=g) if shuffle else None   # None: in order
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
    meter = CpuMeter()
    secs, n = epoch(dl)
    return {"workers": workers, "images_per_s": n / secs, "seconds": secs, "cpu_us": meter.per_sample_us(n)}


def mounted(store: FuseStore, work: str, workers: int, batch: int, seed: int) -> dict:
    local, mnt = os.path.join(work, f"local{workers}"), os.path.join(work, f"mnt{workers}")
    os.makedirs(mnt)
    with Mount(store.path, mnt, local_dir=local) as m:   # lists the store here, before the clock
        ds = FolderDataset(mnt)
        sampler = RandomSampler(ds, seed=seed, mount=mnt)
        dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
        out = {"workers": workers, "epochs": []}
        for e in range(2):
            store.reset()
            meter = CpuMeter(store=store.pid, mount=m.pid)
            secs, n = epoch(dl)
            c, s = store.counters(), m.stats()
            out["epochs"].append({"images_per_s": n / secs, "seconds": secs, "store_opens": c.opens,
                                  "store_bytes": c.bytes, "mount": s._asdict(),
                                  "cpu_us": meter.per_sample_us(n)})
        out["per_file_cached"] = per_file(ds.samples, m.pid)   # the kernel's pages, kept from epoch 2
        drop_pages(p for p, _ in ds.samples)   # the kernel's pages gone: the daemon serves each
        out["per_file"] = per_file(ds.samples, m.pid)          # the daemon serves every file
    return out


def fresh_mount_pass(store: FuseStore, work: str, workers: int, batch: int, shuffle: bool,
                     stage: bool = True) -> dict:
    """One epoch of PyTorch's own sampler (no sampler swapped) through a fresh mount and tier
    (``stage=False``: the mount only passes reads through, ``clairvoyant mount --no-stage``)."""
    tag = f"{'shuffled' if shuffle else 'in-order'}-{workers}{'' if stage else '-nostage'}"
    mnt = os.path.join(work, f"mnt-{tag}")
    os.makedirs(mnt)
    with Mount(store.path, mnt, local_dir=os.path.join(work, f"local-{tag}"), stage=stage) as m:
        store.reset()
        r = plain(mnt, workers, batch, 0, shuffle=shuffle)
        r.update(store_opens=store.counters().opens, read_ahead=m.staging().get("read_ahead", 0))
    return r


def in_order(store: FuseStore, work: str, store_workers, mount_workers, batch: int) -> dict:
    """A validation-style pass (``shuffle=False``, no sampler swapped) over the store directly and
    through a fresh mount (its read-ahead follows the listing's order), each worker count once."""
    return {"store": [plain(store.path, w, batch, 0, shuffle=False) for w in store_workers],
            "mount": [fresh_mount_pass(store, work, w, batch, False) for w in mount_workers]}


SCANS = {"tar": "tar cf - class_000? | wc -c", "md5sum": "md5sum class_005?/*"}   # 10 classes each


def scans(store: FuseStore, copy: str, work: str) -> dict:
    """Programs that are not Python reading a class directory front to back, once each: on the store
    directly, through a fresh mount with no sampler (read-ahead in the listing's order), and on the
    local copy. Wall seconds; the outputs must be the same everywhere."""
    def timed(cwd: str) -> dict:
        out = {}
        for name, cmd in SCANS.items():
            t0 = time.perf_counter()
            r = subprocess.run(cmd, shell=True, cwd=cwd, check=True, capture_output=True)
            out[name] = (time.perf_counter() - t0, r.stdout)
        return out

    mnt = os.path.join(work, "mnt-scan")
    os.makedirs(mnt)
    store.reset()
    direct = timed(store.path)
    t0 = time.perf_counter()
    with Mount(store.path, mnt, local_dir=os.path.join(work, "local-scan")) as m:
        started = time.perf_counter() - t0
        store.reset()
        mounted_ = timed(mnt)
        opens, staging = store.counters().opens, m.staging()
    local = timed(copy)
    for name in SCANS:
        if not direct[name][1] == mounted_[name][1] == local[name][1]:
            raise RuntimeError(f"{SCANS[name]}: output through the mount differs from the store's or the copy's")
    return {"commands": SCANS, "mount_start_s": started, "store_opens_mounted": opens,
            "read_ahead": staging.get("read_ahead", 0),
            **{f"{k}_s": {"store": direct[k][0], "mount": mounted_[k][0], "local": local[k][0]} for k in SCANS}}


def _daemon_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_floor(store: FuseStore, samples, procs: int = 16) -> dict:
    """What reading every file once from the store costs, whoever reads it: ``procs`` ``cat``
    processes (C, 128 KiB reads, nothing staged or kept) read each file once; CPU us per file of
    the readers (mostly the kernel's FUSE client; the cost of starting them, measured with
    ``true``, taken off) and of the store's daemon. A loader that reads the
    store once per file spends about this much at least, so (c)'s CPU / ((c)'s CPU + this)
    estimates the best a first epoch can do against the local copy on a machine whose cores are
    all busy."""
    paths = [p for p, _ in samples]
    per = -(-len(paths) // procs)
    names = b"\0".join(p.encode() for p in paths)

    def children_cpu(program: str) -> float:   # CPU seconds of ``xargs ... program`` over the files
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["xargs", "-0", "-P", str(procs), "-n", str(per), program], input=names,
                       stdout=subprocess.DEVNULL, check=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime

    spawn = children_cpu("true")   # the same processes started, no file read: taken off
    d0, t0 = _daemon_cpu(store.pid), time.perf_counter()
    cpu = children_cpu("cat")
    wall = time.perf_counter() - t0
    n = len(paths)
    return {"files": n, "readers": procs, "files_per_s": n / wall,
            "reader_us": max(0.0, cpu - spawn) / n * 1e6, "spawn_us": spawn / n * 1e6,
            "store_daemon_us": (_daemon_cpu(store.pid) - d0) / n * 1e6}


def per_file(samples, daemon_pid: int | None) -> dict:
    """open + read + close of each file once, one thread: wall and CPU per file (us)."""
    r0, d0, t0 = resource.getrusage(resource.RUSAGE_SELF), _daemon_cpu(daemon_pid) if daemon_pid else 0.0, \
        time.perf_counter()
    for path, _ in samples:
        with open(path, "rb") as f:
            f.read()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    n = len(samples)
    out = {"wall_us": wall / n * 1e6, "user_us": (r1.ru_utime - r0.ru_utime) / n * 1e6,
           "sys_us": (r1.ru_stime - r0.ru_stime) / n * 1e6}
    if daemon_pid:
        out["daemon_us"] = (_daemon_cpu(daemon_pid) - d0) / n * 1e6
    return out


def run(args) -> dict:
    data = make_dataset(os.path.join(cache_home(), "demo", f"synthetic-imagenet-{args.images}"
                                     + ("" if args.size == 256 else f"-{args.size}px")), args.images, size=args.size)
    work = tempfile.mkdtemp(prefix="clairvoyant-mount-bench-")
    try:
        copy = os.path.join(work, "copy")
        shutil.copytree(data, copy)
        with FuseStore(data, open_latency=args.open_latency, read_latency=args.read_latency) as store:
            direct = [plain(store.path, w, args.batch, args.seed) for w in args.workers]
            mount = [mounted(store, work, w, args.batch, args.seed) for w in args.workers]
            scan = scans(store, copy, work) if not args.tiny else None   # tiny: no class_005x
            floor = store_floor(store, FolderDataset(store.path).samples)
            ordered = in_order(store, work, args.workers[-2:], args.workers[:2], args.batch)
            # a shuffled first epoch without the swapped sampler: what the mount costs where it
            # cannot help (against (a), the same DataLoader on the store, same worker counts)
            unswapped = [fresh_mount_pass(store, work, w, args.batch, True) for w in args.workers[-2:]]
            passthrough = [fresh_mount_pass(store, work, w, args.batch, True, stage=False)
                           for w in args.workers[-2:]]
        local = [plain(copy, w, args.batch, args.seed) for w in args.workers]
        local_file = per_file(FolderDataset(copy).samples, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = lambda rows, key: max(rows, key=key)   # noqa: E731
    a = best(direct, lambda r: r["images_per_s"])
    b1 = best(mount, lambda r: r["epochs"][0]["images_per_s"])
    b2 = best(mount, lambda r: r["epochs"][1]["images_per_s"])
    c = best(local, lambda r: r["images_per_s"])
    ratios = {"mount_first_over_store": b1["epochs"][0]["images_per_s"] / a["images_per_s"],
              "mount_first_over_local": b1["epochs"][0]["images_per_s"] / c["images_per_s"],
              "mount_second_over_local": b2["epochs"][1]["images_per_s"] / c["images_per_s"],
              "second_epoch_store_bytes": max(r["epochs"][1]["store_bytes"] for r in mount)}
    c_cpu = sum(c["cpu_us"].values())
    floor_cpu = floor["reader_us"] + floor["store_daemon_us"]
    ratios["first_over_local_bound"] = c_cpu / (c_cpu + floor_cpu)
    best_in_order = lambda side: max(ordered[side], key=lambda r: r["images_per_s"])   # noqa: E731
    ratios["in_order_mount_over_store"] = (best_in_order("mount")["images_per_s"]
                                           / best_in_order("store")["images_per_s"])
    same = {r["workers"]: r for r in direct}
    ratios["unswapped_over_store_same_workers"] = {
        r["workers"]: r["images_per_s"] / same[r["workers"]]["images_per_s"] for r in unswapped}
    ratios["no_stage_over_store_same_workers"] = {
        r["workers"]: r["images_per_s"] / same[r["workers"]]["images_per_s"] for r in passthrough}
    if scan:
        for k in SCANS:
            ratios[f"{k}_mount_over_store"] = scan[f"{k}_s"]["store"] / scan[f"{k}_s"]["mount"]
    return {"params": vars(args) | {"workers": list(args.workers)}, "direct": direct, "mount": mount,
            "local": local, "local_per_file": local_file, "scans": scan, "in_order": ordered, "store_floor": floor,
            "unswapped": unswapped, "no_stage": passthrough,
            "ratios": ratios}


def format_table(s: dict) -> str:
    lines = [f"{'configuration':46s} {'images/s':>9s} {'store opens':>12s} {'store MB':>9s}"]
    for r in s["direct"]:
        lines.append(f"{'(a) DataLoader on the slow store, %d workers' % r['workers']:46s} {r['images_per_s']:9.0f}")
    for r in s["mount"]:
        for e, x in enumerate(r["epochs"]):
            name = f"(b) on clairvoyant mount, {r['workers']} workers, epoch {e + 1}"
            lines.append(f"{name:46s} {x['images_per_s']:9.0f} {x['store_opens']:12d} {x['store_bytes'] / 1e6:9.1f}")
    for r in s["local"]:
        lines.append(f"{'(c) DataLoader on a local copy, %d workers' % r['workers']:46s} {r['images_per_s']:9.0f}")
    t = s["ratios"]
    lines += ["", f"(b) epoch 1 / best (a): {t['mount_first_over_store']:.2f}x   (target >= 2.0)",
              f"(b) epoch 1 / best (c): {t['mount_first_over_local']:.2f}x   (target >= 0.8; "
              f"about {t['first_over_local_bound']:.2f}x at best: reading each file once from the store costs "
              f"{s['store_floor']['reader_us']:.0f} us here + {s['store_floor']['store_daemon_us']:.0f} us "
              f"in its daemon, against (c)'s {sum(max(s['local'], key=lambda r: r['images_per_s'])['cpu_us'].values()):.0f})",
              f"(b) epoch 2 / best (c): {t['mount_second_over_local']:.2f}x",
              f"(b) epoch 2 bytes from the store: {t['second_epoch_store_bytes']}   (target 0)"]
    def cpu(d: dict) -> str:
        return ", ".join(f"{k} {v:.0f}" for k, v in d.items()) + f" (total {sum(d.values()):.0f})"
    b = max(s["mount"], key=lambda r: r["epochs"][0]["images_per_s"])
    c = max(s["local"], key=lambda r: r["images_per_s"])
    lines.append(f"CPU us per sample, (b) {b['workers']} workers, epoch 1: {cpu(b['epochs'][0]['cpu_us'])}; "
                 f"epoch 2: {cpu(b['epochs'][1]['cpu_us'])}")
    lines.append(f"CPU us per sample, (c) {c['workers']} workers: {cpu(c['cpu_us'])}")
    if s.get("in_order"):
        for side, name in (("store", "on the slow store"), ("mount", "through a fresh mount, no sampler")):
            for r in s["in_order"][side]:
                extra = (f" ({r['store_opens']} store opens, {r['read_ahead']} read ahead)"
                         if side == "mount" else "")
                lines.append(f"shuffle=False {name}, {r['workers']} workers: {r['images_per_s']:.0f} images/s{extra}")
        lines.append(f"shuffle=False, best through the mount / best on the store: "
                     f"{t['in_order_mount_over_store']:.2f}x")
    for r in s.get("unswapped", []):
        lines.append(f"shuffled, PyTorch's sampler (not swapped), through a fresh mount, {r['workers']} workers: "
                     f"{r['images_per_s']:.0f} images/s, "
                     f"{t['unswapped_over_store_same_workers'][r['workers']]:.2f}x (a) at the same workers "
                     f"({r['store_opens']} store opens)")
    for r in s.get("no_stage", []):
        lines.append(f"shuffled, PyTorch's sampler, through a fresh mount with --no-stage, {r['workers']} workers: "
                     f"{r['images_per_s']:.0f} images/s, "
                     f"{t['no_stage_over_store_same_workers'][r['workers']]:.2f}x (a) at the same workers")
    if s.get("scans"):
        sc = s["scans"]
        for k, cmd in sc["commands"].items():
            x = sc[f"{k}_s"]
            lines.append(f"`{cmd}`: store {x['store']:.2f} s, fresh mount {x['mount']:.2f} s "
                         f"({x['store'] / x['mount']:.1f}x), local copy {x['local']:.2f} s")
        lines.append(f"  (mount start {sc['mount_start_s']:.2f} s; {sc['read_ahead']} files read ahead; "
                     f"{sc['store_opens_mounted']} store opens through the mount)")
    pf, lf = s["mount"][-1]["per_file"], s["local_per_file"]
    pc = s["mount"][-1]["per_file_cached"]
    lines.append(f"open+read+close of a file whose pages the kernel kept: through the mount "
                 f"{pc['wall_us']:.0f} us wall ({pc['user_us']:.0f} user + {pc['sys_us']:.0f} kernel)")
    lines.append(f"open+read+close of a staged file: through the mount {pf['wall_us']:.0f} us wall "
                 f"({pf['user_us']:.0f} user + {pf['sys_us']:.0f} kernel here, {pf.get('daemon_us', 0):.0f} in the "
                 f"daemon); local copy {lf['wall_us']:.0f} us ({lf['user_us']:.0f} + {lf['sys_us']:.0f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", default="2,4,8,16,32,64")
    p.add_argument("--open-latency", type=float, default=0.012)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a few dozen small images, for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.size, args.batch, args.workers = 48, 32, 8, "1"
        args.open_latency, args.read_latency = 0.001, 0.0
    args.workers = tuple(int(w) for w in args.workers.split(","))
    return run_and_report("mount", args, run, format_table)


if __name__ == "__main__":
    sys.exit(main())
