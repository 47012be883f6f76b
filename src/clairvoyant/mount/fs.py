"""MECHANISM: ``clairvoyant mount``: a read-only FUSE view of a data set's directory, backed by the
same manifest and local tier as the Loader.

:class:`Mount` lists the source once (the manifest), writes the listing the daemon answers
``stat``/``readdir``/``open`` from (``listing.py``), joins the local tier's session as the Loader
does (the first process of a session recovers the tier after a crash), and starts ``mountfs``
(built from ``mountfs.c`` when the package is, never at run time: fuse/daemon.py). The daemon reads a
staged entry only after its checksum verifies, else the source. The mount process stages into
the tier (``controller.py``): ahead in the order a clairvoyant sampler publishes, or what programs
open, within the capacity.

``MNT/.clairvoyant.json`` (hidden, read-only, not listed) says where the mount's local tier, its
published orders and its counters are, for the samplers and ``clairvoyant mount --stats``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
import weakref
from typing import NamedTuple

import numpy as np

from .. import manifest as manifest_mod
from ..cache.entry import entry_size
from ..cache.node import open_tiers
from ..cache.tiers import Tiers
from ..errors import ConfigError, SourceError
from ..nodeio.fileio import process_alive
from ..fuse.daemon import Daemon, check_mountpoint, mounted, start, teardown, wait_mounted
from ..source import PosixSource, as_source
from ..plan.unplanned import hash_homes
from . import listing
from ..cluster.timeouts import ASK_WAIT_MS

DAEMON = Daemon("mountfs", os.path.dirname(os.path.abspath(__file__)))   # built from mountfs.c by setup.py
HANDOFF_PREFIX = "handoff."
WORK_PREFIX = "clairvoyant-mount-"
STAGE_THREADS = 64   # the first epoch is latency-bound: requests in flight = threads (the Loader starts at 48)
INFO_NAME = ".clairvoyant.json"
ORDERS_DIR = "mount-orders"
# the daemon's counters, as mount/mount_stats.h lays them out (tests/mount/test_mount_stats.py checks)
_FIELDS = ("magic", "version", "size", "opens_local", "opens_source", "bytes_local", "bytes_source", "corrupt",
           "reads", "info_opens", "pid", "stale", "wait_timeouts", "events_dropped", "no_open", "opens_seen",
           "opens_cached", "opens_peer", "bytes_peer", "asks", "ask_timeouts")
_LAYOUT = struct.Struct("<8sII" + "Q" * (len(_FIELDS) - 3))
_MAGIC, _VERSION = b"CVMNTST\0", 7


class MountStats(NamedTuple):
    opens_local: int      # opens served from a verified staged entry
    opens_source: int     # opens passed through to the source
    bytes_local: int
    bytes_source: int
    corrupt: int          # staged entries that failed their check (never served)
    reads: int
    stale: int            # entries of an earlier session whose source file changed since (never served)
    events_dropped: int   # first reads the mount process did not hear of (its pipe was full): not
                          # cached through, nor read ahead from
    opens: int | None     # opens of files the daemon saw; None where the kernel sends it none (no_open)
    opens_cached: int | None   # of those, served by the kernel's page cache (no READ reached the daemon
                               # before the close); None where the daemon cannot see them (no_open)
    opens_peer: int = 0        # (--cluster) first reads served from another node's tier
    bytes_peer: int = 0
    asks: int = 0              # files the daemon asked of their homes
    ask_timeouts: int = 0      # of those, no answer in time (read from the store)
    wait_timeouts: int = 0     # first reads that gave up waiting for a copy under way (the file read twice)

    @property
    def page_cache_counted(self) -> bool:
        """Whether opens the kernel served from its page cache are counted (``opens_cached``): not
        where the kernel sends the daemon no open (no_open, the default on Linux 3.19 and later),
        where such an open reaches the daemon not at all and "opens" count first reads only."""
        return self.opens_cached is not None

    def to_json(self) -> dict:
        return {**self._asdict(), "page_cache_counted": self.page_cache_counted}


def mount_available() -> tuple[bool, str]:
    """Whether ``clairvoyant mount`` can work here; when not, the reason and what to install."""
    return DAEMON.available()


def read_stats(path: str) -> MountStats:
    """The counters in a mount's stats file (another process may read them: no round trip)."""
    with open(path, "rb") as f:
        raw = f.read(_LAYOUT.size)
    if len(raw) < _LAYOUT.size:
        raise SourceError(f"{path}: not a clairvoyant mount's stats file (too short)")
    v = _LAYOUT.unpack(raw)
    if v[:3] != (_MAGIC, _VERSION, _LAYOUT.size):
        raise SourceError(f"{path}: stats file of another mountfs version (magic {v[0]!r}, version {v[1]})")
    return _stats(v)


