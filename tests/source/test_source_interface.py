"""The declared Source interface: each capability's default, the concrete sources deriving from it,
the adapter that takes in a user's duck-typed source object, and the error for an object that is
no source at all."""

from __future__ import annotations

import os
import pickle
import re

import pytest

from clairvoyant import ConfigError, Loader
from clairvoyant import manifest as manifest_mod
from clairvoyant.errors import NotASource
from clairvoyant.source import (AdaptedSource, ListedSource, PosixSource, RemoteSource, Source, TarShardSource,
                                as_source)
from clairvoyant.testing import EmulatedStore
from clairvoyant.testing.faults import FaultySource

BLOBS = {f"k{i}": bytes([i]) * (10 + i) for i in range(6)}


class Minimal(Source):
    """What a source must have, and nothing more."""

    uri = "mem://minimal"

    def scan(self):
        return ((k, len(v)) for k, v in sorted(BLOBS.items()))

    def read(self, key):
        return BLOBS[key]


class Versioned(Minimal):
    """Overrides ``version``: the one thing that makes a source versioned."""

    def version(self, key):
        return len(BLOBS[key]), 42


class Duck:
    """A user's source object that derives from nothing (module level: picklable)."""

    uri = "mem://duck"

    def scan(self):
        return ((k, len(v)) for k, v in sorted(BLOBS.items()))

    def read(self, key):
        return BLOBS[key]


class RichDuck(Duck):
    """A duck-typed source with optional capabilities of its own."""

    uri = "mem://rich-duck"
    labels = {k: i % 2 for i, k in enumerate(sorted(BLOBS))}
    classes = ("even", "odd")
    root = "/somewhere"
    has_fields = True

    def __init__(self):
        self.manifests = []

    def read_versioned(self, key):
        return BLOBS[key], 7

    def version(self, key):
        return len(BLOBS[key]), 7

    def fields_of(self, key):
        return {"key": key}

    def use_manifest(self, manifest):
        self.manifests.append(manifest)


# -- defaults -----------------------------------------------------------------------------------

def test_every_optional_capability_has_its_default():
    s = Minimal()
    assert s.read_versioned("k3") == (BLOBS["k3"], 0)
    assert s.version("k3") is None and s.versioned is False and s.head("k3") is None
    assert s.labels is None and tuple(s.classes) == () and s.root is None
    assert s.walks_folders is False and s.has_fields is False and s.fields_of("k3") == {}
    assert s.use_manifest(object()) is None
    assert s.native_reads is False and s.sample_ranges(["k3"]) is None
    with pytest.raises(NotImplementedError):
        s.read_range(["k3"])


def test_overriding_version_declares_it_and_head_follows():
    """Negative control of the defaults above: a source that can tell versions says so."""
    s = Versioned()
    assert s.versioned is True and s.version("k2") == (12, 42) and s.head("k2") == 12
    assert Minimal().versioned is False   # the subclass's override did not leak into the base


def test_a_source_must_scan_and_read():
    with pytest.raises(TypeError):
        Source()

    class NoRead(Source):
        uri = "mem://x"

        def scan(self):
            return iter(())

    with pytest.raises(TypeError, match="read"):
        NoRead()


def test_the_defaults_reach_the_manifest():
    """No labels: every label -1, no classes; a source's own labels and classes are recorded
    (control: the same keys with labels give other labels, so the check can fail)."""
    plain = manifest_mod.build(Minimal())
    assert list(plain.keys) == sorted(BLOBS) and set(plain.labels.tolist()) == {-1} and plain.classes == ()
    rich = manifest_mod.build(as_source(RichDuck()))
    assert rich.labels.tolist() == [0, 1, 0, 1, 0, 1] and rich.classes == ("even", "odd")
    assert plain.fingerprint != rich.fingerprint


# -- the concrete sources ------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [PosixSource, ListedSource, TarShardSource, RemoteSource, EmulatedStore,
                                 FaultySource, AdaptedSource])
def test_every_source_derives_from_the_interface(cls):
    assert issubclass(cls, Source)


