"""`clairvoyant simulate`: thin: parse, build the models, call ``clairvoyant.sim``, print (``--json``).

Flags mean what they mean for ``clairvoyant plan`` where they share a name
(``--nodes``, ``--gpus``, ``--batch-size``, ``--step-time``, ``--sample-size``,
``--local-capacity``, ``--ram-capacity``, ``--experiments``). ``what_if`` answers
``clairvoyant plan --simulate`` through the same simulator.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import ConfigError

# NoPFS (SC'21) section 6.1's simulated data sets (samples, mean bytes). ImageNet-1k's figures are
# the data set's own; ImageNet-22k's (14.2 M images, about 1.3 TB) and CosmoFlow's (262,144 samples
# of 4 x 128^3 int16 voxels, 16 MiB each) are our reading: give --samples / --sample-size to change.
PRESETS = {
    "imagenet1k": (1_281_167, 110_000),
    "imagenet22k": (14_197_103, 92_000),
    "cosmoflow": (262_144, 16 * 2**20),
}
NOPFS_NODE = dict(local_capacity="1020GB", ram_capacity="5GB")   # 900 GB SSD + 120 GB RAM as the tier; 5 GB staging


def parse_count(value: str, *, what: str) -> int:
    """``1280000``, ``1.28M``, ``14.2e6``, ``500k``."""
    s = str(value).strip().lower().replace(",", "").replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(s[-1:], 1)
    try:
        n = float(s[:-1] if mult != 1 else s) * mult
    except ValueError:
        raise ConfigError(f"{what}={value!r} is not a count: use e.g. 1281167, 1.28M or 500k") from None
    if n < 1:
        raise ConfigError(f"{what} must be >= 1, got {value!r}")
    return int(round(n))


def _rate(value: str, what: str) -> float:
    from ..units import parse_bytes
    return float(parse_bytes(value, what=what))


def _store(args: argparse.Namespace, mean_size: float):
    from ..sim.model import StoreModel, nopfs_store
    from ..units import parse_bytes

    given = [x for x in (args.probe, args.store_curve, args.emulated) if x]
    if len(given) > 1:
        raise ConfigError("give one of --probe, --store-curve and --emulated")
    if args.probe:
        return StoreModel.from_probe(args.probe)
    if args.emulated:
        try:
            parts = [float(x) for x in args.emulated.split(",")]
            open_ms, read_ms, mbs = parts[:3]
            inflight = int(parts[3]) if len(parts) > 3 else 64
        except (ValueError, IndexError):
            raise ConfigError(f"--emulated {args.emulated!r}: give OPEN_MS,READ_MS,MB_PER_S[,IN_FLIGHT], "
                              "e.g. 10,2,400,64") from None
        return StoreModel.emulated(open_latency=open_ms / 1e3, read_latency=read_ms / 1e3, bandwidth=mbs * 1e6,
                                   max_inflight=inflight, sample_bytes=mean_size)
    if args.store_curve:
        pts = {}
        for item in args.store_curve.split(","):
            try:
                r, b = item.split(":")
                pts[int(r)] = float(parse_bytes(b, what="--store-curve rate"))
            except ValueError:
                raise ConfigError(f"--store-curve {args.store_curve!r}: give READERS:RATE pairs, e.g. "
                                  "1:330MB,8:2870MB (bytes per second)") from None
        return StoreModel.from_points(pts, latency=args.store_latency, name=f"curve {args.store_curve}")
    s = nopfs_store()
    return s if not args.store_latency else StoreModel(s.curve, args.store_latency, None, s.name)


def build(args: argparse.Namespace):
    """(job, sizes, hardware, overhead) from the parsed flags."""
    from ..cache.capacity import parse_fraction
    from ..sim.model import Hardware, Job, dataset_sizes
    from ..units import parse_bytes

    preset = PRESETS.get(args.preset) if args.preset else None
    if args.manifest:
        from .. import manifest as manifest_mod
        import numpy as np
        sizes = np.asarray(manifest_mod.load(args.manifest).sizes, dtype=np.int64)
    else:
        samples = parse_count(args.samples, what="--samples") if args.samples else (preset or (1_281_167,))[0]
        mean = (float(parse_bytes(args.sample_size, what="--sample-size")) if args.sample_size
                else float((preset or (0, 110_000))[1]))
        sizes = dataset_sizes(samples, mean, sigma=args.size_sigma, seed=args.seed)
    overhead = 32
    total = int(sizes.sum()) + overhead * len(sizes)

    def capacity(value: str, what: str) -> int:
        if str(value).strip().endswith("%"):
            return int(parse_fraction(value, what=what) * total)
        return parse_bytes(value, what=what)

    local = args.local_capacity or (NOPFS_NODE["local_capacity"] if preset else "900GB")
    ram = args.ram_capacity or (NOPFS_NODE["ram_capacity"] if preset else "5GB")
    from ..plan.compression import raw_capacity
    ratio = getattr(args, "compress_ratio", 1.0)
    hw = Hardware(store=_store(args, float(sizes.mean())),
                  local_capacity=raw_capacity(capacity(local, "--local-capacity"), ratio),
                  window=capacity(ram, "--ram-capacity"),
                  ssd_bandwidth=_rate(args.ssd_bandwidth, "--ssd-bandwidth"),
                  link_bandwidth=_rate(args.link_bandwidth, "--link-bandwidth"), link_latency=args.link_latency,
                  decode_rate=args.decode_rate, cores=args.cores, stage_threads=args.stage_threads,
                  loader_workers=args.loader_workers, jobs=args.experiments)
    job = Job(nodes=args.nodes, gpus=args.gpus, batch_size=args.batch_size, step_time=args.step_time,
              epochs=args.epochs, seed=args.seed, lost_at=getattr(args, "lose_node_at", None))
    return job, sizes, hw, overhead


def _policies(value: str, lost: bool = False) -> tuple[str, ...]:
    from ..sim.policies import POLICIES
    if value == "all":   # (the mount without a sampler does not model a node's loss)
        return tuple(p for p in POLICIES if not (lost and p in ("read-through", "cluster-lru")))
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise ConfigError(f"--policies: unknown {', '.join(bad)}; choose from {', '.join(POLICIES)} or all")
    return names


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..sim import simulate
    from ..sim import report

    if args.sweep and getattr(args, "lose_node_at", None) is not None:
        raise ConfigError("--lose-node-at models one job: it does not go with --sweep")
    job, sizes, hw, overhead = build(args)
    policies = _policies(args.policies, job.lost_at is not None)
    quiet = args.json or not sys.stderr.isatty()
    say = None if quiet else (lambda m: print(f"simulating: {m}", file=sys.stderr))
    out: dict = {}
    if args.sweep in ("nodes", "both"):
        grid = [int(x) for x in args.sweep_nodes.split(",")]
        out["nodes_sweep"] = report.sweep_nodes(job, sizes, hw, grid, policies, overhead=overhead, progress=say)
    if args.sweep in ("dataset", "both"):
        ratios = [float(x) for x in args.sweep_ratios.split(",")]
        out["dataset_sweep"] = report.sweep_dataset(job, sizes, hw, ratios, policies, overhead=overhead,
                                                    progress=say)
    if args.sweep == "step":
        times = [float(x) for x in args.sweep_step_times.split(",")]
        out["step_sweep"] = report.sweep_step_times(job, sizes, hw, times, policies, overhead=overhead,
                                                    progress=say)
    if not args.sweep:
        sim = simulate(job, sizes, hw, policies, overhead=overhead)
        out = sim.to_dict()
    if args.plot and args.sweep in ("nodes", "dataset", "both"):
        report.plot_sweeps(args.plot, out.get("nodes_sweep"), out.get("dataset_sweep"),
                           title=f"{len(sizes):,} samples, {job.gpus} GPU(s) per node, batch {job.batch_size}, "
                                 f"step {job.step_time:g} s, {job.epochs} epochs")
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out))
        return 0
    if not args.sweep:
        print(report.format_table(sim))
    if "nodes_sweep" in out:
        print(report.format_sweep(out["nodes_sweep"], "nodes"))
    if "dataset_sweep" in out:
        print(report.format_sweep(out["dataset_sweep"], "ratio"))
    if "step_sweep" in out:
        print(report.format_sweep(out["step_sweep"], "step_time"))
    if "plot" in out:
        print(f"plot: {args.plot}")
    return 0


def plan_what_if(args: argparse.Namespace, sample_bytes: float, dataset_bytes: float | None) -> dict:
    """``clairvoyant plan --simulate``: the plan's job through the simulator (per-node tiers, the
    cluster cache and the no-I/O bound), this command's defaults for what the plan does not say."""
    from ..sim import simulate

    if dataset_bytes is None:
        raise ConfigError("--simulate needs the data set's size: give --dataset-size or --source")
    ns = add_arguments(argparse.ArgumentParser(add_help=False)).parse_args([])
    ns.nodes, ns.gpus, ns.batch_size, ns.step_time = args.nodes, args.gpus, args.batch_size, args.step_time
    ns.samples, ns.sample_size = str(max(1, round(dataset_bytes / sample_bytes))), str(int(sample_bytes))
    ns.local_capacity = args.local_capacity
    ns.compress_ratio = getattr(args, "compress_ratio", 1.0)
    if args.ram_capacity not in (None, "0"):
        ns.ram_capacity = args.ram_capacity
    ns.experiments, ns.epochs = args.experiments, args.sim_epochs
    job, sizes, hw, overhead = build(ns)
    return simulate(job, sizes, hw, ("node", "cluster", "no-io"), overhead=overhead).to_dict()


