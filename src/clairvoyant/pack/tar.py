"""Pack a tree of small files into tar shards of WebDataset layout (``clairvoyant pack``).

Samples go in the manifest's order (keys sorted), each as its file under its
key's name, then a ``.cls`` member with its label where it has one (label >= 0).
A shard is closed before it would pass ``shard_size`` (a larger sample gets one
of its own); where the shards split is decided from the manifest's sizes
before anything is written, so it is the same on every run.

Deterministic: the same manifest and bytes give the same shards, byte for
byte (every header's mtime, owner and mode fixed; PAX format). Each shard is
written to a hidden temporary name in DST and renamed once whole, so DST holds
complete shards only. Resumable: a state file (``.clairvoyant-pack.json``)
records the source and the settings; a rerun with the same ones keeps the
complete shards and writes the rest; other settings, or files that are no part
of a pack, are refused.

Reads run on ``threads`` threads, a bounded number ahead of the writer: on a
shared file system an open costs milliseconds, so one thread would be slow.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import tarfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .. import manifest as manifest_mod
from ..errors import ConfigError, SourceChanged
from ..nodeio.fileio import discard, pid, process_alive, write_all, write_atomically
from ..source import as_source
from ..source.files import STATE
from ..source.tarindex import DATA_EXTENSIONS, split_member
from ..units import parse_bytes

FORMAT = "clairvoyant-pack"
_SHARD = re.compile(r"^shard-(\d{6,})\.(tar|npz|h5)$")      # (arrays.py writes .npz and .h5 shards)
_TMP = re.compile(r"^\.shard-\d{6,}\.(tar|npz|h5)\.(\d+)\.tmp$")
_BLOCK = tarfile.BLOCKSIZE


@dataclass(frozen=True)
class PackResult:
    dst: str
    shards: int          # shards of the whole pack
    written: int         # written by this run
    kept: int            # complete already (a resumed run)
    samples: int
    bytes: int           # of the shard files
    data_key: str | None  # what TarShardSource needs as data_key= (None: the default finds the data)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def shard_name(i: int) -> str:
    return f"shard-{i:06d}.tar"


def _header(name: str, size: int) -> bytes:
    """The member's header: one block, or a PAX header first where the name is long or not ASCII."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _member_bytes(name: str, size: int) -> int:
    """What a member takes in the shard: its header(s) and its data padded to a whole block."""
    raw = name.encode()
    head = _BLOCK if len(raw) <= 100 and raw.isascii() else len(_header(name, size))
    return head + -(-size // _BLOCK) * _BLOCK


def plan_shards(names: list[str], sizes: list[int], has_label: list[bool], shard_size: int) -> list[tuple[int, int]]:
    """``(first, end)`` sample ranges of each shard: consecutive, each shard closed before its file
    would pass ``shard_size`` (the sizes are exact: the end-of-archive blocks are counted, and the
    shards are not padded to whole tar records)."""
    out, start, used = [], 0, 2 * _BLOCK
    for i, (name, size) in enumerate(zip(names, sizes)):
        n = _member_bytes(name, size) + (2 * _BLOCK if has_label[i] else 0)
        if i > start and used + n > shard_size:
            out.append((start, i))
            start, used = i, 2 * _BLOCK
        used += n
    if start < len(names):
        out.append((start, len(names)))
    return out


def member_names(keys) -> tuple[list[str], str | None]:
    """Each sample's member name (its key) and the data_key a reader will need; refuses keys that
    WebDataset's grouping would merge or could not place."""
    names, seen = [], {}
    fields = set()
    for key in keys:
        skey, field = split_member(key)
        if not field or skey.endswith("/") or not skey:
            raise ConfigError(f"sample {key!r} has no extension after a name: a WebDataset shard groups members "
                              "by name and extension; rename it (e.g. add .jpg or .bin)")
        if skey in seen:
            raise ConfigError(f"samples {seen[skey]!r} and {key!r} would be one sample in WebDataset layout "
                              f"(both are {skey!r} up to the first dot): rename one")
        if field in ("cls", "json"):
            raise ConfigError(f"sample {key!r} ends in .{field}, which the shards use for labels and fields: "
                              "rename it")
        seen[skey] = key
        names.append(key)
        fields.add(field)
    other = sorted(f for f in fields if f.rsplit(".", 1)[-1] not in DATA_EXTENSIONS)
    if not other:
        return names, None
    if len(fields) == 1:
        return names, other[0]
    raise ConfigError(f"the samples' extensions ({', '.join(sorted(fields)[:6])}) mix images and other kinds "
                      f"({', '.join(other[:3])}): a reader of the shards finds an image member by itself, or "
                      "one data_key= for all; pack one kind of file at a time")


def _prepare(dst: str, state: dict) -> None:
    """Check DST holds nothing but (this) pack, remove dead writers' temporary files, write the state."""
    os.makedirs(dst, exist_ok=True)
    names = os.listdir(dst)
    other = sorted(n for n in names if n != STATE and not _SHARD.match(n) and not _TMP.match(n))
    if other:
        raise ConfigError(f"{dst} holds files that are no part of a pack ({', '.join(other[:3])}"
                          f"{', ...' if len(other) > 3 else ''}): pack into an empty or new directory")
    if STATE in names:
        try:
            with open(os.path.join(dst, STATE)) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{dst}/{STATE} is unreadable ({e}): remove {dst}, or pack into another "
                              "directory") from e
        mine = {k: v for k, v in state.items() if k != "complete"}
        theirs = {k: old.get(k) for k in mine}
        if theirs != mine:
            diff = [k for k in mine if theirs[k] != mine[k]]
            raise ConfigError(f"{dst} holds a pack of {old.get('source')!r} with other settings ({', '.join(diff)} "
                              "differ): remove it, pack into another directory, or use the same settings")
    elif any(_SHARD.match(n) for n in names):
        raise ConfigError(f"{dst} holds shards without a {STATE}: they are not this pack's; pack into an empty "
                          "or new directory")
    for n in names:
        m = _TMP.match(n)
        if m and (int(m.group(2)) == pid() or not process_alive(int(m.group(2)))):   # ours: an earlier call's
            discard(os.path.join(dst, n))
    _write_state(dst, state)


