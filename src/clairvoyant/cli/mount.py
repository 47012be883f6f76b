"""`clairvoyant mount SRC MNT`, `clairvoyant mount --stats MNT`, `clairvoyant umount MNT`: thin."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


PAGE_CACHE_UNSEEN = ("opens served by the kernel's page cache are not counted: the kernel sends this mount no "
                     "open (no_open), so a file read again while its pages are cached never reaches the daemon; "
                     "the counts are of files read through the daemon, not of opens (CLAIRVOYANT_MOUNT_OPENS=1 in "
                     "the mount's environment counts them, at one request per open and per close)")


def _print_stats(mnt: str, as_json: bool) -> int:
    from ..mount.fs import read_info, read_stats

    info = read_info(mnt)
    s = read_stats(info["stats"])
    staging = {}
    try:
        with open(info["staging"]) as f:
            staging = json.load(f)
    except (OSError, ValueError):
        pass
    if as_json:
        print(json.dumps({"mount": mnt, **s.to_json(), "staging": staging,
                          **({} if s.page_cache_counted else {"note": PAGE_CACHE_UNSEEN})}))
        return 0
    from ..units import format_bytes
    reads = s.opens_local + s.opens_source
    share = f" ({100 * s.opens_local / reads:.1f}% local)" if reads else ""
    opens = f"files read through the daemon: {s.opens_local} local, {s.opens_source} from the source{share}"
    if s.page_cache_counted:
        opens = (f"opens {s.opens}, {s.opens_cached} of them with no read reaching the daemon (served by the "
                 f"kernel's page cache, or nothing read); {opens}")
    if s.asks:
        opens += (f"; {s.opens_peer} from other nodes' tiers ({format_bytes(s.bytes_peer)}; {s.asks} asked, "
                  f"{s.ask_timeouts} not answered in time)")
    print(f"{mnt}: {opens}; bytes {format_bytes(s.bytes_local)} local, {format_bytes(s.bytes_source)} from the "
          f"source; {s.corrupt} corrupt and {s.stale} stale entries not served"
          + (f"; {s.events_dropped} first reads the staging did not hear of (it fell behind)"
             if s.events_dropped else "")
          + (f"; {s.wait_timeouts} first reads gave up waiting for a copy under way and read the store too"
             if s.wait_timeouts else ""))
    if not s.page_cache_counted:
        print(f"note: {PAGE_CACHE_UNSEEN}")
    if staging:
        print("staging: " + ", ".join(f"{k} {v}" for k, v in staging.items()))
    return 0


CLUSTER_FIELDS = ("served_from_store", "served_from_tier", "ahead_from_store", "ahead_from_tier")
JOB_FIELDS = ("opens_local", "opens_peer", "opens_source", "bytes_local", "bytes_peer", "bytes_source", "asks",
              "ask_timeouts", "corrupt", "stale", "wait_timeouts")


def _print_job_stats(mnts: list[str], as_json: bool) -> int:
    """``--stats MNT MNT...``: each node's counters and the job's (the nodes' mounts of a cluster on
    one machine, or mount points gathered from the nodes' shared home)."""
    from ..mount.fs import read_info, read_stats
    from ..units import format_bytes

    nodes = []
    for mnt in mnts:
        info = read_info(mnt)
        s = read_stats(info["stats"]).to_json()
        try:
            with open(info["staging"]) as f:
                served = json.load(f).get("cluster", {})
        except (OSError, ValueError):
            served = {}
        nodes.append({"mount": mnt, **{k: s[k] for k in JOB_FIELDS},
                      **{k: served.get(k, 0) for k in CLUSTER_FIELDS}})
    job = {k: sum(n[k] for n in nodes) for k in (*JOB_FIELDS, *CLUSTER_FIELDS)}
    job["store_reads"] = job["opens_source"] + job["served_from_store"] + job["ahead_from_store"]
    if as_json:
        print(json.dumps({"nodes": nodes, "job": job}))
        return 0
    for n in nodes + [dict(job, mount="job")]:
        print(f"{n['mount']}: files from the own tier {n['opens_local']}, from peers {n['opens_peer']} "
              f"({n['asks']} asked, {n['ask_timeouts']} not answered in time), from the store {n['opens_source']}; "
              f"served to peers {n['served_from_tier']} from the tier and {n['served_from_store']} read from the "
              f"store for them; {n['ahead_from_store']} own files read from the store ahead; bytes {format_bytes(n['bytes_local'])} own, {format_bytes(n['bytes_peer'])} peers, "
              f"{format_bytes(n['bytes_source'])} store")
    print(f"the store read {job['store_reads']} files for the job (the daemons' reads, the homes' for peers and "
          "ahead)")
    return 0


def cmd_mount(args: argparse.Namespace) -> int:
    if args.stats:
        if len(args.paths) == 1:
            return _print_stats(args.paths[0], args.json)
        return _print_job_stats(args.paths, args.json)
    if len(args.paths) != 2:
        raise SystemExit("clairvoyant mount SRC MNT: give the data set's directory and an empty mount point")
    from ..mount.fs import Mount
    from ..nodeio.signals import SignalFlag

    if args.serve_node:   # a cluster's node service, started by its member (mount/cluster/member.py)
        from ..mount.cluster.member import run_service
        return run_service(args)
    src, mnt, local_dir = args.paths[0], args.paths[1], args.local_dir
    if args.cluster:
        from ..cluster.members import rendezvous
        from ..errors import ConfigError
        if args.no_stage:
            raise ConfigError("a mount in a cluster stages (its home files): --no-stage does not go with --cluster")
        try:
            group = rendezvous()
        except ConfigError as e:   # started by hand, outside a job: this node runs on its own
            print(f"clairvoyant: clairvoyant mount --cluster: {e}; start one mount per node with mpirun --map-by "
                  "ppr:1:node, or torchrun --nnodes N --nproc-per-node 1 ... --no-python clairvoyant mount "
                  "(docs/mount.md); this mount runs alone, not as part of a cluster", file=sys.stderr, flush=True)
        else:
            from ..mount.cluster.member import run_member
            try:
                return run_member(args, group)
            finally:
                group.close()
        # several "nodes" on one machine (a test, a benchmark): {node} in a path is this node's number
        node = os.environ.get("CLAIRVOYANT_NODE", "0")
        mnt = mnt.replace("{node}", node)
        local_dir = local_dir.replace("{node}", node) if local_dir else local_dir
    stop = SignalFlag()   # (not an Event: nodeio/signals.py)
    stop.install((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    m = Mount(src, mnt, local_dir=local_dir, local_capacity=args.local_capacity, stage=not args.no_stage,
              reindex=args.reindex, **({} if args.stage_threads is None else {"stage_threads": args.stage_threads}))
    try:
        print(f"clairvoyant: {m.source.root} mounted read-only at {m.path} (local tier {m.tiers.local.root}, "
              f"up to {m.capacity}); Ctrl-C or `clairvoyant umount {m.path}` unmounts", flush=True)
        while not stop.wait(0.2):
            if not m.alive():
                print(f"clairvoyant: the mount daemon of {m.path} is gone (exit status {m.proc.poll()}); "
                      "cleaning up", file=sys.stderr, flush=True)
                return 1
        return 0
    finally:
        m.close()


def cmd_umount(args: argparse.Namespace) -> int:
    from ..fuse.daemon import mounted, unmount
    from ..mount.fs import read_info
    from ..nodeio.fileio import process_alive

    mnt = os.path.realpath(args.mountpoint)
    if not mounted(mnt):
        print(f"{mnt} is not mounted", file=sys.stderr)
        return 1
    if args.drain:
        return _drain(mnt, read_info)
    try:
        pid = int(read_info(mnt)["pid"])
    except Exception:   # no description (a dead daemon, or another file system): unmount it anyway
        pid = -1
    if pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)   # the mount process unmounts and leaves the tier's session
        except ProcessLookupError:
            pid = -1
    deadline = time.monotonic() + args.timeout
    while pid > 0 and mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)
    if mounted(mnt):
        unmount(mnt)
    while pid > 0 and process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if mounted(mnt):
        print(f"{mnt} is still mounted (busy?): close the programs using it, then run fusermount3 -u {mnt}",
              file=sys.stderr)
        return 1
    return 0


def _drain(mnt: str, read_info) -> int:
    """``clairvoyant umount --drain MNT``: the cluster mount at MNT is told its node is to be taken
    back (mount/cluster/links.py ``ServiceLink.drain``); it stays mounted."""
    from ..mount.cluster.member import ask
    from ..plan.membership import DRAIN
    control = read_info(mnt).get("control")
    if not control:
        print(f"{mnt} is not a cluster mount (started with --cluster under a launcher): nothing to drain; "
              f"`clairvoyant umount {mnt}` unmounts it", file=sys.stderr)
        return 1
    if ask(control, {"op": DRAIN}) is None:
        print(f"the mount service at {mnt} did not answer on {control}: `clairvoyant umount {mnt}` unmounts it",
              file=sys.stderr)
        return 1
    print(f"{mnt} drains: it serves the other nodes until it is unmounted, and they plan without it from "
          f"their next epoch; `clairvoyant umount {mnt}` once this node's programs are done", flush=True)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("mount", help="the data set as a read-only FUSE file system staged from the local tier",
                       description="Serve SRC read-only at MNT (an empty directory) until Ctrl-C, SIGTERM or "
                       "`clairvoyant umount MNT`: metadata from the manifest, reads from the local tier where a "
                       "checked entry is there, else from SRC; staging ahead in the order a clairvoyant.torch "
                       "sampler publishes (docs/mount.md). `clairvoyant mount --stats MNT`: the counters.")
    p.add_argument("paths", nargs="+", metavar="SRC MNT", help="the data set's directory and the mount point "
                   "(with --stats: only the mount point)")
    p.add_argument("--local-dir", help="node-local directory of the cache (default: as the Loader's)")
    p.add_argument("--local-capacity", help="room for the cache, e.g. 400GiB or 50%% of the data set")
    p.add_argument("--stage-threads", type=int, default=None,
                   help="threads reading from the source ahead of use (default: clairvoyant.mount.fs.STAGE_THREADS)")
    p.add_argument("--no-stage", action="store_true", help="do not stage: only serve what is already there")
    p.add_argument("--cluster", action="store_true",
                   help="one cache of every node's tier: start one mount per node under an MPI launcher "
                   "(mpirun --map-by ppr:1:node clairvoyant mount --cluster SRC MNT) or torchrun (torchrun "
                   "--nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --no-python "
                   "clairvoyant mount --cluster SRC MNT); a file is kept at its "
                   "home node and read from there by the others; {node} in MNT or --local-dir stands for "
                   "the node's number (several nodes on one machine) (docs/mount.md)")
    p.add_argument("--reindex", action="store_true",
                   help="walk SRC again whole instead of checking its manifest (a stat per folder: a file "
                   "rewritten in place is not noticed by that check; see docs/mount.md)")
    p.add_argument("--stats", action="store_true", help="print the counters of the mount at MNT (several "
                   "mount points: each node's and the job's)")
    p.add_argument("--json", action="store_true")
    # (a cluster's node service, started by the member a launcher runs: mount/cluster/member.py)
    p.add_argument("--serve-node", help=argparse.SUPPRESS)
    p.add_argument("--peer-host", help=argparse.SUPPRESS)
    p.add_argument("--member", help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_mount)
    u = sub.add_parser("umount", help="unmount a clairvoyant mount (its process exits)")
    u.add_argument("mountpoint")
    u.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the mount process")
    u.add_argument("--drain", action="store_true", help="a cluster mount's node is to be taken back (a preemption "
                   "notice): it stays mounted and serves on, its peers plan their next epochs without it")
    u.set_defaults(fn=cmd_umount)
