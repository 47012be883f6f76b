"""A state-machine test of the local tier against a model: fetch, read, evict, crash, restart,
corrupt a byte, delete an extent file; and the same with samples staged by each file engine
(the C threads and their Python twin). Invariants: bytes within capacity, ledger equal to the
bytes of the entries the index lists, no extent that no entry uses after a restart, every read returns the source's bytes or
detects the damage."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clairvoyant.cache.entry import entry_size, unseal
from clairvoyant.cache.extents import read_entry
from clairvoyant.cache.local import LocalStore
from clairvoyant.cache.tiers import LOCAL, Placement, Tiers
from clairvoyant.errors import CorruptEntry
from clairvoyant.source import Source
from clairvoyant.stage import native_files
from clairvoyant.stage.thread_files import ThreadStager

from conftest import orphan_extents

KEYS = [f"k{i}" for i in range(8)]
SOURCE = {k: os.urandom(100 + 37 * i) for i, k in enumerate(KEYS)}
CAPACITY = 4 * entry_size(250)


class DictSource(Source):
    uri = "mem://model"

    def scan(self):
        return ((k, len(v)) for k, v in SOURCE.items())

    def read(self, key: str) -> bytes:
        return SOURCE[key]

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        return SOURCE[key], 7

    def version(self, key: str) -> tuple[int, int]:
        return len(SOURCE[key]), 7


class TierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="cv-model-")
        self.tiers = None
        self._open()
        self.model: dict[str, str] = {}     # key -> "ok" | "corrupt"

    def _open(self) -> None:
        local = LocalStore(os.path.join(self.dir, "l"), DictSource.uri)
        self.tiers = Tiers(local, lambda: LocalStore(os.path.join(self.dir, "r"), DictSource.uri),
                           CAPACITY, CAPACITY, DictSource())

    def _close(self) -> None:
        self.tiers.close()
        self.tiers.local.close()
        self.tiers.ram.close()

    def teardown(self) -> None:
        self._close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _disk(self) -> int:
        return sum(self.tiers.local.entries().values())

    @rule(key=st.sampled_from(KEYS))
    def fetch(self, key):
        size = len(SOURCE[key])
        if self.tiers.claim(key, size):
            return   # present: a hit (whatever its state; read checks it)
        try:
            placed = self.tiers.stage(key, size, True, lambda: (SOURCE[key], 7))
        finally:
            self.tiers.release(key)
        if placed.tier == LOCAL:
            self.model[key] = "ok"
        else:
            self.tiers.after_use(key, placed, False, False)   # the RAM copy goes after its access

    @rule(key=st.sampled_from(KEYS))
    def read(self, key):
        size = len(SOURCE[key])
        loc = self.tiers.find_local(key, size)
        if key not in self.model:
            assert loc is None
            return
        if loc is None:   # a truncated entry is not even offered
            assert self.model[key] == "corrupt"
            self.tiers.local.delete(key)
            del self.model[key]
            return
        try:
            data = unseal(read_entry(loc), size, key)
        except CorruptEntry:
            assert self.model[key] == "corrupt", "a whole entry was reported corrupt"
            self.tiers.after_use(key, Placement(LOCAL, loc, False), True, True)
            del self.model[key]
            return
        assert self.model[key] == "ok", "a corrupt entry was served"
        assert data == SOURCE[key]

    @rule(key=st.sampled_from(KEYS))
    def evict(self, key):
        self.tiers.after_use(key, Placement(LOCAL, self.tiers.local.find(key), False), False, False)
        self.model.pop(key, None)

    @rule(key=st.sampled_from(KEYS), at=st.sampled_from(["reserved", "tmp_written"]))
    def crash_mid_publish(self, key, at):
        """What a SIGKILL leaves at each step: bytes reserved, maybe bytes in an extent no entry uses."""
        self.tiers.local.ledger.reserve(entry_size(len(SOURCE[key])), 1 << 40)
        if at == "tmp_written":
            with open(os.path.join(self.tiers.local.ext_dir, "4000"), "wb") as f:
                f.write(SOURCE[key][:10])
        self.restart()

    @rule()
    def restart(self):
        self._close()
        self._open()
        assert self.tiers.local.ledger.read()[0] == self._disk()
        assert orphan_extents(self.dir) == []

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def corrupt_a_byte(self, data):
        key = data.draw(st.sampled_from(sorted(self.model)))
        loc = self.tiers.local.find(key)
        with open(loc.path, "r+b") as f:
            pos = data.draw(st.integers(0, len(SOURCE[key]) - 1))
            f.seek(loc.offset + pos)   # (off the source's byte, not the entry's: a byte hit twice stays wrong)
            f.write(bytes([SOURCE[key][pos] ^ 0x10]))
        self.model[key] = "corrupt"

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete_an_extent_between_jobs(self, data):
        """An extent file removed while no job runs: its entries are dropped at the next start."""
        key = data.draw(st.sampled_from(sorted(self.model)))
        path = self.tiers.local.find(key).path
        lost = [k for k in self.model if self.tiers.local.find(k).path == path]
        self._close()
        os.unlink(path)
        self._open()
        for k in lost:
            del self.model[k]
            assert self.tiers.local.find(k) is None
        assert self.tiers.local.ledger.read()[0] == self._disk()

    @invariant()
    def within_capacity(self):
        used, peak = self.tiers.local.ledger.read()
        assert self._disk() <= CAPACITY and used <= CAPACITY and peak <= CAPACITY

    @invariant()
    def ledger_equals_disk(self):
        assert self.tiers.local.ledger.read()[0] == self._disk()


TestTierModel = TierMachine.TestCase
TestTierModel.settings = settings(max_examples=12, stateful_step_count=20, deadline=None)


class EngineTierMachine(TierMachine):
    """The same machine with samples also staged by a file engine (stage/engines.py), the way the
    mount and the Loader's native route stage them: the C threads or their Python twin, each
    held to the same model and invariants."""

    engine = None   # set by each subclass below

    def _open(self) -> None:
        super()._open()
        src = os.path.join(self.dir, "src")
        if not os.path.isdir(src):
            os.makedirs(src)
            for k, v in SOURCE.items():
                with open(os.path.join(src, k), "wb") as f:
                    f.write(v)
                os.utime(os.path.join(src, k), ns=(7, 7))   # the mtime DictSource gives: entries stay fresh
        self.told: dict[int, object] = {}
        self.cv = threading.Condition()
        self.token = getattr(self, "token", 0)
        self.stager = self.engine(self.tiers.local, CAPACITY, src, None, 2, self._on_done)

    def _on_done(self, d) -> None:
        with self.cv:
            self.told[d.token] = d
            self.cv.notify_all()

    def _close(self) -> None:
        self.stager.close()
        super()._close()

    @rule(key=st.sampled_from(KEYS))
    def stage_on_the_engine(self, key):
        self.token += 1
        t = self.token
        if self.stager.submit(t, key, len(SOURCE[key])) is not True:
            return   # no room: nothing reserved, nothing changed
        with self.cv:
            assert self.cv.wait_for(lambda: t in self.told, 20)
        d = self.told[t]
        if d.loc is not None:
            self.model[key] = "ok"
        else:
            assert d.present or d.error, d   # told why not


class ThreadEngineMachine(EngineTierMachine):
    engine = ThreadStager


TestTierModelThreadEngine = ThreadEngineMachine.TestCase
TestTierModelThreadEngine.settings = settings(max_examples=12, stateful_step_count=20, deadline=None)

if native_files.available():
    class NativeEngineMachine(EngineTierMachine):
        engine = native_files.NativeStager

    TestTierModelNativeEngine = NativeEngineMachine.TestCase
    TestTierModelNativeEngine.settings = settings(max_examples=12, stateful_step_count=20, deadline=None)
