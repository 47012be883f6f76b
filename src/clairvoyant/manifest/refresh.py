"""The check of a persisted manifest against its directory source, made at each start (a Loader's,
a mount's): one ``stat`` per folder, not per file.

A folder's mtime changes when an entry is added to it, removed from it or renamed in it. A folder
whose mtime differs from the one recorded is listed again (one listing; a new sub-folder in it is
walked whole, a sub-folder gone from it is dropped with everything below); a folder gone is
dropped; every other folder keeps its recorded files. The log (logger ``clairvoyant``) says which
folders were listed again and how many files were added and removed.

Not noticed here: a file whose content is rewritten in place (its folder's mtime stays). Staged
copies of such a file are not served: the Loader and the mount check a staged entry of an earlier
session against its source file's size and mtime (one ``stat`` per file, once per session).

On a file system whose times hold whole seconds (NFSv3 servers, some parallel file systems) a
folder changed in the same second as, but after, its listing keeps its mtime: such a folder
(mtime within a second of its listing) is listed again at the next check. On file systems with
finer times a change in the same clock tick (a few ms on Linux) as the folder's listing, after it,
goes unnoticed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import EmptySourceError
from ..source.posix import Entry, PosixSource
from .record import Manifest
from .tree import CTIME, LISTED, MTIME, Collector, Tree

log = logging.getLogger("clairvoyant")
_SECOND = 1_000_000_000
_SHOWN = 10   # folders named in the log


@dataclass(frozen=True)
class Changes:
    """What a check found."""

    folders: int                 # folders looked at (one stat each)
    relisted: tuple[str, ...]    # folders listed again (their mtime changed, or it could not vouch)
    new: tuple[str, ...]         # folders that appeared (walked whole)
    gone: tuple[str, ...]        # folders no longer there (dropped with what was below)
    added: int                   # files
    removed: int
    resized: int                 # files in a folder listed again whose size differs
    saved: bool                  # the manifest differs from the one read (save it again)

    @property
    def files_changed(self) -> bool:
        return bool(self.added or self.removed or self.resized)


def racy(mtime_ns: int, listed_ns: int) -> bool:
    """Whether a folder's recorded mtime cannot vouch for its listing: a whole-second mtime within
    a second before the listing (a later change in that second leaves the mtime as it was)."""
    return mtime_ns % _SECOND == 0 and listed_ns < mtime_ns + _SECOND


def _parent(key: str) -> str:
    return key.rpartition("/")[0]


def check(source: PosixSource, manifest, *, pinned: str | None = None):
    """``(manifest, changes)``: ``manifest`` with the changed folders of ``source`` listed again
    (the same object when nothing changed), and what changed. ``manifest.tree`` must be set.
    ``pinned``: the path of a manifest the user gave, which is kept as it is (the log says so)."""
    tree: Tree = manifest.tree
    source.check()
    dirs = tree.dirs
    now: list[Entry | None] = [source.stat_folder(d) for d in dirs]   # the whole cost when nothing changed
    times = tree.dir_times.tolist()
    changed = [d for d, e, t in zip(dirs, now, times)
               if e is not None and (e.mtime_ns != t[MTIME] or racy(t[MTIME], t[LISTED]))]
    gone = {d for d, e in zip(dirs, now) if e is None}
    moved = [i for i, (e, m, t) in enumerate(zip(now, tree.dir_modes.tolist(), times))
             if e is not None and (e.mode != m or e.ctime_ns != t[CTIME])]
    if not changed and not gone:
        if not moved:
            return manifest, Changes(len(dirs), (), (), (), 0, 0, 0, False)
        return _with_folders(manifest, now), Changes(len(dirs), (), (), (), 0, 0, 0, True)
    fresh, changes = _relist(source, manifest, now, changed, gone)
    _report(source, manifest, fresh, changes, pinned)
    return fresh, changes


def _with_folders(manifest, now: list[Entry]):
    """``manifest`` with its folders' modes and times as ``now`` (every one still there)."""

    t = manifest.tree
    dtimes = np.array(t.dir_times)
    dtimes[:, :3] = [(e.mtime_ns, e.atime_ns, e.ctime_ns) for e in now]
    tree = Tree(t.file_modes, t.file_times, t.dirs, [e.mode for e in now], dtimes)
    fresh = Manifest(manifest.uri, manifest.keys, manifest.sizes, manifest.labels, manifest.classes, tree=tree)
    fresh._derived.update(manifest._derived)   # the same keys, sizes and labels
    return fresh


