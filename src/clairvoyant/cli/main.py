"""The `clairvoyant` command: thin, it parses, calls the library and prints (``--json`` for scripts)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import ClairvoyantError, ConfigError


def _cmd_index(args: argparse.Namespace) -> int:
    from .. import manifest as manifest_mod
    from ..source import as_source

    source = as_source(args.source, _storage_options(args))
    path = args.output or manifest_mod.default_manifest_path(source.uri)
    found = None if args.force else manifest_mod.existing(source.uri, args.output)
    man = None
    if found is not None:
        # checked against a directory source (a stat per folder; changed folders listed again)
        man, changed = manifest_mod.current(source, manifest_mod.load(found, verify=True), found)
        if found != path or changed:   # an earlier version's JSON at the default place: saved again, binary
            manifest_mod.save(man, path)
        built = False
    if man is None:
        from tqdm import tqdm
        bar = tqdm(desc=f"listing {args.source}", unit=" files", disable=args.json or not sys.stderr.isatty())
        last = [0]

        def progress(n: int) -> None:
            bar.update(n - last[0])
            last[0] = n

        man = manifest_mod.build(source, progress=progress)
        bar.close()
        manifest_mod.save(man, path)
        built = True
    info = {"source": source.uri, "manifest": path, "samples": len(man), "bytes": man.total_bytes,
            "classes": len(man.classes), "built": built, "fingerprint": man.fingerprint}
    if args.json:
        print(json.dumps(info))
    else:
        verb = "indexed" if built else "already indexed (use --force to walk it again)"
        print(f"{source.uri}: {verb}: {len(man)} samples, {man.total_bytes} bytes, "
              f"{len(man.classes)} classes -> {path}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.local_capacity is not None:
        return _demo_capacity(args)
    from ..experiments import staging

    grid = tuple(int(w) for w in args.workers.split(","))
    summary = staging.run(batches=args.batches, batch_size=args.batch_size, workers_grid=grid,
                          data_dir=args.data_dir, stage_threads=args.stage_threads, copy_threads=args.copy_threads,
                          open_latency=args.open_latency_ms / 1e3, read_latency=args.read_latency_ms / 1e3,
                          bandwidth=args.bandwidth_mbs * 1e6, repeats=args.repeats, decoder=args.decoder,
                          progress=not args.json and sys.stderr.isatty())
    return _print_experiment(args, staging, summary, "targets")


def _demo_capacity(args: argparse.Namespace) -> int:
    """The bounded-cache demo: hit rate per epoch against the optimum and LRU, source bytes."""
    from ..cache.capacity import parse_fraction
    from ..experiments import caching

    f = parse_fraction(args.local_capacity, what="--local-capacity")
    if f > 1:
        raise ConfigError(f"--local-capacity {args.local_capacity!r} must be in (0%, 100%]")
    summary = caching.hit_rates(images=args.images, fractions=(f,), ranks_grid=(1, 4), epochs=args.epochs,
                                data_dir=args.data_dir, progress=not args.json)
    return _print_experiment(args, caching, summary, "rows")


def _print_experiment(args: argparse.Namespace, experiment, summary: dict, key: str) -> int:
    """Write an experiment's JSON and plot, then print its table (or, with --json, the paths and
    ``summary[key]``)."""
    jpath, ppath = experiment.write(summary, args.out)
    if args.json:
        print(json.dumps({"json": jpath, "plot": ppath, key: summary[key]}))
    else:
        print(experiment.format_table(summary))
        print(f"\nwrote {jpath} and {ppath}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..plan.budget import loading_budget
    from ..plan.compression import raw_capacity
    from ..units import format_bytes, parse_bytes

    sample = dataset = None
    if args.source:
        from .. import manifest as manifest_mod
        from ..source import as_source
        man, _ = manifest_mod.obtain(as_source(args.source))
        dataset, sample = float(man.total_bytes), man.total_bytes / len(man)
    if args.sample_size is not None:
        sample = float(parse_bytes(args.sample_size, what="--sample-size"))
    if sample is None:
        raise ConfigError("give --sample-size (e.g. 64KiB) or --source to measure it from the data set")
    if args.dataset_size is not None:
        dataset = float(parse_bytes(args.dataset_size, what="--dataset-size"))
    b = loading_budget(batch_size=args.batch_size, step_time=args.step_time, sample_bytes=sample,
                       gpus_per_node=args.gpus, nodes=args.nodes, experiments=args.experiments,
                       dataset_bytes=dataset,
                       local_capacity=raw_capacity(parse_bytes(args.local_capacity, what="--local-capacity"),
                                                   args.compress_ratio),
                       ram_capacity=parse_bytes(args.ram_capacity, what="--ram-capacity"))
    sim = None
    if args.simulate:   # what-ifs through the simulator (cli/simulate.py)
        from .simulate import plan_what_if
        sim = plan_what_if(args, sample, dataset)
    if args.json:
        print(json.dumps(b.to_dict() if sim is None else {**b.to_dict(), "simulation": sim}))
        return 0
    gpus = args.gpus * args.nodes * args.experiments
    print(f"per GPU:   {b.samples_per_s_per_gpu:,.0f} samples/s ({b.batch_size} every {b.step_time:g} s); "
          f"the p99 wait for a batch must stay under {b.latency_budget_s * 1e3:.0f} ms")
    print(f"in total:  {b.samples_per_s:,.0f} samples/s over {gpus} GPUs "
          f"({args.gpus} per node x {args.nodes} nodes x {args.experiments} experiments)")
    print(f"storage:   {b.iops:,.0f} read IOPS and {format_bytes(b.bytes_per_s)}/s "
          f"at {format_bytes(b.sample_bytes)} per sample")
    if b.hit_rate is not None:
        rise = ("" if b.hit_rate >= b.hit_rate_limit - 1e-9 else
                f", rising to {b.hit_rate_limit:.0%} by about epoch {b.epochs_to_limit + 1} (a node caches only "
                f"what it read: 1/{b.nodes} of each epoch; the cluster cache pools the nodes' tiers)")
        print(f"cache:     {b.cache_fraction:.0%} of the data set fits on each node -> hit rate {b.hit_rate:.0%} "
              f"in the second epoch{rise}; the shared storage is left with {b.shared_iops:,.0f} IOPS and "
              f"{format_bytes(b.shared_bytes_per_s)}/s then")
    if sim is not None:
        from .simulate import format_what_if
        print(format_what_if(sim))
    return 0


def _cmd_cache_verify(args: argparse.Namespace) -> int:
    from ..cache.verify import verify
    from ..units import format_bytes

    reports = verify(args.dir, repair=args.repair)
    if args.json:
        print(json.dumps([r.to_json() for r in reports]))
    else:
        for r in reports:
            state = "consistent" if r.consistent else "INCONSISTENT"
            print(f"{r.root}: {state}: {r.entries} entries, {format_bytes(r.bytes)} on disk, ledger "
                  f"{format_bytes(r.ledger)} (peak {format_bytes(r.peak)}){', in use' if r.in_use else ''}")
            for path, why in r.corrupt:
                print(f"  corrupt: {path}: {why}")
            for path in r.orphans:
                print(f"  orphan temporary file: {path}")
            if not r.in_use and r.ledger != r.bytes:
                print(f"  ledger differs from the bytes on disk by {r.ledger - r.bytes:+d}")
        if not reports:
            print(f"{args.dir}: no cached source")
        if any(not r.consistent for r in reports) and not args.repair:
            print("run `clairvoyant cache verify --repair DIR` (or start a job on it) to fix this")
    return 0 if all(r.consistent for r in reports) else 1


def _cmd_cache_clear(args: argparse.Namespace) -> int:
    from ..cache.verify import clear

    n = clear(args.dir)
    print(json.dumps({"removed": n}) if args.json else f"{args.dir}: removed {n} entries")
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    from .. import manifest as manifest_mod
    from ..plan.budget import advise, loading_budget
    from ..source import as_source
    from ..cache.capacity import parse_capacity
    from ..tune.probe import probe
    from ..units import format_bytes

    if args.emulate:
        from ..testing import EmulatedStore
        try:
            open_ms, read_ms, mbs = (float(x) for x in args.emulate.split(","))
        except ValueError:
            raise ConfigError(f"--emulate {args.emulate!r}: give OPEN_MS,READ_MS,MB_PER_S, e.g. 10,2,400") from None
        source = EmulatedStore(args.path, open_latency=open_ms / 1e3, read_latency=read_ms / 1e3,
                               bandwidth=mbs * 1e6)
    else:
        source = as_source(args.path, _storage_options(args))
    man, _ = manifest_mod.obtain(source)
    source.use_manifest(man)   # an object store: reads of exactly the listed sizes
    readers = tuple(int(r) for r in args.readers.split(","))
    quiet = args.json or not sys.stderr.isatty()
    res = probe(source, man, readers=readers, seconds=args.seconds, local_dir=args.local_dir,
                progress=None if quiet else (lambda m: print(f"probing: {m}", file=sys.stderr)))
    out = res.to_json()
    advice = None
    if args.batch_size is not None and args.step_time is not None:
        b = loading_budget(batch_size=args.batch_size, step_time=args.step_time, sample_bytes=res.mean_size,
                           gpus_per_node=args.gpus, dataset_bytes=float(man.total_bytes),
                           local_capacity=parse_capacity(args.local_capacity, what="--local-capacity",
                                                         dataset_bytes=man.total_bytes).nbytes)
        advice = advise(b, res.best.files_per_s, res.best.readers)
        out["advice"] = advice.to_dict()
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{res.uri}: {res.samples} samples, mean {format_bytes(res.mean_size)}")
    print(f"metadata (stat): p50 {res.stat_s['p50'] * 1e3:.2f} ms, p99 {res.stat_s['p99'] * 1e3:.2f} ms")
    print(f"read, one reader: p50 {res.read_s['p50'] * 1e3:.2f} ms, p90 {res.read_s['p90'] * 1e3:.2f} ms, "
          f"p99 {res.read_s['p99'] * 1e3:.2f} ms")
    print("readers  files/s     bytes/s")
    for p in res.curve:
        print(f"{p.readers:7d}  {p.files_per_s:9,.0f}  {format_bytes(p.bytes_per_s)}/s")
    if res.reused:
        print("(the data set is small: some samples were read twice, a page cache may flatter the figures)")
    if res.local:
        print(f"local {res.local['dir']}: create {res.local['write_files_per_s']:,.0f} files/s, "
              f"read back {res.local['read_files_per_s']:,.0f} files/s")
    for line in advice.lines if advice else ():
        print(line)
    return 0


def _storage_options(args: argparse.Namespace) -> dict | None:
    """``--storage-options JSON`` as a dict (None when not given)."""
    if args.storage_options is None:
        return None
    try:
        opts = json.loads(args.storage_options)
    except ValueError as e:   # the message would quote the text, which may hold a secret
        raise ConfigError(f"--storage-options is not valid JSON (at character {e.pos}): give a JSON object, "
                          "e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'") from None
    if not isinstance(opts, dict):
        raise ConfigError("--storage-options must be a JSON object of the fsspec file system's options")
    return opts


def _cmd_report(args: argparse.Namespace) -> int:
    from ..tune.report import draw, load

    out = args.out or os.path.splitext(args.path)[0] + ".png"
    batches, epochs = load(args.path)
    draw(args.path, out)
    if args.json:
        print(json.dumps({"png": out, "batches": len(batches), "epochs": len(epochs)}))
    else:
        for r in epochs:
            print(r.get("line", ""))
        print(f"wrote {out} ({len(batches)} batches, {len(epochs)} epochs)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clairvoyant", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    ix = sub.add_parser("index", help="list a source once and persist its manifest")
    ix.add_argument("source", help="directory of the data set, or an object store URL (s3://bucket/prefix, ...)")
    ix.add_argument("--storage-options", metavar="JSON",
                    help="with a URL: the fsspec file system's options as a JSON object (endpoint_url, key...)")
    ix.add_argument("-o", "--output", help="manifest path (default: the per-user cache)")
    ix.add_argument("--force", action="store_true", help="walk the source again even if indexed")
    ix.add_argument("--json", action="store_true")
    ix.set_defaults(fn=_cmd_index)

    pl = sub.add_parser("plan", help="the loading budget: what storage must deliver to keep the GPUs fed")
    pl.add_argument("--batch-size", type=int, required=True, help="samples per batch per GPU")
    pl.add_argument("--step-time", type=float, required=True, help="seconds per batch on the GPU")
    pl.add_argument("--sample-size", help="mean sample size, e.g. 64KiB (or measured from --source)")
    pl.add_argument("--source", help="a data set whose manifest gives the sample and data set sizes")
    pl.add_argument("--gpus", type=int, default=1, help="GPUs per node")
    pl.add_argument("--nodes", type=int, default=1)
    pl.add_argument("--experiments", type=int, default=1, help="concurrent jobs sharing the storage")
    pl.add_argument("--dataset-size", help="data set size, e.g. 140GB, for the cache hit rate")
    pl.add_argument("--local-capacity", default="0", help="node-local SSD for the cache, e.g. 400GiB")
    pl.add_argument("--compress-ratio", type=float, default=1.0,
                    help="compressed staging (Loader(compress=...)): the data set's raw bytes over the stored ones, "
                    "e.g. 2.2; the local tier holds that many times its size (default 1: none)")
    pl.add_argument("--ram-capacity", default="0", help="RAM for the staging window, e.g. 32GiB (not a cache: "
                    "it does not raise the hit rate)")
    pl.add_argument("--simulate", action="store_true", help="also simulate the job (clairvoyant simulate): "
                    "store bytes, stall and epoch time with per-node tiers and the cluster cache")
    pl.add_argument("--sim-epochs", type=int, default=3, help="epochs for --simulate (default 3)")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(fn=_cmd_plan)

    from .simulate import add_parser as add_simulate
    add_simulate(sub)

    from .pack import add_parser as add_pack
    add_pack(sub)

    from .mount import add_parser as add_mount
    add_mount(sub)

    pr = sub.add_parser("probe", help="measure the storage: latency, throughput vs. readers (never writes there)")
    pr.add_argument("path", help="the data set's directory, or an object store URL (s3://bucket/prefix, ...)")
    pr.add_argument("--storage-options", metavar="JSON",
                    help="with a URL: the fsspec file system's options as a JSON object (endpoint_url, key...)")
    pr.add_argument("--readers", default="1,2,4,8,16,32,64", help="concurrent readers to try")
    pr.add_argument("--seconds", type=float, default=1.0, help="time per number of readers")
    pr.add_argument("--local-dir", help="also measure this node-local directory (files are created and removed)")
    pr.add_argument("--batch-size", type=int, help="with --step-time: hold the result against the budget")
    pr.add_argument("--step-time", type=float)
    pr.add_argument("--gpus", type=int, default=1, help="GPUs per node")
    pr.add_argument("--local-capacity", default="0", help="node-local cache, e.g. 400GiB or 50%% of the data set")
    pr.add_argument("--emulate", help="probe PATH as an emulated store: OPEN_MS,READ_MS,MB_PER_S")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(fn=_cmd_probe)

    rp = sub.add_parser("report", help="draw a run's metrics log (Loader(metrics=PATH)) as a PNG")
    rp.add_argument("path")
    rp.add_argument("--out", help="PNG path (default: next to the log)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(fn=_cmd_report)

    ca = sub.add_parser("cache", help="check or empty a cache directory (local_dir or the RAM tier)")
    casub = ca.add_subparsers(dest="cache_command", required=True)
    cv = casub.add_parser("verify", help="check every entry, the ledger and leftover temporary files")
    cv.add_argument("dir")
    cv.add_argument("--repair", action="store_true", help="remove what is wrong and fix the ledger (when idle)")
    cv.add_argument("--json", action="store_true")
    cv.set_defaults(fn=_cmd_cache_verify)
    cc = casub.add_parser("clear", help="remove every entry (refused while a job uses the directory)")
    cc.add_argument("dir")
    cc.add_argument("--json", action="store_true")
    cc.set_defaults(fn=_cmd_cache_clear)

    dm = sub.add_parser("demo", help="staging vs. PyTorch's DataLoader on an emulated slow store")
    dm.add_argument("--batches", type=int, default=100, help="mini-batches to draw (the paper: 1000)")
    dm.add_argument("--batch-size", type=int, default=32)
    dm.add_argument("--workers", default="2,4,8,16", help="DataLoader worker counts to try")
    dm.add_argument("--stage-threads", type=_threads, default="auto",
                    help="clairvoyant's staging threads: 'auto' (the tuner, as users run it) or a count")
    dm.add_argument("--copy-threads", type=int, default=32, help="threads of (c), the copy-everything-first run")
    dm.add_argument("--open-latency-ms", type=float, default=10.0)
    dm.add_argument("--read-latency-ms", type=float, default=2.0)
    dm.add_argument("--bandwidth-mbs", type=float, default=400.0)
    dm.add_argument("--decoder", choices=("auto", "pillow"), default="auto",
                    help="JPEG decoder for every configuration: libjpeg-turbo direct (auto) or Pillow")
    dm.add_argument("--repeats", type=int, default=3, help="runs of (b) and (d); the median is reported")
    dm.add_argument("--data-dir", help="where the synthetic data set is generated (default: the cache)")
    dm.add_argument("--out", default="out/demo", help="folder for the JSON and the PNG")
    dm.add_argument("--local-capacity", help="instead: the bounded cache at this share of the data set, "
                    "e.g. 50%%: hit rate per epoch vs. the offline optimum and LRU, 1 and 4 ranks")
    dm.add_argument("--images", type=int, default=2000, help="data set size for --local-capacity")
    dm.add_argument("--epochs", type=int, default=4, help="epochs for --local-capacity")
    dm.add_argument("--json", action="store_true")
    dm.set_defaults(fn=_cmd_demo)
    return p


def _threads(text: str) -> int | str:
    """``--stage-threads``: 'auto' or a positive count."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor a count") from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1 thread")
    return n


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ClairvoyantError as e:
        print(f"clairvoyant: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("clairvoyant: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
