"""Benchmark: what one file costs through ``clairvoyant mount --cluster`` (issue 23): read from the
node's own tier, from another node's tier (a peer read), and from the source, beside a plain read
of the source directory.

Two "nodes" on this machine, one MPI job (``mpirun -n 2``, started by this script), or two torchrun
agents (``--launcher torchrun``: the peer reads over ZeroMQ). Each mounts the
same directory with its own local tier, large enough for the data set. Each node first reads its
own home files through its own mount, so that they are staged there. Then node 0 reads, one
thread, the kernel's pages of each file dropped first:

- its own files, from its tier;
- node 1's files, each asked of node 1 (a peer read);
- node 1's files through a third mount, alone, with an empty tier (a read of the source through
  the mount);
- node 1's files from the source directory itself.

Prints microseconds per file (wall, and node 0's CPU). The source is a local directory, so these
are the mechanism's costs, not a store's latency.

    python benchmarks/mount_peer_cost.py                 # 400 files of 29 KB
    python benchmarks/mount_peer_cost.py --launcher torchrun   # the same over ZeroMQ (issue 32)
    python benchmarks/mount_peer_cost.py --files 100 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def _timed(paths: list[str]) -> tuple[float, float, int]:
    """Seconds of wall and of this process's CPU to read ``paths`` (pages dropped first), bytes."""
    from clairvoyant.testing import drop_pages
    drop_pages(paths)
    r0, t0, n = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            n += len(f.read())
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return t1 - t0, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), n


def node_main(work: str) -> None:
    from clairvoyant.mount import Mount
    from clairvoyant.cluster.members import rendezvous
    from clairvoyant.mount.cluster.links import ServiceLink

    link = ServiceLink.of_group(rendezvous())   # formed by mpirun's MPI or torchrun's store; reads over ZeroMQ
    rank, src = link.node, os.path.join(work, "src")

    def barrier() -> None:
        link._group.allgather(b"", "a barrier")
    mnt = os.path.join(work, f"mnt{rank}")
    os.makedirs(mnt, exist_ok=True)
    with Mount(src, mnt, local_dir=os.path.join(work, f"local{rank}"), local_capacity="100%", cluster=link) as m:
        keys = [m.manifest.keys[i] for i in range(len(m.manifest))]
        mine = [k for i, k in enumerate(keys) if m.cluster.owns(i)]
        theirs = [k for i, k in enumerate(keys) if not m.cluster.owns(i)]
        for k in mine:   # staged here, by the read-through
            with open(os.path.join(mnt, k), "rb") as f:
                f.read()
        deadline = time.monotonic() + 60
        while m.controller._in_flight() and time.monotonic() < deadline:
            time.sleep(0.05)
        barrier()
        out: dict = {}
        if rank == 0:
            out["local"] = _timed([os.path.join(mnt, k) for k in mine])
            out["peer"] = _timed([os.path.join(mnt, k) for k in theirs])
            alone_mnt = os.path.join(work, "alone")
            os.makedirs(alone_mnt, exist_ok=True)
            with Mount(src, alone_mnt, local_dir=os.path.join(work, "local-alone"), stage=False) as alone:
                out["source_through_mount"] = _timed([os.path.join(alone.path, k) for k in theirs])
            out["source_directory"] = _timed([os.path.join(src, k) for k in theirs])
            out["stats"] = m.stats().to_json()
            out["cluster"] = m.cluster.counters()
            with open(os.path.join(work, "result.json"), "w") as f:
                json.dump(out, f)
        barrier()


def run(args: argparse.Namespace) -> dict:
    work = tempfile.mkdtemp(prefix="cv-peer-cost-")
    try:
        src = os.path.join(work, "src")
        rng = random.Random(0)
        for i in range(args.files):
            d = os.path.join(src, f"d{i % 10}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
                f.write(rng.randbytes(args.size))
        node = [sys.executable, HERE, "node", work]   # (positional: torchrun would take --node for --node-rank)
        if args.launcher == "mpirun":
            mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_btl="self,tcp")
            subprocess.run([mpirun, "-n", "2", "--oversubscribe", "--bind-to", "none", *node], check=True, env=env,
                           timeout=600)
        else:   # two torchrun agents, one "node" each, c10d rendezvous on this machine
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
            agents = [subprocess.Popen([torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--no-python", *node])
                      for _ in range(2)]
            if any(a.wait(600) for a in agents):
                raise RuntimeError("a node failed")
        with open(os.path.join(work, "result.json")) as f:
            got = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"files": args.files, "size": args.size, "launcher": args.launcher}
    for name in ("local", "peer", "source_through_mount", "source_directory"):
        wall, cpu, nbytes = got[name]
        files = max(1, round(nbytes / args.size))
        out[name] = {"files": files, "wall_us": round(1e6 * wall / files), "cpu_us": round(1e6 * cpu / files)}
    out["stats"], out["cluster"] = got["stats"], got["cluster"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=400)
    p.add_argument("--size", type=int, default=29_000, help="bytes per file")
    p.add_argument("--launcher", choices=("mpirun", "torchrun"), default="mpirun",
                   help="mpirun: the peer reads over MPI; torchrun: over ZeroMQ, joined through torchrun's store")
    p.add_argument("--json", action="store_true")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:   # one node of the job this script started
        node_main(argv[1])
        return 0
    args = p.parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['files']} files of {out['size']:,} bytes; node 0 reads, one thread, pages dropped first; "
          f"started by {out['launcher']}")
    print(f"{'read':34s} {'files':>6s} {'wall us/file':>13s} {'CPU us/file (node 0)':>21s}")
    for name, label in (("local", "own tier, through the mount"), ("peer", "another node's tier (peer read)"),
                        ("source_through_mount", "the source, through a mount"),
                        ("source_directory", "the source directory itself")):
        r = out[name]
        print(f"{label:34s} {r['files']:6d} {r['wall_us']:13d} {r['cpu_us']:21d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
