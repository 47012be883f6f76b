"""Shared fixtures: a tiny synthetic ImageFolder data set and leak checks."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from clairvoyant.testing import make_dataset


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Manifests go to a per-test cache, never to the user's home."""
    monkeypatch.setenv("CLAIRVOYANT_CACHE", str(tmp_path_factory.mktemp("cvcache")))
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


def tmp_files(local_dir: str) -> list[str]:
    """Files in the cache's temporary area (writes in progress or orphans)."""
    out = []
    for root, _dirs, files in os.walk(local_dir):
        if "tmp" in os.path.relpath(root, local_dir).split(os.sep):
            out += [os.path.join(root, f) for f in files]
    return out


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves reader processes or staging threads behind."""
    yield
    assert wait_until(lambda: not mp.active_children()), f"orphan processes: {mp.active_children()}"
    assert wait_until(lambda: not clairvoyant_threads()), f"orphan threads: {clairvoyant_threads()}"
