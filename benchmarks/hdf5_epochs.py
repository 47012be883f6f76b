"""Benchmark: a CosmoFlow-like HDF5 data set, clairvoyant through the kernel's file-system path
against the same training loop reading a local copy with h5py (issue 24).

The data: ``--samples`` volumes of int16, ``--side``^3 x 4 channels (2 MiB at 64^3), with four
float32 targets each, in ``--files`` HDF5 files (contiguous datasets ``x`` and ``y``), smooth
fields that compress about 2x. Both loops take batches of ``--batch`` in a shuffled order, every
sample once per epoch, and touch every batch (a sum), in processes of their own, ``import torch``
done before the clock. Both read each volume and its four float targets (clairvoyant: as the
sample's field ``y``, read once into memory):

- **h5py, local copy**: ``torch.utils.data.DataLoader`` over a Dataset whose ``__getitem__``
  reads ``x[i]`` and ``y[i]`` with h5py (each worker opens the files once), from the files on
  local disk (warm page cache): what a user runs after copying the data set first;
- **h5py on the store**: the same DataLoader over the ``FuseStore`` mount (no copy first);
- **clairvoyant**: ``Loader(HDF5Source(mount, dataset="x", fields=["y"]))`` on a ``FuseStore`` mount of the same
  files (the emulated shared store: ``--open-latency`` per open, ``--read-latency`` per read,
  ``--bandwidth``), its local tier cold for epoch 1 and warm for epoch 2.

Reported: samples/s per epoch, and the ratio clairvoyant's first epoch / h5py's local copy
(target >= 0.9). Writes benchmarks/results/hdf5_epochs.json.

    python benchmarks/hdf5_epochs.py
    python benchmarks/hdf5_epochs.py --samples 64 --side 32      # a smoke size
"""

from __future__ import annotations

import torch  # imported before any clock: its import is not timed

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)


def make(dst: str, samples: int, side: int, files: int, seed: int = 0) -> int:
    """The data set under ``dst``; its bytes."""
    import h5py
    rng = np.random.default_rng(seed)
    os.makedirs(dst, exist_ok=True)
    total = 0
    for fi, rows in enumerate(np.array_split(np.arange(samples), files)):
        x = np.empty((len(rows), side, side, side, 4), np.int16)
        for j in range(len(rows)):   # smooth fields: a coarse grid upsampled, plus a little noise
            coarse = rng.integers(0, 400, (side // 8, side // 8, side // 8, 4))
            x[j] = np.repeat(np.repeat(np.repeat(coarse, 8, 0), 8, 1), 8, 2) + rng.integers(0, 4, (side,) * 3 + (4,))
        y = rng.standard_normal((len(rows), 4)).astype(np.float32)
        with h5py.File(os.path.join(dst, f"univ-{fi:03d}.h5"), "w") as f:
            f.create_dataset("x", data=x)
            f.create_dataset("y", data=y)
        total += x.nbytes + y.nbytes
    return total


class H5Dataset(torch.utils.data.Dataset):
    def __init__(self, root: str) -> None:
        import h5py
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".h5"))
        self.index = []
        for fi, p in enumerate(self.paths):
            with h5py.File(p, "r") as f:
                self.index += [(fi, i) for i in range(f["x"].shape[0])]
        self.files: dict = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k: int):
        import h5py
        fi, i = self.index[k]
        f = self.files.get(fi)
        if f is None:
            f = self.files[fi] = h5py.File(self.paths[fi], "r")
        return torch.from_numpy(f["x"][i]), torch.from_numpy(f["y"][i])   # the volume, its four targets


def child(kind: str, data: str, work: str, batch: int, workers: int, store: dict) -> dict:
    out = {"kind": kind, "epochs": []}
    from clairvoyant.testing import FuseStore
    if kind.startswith("h5py"):
        with (FuseStore(data, **store) if kind == "h5py-store" else contextlib.nullcontext()) as fs:
            root = fs.path if fs is not None else data
            dl = torch.utils.data.DataLoader(H5Dataset(root), batch_size=batch, shuffle=True, num_workers=workers,
                                             persistent_workers=True, generator=torch.Generator().manual_seed(0))
            for _ in range(2):
                t0, n, s = time.perf_counter(), 0, 0
                for x, y in dl:
                    s += int(x[:, 0, 0, 0, 0].sum())
                    n += len(x)
                out["epochs"].append({"samples": n, "seconds": time.perf_counter() - t0})
            del dl
        return out
    from clairvoyant import Loader
    from clairvoyant.source import HDF5Source
    with FuseStore(data, **store) as fs:
        fs.reset()
        with Loader(HDF5Source(fs.path, dataset="x", fields=["y"]), batch_size=batch,
                    local_dir=os.path.join(work, "local"), seed=0, num_workers=workers) as ld:
            for e in range(2):
                ld.set_epoch(e)
                out["epochs"].append(timed_epoch(ld, fs))
    return out


