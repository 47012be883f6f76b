"""Benchmark: one rank's resident memory at ImageNet-1k size, while it trains (issue 22).

An ImageNet-like manifest of 1.28 M samples (1,000 classes, sizes log-normal around 110 KB) is
written once; then, in a process of its own (Linux's ``ru_maxrss`` carries a parent's peak
across fork), ``import torch``, a ``Loader`` over a source whose files are generated on read
(each key carries its size; the bytes are zeros: nothing of the data set is on disk, so only the
loader's own memory is measured), batch 256, 2 reader processes, and 21 batches of epoch 0
taken. Reported: the rank's resident set (VmRSS, split anonymous / file-backed) after import
torch, after the Loader is built, and after the 21 batches, and its peak (VmHWM). The readers are
processes of their own and are not counted. Target: <= 400 MiB resident after the 21 batches.

    python benchmarks/rank_memory.py                # 1.28 M samples
    python benchmarks/rank_memory.py --tiny         # a smoke size for CI
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.abspath(__file__)


class SizedSource:
    """Samples generated on read: key ``<class>/<class>_<i>_<size>.JPEG`` reads as ``size`` zero bytes."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def scan(self):
        raise RuntimeError("give the manifest: this source lists nothing")

    def read(self, key: str) -> bytes:
        return bytes(int(key.rsplit("_", 1)[1].split(".", 1)[0]))


def nbytes(data: bytes) -> int:
    return len(data)


def rss() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


def write_manifest(path: str, uri: str, samples: int, classes: int, seed: int = 0) -> None:
    import numpy as np

    from clairvoyant.manifest import Manifest, save
    rng = np.random.default_rng(seed)
    wnids = np.sort(rng.choice(10 ** 8, size=classes, replace=False))
    per_class = np.bincount(rng.integers(0, classes, size=samples), minlength=classes)
    sizes = np.clip(rng.lognormal(np.log(110e3), 0.5, size=samples), 1e3, 5e6).astype(np.int64)
    keys: list[str] = []
    at = 0
    for w, count in zip(wnids.tolist(), per_class.tolist()):
        d = f"n{w:08d}"
        keys += sorted(f"{d}/{d}_{j}_{int(sizes[at + j])}.JPEG" for j in range(count))
        at += count
    sizes = np.array([int(k.rsplit("_", 1)[1].split(".", 1)[0]) for k in keys], np.int64)
    labels = np.repeat(np.arange(classes, dtype=np.int64), per_class)
    save(Manifest(uri=uri, keys=keys, sizes=sizes, labels=labels,
                  classes=tuple(f"n{w:08d}" for w in wnids.tolist())), path)


def child(manifest: str, local: str, batches: int, batch: int) -> dict:
    import torch  # noqa: F401  (imported first, as a training script does)
    out = {"after_import_torch": rss()}
    from clairvoyant import Loader
    src = SizedSource("sized://rank-memory")
    loader = Loader(src, manifest=manifest, batch_size=batch, num_workers=2, local_dir=local,
                    decode=nbytes, output="numpy")
    out["after_loader"] = rss()
    n = 0
    for _ in loader:
        n += 1
        if n == batches:
            break
    out["after_batches"] = rss()
    out["batches"] = n
    out["tiers"] = loader.stats()["tiers"]
    out["ram_window_mib"] = round(loader.tiers.usage()["ram"]["used"] / 2**20, 1)   # staged bytes held here
    out["lookahead"] = loader.lookahead
    out["capacities"] = {k: str(v) for k, v in loader.capacities.items()}
    loader.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=float, default=1.28e6)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batches", type=int, default=21)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.child:
        manifest, local, batches, batch = args.child
        print(json.dumps(child(manifest, local, int(batches), int(batch))))
        return 0
    if args.tiny:
        args.samples, args.classes, args.batches, args.batch = 2000, 10, 3, 32
    work = tempfile.mkdtemp(prefix="clairvoyant-rank-memory-")
    try:
        path = os.path.join(work, "manifest.bin")
        write_manifest(path, "sized://rank-memory", int(args.samples), args.classes)
        r = subprocess.run([sys.executable, HERE, "--child", path, os.path.join(work, "local"), str(args.batches),
                            str(args.batch)], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        out = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["samples"], out["batch"] = int(args.samples), args.batch
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for stage in ("after_import_torch", "after_loader", "after_batches"):
        m = out[stage]
        print(f"{stage:20s} VmRSS {m['VmRSS']:7.1f} MiB (anon {m['RssAnon']:6.1f}, file {m['RssFile']:6.1f}); "
              f"peak {m['VmHWM']:7.1f} MiB")
    print(f"{out['samples']:,} samples, batch {args.batch}, {out['batches']} batches: resident after them "
          f"{out['after_batches']['VmRSS']:.0f} MiB (target <= 400)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
