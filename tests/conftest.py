"""Shared fixtures: a tiny synthetic ImageFolder data set and leak checks."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time

import pytest

from clairvoyant.testing import make_dataset


@pytest.fixture(scope="session", autouse=True)
def _suite_tmpdir(tmp_path_factory):
    """Every process the suite starts keeps its temporary files in one folder, removed at the end:
    torchrun's ``torchelastic_*`` log folders (one per launch: 2,047 were left in /tmp here before),
    the emulated store's shared counters, the mounts' control sockets. (pytest's own folders stay
    where they were, kept for a look after a failure.)"""
    tmp_path_factory.getbasetemp()   # (fixed now, before the temporary folder moves)
    folder = tempfile.mkdtemp(prefix="cv-suite-")
    before, cached = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = cached
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Manifests go to a per-test cache, never to the user's home; so does the job's secret file
    (cluster/secret.py: the processes a test starts inherit it)."""
    monkeypatch.setenv("CLAIRVOYANT_CACHE", str(tmp_path_factory.mktemp("cvcache")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    ram = tmp_path_factory.mktemp("ram")
    monkeypatch.setenv("CLAIRVOYANT_RAM_DIR", str(ram / "tier"))
    yield
    # the RAM tier removes itself when its last user leaves: nothing may stay behind
    leftovers = [os.path.join(r, f) for r, _, fs in os.walk(ram) for f in fs]
    assert not leftovers, f"RAM tier left behind: {leftovers[:5]}"


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> str:
    """96 JPEGs of 32x32 in 4 classes."""
    root = str(tmp_path_factory.mktemp("data") / "imgs")
    return make_dataset(root, 96, num_classes=4, size=32)


def clairvoyant_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("clairvoyant")]


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def differing(root_a: str, root_b: str, rels) -> list[str]:
    """The relative paths whose bytes under ``root_a`` and ``root_b`` differ."""
    return [rel for rel in rels if content(os.path.join(root_a, rel)) != content(os.path.join(root_b, rel))]


def _tier_roots(local_dir: str):
    """The local tiers under ``local_dir`` (directories with an index and extents), each with its
    present entries."""
    from clairvoyant.cache.extents import Index
    for root, dirs, files in os.walk(local_dir):
        if "index" in files and "ext" in dirs:
            index = Index(os.path.join(root, "index"))
            try:
                present = index.present()
            finally:
                index.close()
            yield root, present


def orphan_extents(local_dir: str) -> list[str]:
    """Extent files of the local tier that no entry of its index uses (what a killed or failed
    writer would leave behind; a live store's current extent counts too, so call it after close)."""
    out = []
    for root, present in _tier_roots(local_dir):
        live = {str(int(e)) for e in present["extent"]}
        out += [os.path.join(root, "ext", n) for n in os.listdir(os.path.join(root, "ext")) if n not in live]
    return out


def entry_count(local_dir: str) -> int:
    """Entries the local tiers under ``local_dir`` hold, from their indexes."""
    return sum(len(present) for _, present in _tier_roots(local_dir))


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves reader processes or staging threads behind."""
    yield
    assert wait_until(lambda: not mp.active_children()), f"orphan processes: {mp.active_children()}"
    assert wait_until(lambda: not clairvoyant_threads()), f"orphan threads: {clairvoyant_threads()}"
