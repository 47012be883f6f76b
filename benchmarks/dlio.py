"""Benchmark: MLPerf Storage's workload generator, DLIO (``dlio-benchmark``), reading its data set
from a slow shared store directly, through ``clairvoyant mount``, and from a local copy.

DLIO emulates a training job: its own PyTorch DataLoader (``read_threads`` workers, its own seeded
shuffle of files every epoch) reads the data set's files, and each step "computes" for
``computation_time`` seconds instead of running a model. Its figure of merit is the accelerator
utilization (AU): the share of the training time spent computing, not waiting for data; MLPerf
Storage asks for >= 90%. Here the workload is ``unet3d_h100`` (NumPy ``.npz`` files, batches of
7, 4 reader processes) scaled to this machine: ``--files`` files of ``--mib`` MiB, a step of
``--compute`` seconds, so that the "accelerator" wants ``7 * mib / compute`` MiB/s, more than the
store gives. The store is a FuseStore mount (reads through the kernel, as on a parallel file
system) of ``--bandwidth`` bytes/s shared, ``--open-latency`` per open and ``--read-latency`` per
read. Three runs, side by side, each a fresh DLIO process:

  store:       DLIO's ``data_folder`` is the store's mount (what a job does today);
  clairvoyant: ``data_folder`` is a ``clairvoyant mount`` of the store (fresh local tier). DLIO
               shuffles on its own, so the mount learns the order from the reads: the first
               epoch is the store's, later ones come from the node-local tier;
  local copy:  the data set copied to local disk first (the copy's seconds are printed beside).

Prints AU per epoch and DLIO's mean for each; writes ``--out``/dlio.json (benchmarks/results/). DLIO is
installed by ``make bench`` (``--no-deps``; the PyTorch path needs none of its TensorFlow or
DALI imports, but one of its modules imports TensorFlow at the top: where TensorFlow is not
installed, the DLIO process started here gets an empty module in its place, which the PyTorch
path never touches).

    python benchmarks/dlio.py            # 128 files of 2 MiB, 5 epochs (about 3 minutes)
    python benchmarks/dlio.py --tiny     # a smoke size
"""

from __future__ import annotations

import torch  # noqa: F401  (imported before any clock, as users run)

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

from clairvoyant.mount import Mount
from clairvoyant.nodeio.paths import cache_home
from clairvoyant.testing import FuseStore

HERE = os.path.abspath(__file__)


def run_dlio(argv: list[str]) -> int:
    """DLIO's own command line, in this process (``--run-dlio`` ARGS...)."""
    if importlib.util.find_spec("tensorflow") is None:   # (imported at the top of a profiler module only)
        sys.modules["tensorflow"] = types.ModuleType("tensorflow")
    from dlio_benchmark.main import main as dlio_main
    sys.argv = [sys.argv[0], *argv]
    return dlio_main() or 0


def workload(args, folder: str, out: str, *, generate: bool = False) -> list[str]:
    size = int(args.mib * (1 << 20))
    return [sys.executable, HERE, "--run-dlio", "workload=unet3d_h100",
            f"++workload.workflow.generate_data={generate}", f"++workload.workflow.train={not generate}",
            "++workload.workflow.checkpoint=False", f"++workload.dataset.data_folder={folder}",
            f"++workload.dataset.num_files_train={args.files}", f"++workload.dataset.record_length={size}",
            "++workload.dataset.record_length_stdev=0", f"++workload.dataset.record_length_resize={size}",
            f"++workload.train.epochs={args.epochs}", f"++workload.train.computation_time={args.compute}",
            f"hydra.run.dir={out}"]


def dlio_run(cmd: list[str], log, timeout: float | None = None) -> int:
    """Run DLIO with a temporary folder of its own, removed after it (its reader processes and Open
    MPI leave theirs behind), at a short path: torch's readers pass their batches' buffers over a
    Unix socket in it, whose path may not pass 107 bytes (past it, the batch is lost and the run
    hangs)."""
    tmp = tempfile.mkdtemp(prefix="d")
    try:
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": tmp},
                              timeout=timeout).returncode
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def data_set(args) -> str:
    """The data set DLIO generates (once, under the cache home)."""
    root = os.path.join(cache_home(), "bench", f"dlio-unet3d-{args.files}x{args.mib}MiB")
    done = os.path.join(root, ".complete")
    if not os.path.exists(done):
        shutil.rmtree(root, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="clairvoyant-dlio-gen-") as out:
            if dlio_run(workload(args, root, out, generate=True), subprocess.DEVNULL):
                raise RuntimeError(f"DLIO could not generate its data set in {root}")
        open(done, "w").close()
    return root


