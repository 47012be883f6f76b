"""MECHANISM: what the storage really gives (``clairvoyant probe``).

Measures, on the data set's own samples: metadata latency (a stat per
sample), the latency of whole-sample reads by one reader (p50/p90/p99), and
throughput (files/s, bytes/s) against the number of concurrent readers,
1, 2, 4, ... 64: the curve NoPFS's users wrote by hand. Optionally the same for
the node-local directory where samples would be staged (written, read back,
removed). Everything on the source goes through the source's own read calls and
opens read-only: the probe never writes there. Each measurement takes samples
not read before by the probe, so a page cache does not flatter the result
(unless the data set is too small: then ``reused`` says so).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..manifest import Manifest

READERS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Point:
    readers: int
    files_per_s: float
    bytes_per_s: float


@dataclass
class ProbeResult:
    uri: str
    samples: int                 # in the data set
    mean_size: float
    stat_s: dict                 # p50, p99 of one metadata operation
    read_s: dict                 # p50, p90, p99 of one whole-sample read, one reader
    curve: list[Point]
    reused: bool = False         # the data set was too small: some samples were read twice
    local: dict | None = None    # the staging directory: write and read files/s
    extra: dict = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        """The storage's per-request latency: the median metadata operation."""
        return float(self.stat_s["p50"])

    @property
    def best(self) -> Point:
        return max(self.curve, key=lambda p: p.files_per_s)

    @property
    def bandwidth(self) -> float:
        """The most bytes/s seen at any number of readers."""
        return max(p.bytes_per_s for p in self.curve)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(latency_s=self.latency_s, bandwidth=self.bandwidth, best=asdict(self.best))
        return d


class _Picker:
    """Hands out sample indices not read before by this probe, in a random order."""

    def __init__(self, n: int, seed: int) -> None:
        self._order = np.random.default_rng(seed).permutation(n).tolist()
        self._i = itertools.count()
        self.reused = False

    def __call__(self) -> int:
        i = next(self._i)
        if i >= len(self._order):
            self.reused = True
        return self._order[i % len(self._order)]


def _pct(xs: list[float], qs=(50, 90, 99)) -> dict:
    a = np.asarray(xs, dtype=float)
    return {f"p{q}": float(np.percentile(a, q)) for q in qs}


def _stat_once(source, key: str) -> None:
    # a file's version (a stat), an object's size (a HEAD request: RemoteSource.head)
    if source.head(key) is None:   # a source with no metadata request of its own
        os.stat(os.path.join(source.root or "", key))


def probe(source, manifest: Manifest, *, readers=READERS, seconds: float = 1.0, timed: int = 64, seed: int = 0,
          local_dir: str | None = None, progress: Callable[[str], None] | None = None) -> ProbeResult:
    """Measure ``source`` (a Source) on the samples of ``manifest``."""
    say = progress or (lambda _msg: None)
    pick = _Picker(len(manifest), seed)
    keys, sizes = manifest.keys, manifest.sizes
    say("metadata")
    stats = []
    for _ in range(min(timed, len(manifest))):
        key = keys[pick()]
        t0 = time.perf_counter()
        _stat_once(source, key)
        stats.append(time.perf_counter() - t0)
    say("reads, one reader")
    reads = []
    for _ in range(min(timed, len(manifest))):
        key = keys[pick()]
        t0 = time.perf_counter()
        source.read(key)
        reads.append(time.perf_counter() - t0)
    curve = []
    for r in readers:
        say(f"{r} reader(s)")
        curve.append(_throughput(source, keys, sizes, pick, r, seconds))
    result = ProbeResult(uri=source.uri, samples=len(manifest), mean_size=float(np.mean(sizes)),
                         stat_s=_pct(stats, (50, 99)), read_s=_pct(reads), curve=curve, reused=pick.reused)
    if local_dir is not None:
        say("local directory")
        result.local = probe_local(local_dir, int(np.mean(sizes)), min(len(manifest), 1000))
    return result


def _throughput(source, keys, sizes, pick: _Picker, readers: int, seconds: float) -> Point:
    lock = threading.Lock()
    done = [0, 0]
    stop = time.perf_counter() + seconds
    errors: list[BaseException] = []

    def run() -> None:
        try:
            while time.perf_counter() < stop:
                with lock:
                    i = pick()
                data = source.read(keys[i])
                with lock:
                    done[0] += 1
                    done[1] += len(data)
        except BaseException as e:   # reported after the join
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, name=f"clairvoyant-probe-{i}", daemon=True) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    dt = time.perf_counter() - t0
    return Point(readers, done[0] / dt, done[1] / dt)


def probe_local(local_dir: str, size: int, count: int) -> dict:
    """Create, read back and remove ``count`` files of ``size`` bytes in a fresh directory under
    ``local_dir``: files/s for each, as staging would do them."""
    os.makedirs(local_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".clairvoyant-probe-", dir=local_dir)
    data = os.urandom(size)
    try:
        t0 = time.perf_counter()
        for i in range(count):
            fd = os.open(os.path.join(work, str(i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        t1 = time.perf_counter()
        for i in range(count):
            with open(os.path.join(work, str(i)), "rb") as f:
                f.read()
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"dir": local_dir, "files": count, "size": size, "write_files_per_s": count / (t1 - t0),
            "read_files_per_s": count / (t2 - t1)}
