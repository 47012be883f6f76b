"""Where a source's manifest lives, and getting one: loaded if persisted and current, else listed.

:func:`obtain` is what the Loader, the mount and ``clairvoyant index`` call: the persisted file
if there is one (a directory source's folders checked against it, ``refresh.py``), else a walk
of the source (:func:`build`), saved for the next run.
"""


from __future__ import annotations

import hashlib
import logging
import os
from typing import Callable

from ..errors import EmptySourceError, ManifestError
from ..nodeio.paths import cache_home
from ..source import Source
from . import refresh
from .tree import Collector
from .fileformat import load, save
from .record import Manifest

log = logging.getLogger("clairvoyant")


def default_manifest_path(uri: str) -> str:
    """Where the manifest of the source ``uri`` is kept unless told otherwise."""
    digest = hashlib.sha1(uri.encode()).hexdigest()[:20]
    return os.path.join(cache_home(), "manifests", f"{digest}.manifest")


def legacy_manifest_path(uri: str) -> str:
    """Where versions before the binary format kept it (JSON): still read, then upgraded."""
    return default_manifest_path(uri)[:-len(".manifest")] + ".json"


def existing(uri: str, path: str | None = None) -> str | None:
    """The file to read the manifest of ``uri`` from: ``path`` if given (and there), else the
    default, else the default of the JSON versions; None when there is none."""
    if path is not None:
        return path if os.path.exists(path) else None
    for p in (default_manifest_path(uri), legacy_manifest_path(uri)):
        if os.path.exists(p):
            return p
    return None


def build(source: Source, progress: Callable[[int], None] | None = None) -> Manifest:
    """Walk the source once (a directory source: its folders and file attributes too)."""
    if source.walks_folders:   # a PosixSource: its walk, folders included
        source.check()
        got = Collector()
        for item in source.walk_tree():
            got.add(*item)
            if progress is not None and not item[1].is_dir and len(got.keys) % 1000 == 0:
                progress(len(got.keys))
        if not got.keys:
            raise EmptySourceError(f"data source {source.root!r} holds no files: point it at the directory that "
                                   "holds the samples")
        keys, sizes, tree = got.finish()
        return Manifest.from_columns(source.uri, keys, sizes, source.labels, tuple(source.classes), tree)
    entries = []
    for entry in source.scan():
        entries.append(entry)
        if progress is not None and len(entries) % 1000 == 0:
            progress(len(entries))
    return Manifest.from_entries(source.uri, entries, source.labels, tuple(source.classes))


def obtain(source: Source, path: str | None = None, *, reindex: bool = False,
           require_folders: bool = False) -> tuple[Manifest, bool]:
    """The persisted manifest of ``source`` if there is one, else build and persist it.

    Returns ``(manifest, built)``; ``built`` says whether the source was walked whole. A JSON
    manifest found at the default place (an earlier version's) is read and saved again in the
    binary format. A directory source's manifest is checked against the source first (one stat
    per folder, :func:`current`); ``require_folders``: one that records no folders (an earlier
    version's) is rebuilt rather than used as it is (the mount shows every folder). A manifest
    ``path`` the caller gave that exists is pinned: checked, a change logged, never rewritten
    (``reindex=True`` builds it anew).
    """
    target = path or default_manifest_path(source.uri)
    found = None if reindex else existing(source.uri, path)
    manifest = None
    if found is not None:
        try:
            manifest = load(found)
        except ManifestError as e:
            if path is not None:   # the user's: theirs to fix
                raise
            # ours, torn or damaged (a crash of an older version): list the source again
            log.warning("the manifest %s of %s cannot be read (%s): listing the source again", found, source.uri, e)
    if manifest is not None:
        if manifest.uri != source.uri:
            raise ManifestError(
                f"manifest {found} belongs to {manifest.uri}, not to {source.uri}: pass the right manifest= "
                "or rebuild with reindex=True")
        pinned = found if path is not None and found == path else None
        fresh, changed = current(source, manifest, found, require_folders=require_folders, pinned=pinned)
        if pinned is not None and fresh is not None:
            return manifest, False   # the user's file, as it is
        manifest = fresh
        if manifest is not None:
            if found != target or changed:
                _save_quietly(manifest, target)
            return manifest, False
    manifest = build(source)
    _save_quietly(manifest, target)
    return manifest, True


def current(source: Source, manifest: Manifest, origin: str, *, require_folders: bool = False,
            pinned: str | None = None) -> tuple[Manifest | None, bool]:
    """``(manifest, changed)``: a directory source's persisted ``manifest`` (read from ``origin``)
    with the folders that changed since listed again (``refresh.py``; ``changed``: save it again);
    other sources' as it is. ``(None, False)`` when it records no folders and ``require_folders``:
    walk the source again."""
    if not source.walks_folders:
        return manifest, False
    if manifest.tree is None:
        if require_folders:
            log.warning("manifest %s of %s records no folders (an earlier clairvoyant wrote it): walking the "
                        "source again, once, to show every folder and to notice later changes", origin, source.root)
            return None, False
        log.warning("manifest %s of %s records no folders (an earlier clairvoyant wrote it): files added to or "
                    "removed from the source since are not noticed; run `clairvoyant index --force %s` once to "
                    "record them", origin, source.root, source.root)
        return manifest, False

    fresh, changes = refresh.check(source, manifest, pinned=pinned)
    return fresh, changes.saved


def _save_quietly(manifest: Manifest, path: str) -> None:
    try:
        save(manifest, path)
    except OSError:
        pass  # a read-only cache home costs a re-walk next time, nothing more