def timed_epoch(ld, fs) -> dict:
    """One epoch of ``ld`` (a Loader of ``HDF5Source(..., fields=["y"])`` on the FuseStore ``fs``),
    each batch touched with a sum: its samples, seconds, and the store's bytes and opens."""
    c0 = fs.counters()
    t0, n, s = time.perf_counter(), 0, 0
    for x, _, fields in ld:
        s += int(x[:, 0, 0, 0, 0].sum()) + int(fields["y"].sum() > 0)
        n += len(x)
    c1 = fs.counters()
    return {"samples": n, "seconds": time.perf_counter() - t0, "store_bytes": c1.bytes - c0.bytes,
            "store_opens": c1.opens - c0.opens}


def arguments(doc: str) -> argparse.ArgumentParser:
    """The data set's, the loop's and the emulated store's options (also compressed_staging.py's)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--open-latency", type=float, default=0.012)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--bandwidth", type=float, default=400e6)
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results"))
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    return p


def run_children(script: str, kinds: tuple[str, ...], args: argparse.Namespace, options: tuple[str, ...],
                 prefix: str) -> tuple[int, dict] | None:
    """The data set made in a temporary folder, then ``script --child KIND DATA WORK`` run for each
    kind in a process of its own with ``options`` (argument names) passed on: the data set's bytes
    and each child's JSON, or None where a child failed (its stderr printed)."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        data = os.path.join(work, "data")
        nbytes = make(data, args.samples, args.side, args.files)
        runs = {}
        for kind in kinds:
            sub = os.path.join(work, kind)
            os.makedirs(sub)
            cmd = [sys.executable, script, "--child", kind, data, sub] + [
                f"--{name}={getattr(args, name.replace('-', '_'))}" for name in options]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                print(r.stderr[-3000:], file=sys.stderr)
                return None
            runs[kind] = json.loads(r.stdout.strip().splitlines()[-1])
        return nbytes, runs
    finally:
        shutil.rmtree(work, ignore_errors=True)


STORE_OPTIONS = ("batch", "workers", "open-latency", "read-latency", "bandwidth")


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__).parse_args(argv)
    store = dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth)
    if args.child:
        kind, data, work = args.child
        print(json.dumps(child(kind, data, work, args.batch, args.workers, store)))
        return 0
    done = run_children(HERE, ("h5py-local", "h5py-store", "clairvoyant"), args, STORE_OPTIONS,
                        "clairvoyant-hdf5-bench-")
    if done is None:
        return 1
    nbytes, runs = done
    rate = {k: [e["samples"] / e["seconds"] for e in v["epochs"]] for k, v in runs.items()}
    summary = {"samples": args.samples, "side": args.side, "files": args.files, "bytes": nbytes, "batch": args.batch,
               "workers": args.workers, "store": store, "runs": runs, "samples_per_s": rate,
               "cold_vs_h5py_local": rate["clairvoyant"][0] / rate["h5py-local"][0],
               "cold_vs_h5py_store": rate["clairvoyant"][0] / rate["h5py-store"][0]}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hdf5_epochs.json"), "w") as f:
        json.dump(summary, f, indent=1)
    mb = nbytes / args.samples / 2**20
    print(f"{args.samples} samples of {mb:.1f} MiB in {args.files} HDF5 files, batch {args.batch}, {args.workers} "
          f"readers/workers; FUSE store {args.open_latency * 1e3:g} ms per open, {args.read_latency * 1e3:g} ms per "
          f"read, {args.bandwidth / 1e6:g} MB/s")
    for k, v in rate.items():
        extra = ""
        if k == "clairvoyant":
            e = runs[k]["epochs"]
            extra = "   store read: " + ", ".join(f"{x['store_bytes'] / nbytes:.2f}x" for x in e)
        print(f"  {k:12s} epoch 1 {v[0]:7.1f} samples/s, epoch 2 {v[1]:7.1f}{extra}")
    print(f"clairvoyant's first epoch / h5py on a local copy: {summary['cold_vs_h5py_local']:.2f}x (target >= 0.9); "
          f"/ h5py on the store: {summary['cold_vs_h5py_store']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
