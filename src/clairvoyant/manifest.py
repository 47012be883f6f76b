"""The index of a source: every sample's key, size and label, listed once and persisted.

A later run over the same source loads the persisted manifest instead of
walking the (slow, shared) file system again. The file is JSON, written
atomically; it is never unpickled.

Labels follow torchvision's ImageFolder: when every key lies in a top-level
sub-directory, those directories are the classes, in sorted order; otherwise
every sample's label is -1. A listed source (a list file, a torchvision-style
dataset) gives its own labels and classes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from .cache.publish import tmp_name
from .errors import ManifestError
from .fileio import write_all, write_atomically
from .paths import cache_home
from .source import Source

FORMAT = "clairvoyant-manifest"
VERSION = 1


@dataclass(frozen=True)
class Manifest:
    """What a source holds, in a stable order (sorted keys)."""

    uri: str
    keys: tuple[str, ...]
    sizes: np.ndarray  # int64, one per key
    labels: np.ndarray  # int64, one per key; -1 where the layout gives no label
    classes: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    @property
    def fingerprint(self) -> str:
        """Changes whenever a key, a size or a label changes."""
        h = hashlib.sha1()
        for k in self.keys:
            h.update(k.encode())
            h.update(b"\0")
        h.update(np.ascontiguousarray(self.sizes, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.labels, dtype="<i8").tobytes())
        return h.hexdigest()[:20]

    @classmethod
    def from_entries(cls, uri: str, entries: Iterable[tuple[str, int]], labels: dict[str, int] | None = None,
                     classes: tuple[str, ...] = ()) -> "Manifest":
        """Keys sorted; labels given (a listed source), else from the top-level directories."""
        items = sorted(entries)
        keys = tuple(k for k, _ in items)
        sizes = np.fromiter((s for _, s in items), dtype=np.int64, count=len(items))
        if labels is not None:
            given = np.fromiter((labels[k] for k in keys), dtype=np.int64, count=len(keys))
            return cls(uri=uri, keys=keys, sizes=sizes, labels=given, classes=tuple(classes))
        if keys and all("/" in k for k in keys):
            top = [k.split("/", 1)[0] for k in keys]
            classes = tuple(sorted(set(top)))
            index = {c: i for i, c in enumerate(classes)}
            labels = np.fromiter((index[t] for t in top), dtype=np.int64, count=len(keys))
        else:
            classes = ()
            labels = np.full(len(keys), -1, dtype=np.int64)
        return cls(uri=uri, keys=keys, sizes=sizes, labels=labels, classes=classes)

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "uri": self.uri, "created": self.created,
            "classes": list(self.classes),
            "samples": [[k, int(s), int(l)] for k, s, l in zip(self.keys, self.sizes, self.labels)],
        }

    @classmethod
    def from_json(cls, doc: object, *, origin: str = "<memory>") -> "Manifest":
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a clairvoyant manifest")
            if doc.get("version") != VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            samples = doc["samples"]
            keys = tuple(str(s[0]) for s in samples)
            sizes = np.array([int(s[1]) for s in samples], dtype=np.int64)
            labels = np.array([int(s[2]) for s in samples], dtype=np.int64)
            return cls(uri=str(doc["uri"]), keys=keys, sizes=sizes, labels=labels,
                       classes=tuple(doc.get("classes", ())), created=float(doc.get("created", 0.0)))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ManifestError(
                f"manifest {origin} is unreadable ({e}): delete it, or rebuild it with `clairvoyant index --force`") from e


def default_manifest_path(uri: str) -> str:
    """Where the manifest of the source ``uri`` is kept unless told otherwise."""
    digest = hashlib.sha1(uri.encode()).hexdigest()[:20]
    return os.path.join(cache_home(), "manifests", f"{digest}.json")


def save(manifest: Manifest, path: str) -> None:
    """Write atomically: a reader sees the old manifest or the new one, never half."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    data = json.dumps(manifest.to_json(), separators=(",", ":")).encode()
    write_atomically(path, tmp_name(directory, path), lambda fd: write_all(fd, data))


def load(path: str) -> Manifest:
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ManifestError(f"manifest {path} is not valid JSON ({e}): delete it and index the source again") from e
    return Manifest.from_json(doc, origin=path)


def build(source: Source, progress: Callable[[int], None] | None = None) -> Manifest:
    """Walk the source once."""
    entries = []
    for entry in source.scan():
        entries.append(entry)
        if progress is not None and len(entries) % 1000 == 0:
            progress(len(entries))
    return Manifest.from_entries(source.uri, entries, getattr(source, "labels", None),
                                 tuple(getattr(source, "classes", ())))


def obtain(source: Source, path: str | None = None, *, reindex: bool = False) -> tuple[Manifest, bool]:
    """The persisted manifest of ``source`` if there is one, else build and persist it.

    Returns ``(manifest, built)``; ``built`` says whether the source was walked.
    """
    path = path or default_manifest_path(source.uri)
    if not reindex and os.path.exists(path):
        manifest = load(path)
        if manifest.uri != source.uri:
            raise ManifestError(
                f"manifest {path} belongs to {manifest.uri}, not to {source.uri}: pass the right manifest= "
                "or rebuild with reindex=True")
        return manifest, False
    manifest = build(source)
    try:
        save(manifest, path)
    except OSError:
        pass  # a read-only cache home costs a re-walk next time, nothing more
    return manifest, True