def _relist(source: PosixSource, manifest, now: list[Entry | None], changed: list[str], gone: set[str]):
    """The folders ``changed`` listed again, those ``gone`` dropped: a new manifest and its changes."""

    tree: Tree = manifest.tree
    dirs = tree.dirs
    known = set(dirs)
    got = Collector()   # the files of the folders listed again, the new folders whole
    new: list[str] = []
    listed: dict[str, int] = {}
    for d in changed:
        present = set()
        listed[d] = time.time_ns()
        for e in source.listdir(d):
            key = f"{d}/{e.name}" if d else e.name
            if not e.is_dir:
                got.add(key, e)
            elif key in known and key not in gone:
                present.add(key)
            else:
                new.append(key)
                got.extend(source.walk_tree(key, e))
        gone |= {k for k in dirs if k and _parent(k) == d and k not in present}
    gone |= {k for k in dirs if _under(k, gone)}   # everything below a folder gone is gone
    relisted = set(changed)
    for i, d in enumerate(dirs):   # the folders kept, with their attributes as they are now
        e = now[i]
        if d not in gone and e is not None:
            got.add(d, e, listed.get(d, int(tree.dir_times[i, LISTED])))
    keys_new, sizes_new, tree_new = got.finish()

    old_keys = list(manifest.keys)
    parents = [_parent(k) for k in old_keys]
    kept = np.flatnonzero(np.fromiter((p not in relisted and p not in gone for p in parents), dtype=bool,
                                      count=len(old_keys)))
    keys = [old_keys[i] for i in kept] + keys_new
    if not keys:
        raise EmptySourceError(f"data source {source.root!r} holds no files any more: point it at the directory "
                               "that holds the samples")
    order = np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    keys = [keys[i] for i in order]
    sizes = np.concatenate([np.asarray(manifest.sizes)[kept], sizes_new])[order]
    files = Tree(np.concatenate([tree.file_modes[kept], tree_new.file_modes])[order],
                 np.concatenate([tree.file_times[kept], tree_new.file_times])[order],
                 tree_new.dirs, tree_new.dir_modes, tree_new.dir_times)
    fresh = Manifest.from_columns(manifest.uri, keys, sizes, source.labels, tuple(source.classes), files)

    before = {k: s for k, s, p in zip(old_keys, manifest.sizes.tolist(), parents) if p in relisted}
    after = dict(zip(keys_new, sizes_new.tolist()))
    removed = sum(1 for k in before if k not in after) + sum(1 for p in parents if p in gone)
    return fresh, Changes(len(dirs), tuple(sorted(relisted)), tuple(sorted(new)), tuple(sorted(gone)),
                          sum(1 for k in after if k not in before), removed,
                          sum(1 for k, s in after.items() if k in before and before[k] != s), True)


def _under(folder: str, gone: set[str]) -> bool:
    """Whether a folder above ``folder`` (not the root) is in ``gone``."""
    up = _parent(folder)
    while up:
        if up in gone:
            return True
        up = _parent(up)
    return False


def _names(folders: tuple[str, ...]) -> str:
    shown = ", ".join(repr(d or ".") for d in folders[:_SHOWN])
    return shown + (f" and {len(folders) - _SHOWN} more" if len(folders) > _SHOWN else "")


def _report(source: PosixSource, old, fresh, c: Changes, pinned: str | None = None) -> None:
    if not (c.relisted or c.gone):
        log.debug("%s: folder attributes changed (no folder listed again)", source.root)
        return
    parts = []
    if c.relisted:
        parts.append(f"listed again {len(c.relisted)} of {c.folders} folders whose mtime changed "
                     f"({_names(c.relisted)})")
    if c.new:
        parts.append(f"{len(c.new)} new folders walked ({_names(c.new)})")
    if c.gone:
        parts.append(f"{len(c.gone)} folders gone ({_names(c.gone)})")
    files = f"{c.added} files added, {c.removed} removed, {c.resized} of another size"
    if c.files_changed:
        classes = (f"; classes {len(old.classes)} -> {len(fresh.classes)}" if old.classes != fresh.classes else "")
        if pinned is not None:
            log.warning("%s changed since its manifest was made: %s; %s%s; the manifest you gave (%s) is used as "
                        "it is, not updated: pass reindex=True (or remove it) to follow the source",
                        source.root, "; ".join(parts), files, classes, pinned)
        else:
            log.warning("%s changed since its manifest was made: %s; %s%s; manifest updated (fingerprint %s -> %s)",
                        source.root, "; ".join(parts), files, classes, old.fingerprint, fresh.fingerprint)
    else:
        log.info("%s: %s; %s", source.root, "; ".join(parts), files)