def test_a_directory_source_overrides_what_it_has(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"12345")
    s = PosixSource(tmp_path)
    data, mtime = s.read_versioned("a/x.bin")
    assert data == b"12345" and mtime == os.stat(tmp_path / "a" / "x.bin").st_mtime_ns != 0
    assert s.versioned and s.version("a/x.bin") == (5, mtime) and s.head("a/x.bin") == 5
    assert s.walks_folders and s.root == str(tmp_path) and not s.has_fields
    assert s.native_reads and s.sample_ranges(["a/x.bin"]) is None
    # a subclass that reads otherwise (charges, checks) is not read natively unless it says so
    assert EmulatedStore.native_reads is False and FaultySource.native_reads is False
    listed = ListedSource(tmp_path, [("a/x.bin", "cat", {"w": 1})], fields=True)
    assert not listed.walks_folders and listed.has_fields and listed.fields_of("a/x.bin") == {"w": 1}
    assert listed.labels == {"a/x.bin": 0} and listed.classes == ("cat",)
    clone = pickle.loads(pickle.dumps(listed))
    assert clone.uri == listed.uri and clone.read("a/x.bin") == b"12345"


# -- the adapter ----------------------------------------------------------------------------------

def test_a_duck_typed_source_is_adapted_with_the_defaults():
    duck = Duck()
    s = as_source(duck)
    assert isinstance(s, AdaptedSource) and isinstance(s, Source) and s.inner is duck
    assert s.uri == "mem://duck" and list(s.scan()) == list(duck.scan()) and s.read("k1") == BLOBS["k1"]
    assert s.read_versioned("k1") == (BLOBS["k1"], 0)
    assert s.version("k1") is None and not s.versioned and s.head("k1") is None
    assert s.labels is None and tuple(s.classes) == () and s.root is None
    assert not s.walks_folders and not s.has_fields and s.fields_of("k1") == {}
    s.use_manifest(object())   # nothing to forward to: no error


def test_a_duck_typed_source_keeps_its_own_capabilities():
    """Control of the test above: what the object has is its own, not the default."""
    duck = RichDuck()
    s = as_source(duck)
    assert s.read_versioned("k1") == (BLOBS["k1"], 7)
    assert s.versioned and s.version("k1") == (11, 7) and s.head("k1") == 11
    assert s.labels is duck.labels and tuple(s.classes) == ("even", "odd") and s.root == "/somewhere"
    assert s.has_fields and s.fields_of("k1") == {"key": "k1"}
    s.use_manifest("m")
    assert duck.manifests == ["m"]


def test_the_adapter_is_picklable_and_a_source_is_taken_as_it_is(tmp_path):
    s = as_source(RichDuck())
    clone = pickle.loads(pickle.dumps(s))
    assert isinstance(clone, AdaptedSource) and clone.uri == s.uri and clone.read("k2") == BLOBS["k2"]
    mine = Minimal()
    assert as_source(mine) is mine
    direct = PosixSource(tmp_path)
    assert as_source(direct) is direct


def test_the_loader_reads_a_duck_typed_source(tmp_path, no_leaks):
    with Loader(RichDuck(), batch_size=3, shuffle=False, local_dir=tmp_path, num_workers=1, stage_threads=2,
                decode=bytes, cluster=False) as ld:
        assert isinstance(ld.source, AdaptedSource) and ld.source.inner.manifests == [ld.manifest]
        got = {}
        for samples, labels, fields in ld:   # fields collate to a dict of lists
            for b, y, k in zip(samples, labels, fields["key"]):
                got[k] = (b, int(y))
    assert got == {k: (v, i % 2) for i, (k, v) in enumerate(sorted(BLOBS.items()))}


# -- what is no source ----------------------------------------------------------------------------

class NoScan:
    uri = "mem://no-scan"

    def read(self, key):
        return b""


class BadUri(Duck):
    uri = 7


@pytest.mark.parametrize("obj, lacks, has", [
    (NoScan(), ["scan()"], ["uri", "read()"]),
    (BadUri(), ["uri (a string)"], ["scan()", "read()"]),
    (42, ["uri (a string)", "scan()", "read()"], []),
])
def test_an_object_that_is_no_source_gets_an_error_naming_what_it_lacks(obj, lacks, has, tmp_path):
    with pytest.raises(NotASource, match=re.escape(f"cannot use {obj!r} as a data source")) as e:
        Loader(obj, local_dir=tmp_path)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, TypeError)
    said = str(e.value).split(". Pass")[0]
    assert all(x in said for x in lacks)
    assert not any(x in said for x in has)   # control: what it has is not named
