"""MECHANISM: the loss-spike guard against silent data corruption (seed 003).

With the guard on, readers record the xxh3-64 of the bytes each sample was
decoded from and of every array they wrote into the batch buffer
(load/worker.py). The user hands the guard each step's loss; on a spike
(tune/spike.py) it checks the last batches the loop got:

- each sample is read again from the source and compared with what was
  decoded; where they differ, the place is named from where the reader got the
  bytes: a local entry whose recorded checksum still matches the source (the
  bytes changed after the reader verified them: **local**), one whose recorded
  checksum matches what was served (the source changed, or its first read was
  wrong: **source**), the RAM window (its bytes changed in memory while the
  source did not: **ram**), a direct read (the source gave two answers:
  **source**);
- every array of the batch as the loop holds it is hashed again and compared
  with the reader's record (changed after collation: **batch buffer**; a loop
  that changes its batch in place on the CPU, ``x.sub_(mean)``, looks the same:
  normalise into a new tensor, or on the device);
- the sample's local entry, if there is one, is verified again; one that went
  bad after it was served (readers verify every read, so it was not served so),
  or that differs from the source now (staged from bad bytes), is removed and
  reported.

If nothing that was served differs, the data was intact and the spike came from
the compute path (a memory error on the accelerator, say): the advice is to
reload the last checkpoint. The check costs one source read per sample of the
checked batches; the records cost two xxh3 passes per batch (about 1 ms per
10 MB) while the guard is on.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..cache.entry import check_entry, recorded_checksum
from ..errors import ConfigError
from ..tune.spike import SpikeDetector, SpikeRule
from .transport import leaf_digests

log = logging.getLogger("clairvoyant")


@dataclass(frozen=True)
class Finding:
    key: str       # the sample ("" for the batch buffer)
    place: str     # source, local, ram, batch buffer
    served: bool   # the training loop got the bad bytes (False: found on the way, never served)
    detail: str


@dataclass
class GuardVerdict:
    """What a check found: ``corrupt`` if the loop was served bad data (``findings`` say which
    samples and where); else the data was intact and the advice is to reload the last checkpoint."""

    epoch: int
    batches: list[int]
    samples_checked: int
    score: float
    findings: list[Finding] = field(default_factory=list)

    @property
    def corrupt(self) -> bool:
        return any(f.served for f in self.findings)

    @property
    def advice(self) -> str:
        if self.corrupt:
            places = sorted({f.place for f in self.findings if f.served})
            return (f"the data was corrupt ({', '.join(places)}): skip this step's update and go on; local "
                    "entries that differ from the source were removed. Check the node's memory and storage if "
                    "it repeats")
        return ("the data was intact: the spike came from the compute path (or the data itself); reload the "
                "last checkpoint and check the accelerator's memory if it repeats")

    def __str__(self) -> str:
        head = f"loss spike (score {self.score:.1f}) at epoch {self.epoch}, batch(es) {self.batches}: " \
               f"{self.samples_checked} samples checked against the source; {self.advice}"
        return "\n".join([head] + [f"  {f.place}: {f.key or 'the batch'}: {f.detail}" for f in self.findings])


class Guard:
    """``guard = loader.guard()`` before iterating; then ``guard.step(loss)`` after each step."""

    def __init__(self, loader: Any, rule: SpikeRule, keep: int = 1) -> None:
        self._loader = loader
        self.detector = SpikeDetector(rule)
        self.recent: collections.deque = collections.deque(maxlen=keep)   # ServedBatch, newest last
        self.verdicts: list[GuardVerdict] = []

    def step(self, loss: Any) -> GuardVerdict | None:
        """Report this step's loss (a float or a one-element tensor). On a spike, check the last
        batches and return the verdict (also logged as a warning); else None."""
        value = float(loss.item() if hasattr(loss, "item") else loss)
        if not self.detector.update(value):
            return None
        return self.check(score=self.detector.last_score)

    def check(self, score: float = float("nan")) -> GuardVerdict:
        """Check the last batches the loop got now, spike or not."""
        if not self.recent:
            raise ConfigError("the guard has no batch to check: call loader.guard() before iterating, then "
                              "check after the loop got a batch")
        ld = self._loader
        served = list(self.recent)
        v = GuardVerdict(served[-1].epoch, [b.batch for b in served], sum(len(b.samples) for b in served), score)
        for b in served:
            for s in b.samples:
                v.findings.extend(_check_sample(s, ld.source, ld.tiers))
            if b.output is not None:
                now = leaf_digests(b.spec, b.output)
                bad = [i for i, (x, y) in enumerate(zip(now, b.leaves)) if x != y]
                if bad:
                    v.findings.append(Finding("", "batch buffer", True,
                                              f"array(s) {bad} of batch {b.batch} changed after the reader "
                                              "collated them"))
        self.verdicts.append(v)
        log.warning("clairvoyant guard: %s", v)
        return v


def _check_sample(s, source, tiers) -> list[Finding]:
    out = []
    try:
        now = xxhash.xxh3_64_intdigest(source.read(s.key))
    except Exception as e:   # noqa: BLE001 - reported, not raised: the check must finish
        return [Finding(s.key, "source", False, f"cannot be read again for the check: {e}")]
    loc = tiers.local.find(s.key)
    recorded = recorded_checksum(loc)
    if s.digest != now:
        if s.where == "local" and recorded == now:
            out.append(Finding(s.key, "local", True, "the bytes decoded differ from the entry and the source: "
                               "they changed after the entry's checksum was verified (in the reader's memory)"))
        elif s.where == "local" and recorded == s.digest:
            out.append(Finding(s.key, "source", True, "the staged copy matches what was decoded but not the "
                               "source now: the source changed after staging, or its first read was wrong"))
        elif s.where == "local":
            out.append(Finding(s.key, "local", True, "the bytes decoded differ from the source; the entry is "
                               "gone or differs too"))
        elif s.where == "ram":
            changed = _mtime(source, s.key) not in (None, s.mtime_ns)
            out.append(Finding(s.key, "source" if changed else "ram", True,
                               "the source changed since it was fetched" if changed else
                               "the bytes held in the RAM window changed after they were read from the source"))
        else:
            out.append(Finding(s.key, "source", True, "two reads of the source gave different bytes"))
    if recorded is not None and check_entry(loc) is not None:
        tiers.local.delete(s.key)
        out.append(Finding(s.key, "local", False, "the local entry is corrupt now (it was not served so: "
                           "readers verify every read); removed"))
    elif recorded is not None and recorded != now:
        # staged from bad bytes (a misread source, a RAM window moved down after its use) or from a
        # source that changed since: it passes its own checksum, so it must go now
        tiers.local.delete(s.key)
        out.append(Finding(s.key, "local", False, "the local entry differs from the source now; removed"))
    return out


def _mtime(source, key: str) -> int | None:
    try:
        v = source.version(key)
        return int(v[1]) if v is not None else None
    except OSError:
        return None
