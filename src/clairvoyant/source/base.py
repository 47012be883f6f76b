"""The contract every data source fulfils, declared once: what a caller may ask of a source, and
what a source that does not say otherwise answers.

A source is where the bytes live (a POSIX directory on a shared file system, a list of its files,
packed tar shards, an object store, an emulated slow store). Keys are relative POSIX paths. Every
source lists its samples (``scan``) and reads one (``read``); everything else is an optional
capability with a default here, so callers use it directly and never probe for it. Sources must
be picklable so that reader processes can use them.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterator, Mapping, Sequence


class Source(abc.ABC):
    """Where samples live. Subclasses implement ``scan`` and ``read`` and set ``uri``; they
    override a capability below only when they have it.

    ``uri`` is a stable identity used to find the persisted manifest and the node-local cache of
    this source (no credentials in it).
    """

    uri: str

    #: ``labels``: each sample's integer label by key (what the manifest records), or None: every
    #: label -1
    labels: Mapping[str, int] | None = None
    #: ``classes``: the class names, in the order of their label indices
    classes: Sequence[str] = ()
    #: ``root``: the directory the keys are relative to, for a source that is a POSIX tree; None
    #: for any other (shards, object stores)
    root: str | None = None
    #: ``walks_folders``: the source is a directory tree (a :class:`PosixSource`) whose walk
    #: (``walk_tree``) stands in for ``scan``; the manifest records its folders and checks them
    #: for changes at each start (refresh.py)
    walks_folders: bool = False
    #: ``has_fields``: samples carry extra fields (``fields_of``) that travel with each sample
    has_fields: bool = False
    #: ``native_reads``: a key's bytes are a plain span of a file (``native_span``), read with
    #: nothing charged or checked on the way, so the native staging threads may read them
    #: themselves (stage/native.py)
    native_reads: bool = False
    #: ``decoder``: what a sample's bytes are turned into when the Loader is given no ``decode=``
    #: (arrays: their dtype and shape); None: the Loader's default (images)
    decoder: Callable[[bytes], Any] | None = None
    #: ``made_in_reader``: the samples are made, not read (a map-style dataset with no files,
    #: source/indexed.py): readers call ``item(key)`` for each, and nothing is staged
    made_in_reader: bool = False
    #: ``target_field``: the field (of ``fields_of``) that is each sample's target, for targets that
    #: are not one integer (a regression's floats, a vector); None: the manifest's integer label
    target_field: str | None = None

    def native_span(self, key: str, size: int) -> tuple[str, int, int] | None:
        """Where sample ``key``'s ``size`` bytes lie, for the native staging threads
        (``native_reads``): the file (relative to ``root``, or absolute), the offset of the bytes in
        it and the file's mtime as indexed (checked before the read), or -1, -1 where the whole
        file is the sample (its size checked); None where the source says the sample is not
        ``size`` bytes (it changed since the manifest: the Python path raises the typed error)."""
        return key, -1, -1

    @abc.abstractmethod
    def scan(self) -> Iterator[tuple[str, int]]:
        """Walk the source once, yielding ``(key, size_in_bytes)`` for every sample."""

    @abc.abstractmethod
    def read(self, key: str) -> bytes:
        """Return the whole content of sample ``key``; raise SampleReadError if it cannot be read."""

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        """The sample's bytes and its version (a modification time in ns) from one read; a source
        that cannot tell gives version 0."""
        return self.read(key), 0

    @property
    def versioned(self) -> bool:
        """Whether ``version`` tells anything (a subclass that overrides it does): callers that
        would check a staged copy against the source skip the check when it does not."""
        return type(self).version is not Source.version

    def version(self, key: str) -> tuple[int, int] | None:
        """``(size, version)`` of sample ``key`` now, from one metadata operation; None where the
        source cannot tell (then a staged copy is trusted as it is)."""
        return None

    def head(self, key: str) -> int | None:
        """The size of sample ``key`` now, from one metadata request (what ``clairvoyant probe``
        times): its ``version``'s size by default; None where the source has no such request."""
        v = self.version(key)
        return None if v is None else int(v[0])

    def item(self, key: str) -> Any:
        """Sample ``key`` made whole (only where ``made_in_reader``)."""
        raise NotImplementedError(f"{type(self).__name__} reads bytes (read); it makes no samples")

    def fields_of(self, key: str) -> dict:
        """The extra fields of sample ``key`` (read only where ``has_fields``)."""
        return {}

    def sample_ranges(self, keys: Sequence[str]) -> tuple[Any, Any] | None:
        """For a source that packs samples together (tar shards): runs of samples that one request
        reads, as the manifest ``keys`` number them: each sample's range (int32 array) and the
        bytes one read of each range takes (int64 array), plan/ranges.py's ``Ranges``; None (the
        default): every sample is read on its own."""
        return None

    def read_range(self, keys: Sequence[str]) -> tuple[list[bytes], int]:
        """The bytes of ``keys``, samples of one range of ``sample_ranges``, in that order, read
        with one request, and the source's version of them."""
        raise NotImplementedError(f"{type(self).__name__} has no ranges (sample_ranges gives None)")

    def use_manifest(self, manifest: Any) -> None:
        """The manifest the reads follow (an object store reads exactly the listed sizes); the
        Loader calls it once the manifest is known. Nothing to do by default."""