def format_what_if(sim: dict) -> str:
    from .. sim.report import LABELS

    lines = [f"simulated ({sim['job']['epochs']} epochs, NoPFS's store unless told; `clairvoyant simulate` "
             "for the rest):"]
    for p in sim["policies"]:
        lines.append(f"  {LABELS.get(p['policy'], p['policy']):16} {p['seconds']:,.1f} s, stall {p['stall_share']:.0%}, "
                     f"p99 wait {p['p99_wait'] * 1e3:,.0f} ms, store {p['store_per_job']:.2f}x the data set per job "
                     f"({', '.join(f'{x:.2f}' for x in p['store_per_epoch'])} per epoch), bound by {p['bound_by']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = p.add_argument_group("the job (as `clairvoyant plan`)")
    g.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    g.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) per node (default 1)")
    g.add_argument("--batch-size", type=int, default=32, help="samples per batch per GPU (default 32)")
    g.add_argument("--step-time", type=float, default=0.2, help="seconds per batch on the GPU (default 0.2)")
    g.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    g.add_argument("--seed", type=int, default=0, help="the shuffle's seed (default 0)")
    g.add_argument("--experiments", type=int, default=1, help="identical jobs sharing the store (default 1)")
    g.add_argument("--lose-node-at", type=int, metavar="K", help="the last node is lost at the start of epoch K and "
                   "the job restarts elastically on the others, their tiers as they were (torchrun --max-restarts): "
                   "what the store pays after")
    d = p.add_argument_group("the data set")
    d.add_argument("--samples", help="samples, e.g. 1.28M (default 1,281,167, or the preset's)")
    d.add_argument("--sample-size", help="mean sample size, e.g. 110KB (default 110 kB, or the preset's)")
    d.add_argument("--size-sigma", type=float, default=0.0,
                   help="log-normal shape of the sizes around the mean (default 0: all equal; ImageNet ~0.5)")
    d.add_argument("--manifest", help="take the sizes from this manifest (clairvoyant index) instead")
    d.add_argument("--preset", choices=sorted(PRESETS), help="NoPFS section 6.1's data sets and node: "
                   "1,020 GB tier (900 GB SSD + 120 GB RAM), 5 GB staging window")
    h = p.add_argument_group("the hardware (per node)")
    h.add_argument("--local-capacity", help="the cache tier, bytes or %% of the data set (default 900GB)")
    h.add_argument("--compress-ratio", type=float, default=1.0,
                   help="compressed staging: raw bytes over stored ones (e.g. 2.2); the tier holds that many "
                   "times its size (the CPU to compress and inflate is not modelled)")
    h.add_argument("--ram-capacity", help="the staging window, bytes or %% (default 5GB)")
    h.add_argument("--store-curve", help="the shared store's aggregate rate vs readers, READERS:RATE,... "
                   "(default NoPFS's 1:330MB,8:2870MB, flat beyond)")
    h.add_argument("--store-latency", type=float, default=0.0, help="seconds per store request (default 0)")
    h.add_argument("--probe", help="the store from `clairvoyant probe --json` output (a file)")
    h.add_argument("--emulated", help="the store as clairvoyant.testing.EmulatedStore: "
                   "OPEN_MS,READ_MS,MB_PER_S[,IN_FLIGHT]")
    h.add_argument("--ssd-bandwidth", default="2GB", help="local tier reads, bytes/s (default 2GB)")
    h.add_argument("--link-bandwidth", default="12.5GB", help="interconnect per node and direction, "
                   "bytes/s (default 12.5GB: 100 Gb/s)")
    h.add_argument("--link-latency", type=float, default=2e-6, help="interconnect, seconds one way (default 2e-6)")
    h.add_argument("--decode-rate", type=float, default=0.0,
                   help="samples/s one core decodes (default 0: decoding is not simulated)")
    h.add_argument("--cores", type=float, default=16, help="decoding cores per node (default 16)")
    h.add_argument("--stage-threads", type=int, default=16, help="store readers per node, staging (default 16)")
    h.add_argument("--loader-workers", type=int, default=4,
                   help="store readers per GPU for the store-only policy (default 4)")
    o = p.add_argument_group("what to run and print")
    o.add_argument("--policies", default="all", help="store-only,staging,node,cluster,read-through,cluster-lru,no-io or all (default all)")
    o.add_argument("--sweep", choices=("nodes", "dataset", "both", "step"), help="sweep nodes, or the data set "
                   "against a node's tier (NoPFS's regimes), or both; or the step time (planned once, timed at "
                   "each), instead of one configuration")
    o.add_argument("--sweep-nodes", default="1,2,4,8,16,32,64,128,256,512,1024",
                   help="nodes for --sweep nodes (default 1,2,4,...,1024)")
    o.add_argument("--sweep-ratios", default="0.25,0.5,1,2,4,8,16,32,64",
                   help="data set / one node's tier for --sweep dataset (default 0.25,...,64)")
    o.add_argument("--sweep-step-times", default="0.2,0.05,0.01,0",
                   help="step times for --sweep step, seconds (default 0.2,0.05,0.01,0; 0: the loading alone)")
    o.add_argument("--plot", help="with --sweep: draw it into this PNG (matplotlib)")
    o.add_argument("--json", action="store_true")
    return p


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help="simulate N nodes x G GPUs with the loader's own plan: store bytes, "
                       "epoch time, stall, per policy",
                       description="Simulate a training job of N nodes x G GPUs with the loader's own plan "
                       "functions and models of the shared store, local tiers, interconnect, cores and GPU step: "
                       "per policy (shared store only, staging window only, per-node tiers, the cluster cache, "
                       "no I/O), the epoch time, the GPUs' stall, the p99 wait, the shared store's bytes per "
                       "epoch and per job, the interconnect's bytes, and what binds. See docs/simulator.md.")
    add_arguments(p)
    p.set_defaults(fn=cmd_simulate)
    return p