def train(args, folder: str, out: str) -> dict:
    t0 = time.perf_counter()
    os.makedirs(out)
    console = os.path.join(out, "console.log")
    with open(console, "wb") as log:   # (a file, not a pipe: DLIO's output is long)
        code = dlio_run(workload(args, folder, out), log, args.timeout)
    if code != 0:
        with open(console, errors="replace") as f:
            raise RuntimeError(f"DLIO failed ({code}):\n{f.read()[-4000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        m = json.load(f)["metric"]
    with open(os.path.join(out, "per_epoch_stats.json")) as f:
        epochs = [float(e["duration"]) for _, e in sorted(json.load(f).items(), key=lambda kv: int(kv[0]))]
    return {"au": m["train_au_percentage"], "au_mean": m["train_au_mean_percentage"], "epoch_seconds": epochs,
            "samples_per_s": m["train_throughput_samples_per_second"], "seconds": time.perf_counter() - t0}


def run(args) -> dict:
    data = data_set(args)
    data_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs
                     if not f.startswith("."))
    store = dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth,
                 max_inflight=64)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="clairvoyant-dlio-") as work:
        for door in args.doors:
            print(f"dlio: {door}", flush=True)
            out = os.path.join(work, f"out-{door}")
            with FuseStore(data, **store) as fs:
                if door == "store":
                    r = train(args, fs.path, out)
                elif door == "clairvoyant":
                    mnt = os.path.join(work, "mnt")
                    os.makedirs(mnt)
                    with Mount(fs.path, mnt, local_dir=os.path.join(work, "local")) as m:
                        fs.reset()
                        r = train(args, mnt, out)
                        r["mount"] = m.stats()._asdict()
                    r["store_bytes"] = fs.counters().bytes
                else:
                    t0 = time.perf_counter()
                    copy = shutil.copytree(fs.path, os.path.join(work, "copy"))
                    r = train(args, copy, out)
                    r["copy_seconds"] = time.perf_counter() - t0 - r["seconds"]
            rows[door] = r
    mib_s = 7 * args.mib / args.compute
    params = dict(files=args.files, mib=args.mib, data_bytes=data_bytes, epochs=args.epochs, compute=args.compute, store=store,
                  wanted_mib_per_s=mib_s, store_mib_per_s=args.bandwidth / (1 << 20), cpus=os.cpu_count())
    return {"params": params, "rows": rows}


def format_table(s: dict) -> str:
    p = s["params"]
    lines = [f"DLIO unet3d, {p['files']} files of {p['mib']} MiB, {p['epochs']} epochs; the accelerator wants "
             f"{p['wanted_mib_per_s']:.0f} MiB/s, the store gives {p['store_mib_per_s']:.0f} MiB/s",
             "| data_folder | AU per epoch (%) | DLIO's mean AU (%) | epochs' seconds | notes |",
             "| --- | --- | --- | --- | --- |"]
    for door, r in s["rows"].items():
        note = f"copy first: {r['copy_seconds']:.1f} s" if "copy_seconds" in r else ""
        if "store_bytes" in r:
            note = f"store read {r['store_bytes'] / p['data_bytes']:.2f}x the data set"
        lines.append(f"| {door} | {', '.join(f'{a:.1f}' for a in r['au'])} | {r['au_mean']:.1f} | "
                     f"{sum(r['epoch_seconds']):.1f} | {note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-dlio"]:
        return run_dlio(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=128)
    p.add_argument("--mib", type=float, default=2.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--compute", type=float, default=0.175, help="seconds per step of 7 samples")
    p.add_argument("--bandwidth", type=float, default=50e6, help="the store's bytes/s, shared")
    p.add_argument("--open-latency", type=float, default=0.040)
    p.add_argument("--read-latency", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=900, help="seconds a DLIO run may take")
    p.add_argument("--doors", default="store,clairvoyant,local", type=lambda s: s.split(","))
    p.add_argument("--tiny", action="store_true", help="a smoke size: 28 files of 1 MiB, 2 epochs")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results"), help="where dlio.json goes")
    args = p.parse_args(argv)
    if args.tiny:
        args.files, args.mib, args.epochs = 28, 1.0, 2
    if importlib.util.find_spec("dlio_benchmark") is None:
        print("dlio: dlio-benchmark is not installed: `make bench` installs it (pip install dlio-benchmark "
              "--no-deps, with hydra-core, omegaconf, pandas, psutil and pydftracer)", file=sys.stderr)
        return 2
    s = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dlio.json"), "w") as f:
        json.dump(s, f, indent=1)
    print(format_table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
