"""Checking and emptying a cache directory (``clairvoyant cache verify`` / ``clear``).

A tier is consistent when every entry its index lists is whole and matches
its checksum and, when no process uses the tier, no extent is left that no
entry uses (what a killed writer left) and its ledger equals the bytes of its
entries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass, field

from ..errors import CacheError
from ..nodeio.fileio import discard
from .entry import check_entry
from .extents import Index, Loc
from .ledger import Ledger
from .local import LAYOUT
from .session import in_use


@dataclass
class TierReport:
    root: str
    entries: int = 0
    bytes: int = 0
    ledger: int = 0
    peak: int = 0
    in_use: bool = False
    corrupt: list[tuple[str, str]] = field(default_factory=list)   # (path, what is wrong)
    orphans: list[str] = field(default_factory=list)               # extents no entry uses

    @property
    def consistent(self) -> bool:
        return not self.corrupt and not self.orphans and (self.in_use or self.ledger == self.bytes)

    def to_json(self) -> dict:
        return {"root": self.root, "entries": self.entries, "bytes": self.bytes, "ledger": self.ledger,
                "peak": self.peak, "in_use": self.in_use, "corrupt": [list(c) for c in self.corrupt],
                "orphans": self.orphans, "consistent": self.consistent}


def tier_roots(cache_dir: str) -> list[str]:
    base = os.path.join(os.path.abspath(cache_dir), LAYOUT)
    if not os.path.isdir(base):
        raise CacheError(f"{cache_dir!r} holds no clairvoyant cache (no {LAYOUT}/ inside): check the path")
    return sorted(os.path.join(base, d) for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))


def _extents(root: str) -> list[str]:
    d = os.path.join(root, "ext")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def verify_tier(root: str, repair: bool = False) -> TierReport:
    """Check one source's tier; with ``repair`` (and no one using it), remove what is wrong (corrupt
    entries, extents no entry uses) and set the ledger to the bytes of the sound entries."""
    rep = TierReport(root, in_use=in_use(root, "local"))
    index_path = os.path.join(root, "index")
    index = Index(index_path) if os.path.exists(index_path) else None
    try:
        present = index.present() if index is not None else []
        bad_digests = []
        for row in present:
            loc = Loc(os.path.join(root, "ext", str(int(row["extent"]))), int(row["offset"]), int(row["length"]))
            why = check_entry(loc)
            if why is None:
                rep.entries += 1
                rep.bytes += loc.length
            else:
                rep.corrupt.append((f"{loc.path}@{loc.offset}", why))
                bad_digests.append(int(row["digest"]))
        if not rep.in_use:   # extents that no entry uses: what a killed writer left
            live = {str(int(e)) for e in (present["extent"] if len(present) else [])}
            rep.orphans = [os.path.join(root, "ext", n) for n in _extents(root) if n not in live]
        ledger_path = os.path.join(root, "usage")
        if os.path.exists(ledger_path):
            led = Ledger(ledger_path)
            try:
                rep.ledger, rep.peak = led.read()
                if repair and not rep.in_use:
                    for d in bad_digests:
                        index.retract(d)
                    for path in rep.orphans:
                        discard(path)
                    led.set(rep.bytes, reset_peak=False)
                    rep.corrupt, rep.orphans = [], []
                    rep.ledger, rep.peak = led.read()
            finally:
                led.close()
    finally:
        if index is not None:
            index.close()
    return rep


def verify(cache_dir: str, repair: bool = False) -> list[TierReport]:
    """Check every source's tier in ``cache_dir``; with ``repair``, each under its join lock, so that
    no job starts using a tier between the check that no one uses it and the repair."""
    if not repair:
        return [verify_tier(r) for r in tier_roots(cache_dir)]
    out = []
    for root in tier_roots(cache_dir):
        with _joins_held(root):
            out.append(verify_tier(root, repair=True))
    return out


@contextlib.contextmanager
def _joins_held(root: str):
    """Hold the local tier's join lock (session.py): no process joins or leaves meanwhile."""
    fd = os.open(os.path.join(root, "local.init.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clear(cache_dir: str) -> int:
    """Remove every entry of every source in ``cache_dir``; refuses while a job uses it."""
    removed = 0
    for root in tier_roots(cache_dir):
        with _joins_held(root):   # no one joins while we clear
            if in_use(root, "local"):
                raise CacheError(f"the cache {root} is in use by a running job: stop it first, then clear")
            if os.path.exists(os.path.join(root, "index")):
                index = Index(os.path.join(root, "index"))
                try:
                    removed += len(index.present())
                    index.clear()
                finally:
                    index.close()
            for name in _extents(root):
                os.unlink(os.path.join(root, "ext", name))
            if os.path.exists(os.path.join(root, "usage")):
                led = Ledger(os.path.join(root, "usage"))
                led.set(0)
                led.close()
            for stale in ("local.inventory.json",):
                discard(os.path.join(root, stale))
    return removed
