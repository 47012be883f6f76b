"""Benchmark: clairvoyant on tar shards against the packed-format loaders, through a FUSE mount.

The same JPEG tree (clairvoyant.testing.make_dataset) is prepared once, cached under
``cache_home()/bench``, in each peer's own format, with about the same number of shards:
  (a) WebDataset-layout tar shards, written by ``clairvoyant pack``;
  (b) LitData optimized chunks (``litdata.optimize``), the raw JPEG bytes, the label and the
      sample's index per item;
  (c) MosaicML Streaming MDS shards (``streaming.MDSWriter``), the same three columns.
Each run serves its format's directory through a FuseStore mount of its own (12 ms per open,
2 ms per read, 400 MB/s shared, 64 requests in flight by default), in a process of its own, and
times a first (cold: fresh cache and local directories) and a second epoch, batch 32, every
image decoded by ``clairvoyant.load.decode.decode_image``:
  - clairvoyant: ``Loader(<mount of the tar shards>, decode="numpy")``, and the same on a mount of
    the JPEG tree for reference;
  - LitData: ``StreamingDataset`` + ``StreamingDataLoader``, shuffle=True, the mount given as
    input_dir (read in place) and as ``"local:" + mount`` (chunks copied to a fresh cache_dir);
  - Streaming: ``StreamingDataset(remote=<mount>, local=<fresh dir>)`` and ``local=<mount>``,
    shuffle=True, its ``StreamingDataLoader``;
  - WebDataset: ``WebDataset(urls, shardshuffle=True).shuffle(1000).decode(...)``, batched in the
    workers, ``WebLoader``; the shards opened through ``pipe:cat`` and as plain files;
  each peer for num_workers in --workers. Per epoch: images/s, the FUSE store's opens and bytes.
Shuffle quality: the mean number of distinct shards the samples of a (full) batch of the first
epoch come from. Writes benchmarks/results/packed_peers.json; prints a table and the ratios
clairvoyant-on-shards / best LitData run, per epoch.

    python benchmarks/packed_peers.py           # 3,200 JPEGs of 256x256, about 8 shards
    python benchmarks/packed_peers.py --tiny    # a smoke size for CI; peers not installed are skipped
"""

from __future__ import annotations

import torch  # imported before any clock: its import is not timed

import argparse
import contextlib
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings

import numpy as np

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata asks PyPI for a newer version otherwise

from fusebench import run_and_report  # noqa: E402

from clairvoyant import Loader  # noqa: E402
from clairvoyant import manifest as manifest_mod  # noqa: E402
from clairvoyant.experiments import staging  # noqa: E402
from clairvoyant.load.decode import decode_image  # noqa: E402
from clairvoyant.pack.tar import member_names, pack, plan_shards  # noqa: E402
from clairvoyant.nodeio.paths import cache_home  # noqa: E402
from clairvoyant.source import PosixSource, TarShardSource  # noqa: E402
from clairvoyant.testing import FuseStore, make_dataset  # noqa: E402

PEERS = {"litdata": "litdata", "streaming": "mosaicml-streaming", "webdataset": "webdataset"}  # module: package
MODES = {"clairvoyant": ("shards", "tree"), "litdata": ("in place", "local: cache"),
         "streaming": ("remote + local", "local = mount"), "webdataset": ("pipe:cat", "file")}
FORMAT_OF = {"clairvoyant": "shards", "litdata": "litdata", "streaming": "mds", "webdataset": "shards"}