def _stats(v: tuple) -> MountStats:
    f = dict(zip(_FIELDS, v))
    seen = f["no_open"] == 0   # the kernel sends OPEN and RELEASE
    return MountStats(f["opens_local"], f["opens_source"], f["bytes_local"], f["bytes_source"], f["corrupt"],
                      f["reads"], f["stale"], f["events_dropped"], f["opens_seen"] if seen else None,
                      f["opens_cached"] if seen else None, f["opens_peer"], f["bytes_peer"], f["asks"],
                      f["ask_timeouts"], f["wait_timeouts"])


def read_info(mnt: str) -> dict:
    """What ``MNT/.clairvoyant.json`` says (ConfigError if ``mnt`` is no clairvoyant mount)."""
    path = os.path.join(os.fspath(mnt), INFO_NAME)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{mnt} is not a clairvoyant mount (cannot read {path}: {e}); start one with "
                          "clairvoyant mount SRC MNT") from e
    if not isinstance(doc, dict) or doc.get("clairvoyant_mount") != 1:
        raise ConfigError(f"{path} is not a clairvoyant mount's description")
    return doc


def _finish(held: dict, proc, mnt: str, work: str, tiers: Tiers, handoff: str) -> None:
    ctl = held.pop("controller", None)
    if ctl is not None:
        ctl.stop()
    cl = held.pop("cluster", None)
    if cl is not None:
        cl.close()
    teardown(proc, mnt, None, False, {k: held.pop(k) for k in ("stats",) if k in held})
    for fd in (held.pop("events", -1),):
        if fd >= 0:
            os.close(fd)
    tiers.close()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(handoff, ignore_errors=True)


def left_by_the_dead(parent: str, prefix: str) -> list[str]:
    """The entries ``prefix<pid>...`` in ``parent`` of processes that are gone (killed: nothing
    cleaned up after them)."""
    out = []
    for name in os.listdir(parent):
        pid = name[len(prefix):].split(".", 1)[0]
        if name.startswith(prefix) and pid.isdigit() and not process_alive(int(pid)):
            out.append(os.path.join(parent, name))
    return out


def _own_dir(parent: str, prefix: str) -> str:
    """A new directory ``prefix<pid>.<random>`` of this mount in ``parent``; those of mount
    processes that are gone are removed first."""
    for path in left_by_the_dead(parent, prefix):
        shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=parent)   # one per mount


def _handoff_dir(tier_root: str) -> str:
    """A handoff directory of this mount in the tier (bytes the daemon read from the source, for the
    mount process to cache)."""
    return _own_dir(tier_root, HANDOFF_PREFIX)


