"""Sources named by a list instead of a directory walk: a list file (CSV or JSON lines) or a
torchvision-style dataset (``DatasetFolder``, ``ImageFolder`` and anything shaped like them).

A listed source reads files of a POSIX tree like :class:`PosixSource`, but only
those the list names, with the labels the list gives (class names become
indices in sorted order, as ImageFolder's do). Its identity (``uri``) includes a
hash of the list, so a changed list gets its own manifest. Extra columns of a
list file travel with each sample when asked for (``fields=``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from typing import Any, Iterator, Sequence

from ..errors import ConfigError, SourceNotFound
from .posix import PosixSource

LIST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
_PIL_LOADERS = ("default_loader", "pil_loader", "accimage_loader")


class ListedSource(PosixSource):
    """The files of ``entries`` (``(path, label, fields)``; paths absolute or relative to ``root``)."""

    walks_folders = False   # the list names the samples: no walk, no folders recorded

    def __init__(self, root: str | os.PathLike[str], entries: Sequence[tuple[str, Any, dict | None]], *,
                 classes: Sequence[str] | None = None, fields: bool | Sequence[str] = False,
                 origin: str = "the list", scheme: str = "list") -> None:
        if not entries:
            raise ConfigError(f"{origin} names no samples: check it")
        root = os.path.abspath(os.fspath(root))
        keys: list[str] = []
        prefix = os.path.join(root, "")
        for path, _, _ in entries:   # a prefix test, not commonpath/relpath: lists of millions
            full = os.path.normpath(os.path.join(root, os.fspath(path)))
            if not full.startswith(prefix):
                raise ConfigError(f"{origin} names {path!r}, which is outside its root {root}: pass root= "
                                  "the directory that holds every sample")
            keys.append(full[len(prefix):].replace(os.sep, "/"))
        if len(set(keys)) != len(keys):
            seen: set[str] = set()
            first = next(k for k in keys if k in seen or seen.add(k))
            raise ConfigError(f"{origin} names {first!r} more than once: list each sample once")
        super().__init__(root)
        labels = [e[1] for e in entries]
        if classes is None and any(isinstance(x, str) for x in labels):
            classes = sorted({str(x) for x in labels})
        self.classes = tuple(classes or ())
        index = {c: i for i, c in enumerate(self.classes)}
        try:
            ints = [index[x] if isinstance(x, str) and x in index else int(x) for x in labels]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{origin} has a label that is neither a class name nor an integer ({e})") from e
        self.labels = dict(zip(keys, ints))
        wanted = _field_names(fields, entries, origin)
        self.has_fields = bool(wanted)
        self._fields = {k: {n: (e[2] or {}).get(n) for n in wanted} for k, e in zip(keys, entries)} if wanted else {}
        h = hashlib.sha1()
        for k, x in zip(keys, ints):
            h.update(f"{k}\0{x}\n".encode())
        self.uri = f"{scheme}+file://{root}#{h.hexdigest()[:16]}"
        self._keys = keys

    def __repr__(self) -> str:
        return f"ListedSource({self.root!r}, {len(self._keys)} samples)"

    def scan(self) -> Iterator[tuple[str, int]]:
        self.check()
        for key in sorted(self._keys):
            path = self.path_of(key)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise SourceNotFound(f"sample {key!r} named by the list is missing ({path}): fix the list or "
                                     "the path") from None
            self._charge_meta()
            yield key, size

    def fields_of(self, key: str) -> dict:
        """The extra fields of sample ``key`` (those asked for with ``fields=``)."""
        return self._fields[key]


def _field_names(fields: bool | Sequence[str], entries, origin: str) -> list[str]:
    if not fields:
        return []
    present = list(dict.fromkeys(n for e in entries for n in (e[2] or {})))
    if fields is True:
        return present
    missing = [n for n in fields if n not in present]
    if missing:
        raise ConfigError(f"{origin} has no field {missing[0]!r}; it has {present}")
    return list(fields)


def read_list(path: str | os.PathLike[str]) -> list[tuple[str, Any, dict]]:
    """``(path, label, other fields)`` per line of a CSV/TSV file (a header naming ``path`` and
    ``label``, or none: path, label, then more columns) or of a JSON-lines file (objects with
    ``path`` and ``label``)."""
    path = os.fspath(path)
    try:
        with open(path, newline="") as f:
            if path.endswith((".jsonl", ".ndjson")):
                return [_json_entry(line, n, path) for n, line in enumerate(f, 1) if line.strip()]
            rows = [r for r in csv.reader(f, delimiter="\t" if path.endswith(".tsv") else ",") if r]
    except FileNotFoundError:
        raise SourceNotFound(f"list file {path!r} does not exist: check the path") from None
    if not rows:
        return []
    header = [c.strip().lower() for c in rows[0]]
    if "path" in header:
        body, names = rows[1:], header
    else:
        body, names = rows, ["path", "label"] + [f"field{i}" for i in range(2, max(map(len, rows)))]
    ip, il = names.index("path"), names.index("label") if "label" in names else None
    out = []
    for n, r in enumerate(body, 2 if body is not rows else 1):
        if len(r) <= ip or (il is not None and len(r) <= il):
            raise ConfigError(f"line {n} of {path} has {len(r)} columns: it needs a path and a label")
        fields = {names[i]: _number(v) for i, v in enumerate(r) if i not in (ip, il) and i < len(names)}
        out.append((r[ip].strip(), _number(r[il]) if il is not None else -1, fields))
    return out


def _json_entry(line: str, n: int, path: str) -> tuple[str, Any, dict]:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"line {n} of {path} is not JSON ({e})") from e
    if not isinstance(doc, dict) or "path" not in doc:
        raise ConfigError(f"line {n} of {path} needs an object with a \"path\" (and a \"label\")")
    fields = {k: v for k, v in doc.items() if k not in ("path", "label")}
    return str(doc["path"]), doc.get("label", -1), fields


def _number(v: str) -> Any:
    v = v.strip()
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def list_file_source(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                     fields: bool | Sequence[str] = False) -> ListedSource:
    """A source from a list file; relative paths are under ``root`` (default: the list's directory)."""
    entries = read_list(path)
    base = root if root is not None else os.path.dirname(os.path.abspath(os.fspath(path)))
    if root is None and entries and all(os.path.isabs(p) for p, _, _ in entries):
        base = os.path.commonpath([os.path.dirname(p) for p, _, _ in entries])
    return ListedSource(base, entries, fields=fields, origin=f"list file {os.fspath(path)}")


def unwrap_subset(obj: Any) -> tuple[Any, list[int] | None]:
    """A ``torch.utils.data.Subset`` (what ``random_split`` gives), nested or not: the dataset
    under it and the indices of that dataset it holds, in its order; anything else as it is, None."""
    chosen: list[int] | None = None
    while type(obj).__name__ == "Subset" and hasattr(obj, "dataset") and hasattr(obj, "indices"):
        own = [int(i) for i in obj.indices]
        chosen = own if chosen is None else [own[i] for i in chosen]
        obj = obj.dataset
    return obj, chosen


def is_dataset(obj: Any) -> bool:
    """Shaped like torchvision's DatasetFolder (a ``samples`` list of (path, class index)), or a
    ``Subset`` of one."""
    obj, _ = unwrap_subset(obj)
    samples = getattr(obj, "samples", None)
    return isinstance(samples, (list, tuple)) and hasattr(obj, "__getitem__") and \
        (not samples or (isinstance(samples[0], (tuple, list)) and len(samples[0]) == 2))


class DatasetPort:
    """What a torchvision-style dataset brings: its files and labels as a source, its transforms,
    and whether its image loader is the standard PIL one (then readers decode to PIL)."""

    def __init__(self, ds: Any) -> None:
        ds, chosen = unwrap_subset(ds)   # a Subset: its samples of the dataset under it
        name = type(ds).__name__ if chosen is None else f"Subset of {type(ds).__name__}"
        samples = list(ds.samples) if chosen is None else [ds.samples[i] for i in chosen]
        paths = [os.path.abspath(os.fspath(p)) for p, _ in samples]
        root = getattr(ds, "root", None)
        root = os.path.abspath(os.fspath(root)) if root is not None else None
        if root is None or not all(p.startswith(root + os.sep) for p in paths):
            root = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else "."
        self.source = ListedSource(root, [(p, int(t), None) for p, (_, t) in zip(paths, samples)],
                                   classes=list(getattr(ds, "classes", ()) or ()) or None,
                                   origin=f"dataset {name} ({root})", scheme="dataset")
        self.transform = getattr(ds, "transform", None)
        self.target_transform = getattr(ds, "target_transform", None)
        loader = getattr(ds, "loader", None)
        self.pil = loader is None or getattr(loader, "__name__", "") in _PIL_LOADERS
        self.loader_name = getattr(loader, "__name__", repr(loader))
        self.name = name
