"""Checking and emptying a cache directory (``clairvoyant cache verify`` / ``clear``).

A tier is consistent when every entry is whole and matches its checksum, no
temporary file of a dead writer is left, and, when no process uses the tier,
its ledger equals the bytes of its entries on disk.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field

from ..errors import CacheError
from .entry import check_file
from .ledger import Ledger
from .local import LAYOUT, SHARDS, scan_entries
from .publish import _alive
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
    orphans: list[str] = field(default_factory=list)               # temporary files of dead writers

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


def verify_tier(root: str, repair: bool = False) -> TierReport:
    """Check one source's tier; with ``repair`` (and no one using it), remove what is wrong and
    set the ledger to the bytes on disk."""
    rep = TierReport(root, in_use=in_use(root, "local"))
    data = os.path.join(root, "data")
    for name, n in scan_entries(data).items():
        path = os.path.join(data, name[:2], name)
        why = check_file(path)
        if why is None:
            rep.entries += 1
            rep.bytes += n
        else:
            rep.corrupt.append((path, why))
    for shard in SHARDS:
        d = os.path.join(root, "tmp", shard)
        for name in (os.listdir(d) if os.path.isdir(d) else []):
            pid = name.split(".", 1)[0]
            if not (pid.isdigit() and _alive(int(pid))):
                rep.orphans.append(os.path.join(d, name))
    ledger_path = os.path.join(root, "usage")
    if os.path.exists(ledger_path):
        led = Ledger(ledger_path)
        try:
            rep.ledger, rep.peak = led.read()
            if repair and not rep.in_use:
                for path in [p for p, _ in rep.corrupt] + rep.orphans:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                led.set(rep.bytes, reset_peak=False)
                rep.corrupt, rep.orphans = [], []
                rep.ledger, rep.peak = led.read()
        finally:
            led.close()
    return rep


def verify(cache_dir: str, repair: bool = False) -> list[TierReport]:
    return [verify_tier(r, repair) for r in tier_roots(cache_dir)]


def clear(cache_dir: str) -> int:
    """Remove every entry of every source in ``cache_dir``; refuses while a job uses it."""
    removed = 0
    for root in tier_roots(cache_dir):
        init = os.open(os.path.join(root, "local.init.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(init, fcntl.LOCK_EX)   # no one joins while we clear
            if in_use(root, "local"):
                raise CacheError(f"the cache {root} is in use by a running job: stop it first, then clear")
            data = os.path.join(root, "data")
            for name in scan_entries(data):
                try:
                    os.unlink(os.path.join(data, name[:2], name))
                    removed += 1
                except FileNotFoundError:
                    pass
            for shard in SHARDS:
                d = os.path.join(root, "tmp", shard)
                for name in (os.listdir(d) if os.path.isdir(d) else []):
                    os.unlink(os.path.join(d, name))
            if os.path.exists(os.path.join(root, "usage")):
                led = Ledger(os.path.join(root, "usage"))
                led.set(0)
                led.close()
            for stale in ("local.inventory.json",):
                try:
                    os.unlink(os.path.join(root, stale))
                except FileNotFoundError:
                    pass
        finally:
            os.close(init)
    return removed