def say(msg: str) -> None:
    print(f"packed_peers: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send what the peers' writers print (their worker processes too) to stderr: stdout is the table's."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def import_streaming():
    """``import streaming``. Its vision subpackage imports torchvision at import time, which this
    venv lacks (PyPI's torchvision wheels are CUDA builds that do not load with the CPU torch); the
    classes it takes from there are stood in for while importing, as nothing here uses them."""
    try:
        import streaming
        return streaming
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("torchvision"):
            raise
    for name in [n for n in sys.modules if n == "streaming" or n.startswith("streaming.")]:
        del sys.modules[name]

    def stub(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    def unavailable(*a, **k):
        raise RuntimeError("torchvision is not installed")

    tv = stub("torchvision")
    tv.datasets = stub("torchvision.datasets", VisionDataset=type("VisionDataset", (), {}), CIFAR10=None)
    tv.transforms = stub("torchvision.transforms")
    tv.transforms.functional = stub("torchvision.transforms.functional", to_tensor=unavailable)
    try:
        import streaming
    finally:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    return streaming


# -- preparing the formats (once, cached) ------------------------------------------------------

def _litdata_item(root: str, keys: list[str], labels: list[int], i: int) -> dict:
    with open(os.path.join(root, keys[i]), "rb") as f:
        return {"image": f.read(), "label": labels[i], "index": i}


def _counted(what: str, total: int):
    step, done = max(1, total // 10), [0]

    def progress(n: int) -> None:
        before, done[0] = done[0], done[0] + n
        if done[0] // step != before // step or done[0] == total:
            say(f"{what}: {done[0]}/{total}")
    return progress


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return path


def tar_shard_size(keys: list[str], sizes: list[int], labels: list[int], shards: int) -> int:
    """The smallest --shard-size that packs the samples into ``shards`` tar shards at most (a tar
    member's header, padding and label member are a larger share of a small image than the other
    formats' overheads)."""
    names, _ = member_names(keys)
    labelled = [x >= 0 for x in labels]
    lo, hi = 4 * 512, 2 * sum(sizes) + 4096 * len(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(plan_shards(names, sizes, labelled, mid)) <= shards:
            hi = mid
        else:
            lo = mid + 1
    return lo


def prepare(data: str, work: str, shards: int) -> dict:
    """The tar shards, LitData chunks and MDS shards of ``data`` under ``work`` (made once: a
    ``ready.json`` records a finished preparation), and which shard each sample lies in."""
    ready = os.path.join(work, "ready.json")
    man = manifest_mod.build(PosixSource(data))
    keys, labels = list(man.keys), [int(x) for x in man.labels]
    shard_size = -(-man.total_bytes * 102 // 100 // shards)   # LitData's and MDS's: a 2% margin for their headers
    tar_size = tar_shard_size(keys, man.sizes.tolist(), labels, shards)
    want = {"data": data, "fingerprint": man.fingerprint, "shards": shards, "shard_size": shard_size,
            "tar_shard_size": tar_size, "peers": [m for m in PEERS if importlib.util.find_spec(m) is not None]}
    if os.path.exists(ready):
        with open(ready) as f:
            prep = json.load(f)
        if prep["want"] == want:
            return prep
    os.makedirs(work, exist_ok=True)
    prep: dict = {"want": want, "dirs": {}, "maps": {}, "shards": {}}

    tar_dir = _fresh(os.path.join(work, "shards"))
    say(f"packing {len(keys)} images into tar shards of {tar_size / 1e6:.1f} MB (clairvoyant pack)")
    pack(data, tar_dir, shard_size=tar_size, progress=_counted("pack", len(keys)))
    src = TarShardSource(tar_dir)
    names = sorted(os.path.basename(p) for p in src.paths)
    prep["maps"]["tar"] = {hashlib.md5(src.read(k)).hexdigest(): names.index(os.path.basename(src.locate(k)[0]))
                           for k, _ in src.scan()}
    prep["dirs"]["shards"], prep["shards"]["shards"] = tar_dir, names
    src.close()

    if "litdata" in want["peers"]:
        import litdata
        out = _fresh(os.path.join(work, "litdata"))
        say(f"writing LitData chunks of {shard_size / 1e6:.1f} MB (litdata.optimize)")
        with stdout_to_stderr():
            litdata.optimize(fn=functools.partial(_litdata_item, data, keys, labels), inputs=list(range(len(keys))),
                             output_dir=out, chunk_bytes=shard_size, num_workers=1, mode="overwrite")
        with open(os.path.join(out, "index.json")) as f:
            chunks = json.load(f)["chunks"]
        position_chunk = np.repeat(np.arange(len(chunks)), [c["chunk_size"] for c in chunks])
        chunk_of = [-1] * len(keys)
        for p, item in enumerate(litdata.StreamingDataset(out, shuffle=False)):   # in order: which chunk holds i
            chunk_of[int(item["index"])] = int(position_chunk[p])
        prep["dirs"]["litdata"], prep["maps"]["litdata"] = out, chunk_of
        prep["shards"]["litdata"] = [c["filename"] for c in chunks]

    if "streaming" in want["peers"]:
        MDSWriter = import_streaming().MDSWriter
        out = _fresh(os.path.join(work, "mds"))
        say(f"writing MDS shards of {shard_size / 1e6:.1f} MB (streaming.MDSWriter)")
        read = staging.file_reader(data)
        progress = _counted("MDS", len(keys))
        with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int", "index": "int"}, size_limit=shard_size,
                       compression=None, progress_bar=False) as w:
            for i, key in enumerate(keys):
                w.write({"jpg": read(key), "cls": labels[i], "index": i})
                progress(1)
        with open(os.path.join(out, "index.json")) as f:
            mds = json.load(f)["shards"]   # one writer: samples in the order written, shard after shard
        prep["dirs"]["mds"] = out
        prep["maps"]["mds"] = np.repeat(np.arange(len(mds)), [s["samples"] for s in mds]).tolist()
        prep["shards"]["mds"] = [s["raw_data"]["basename"] for s in mds]
    prep["dirs"]["tree"] = data
    with open(ready + ".tmp", "w") as f:
        json.dump(prep, f)
    os.replace(ready + ".tmp", ready)
    return prep


# -- one run: a peer, a mode, a worker count, in a process of its own --------------------------

def _indices(batch) -> list[int]:
    return [int(i) for i in batch[2]]


def _lazily(iterable):
    """Iterate ``iterable``, calling its ``__iter__`` only at the first ``next``: inside the clock."""
    yield from iterable


def _recording(it, ids_of, out: list):
    for batch in it:
        out.append(ids_of(batch))
        yield batch


def _digest(data: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.md5(data).digest(), np.uint8).copy()


def _decode_item(item: dict) -> tuple:
    return decode_image(item["image"]), item["label"], item["index"]


def _wds_jpg(key: str, data: bytes):
    return decode_image(data) if key.lower().endswith("jpg") else None


class _Clairvoyant:
    def __init__(self, cfg: dict, mount: str, work: str) -> None:
        self.cfg, self.mount, self.work = cfg, mount, work
        self.loader = Loader(mount, batch_size=cfg["batch"], local_dir=os.path.join(work, "local"), seed=cfg["seed"],
                             decode="numpy")   # lists or indexes the mount here, before the clock
        self.workers = self.loader.num_workers

    def epoch(self, e: int):
        self.loader.set_epoch(e)
        return self.loader

    ids_of = None

    def mixing(self, tar_map: dict) -> list[list[int]]:
        """The first epoch's batches again, each sample's bytes digested (they come from the local
        tier by now, untimed): which shard each came from."""
        self.loader.close()
        cfg = self.cfg
        with Loader(self.mount, batch_size=cfg["batch"], local_dir=os.path.join(self.work, "local"),
                    seed=cfg["seed"], decode=_digest, output="numpy") as again:
            again.set_epoch(0)
            return [[tar_map[bytes(d).hex()] for d in np.asarray(x)] for x, _ in again]

    def close(self) -> None:
        self.loader.close()


class _LitData:
    def __init__(self, cfg: dict, mount: str, work: str) -> None:
        import litdata
        source = mount if cfg["mode"] == "in place" else "local:" + mount
        self.ds = litdata.StreamingDataset(source, cache_dir=os.path.join(work, "cache"), shuffle=True,
                                           seed=cfg["seed"], transform=_decode_item)
        self.dl = litdata.StreamingDataLoader(self.ds, batch_size=cfg["batch"], num_workers=cfg["workers"])
        self.workers = cfg["workers"]

    def epoch(self, e: int):
        return self.dl   # each iteration is the next epoch

    ids_of = staticmethod(_indices)

    def close(self) -> None:
        pass


class _Streaming:
    def __init__(self, cfg: dict, mount: str, work: str) -> None:
        streaming = import_streaming()

        class Decoded(streaming.StreamingDataset):
            def __getitem__(self, i: int):
                s = super().__getitem__(i)
                return decode_image(s["jpg"]), s["cls"], s["index"]

        where = (dict(remote=mount, local=os.path.join(work, "local")) if cfg["mode"] == "remote + local"
                 else dict(local=mount))
        self.ds = Decoded(**where, shuffle=True, shuffle_seed=cfg["seed"], batch_size=cfg["batch"])
        self.dl = streaming.StreamingDataLoader(self.ds, batch_size=cfg["batch"], num_workers=cfg["workers"])
        self.workers = cfg["workers"]

    def epoch(self, e: int):
        return self.dl

    ids_of = staticmethod(_indices)

    def close(self) -> None:
        pass


class _WebDataset:
    def __init__(self, cfg: dict, mount: str, work: str) -> None:
        import webdataset as wds
        paths = [os.path.join(mount, n) for n in cfg["shard_names"]]
        urls = [f"pipe:cat {shlex.quote(p)}" for p in paths] if cfg["mode"] == "pipe:cat" else paths
        ds = (wds.WebDataset(urls, shardshuffle=100, seed=cfg["seed"]).shuffle(1000)
              .decode(_wds_jpg).to_tuple("jpg", "cls", "__url__").batched(cfg["batch"]))
        self.dl = wds.WebLoader(ds, batch_size=None, num_workers=cfg["workers"])
        self.names = {n: i for i, n in enumerate(cfg["shard_names"])}
        self.workers = cfg["workers"]

    def epoch(self, e: int):
        return self.dl

    def ids_of(self, batch) -> list[int]:
        return [self.names[os.path.basename(u)] for u in batch[2]]

    def close(self) -> None:
        pass


READERS = {"clairvoyant": _Clairvoyant, "litdata": _LitData, "streaming": _Streaming, "webdataset": _WebDataset}


def run_one(cfg: dict) -> dict:
    """One configuration: its format's directory through a FuseStore of its own, two epochs timed."""
    work = tempfile.mkdtemp(prefix="clairvoyant-packed-peers-")
    try:
        with FuseStore(cfg["dir"], **cfg["store"]) as store, warnings.catch_warnings():
            # more DataLoader workers than cores is part of the sweep
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            if cfg["peer"] in PEERS:   # its import is not setup: streaming's imports transformers (seconds)
                import_streaming() if cfg["peer"] == "streaming" else importlib.import_module(cfg["peer"])
            store.reset()
            t0 = time.perf_counter()
            reader = READERS[cfg["peer"]](cfg, store.path, work)   # reads its index or lists the mount
            c = store.counters()
            setup = dict(seconds=time.perf_counter() - t0, opens=c.opens, bytes=c.bytes)
            epochs, batches = [], []
            try:
                for e in range(2):
                    store.reset()
                    it = _lazily(reader.epoch(e))
                    if e == 0 and reader.ids_of is not None:
                        it = _recording(it, reader.ids_of, batches)
                    secs, first, _, n = staging.time_batches(it, 1 << 62, None)
                    c = store.counters()
                    epochs.append(dict(epoch=e, images=n, seconds=secs, first_batch_s=first, images_per_s=n / secs,
                                       opens=c.opens, reads=c.reads, bytes=c.bytes))
                if cfg["peer"] == "clairvoyant" and cfg["mode"] == "shards":
                    batches = reader.mixing(cfg["map"])
            finally:
                reader.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if cfg["peer"] in ("litdata", "streaming"):   # sample indices: their shards
        batches = [[cfg["map"][i] for i in b] for b in batches]
    full = [b for b in batches if len(b) == cfg["batch"]]
    mixing = float(np.mean([len(set(b)) for b in full])) if full else None
    return dict(setup=setup, epochs=epochs, workers=reader.workers, shards_per_batch=mixing)


def configurations(args, prep: dict) -> tuple[list[dict], list[str]]:
    store = dict(open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth,
                 max_inflight=args.max_inflight)
    base = dict(batch=args.batch, seed=args.seed, store=store)
    cfgs = [dict(base, peer="clairvoyant", mode="shards", workers=None, dir=prep["dirs"]["shards"],
                 map=prep["maps"]["tar"], nshards=len(prep["shards"]["shards"])),
            dict(base, peer="clairvoyant", mode="tree", workers=None, dir=prep["dirs"]["tree"], nshards=None)]
    skipped = []
    for peer, package in PEERS.items():
        if args.peers is not None and peer not in args.peers:
            continue
        if importlib.util.find_spec(peer) is None:
            skipped.append(f"{peer}: skipped, {package} is not installed (make .venv/.bench-installed; see the "
                           "bench extra in pyproject.toml)")
            continue
        fmt = FORMAT_OF[peer]
        for mode in MODES[peer]:
            for w in args.workers:
                cfgs.append(dict(base, peer=peer, mode=mode, workers=w, dir=prep["dirs"][fmt],
                                 shard_names=prep["shards"][fmt], nshards=len(prep["shards"][fmt]),
                                 map=prep["maps"].get(fmt)))   # litdata, mds: sample index -> shard
    return cfgs, skipped


def run_child(cfg: dict, timeout: float) -> dict:
    """``run_one(cfg)`` in a fresh Python process; its output goes to stderr."""
    with tempfile.TemporaryDirectory(prefix="clairvoyant-packed-peers-") as tmp:
        spec, result = os.path.join(tmp, "cfg.json"), os.path.join(tmp, "result.json")
        with open(spec, "w") as f:
            json.dump(cfg, f)
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec, result],
                               stdout=sys.stderr, stderr=sys.stderr, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:g} s"}
        if r.returncode != 0 or not os.path.exists(result):
            return {"error": f"exit status {r.returncode} (its output is on stderr above)"}
        with open(result) as f:
            return json.load(f)


def label(cfg: dict) -> str:
    if cfg["peer"] == "clairvoyant":
        return f"clairvoyant on the {'tar shards' if cfg['mode'] == 'shards' else 'JPEG tree'}"
    return f"{cfg['peer']} ({cfg['mode']}), {cfg['workers']} workers"


def run(args) -> dict:
    name = f"synthetic-imagenet-{args.images}" + ("" if args.size == 256 else f"-{args.size}px")  # the demo's
    data = make_dataset(os.path.join(cache_home(), "demo", name), args.images, size=args.size)
    prep = prepare(data, os.path.join(cache_home(), "bench", f"packed-peers-{name}-{args.shards}"), args.shards)
    cfgs, skipped = configurations(args, prep)
    for line in skipped:
        print(line)
    rows = []
    for cfg in cfgs:
        say(f"running {label(cfg)}")
        out = run_child(cfg, args.timeout)
        rows.append(dict(name=label(cfg), peer=cfg["peer"], mode=cfg["mode"], shards=cfg["nshards"],
                         **out))
    ok = [r for r in rows if "error" not in r]
    cv = next((r for r in ok if r["peer"] == "clairvoyant" and r["mode"] == "shards"), None)
    ratios, best = {}, {}
    for peer in ("litdata", "streaming", "webdataset"):
        runs = [r for r in ok if r["peer"] == peer]
        if runs:
            best[peer] = [max(runs, key=lambda r: r["epochs"][e]["images_per_s"])["name"] for e in (0, 1)]
            if cv is not None and peer == "litdata":
                for e in (0, 1):
                    top = max(r["epochs"][e]["images_per_s"] for r in runs)
                    ratios[f"clairvoyant_shards_over_best_litdata_epoch{e + 1}"] = \
                        cv["epochs"][e]["images_per_s"] / top
    if cv is not None:   # issue 22: the first (cold) epoch on shards against the same Loader's warm one
        ratios["clairvoyant_shards_epoch1_over_epoch2"] = \
            cv["epochs"][0]["images_per_s"] / cv["epochs"][1]["images_per_s"]
    s = len(prep["shards"]["shards"])
    params = dict(images=args.images, size=args.size, batch_size=args.batch, shards=args.shards,
                  shard_bytes=prep["want"]["shard_size"], tar_shard_bytes=prep["want"]["tar_shard_size"],
                  open_latency=args.open_latency, read_latency=args.read_latency, bandwidth=args.bandwidth,
                  max_inflight=args.max_inflight,
                  workers=list(args.workers), seed=args.seed, cpus=os.cpu_count(), torch=torch.__version__,
                  versions=versions(), full_shuffle_shards_per_batch=s * (1 - (1 - 1 / s) ** args.batch))
    return {"params": params, "rows": rows, "best": best, "ratios": ratios, "skipped": skipped}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for package in ("clairvoyant", *PEERS.values()):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def format_table(summary: dict) -> str:
    lines = [f"{'configuration':48s} {'setup s':>7s} {'ep':>2s} {'images/s':>9s} {'seconds':>8s} {'1st batch':>9s} "
             f"{'opens':>6s} {'MB read':>8s} {'shards/batch':>12s}"]
    for r in summary["rows"]:
        name = r["name"] + (f", {r['workers']} readers" if r["peer"] == "clairvoyant" and r.get("workers") else "")
        if "error" in r:
            lines.append(f"{name:48s} failed: {r['error']}")
            continue
        for ep in r["epochs"]:
            first = ep["epoch"] == 0
            mix = r["shards_per_batch"]
            mixing = f"{mix:5.2f} of {r['shards']:<4d}" if first and mix is not None else ""
            setup = f"{r['setup']['seconds']:7.2f}" if first else ""
            lines.append(f"{name if first else '':48s} {setup:>7s} {ep['epoch'] + 1:2d} {ep['images_per_s']:9.0f} "
                         f"{ep['seconds']:8.2f} {ep['first_batch_s']:8.3f}s {ep['opens']:6d} "
                         f"{ep['bytes'] / 1e6:8.1f} {mixing:>12s}")
    p = summary["params"]
    lines += ["", "setup: constructing the loader (reading its index, listing or indexing the mount), before the "
                  "clock; images/s: from the epoch's first next() to its last batch",
              f"a full per-sample shuffle would draw a batch from {p['full_shuffle_shards_per_batch']:.2f} "
                  f"shards on average"]
    for peer, (first, second) in summary["best"].items():
        lines.append(f"best {peer}: epoch 1 {first}; epoch 2 {second}")
    for k, v in summary["ratios"].items():
        if k == "clairvoyant_shards_epoch1_over_epoch2":
            lines.append(f"clairvoyant on tar shards, epoch 1 (cold) / epoch 2 (warm): {v:.2f}x   (target >= 0.9)")
            continue
        e = k[-1]
        lines.append(f"clairvoyant on tar shards / best LitData, epoch {e}: {v:.2f}x   (target >= 1.2)")
    lines.append(f"({p['images']} images of {p['size']}x{p['size']}, batch {p['batch_size']}, about {p['shards']} "
                 f"shards of {p['tar_shard_bytes'] / 1e6:.1f} MB (tar), {p['shard_bytes'] / 1e6:.1f} MB (LitData, "
                 "MDS); "
                 f"FUSE store {p['open_latency'] * 1e3:g} ms per open, "
                 f"{p['read_latency'] * 1e3:g} ms per read, {p['bandwidth'] / 1e6:g} MB/s, {p['max_inflight']} "
                 f"in flight; {p['cpus']} CPUs; "
                 + ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v) + ")")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        with open(argv[1]) as f:
            cfg = json.load(f)
        out = run_one(cfg)
        with open(argv[2], "w") as f:
            json.dump(out, f)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--shards", type=int, default=8, help="about this many shards per format")
    for flag, default, what in (("open-latency", 0.012, "the store's seconds per open"),
                                ("read-latency", 0.002, "the store's seconds per read request"),
                                ("bandwidth", 400e6, "the store's bytes/s, shared by all readers")):
        p.add_argument(f"--{flag}", type=float, default=default, help=what)
    p.add_argument("--max-inflight", type=int, default=64, help="the store's requests in service at once")
    p.add_argument("--workers", default="2,4,8", help="the peers' num_workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", default=None, help="only these peers, comma-separated (litdata,streaming,webdataset)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--tiny", action="store_true", help="a few dozen small images, 2 workers, for CI")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.size, args.batch, args.shards = 48, 32, 8, 4
        args.open_latency, args.read_latency, args.workers, args.timeout = 0.001, 0.0, "2", 120
    args.workers = tuple(int(w) for w in args.workers.split(","))
    args.peers = None if args.peers is None else set(args.peers.split(","))
    return run_and_report("packed_peers", args, run, format_table)

if __name__ == "__main__":
    sys.exit(main())