def _write_state(dst: str, state: dict) -> None:
    data = json.dumps(state, indent=1, sort_keys=True).encode()
    write_atomically(os.path.join(dst, STATE), os.path.join(dst, f".{STATE}.{pid()}.tmp"),
                     lambda fd: write_all(fd, data))


def start(dst: str, state: dict, plan: list[tuple[int, int]], name: Callable[[int], str], samples: int,
          progress: Callable[[int], None] | None) -> list[tuple[int, int, int]]:
    """Check and claim DST for the pack ``state`` describes; the shards still to write, as
    ``(shard, first sample, end)`` (those complete from an earlier run are told to ``progress``)."""
    _prepare(dst, state)
    todo = [(s, a, b) for s, (a, b) in enumerate(plan) if not os.path.exists(os.path.join(dst, name(s)))]
    if progress is not None and len(todo) < len(plan):
        progress(samples - sum(b - a for _, a, b in todo))
    return todo


def read_in_order(source: Any, keys: list[str], sizes: list[int], todo: list[tuple[int, int, int]],
                  threads: int) -> Iterator[tuple[int, bytes]]:
    """``(i, bytes)`` of every sample of the shards ``todo``, in order, read on ``threads`` threads a
    bounded number ahead (on a shared file system an open costs milliseconds); a size other than
    the manifest's is SourceChanged. Close it (``contextlib.closing``) to stop the reads early."""
    order = (i for _, a, b in todo for i in range(a, b))
    window: deque = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="clairvoyant-pack") as pool:
        try:
            for i in (i for _, a, b in todo for i in range(a, b)):
                while len(window) < 4 * threads and (j := next(order, None)) is not None:
                    window.append(pool.submit(source.read, keys[j]))
                data = window.popleft().result()
                if len(data) != sizes[i]:
                    raise SourceChanged(f"sample {keys[i]!r} is {len(data)} bytes, its manifest says {sizes[i]}: the "
                                        "source changed since it was indexed; run `clairvoyant index --force` on it "
                                        "and pack into an empty directory")
                yield i, data
        finally:
            for f in window:
                f.cancel()


class _ShardWriter:
    """A tar written to a hidden temporary name, renamed to ``final`` once whole and synced. The
    members are written as they come (header, data, padding to a block), then two zero blocks."""

    def __init__(self, final: str) -> None:
        self.final = final
        self.tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{pid()}.tmp")
        self._f = open(self.tmp, "wb")

    def add(self, name: str, data: bytes) -> None:
        self._f.write(_header(name, len(data)))
        self._f.write(data)
        self._f.write(tarfile.NUL * (-len(data) % _BLOCK))

    def __enter__(self) -> "_ShardWriter":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None:
                self._f.write(tarfile.NUL * (2 * _BLOCK))   # end of archive
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()
                os.replace(self.tmp, self.final)
                return
        except BaseException:
            self._discard()
            raise
        self._discard()

    def _discard(self) -> None:
        self._f.close()
        discard(self.tmp)


def pack(src: Any, dst: str | os.PathLike[str], *, shard_size: int | str = "256MiB", threads: int = 16,
         progress: Callable[[int], None] | None = None, reindex: bool = False) -> PackResult:
    """Write the samples of ``src`` (anything :func:`clairvoyant.source.as_source` accepts) as
    ``dst/shard-000000.tar``, ...; ``progress(n)`` is called as each ``n`` more samples are done
    (those of shards already complete at once)."""
    size = parse_bytes(shard_size, what="shard_size")
    if size < 4 * _BLOCK:
        raise ConfigError(f"shard_size={shard_size!r} is too small: give at least 2KiB (e.g. 256MiB)")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
    source = as_source(src)
    man, _ = manifest_mod.obtain(source, reindex=reindex)
    keys = list(man.keys)
    names, data_key = member_names(keys)
    sizes, labels = man.sizes.tolist(), man.labels.tolist()
    plan = plan_shards(names, sizes, [x >= 0 for x in labels], size)
    dst = os.path.abspath(os.fspath(dst))
    state = {"format": FORMAT, "version": 1, "source": source.uri, "fingerprint": man.fingerprint,
             "samples": len(keys), "shard_size": size, "shards": len(plan), "complete": False}
    todo = start(dst, state, plan, shard_name, len(keys), progress)
    with contextlib.closing(read_in_order(source, keys, sizes, todo, threads)) as samples:
        for s, a, b in todo:
            with _ShardWriter(os.path.join(dst, shard_name(s))) as w:
                for i, data in itertools.islice(samples, b - a):
                    w.add(names[i], data)
                    if labels[i] >= 0:
                        w.add(split_member(names[i])[0] + ".cls", str(labels[i]).encode())
                    if progress is not None:
                        progress(1)
    _write_state(dst, dict(state, complete=True))
    total = sum(os.path.getsize(os.path.join(dst, shard_name(s))) for s in range(len(plan)))
    return PackResult(dst, len(plan), len(todo), len(plan) - len(todo), len(keys), total, data_key)
