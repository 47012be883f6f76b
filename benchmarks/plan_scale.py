"""Benchmark: the scale of the manifest and of the plan itself (issue 9, "Scale of the plan itself").

Builds a synthetic ImageNet-like manifest (keys ``n%08d/n%08d_%d.JPEG`` over 21,841 classes, or
1,000 at ImageNet-1k size; sizes around 110 KB from a fixed-seed log-normal), saves it in a
temporary directory and reads it once so that it is warm in the page cache. Then, in a fresh
process (so that its memory is that of one rank), it measures: the file's size; the time to load
it; the time to build a ``clairvoyant.Loader`` over an (empty) directory source with that manifest
(``manifest=``; everything the constructor does, tiers included); ``plan_rank_epoch`` for rank 0
of a cluster of ``--nodes`` x ``--ranks`` ranks (``--capacity`` per node) for epoch 0 and epoch 1
(epoch 1 from epoch 0's ``cluster_residents``); the lookup of cache entry names (what the first
epoch's residents cost, ``Manifest.find_digests``); the peak resident memory after each step
(``ru_maxrss``; the current RSS split into anonymous and file-backed pages, the manifest's pages
being file-backed and shared by the ranks of a node).

    python benchmarks/plan_scale.py                        # ImageNet-22k size: 14.2 M samples
    python benchmarks/plan_scale.py --samples 1.28e6       # ImageNet-1k size
    python benchmarks/plan_scale.py --samples 1.28e6 --compare-v1   # also the JSON manifest (version 1)
    python benchmarks/plan_scale.py --samples 20000 --nodes 4 --json  # tiny (the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def synthetic(uri: str, samples: int, classes: int, seed: int = 0):
    """An ImageNet-like manifest: sorted keys ``n<wnid>/n<wnid>_<i>.JPEG``, ImageFolder labels."""
    import numpy as np

    from clairvoyant.manifest import Manifest
    rng = np.random.default_rng(seed)
    wnids = np.sort(rng.choice(10 ** 8, size=classes, replace=False))
    per_class = np.bincount(rng.integers(0, classes, size=samples), minlength=classes)
    keys: list[str] = []
    for w, count in zip(wnids.tolist(), per_class.tolist()):
        d = f"n{w:08d}"
        keys += sorted(f"{d}/{d}_{j}.JPEG" for j in range(count))
    labels = np.repeat(np.arange(classes, dtype=np.int64), per_class)
    sizes = np.clip(rng.lognormal(np.log(110e3), 0.5, size=samples), 1e3, 5e6).astype(np.int64)
    return Manifest(uri=uri, keys=keys, sizes=sizes, labels=labels,
                    classes=tuple(f"n{w:08d}" for w in wnids.tolist()))


def memory() -> dict:
    """Peak RSS so far (ru_maxrss) and the current RSS split, in MiB."""
    import resource
    out = {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssFile"):
                    out[name] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def child(args: argparse.Namespace) -> None:
    """One rank: load, build the loader, plan two epochs, look up entry names."""
    args.manifest = sys.stdin.readline().strip()   # once the manifest is written
    import numpy as np

    from clairvoyant import Loader
    from clairvoyant import manifest as manifest_mod
    from clairvoyant.cache.entry import entry_size
    from clairvoyant.cache.extents import key_digest
    from clairvoyant.plan.layout import NodeLayout
    from clairvoyant.plan.rank_plan import ClusterTiers, PlanConfig, plan_rank_epoch
    res: dict = {"after_imports": memory()}
    t = time.perf_counter()
    man = manifest_mod.load(args.manifest)
    res["load_s"] = time.perf_counter() - t
    res["fingerprint"] = man.fingerprint
    res["after_load"] = memory()
    del man
    world, rpn = args.nodes * args.ranks, args.ranks
    t = time.perf_counter()
    ld = Loader(args.data, batch_size=args.batch_size, local_dir=os.path.join(args.work, "local"),
                manifest=args.manifest, rank=0, world_size=world, local_world_size=rpn, cluster=False,
                num_workers=1, stage_threads=1, output="numpy")
    res["loader_s"] = time.perf_counter() - t
    res["after_loader"] = memory()
    man = ld.manifest
    entry_sizes = ld._entry_sizes   # what the loader plans with (manifest sizes + entry header)
    assert entry_sizes[0] == man.sizes[0] + entry_size(0)
    config = PlanConfig(len(man), args.batch_size, seed=0)
    layout = NodeLayout.blocks(world, rpn, rank=0)
    capacities = (int(args.capacity),) * args.nodes
    held: tuple = tuple({} for _ in layout.nodes)
    for epoch in (0, 1):
        spec = ClusterTiers(layout, capacities, held)
        t = time.perf_counter()
        plan = plan_rank_epoch(entry_sizes, config, layout, epoch=epoch, capacity=capacities[0], residents={},
                               cluster=spec)
        res[f"plan{epoch}_s"] = time.perf_counter() - t
        res[f"after_plan{epoch}"] = memory()
        res[f"plan{epoch}_batches"] = len(plan)
        held = plan.cluster_residents
        del plan
    del held
    names = np.array([key_digest(man.keys[int(i)])   # the local tier index's keys (cache/extents.py)
                      for i in np.random.default_rng(1).choice(len(man), size=min(args.lookups, len(man)),
                                                               replace=False)], dtype=np.uint64)
    t = time.perf_counter()
    found = man.find_digests(names)
    res["lookup_s"] = time.perf_counter() - t
    res["lookups"] = len(names)
    assert bool(np.all(found >= 0))
    res["after_lookup"] = memory()
    ld.close()
    print(json.dumps(res))


def spawn(args: argparse.Namespace, work: str, data: str) -> subprocess.Popen:
    """A measuring process, started before this one grows: on Linux ru_maxrss carries the parent's
    peak across fork and exec, so a child started later would report the generator's memory."""
    cmd = [sys.executable, HERE, "--child", "--data", data, "--work", work, "--nodes", str(args.nodes),
           "--ranks", str(args.ranks), "--batch-size", str(args.batch_size), "--capacity", str(args.capacity),
           "--lookups", str(args.lookups)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def measure(proc: subprocess.Popen, path: str) -> dict:
    """Hand the manifest's path to a waiting measuring process and take its figures."""
    out, err = proc.communicate(path + "\n")
    if proc.returncode != 0:
        sys.exit(f"the measuring process failed:\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=float, default=14.2e6)
    p.add_argument("--classes", type=int, default=None, help="default: 1,000 up to 1.5 M samples, else 21,841")
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--ranks", type=int, default=4, help="ranks per node")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--capacity", type=float, default=900e9, help="local-tier bytes per node")
    p.add_argument("--lookups", type=int, default=100_000, help="cache entry names to look up")
    p.add_argument("--compare-v1", action="store_true", help="also measure the same manifest as JSON (version 1)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    n = int(round(args.samples))
    classes = args.classes or (1000 if n <= 1_500_000 else 21841)
    out: dict = {"samples": n, "classes": classes, "nodes": args.nodes, "ranks_per_node": args.ranks,
                 "batch_size": args.batch_size, "capacity": args.capacity}
    with tempfile.TemporaryDirectory(prefix="plan_scale.") as work:
        data = os.path.join(work, "data")
        os.makedirs(data)
        procs = {name: spawn(args, work, data) for name in ("v2", "v1")[:2 if args.compare_v1 else 1]}
        from clairvoyant import manifest as manifest_mod
        from clairvoyant.source import as_source
        t = time.perf_counter()
        man = synthetic(as_source(data).uri, n, classes)
        out["generate_s"] = time.perf_counter() - t
        path = os.path.join(work, "m.manifest")
        t = time.perf_counter()
        manifest_mod.save(man, path)   # fingerprint and digest index computed here, once
        out["save_s"] = time.perf_counter() - t
        out["file_mb"] = os.path.getsize(path) / 1e6
        variants = [("v2", path)]
        if args.compare_v1:
            v1 = os.path.join(work, "m.json")
            manifest_mod.save(man, v1, version=1)
            out["v1_file_mb"] = os.path.getsize(v1) / 1e6
            variants.append(("v1", v1))
        del man
        for name, file in variants:
            warm(file)
            out[name] = measure(procs[name], file)
    report(out, args.json)


def report(out: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(out))
        return
    print(f"{out['samples']:,} samples, {out['classes']:,} classes; plan for rank 0 of {out['nodes']:,} nodes x "
          f"{out['ranks_per_node']} ranks, batch {out['batch_size']}, {out['capacity'] / 1e9:g} GB per node")
    print(f"synthetic manifest: generated in {out['generate_s']:.1f} s, saved (fingerprint + digest index) "
          f"in {out['save_s']:.1f} s")
    print()
    print("| manifest | file | load | Loader built | peak RSS after build | plan epoch 0 | plan epoch 1 | "
          "peak RSS after plans | entry lookups |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("v2", "v1"):
        r = out.get(name)
        if r is None:
            continue
        size = out["file_mb"] if name == "v2" else out["v1_file_mb"]
        a, b = r["after_loader"], r["after_plan1"]
        print(f"| {name} | {size:.1f} MB | {r['load_s']:.2f} s | {r['loader_s']:.2f} s | "
              f"{a['peak_mib']:.0f} MiB (now anon {a.get('RssAnon', 0):.0f}, file {a.get('RssFile', 0):.0f}) | "
              f"{r['plan0_s']:.2f} s | {r['plan1_s']:.2f} s | {b['peak_mib']:.0f} MiB "
              f"(now anon {b.get('RssAnon', 0):.0f}, file {b.get('RssFile', 0):.0f}) | "
              f"{r['lookups']:,} in {r['lookup_s']:.2f} s |")
    print()
    print("peak RSS after imports: %.0f MiB; after load: %.0f MiB" % (
        out["v2"]["after_imports"]["peak_mib"], out["v2"]["after_load"]["peak_mib"]))


if __name__ == "__main__":
    main()
