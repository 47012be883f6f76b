"""`clairvoyant pack SRC DST`: thin: parse, call ``clairvoyant.pack``, print (``--json``)."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_pack(args: argparse.Namespace) -> int:
    from ..pack.tar import pack
    from ..pack.arrays import pack_arrays
    from ..units import format_bytes

    quiet = args.json or not sys.stderr.isatty()
    bar = None
    if not quiet:
        from tqdm import tqdm
        bar = tqdm(desc=f"packing {args.src}", unit=" samples", file=sys.stderr)
    try:
        kw = dict(shard_size=args.shard_size, threads=args.threads, progress=bar.update if bar is not None else None,
                  reindex=args.reindex)
        if args.format == "tar":
            res = pack(args.src, args.dst, **kw)
        else:
            res = pack_arrays(args.src, args.dst, layout=args.format, **kw)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(res.to_json()))
        return 0
    kept = f", {res.kept} kept from an earlier run" if res.kept else ""
    print(f"{res.dst}: {res.shards} shards ({res.written} written{kept}), {res.samples} samples, "
          f"{format_bytes(res.bytes)}")
    if res.data_key:
        print(f"the samples are no images: read them with TarShardSource({res.dst!r}, data_key={res.data_key!r})")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("pack", help="pack a tree of small files into WebDataset-layout tar shards",
                       description="Write the samples of SRC (a directory, a list file: anything a Loader "
                       "takes as a path), in the manifest's order, as DST/shard-000000.tar, ...: each file under "
                       "its key's name plus a .cls member with its label. Deterministic; a rerun after an "
                       "interruption keeps the complete shards. See docs/shards.md.")
    p.add_argument("src", help="the data set: a directory, a list file (.csv, .jsonl)")
    p.add_argument("dst", help="directory for the shards (new, empty, or an earlier run's of the same pack)")
    p.add_argument("--shard-size", default="256MiB", help="bytes per shard at most, e.g. 256MiB (default); "
                   "a larger sample gets a shard of its own")
    p.add_argument("--threads", type=int, default=16, help="threads reading SRC (default 16)")
    p.add_argument("--format", choices=("tar", "npz", "hdf5"), default="tar",
                   help="tar: WebDataset-layout tar shards (default); npz or hdf5: a tree of .npy files, one sample "
                   "each, as NumPy (.npz) or HDF5 (.h5) shards (x the samples stacked, y their labels), read by "
                   "byte range")
    p.add_argument("--reindex", action="store_true", help="walk SRC again even if its manifest exists")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_pack)
    return p