class Mount:
    """``source`` (a directory) served read-only at ``mountpoint`` (an empty directory), reads from the
    node's local tier in ``local_dir`` where a verified entry is there, else from the source.

    A context manager; ``close()`` unmounts (lazily if a file is still open), reaps the daemon and
    leaves the tier's session (also done at garbage collection and at exit). ``stage=False``: no
    staging by this process (the daemon still serves what others staged).
    """

    def __init__(self, source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *,
                 local_dir: str | os.PathLike[str] | None = None, local_capacity: int | str | None = None,
                 stage: bool = True, stage_threads: int = STAGE_THREADS, ready_timeout: float = 10.0,
                 reindex: bool = False, cluster=None) -> None:
        ok, why = mount_available()
        if not ok:
            raise SourceError(f"cannot mount {source}: {why}")
        src = as_source(os.fspath(source))
        if not isinstance(src, PosixSource):
            raise ConfigError(f"clairvoyant mount serves a directory of files; {source} is a {type(src).__name__}")
        src.check()
        self.source = src
        self.path = check_mountpoint(mountpoint)
        # checked against the source (a stat per folder), changed folders listed again; a manifest
        # of an earlier version, which records no folders, is walked again to show them all
        self.manifest, _ = manifest_mod.obtain(src, reindex=reindex, require_folders=True)
        if len(self.manifest) == 0:
            raise ConfigError(f"{src.root} holds no files to mount")
        if cluster is not None:   # collective, before anything is mounted: a node that differs stops them all
            # (a file is asked for by its number: the manifests' fingerprints, of every name, size and
            # class in order, must be the same)
            cluster.agree(hashlib.sha256(self.manifest.compute_fingerprint().encode()).digest(),
                          "the mounted source's files (names and sizes)")
        binary = DAEMON.binary()
        node = open_tiers(src, np.asarray(self.manifest.sizes, dtype=np.int64) + entry_size(0), local_dir=local_dir,
                          local_capacity=local_capacity, ram=False)
        self.tiers, self.capacity = node.tiers, node.local
        self.local_dir = self.tiers.local.local_dir
        self.orders_dir = os.path.join(self.tiers.local.root, ORDERS_DIR)
        os.makedirs(self.orders_dir, mode=0o700, exist_ok=True)
        work = _own_dir(tempfile.gettempdir(), WORK_PREFIX)   # the listing, stats, info, the daemon's log
        self.handoff = _handoff_dir(self.tiers.local.root)
        held: dict = {}
        try:
            listing.write(os.path.join(work, "listing"), self.manifest)
            self.stats_path = os.path.join(work, "stats")
            self.info = {"clairvoyant_mount": 1, "source": src.root, "mount": self.path, "pid": os.getpid(),
                         "local_dir": self.local_dir, "tier": self.tiers.local.root, "orders": self.orders_dir,
                         "stats": self.stats_path, "staging": os.path.join(work, "staging.json"),
                         "samples": len(self.manifest), "capacity": self.capacity.nbytes,
                         **getattr(cluster, "info", {})}   # (a cluster service's control socket)
            listing.publish_bytes(os.path.join(work, "info.json"), json.dumps(self.info, indent=1).encode())
            w = -1
            homes_args: list[str] = []
            if cluster is not None:   # each file's home: asked of it when absent here (mount/cluster/node.py)
                if not stage:
                    raise ConfigError("a mount in a cluster stages (its home files): stage=False does not go with it")
                homes_path = self.homes_path = os.path.join(work, "homes")   # rewritten by a cluster plan
                hash_homes(len(self.manifest), int(cluster.nodes)).astype("<u4").tofile(homes_path)
                homes_args = [f"--homes={homes_path}", f"--node={int(cluster.node)}", f"--ask-wait={ASK_WAIT_MS}"]
            if stage:   # the reports of first reads are for the staging: none without it
                r, w = os.pipe()
                held["events"] = r
            cmd = [binary, "-f", "--watch-parent", f"--listing={work}/listing",
                   f"--index={self.tiers.local.index.path}", f"--extents={self.tiers.local.ext_dir}",
                   f"--stats={self.stats_path}", f"--info={work}/info.json",
                   *([f"--events-fd={w}", f"--handoff={self.handoff}"] if stage else []), *homes_args,
                   f"--session={self.tiers.local.session}", src.root, self.path]
            try:
                proc = start(cmd, os.path.join(work, "mountfs.log"), pass_fds=(w,) if stage else ())
            finally:
                if w >= 0:
                    os.close(w)
        except BaseException:
            for fd in (held.pop("events", -1),):
                if fd >= 0:
                    os.close(fd)
            self.tiers.close()
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(self.handoff, ignore_errors=True)
            raise
        self.proc = proc
        self.pid = proc.pid
        self._held = held
        self._work = work
        self._finalizer = weakref.finalize(self, _finish, held, proc, self.path, work, self.tiers, self.handoff)
        try:
            wait_mounted(proc, self.path, os.path.join(work, "mountfs.log"), ready_timeout,
                         f"mountfs serving {src.root}")
            with open(self.stats_path, "r+b") as f:
                held["stats"] = mmap.mmap(f.fileno(), _LAYOUT.size)
            if cluster is not None:   # before the controller: it hands the daemon's asks on to it
                from .cluster import MountCluster
                held["cluster"] = MountCluster(self, cluster)
            if stage:
                from .controller import Controller
                held["controller"] = Controller(self, threads=stage_threads)
        except BaseException:
            self._finalizer()
            raise

    @property
    def events_fd(self) -> int:
        """The read end of the daemon's pipe of source opens (file numbers, u64 each)."""
        return self._held.get("events", -1)

    @property
    def controller(self):
        return self._held.get("controller")

    @property
    def cluster(self):
        """This node's part of a cluster of mounts (mount/cluster/node.py), or None."""
        return self._held.get("cluster")

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def alive(self) -> bool:
        """The daemon still runs and the mount is still there."""
        return self.proc.poll() is None and mounted(self.path)

    def stats(self) -> MountStats:
        mm = self._held.get("stats")
        if mm is None:
            raise SourceError(f"the mount on {self.path} is closed")
        return _stats(_LAYOUT.unpack_from(mm, 0))

    def staging(self) -> dict:
        """What the mount's staging did (controller.py); empty without staging."""
        ctl = self.controller
        return ctl.snapshot() if ctl is not None else {}

    def close(self) -> None:
        """Unmount, reap the daemon, leave the tier's session, remove the temporary files. Idempotent."""
        self._finalizer()

    def __enter__(self) -> "Mount":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"mounted at {self.path!r}"
        return f"Mount({self.source.root!r}; {state}; local tier {self.tiers.local.root!r})"


__all__ = ["Mount", "MountStats", "mount_available", "read_stats", "read_info", "DAEMON", "INFO_NAME"]
