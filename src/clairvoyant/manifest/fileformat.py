"""The manifest's file: written atomically, never unpickled, read without parsing anything per sample.

Version 2 (the default) is binary: a small JSON header,
then raw little-endian arrays that a reader maps into memory as they are, so
loading parses nothing per sample and the ranks of a node share one copy in
the page cache::

    magic (8 bytes) | version u32 | header length u32 | header (JSON) | pad to 64
    sections, each at a multiple of 64 from the end of the header's padding:
      sizes         <i8, one per key
      labels        <i4 (or <i8), one per key
      key_offsets   <u4 (or <u8), count + 1: key i is keys[off[i] : off[i+1] - 1]
      keys          UTF-8, each key followed by a NUL byte, keys sorted
      digests       <u8, sorted: the first 8 bytes of sha1(key) (cache entries' names), big-endian
      digest_order  <u4 (or <u8): the manifest index of each sorted digest

The header holds uri, created, classes, count, the fingerprint and each
section's place. Version 1 (one JSON document) is still read.

A directory source's manifest also holds its folders (empty ones too) and each file's mode and
times, as optional sections (``tree.py``; the header's ``folders`` counts them): the mount shows
them, and ``obtain.py`` checks the folders against the source at each start (``refresh.py``).
A manifest without them loads as before, and earlier versions read one with them (they skip
sections they do not know).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from typing import Callable

import numpy as np

from ..cache.publish import tmp_name
from ..errors import ManifestError
from ..nodeio.fileio import write_all, write_atomically
from .tree import PER as _TREE_PER, SECTIONS as _TREE_SECTIONS, Tree
from .record import _CHUNK, FORMAT, Keys, Manifest

VERSION = 2                    # what save() writes
MAGIC = b"\x89CVYMAN\n"        # not UTF-8 and not JSON: a v2 file is never mistaken for v1
_PREFIX = struct.Struct("<8sII")   # magic, version, header length
ALIGN = 64
_MAX_HEADER = 1 << 26
# dtypes each section may have
_DTYPES = {"sizes": ("<i8",), "labels": ("<i4", "<i8"), "key_offsets": ("<u4", "<u8"), "keys": ("|u1",),
           "digests": ("<u8",), "digest_order": ("<u4", "<u8")}



def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _sections(m: Manifest) -> dict[str, np.ndarray | memoryview]:
    n = len(m)
    blob = m.keys.nul_joined()
    off_dtype = "<u4" if len(blob) < 2 ** 32 else "<u8"
    labels = m.labels
    lab_dtype = "<i4" if n == 0 or (int(labels.min()) >= -2 ** 31 and int(labels.max()) < 2 ** 31) else "<i8"
    digests, order = m.digest_index()
    return {
        "sizes": np.ascontiguousarray(m.sizes, dtype="<i8"),
        "labels": np.ascontiguousarray(labels, dtype=lab_dtype),
        "key_offsets": np.ascontiguousarray(m.keys.offsets(), dtype=off_dtype),
        "keys": blob,
        "digests": np.ascontiguousarray(digests, dtype="<u8"),
        "digest_order": np.ascontiguousarray(order, dtype="<u4" if n < 2 ** 32 else "<u8"),
        **(m.tree.sections() if m.tree is not None else {}),
    }


def _write_v2(m: Manifest, fd: int) -> int:
    secs = _sections(m)
    table, pos = {}, 0
    for name, a in secs.items():
        nbytes = a.nbytes
        dtype = "|u1" if name in ("keys", "dir_keys") else a.dtype.str
        table[name] = {"offset": pos, "nbytes": nbytes, "dtype": dtype}
        pos = _align(pos + nbytes)
    header = json.dumps({"format": FORMAT, "version": 2, "uri": m.uri, "created": m.created,
                         "classes": list(m.classes), "count": len(m), "fingerprint": m.fingerprint,
                         **({"folders": len(m.tree.dirs)} if m.tree is not None else {}),
                         "sections": table}, separators=(",", ":")).encode()
    head = _PREFIX.pack(MAGIC, 2, len(header)) + header
    written = write_all(fd, head + b"\0" * (_align(len(head)) - len(head)))
    for name, a in secs.items():
        view = memoryview(a).cast("B") if isinstance(a, np.ndarray) else a
        written += write_all(fd, view) if len(view) else 0
        pad = _align(len(view)) - len(view)
        if pad and name != list(secs)[-1]:
            written += write_all(fd, b"\0" * pad)
    return written


def save(manifest: Manifest, path: str, *, version: int = VERSION) -> None:
    """Write atomically: a reader sees the old manifest or the new one, never half. ``version=1``
    writes the JSON of earlier versions."""
    if version not in (1, 2):
        raise ValueError(f"manifest version {version!r}: choose 1 (JSON) or 2 (binary)")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # a cache home may be shared by the nodes of a cluster: the host in the name keeps two nodes'
    # writers (the same pid, by chance) apart; fsync'ed, so that a crash never leaves a torn one
    tmp = f"{tmp_name(directory, path)}.{socket.gethostname()}"
    if version == 1:
        data = json.dumps(manifest.to_json(), separators=(",", ":")).encode()
        write_atomically(path, tmp, lambda fd: write_all(fd, data), durable=True)
    else:
        write_atomically(path, tmp, lambda fd: _write_v2(manifest, fd), durable=True)


def load(path: str, *, verify: bool = False) -> Manifest:
    """Read a manifest of either version. ``verify``: also recompute the fingerprint of a binary
    one and compare (one pass over the file; the checks of its layout are always made)."""
    with open(path, "rb") as f:
        head = f.read(_PREFIX.size)
        if head[:len(MAGIC)] == MAGIC[:len(head)] and head:
            return _load_v2(path, f, head, verify)
        f.seek(0)
        try:
            doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(
                f"manifest {path} is not valid JSON ({e}) nor a binary manifest: delete it and index the "
                "source again (`clairvoyant index --force`)") from e
    return Manifest.from_json(doc, origin=path)


def _bad(path: str, why: str) -> ManifestError:
    return ManifestError(f"manifest {path} is damaged ({why}): delete it, or rebuild it with "
                         "`clairvoyant index --force`")


def _load_v2(path: str, f, head: bytes, verify: bool) -> Manifest:
    if len(head) < _PREFIX.size:
        raise _bad(path, f"{len(head)} bytes, shorter than the header")
    _, version, hlen = _PREFIX.unpack(head)
    if version != 2:
        raise ManifestError(f"manifest {path} has format version {version}, which this clairvoyant cannot "
                            "read: upgrade clairvoyant, or rebuild it with `clairvoyant index --force`")
    size = os.fstat(f.fileno()).st_size
    if hlen > _MAX_HEADER or _PREFIX.size + hlen > size:
        raise _bad(path, f"header of {hlen} bytes in a file of {size}")
    try:
        doc = json.loads(f.read(hlen))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != 2:
            raise ValueError("not a clairvoyant manifest header")
        count, fp, table = doc["count"], doc["fingerprint"], doc["sections"]
        uri, classes, created = doc["uri"], doc.get("classes", []), float(doc.get("created", 0.0))
        if not (isinstance(count, int) and count >= 0 and isinstance(fp, str) and len(fp) == 20
                and isinstance(uri, str) and isinstance(classes, list)
                and all(isinstance(c, str) for c in classes) and isinstance(table, dict)):
            raise ValueError("header fields of the wrong type")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise _bad(path, f"header: {e}") from e
    base = _align(_PREFIX.size + hlen)
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def section(name: str, allowed: tuple[str, ...], want: int | None) -> np.ndarray:
        s = table.get(name)
        if not (isinstance(s, dict) and isinstance(s.get("offset"), int) and isinstance(s.get("nbytes"), int)
                and s.get("dtype") in allowed):
            raise _bad(path, f"section {name} missing or malformed: {s!r}")
        dt = np.dtype(s["dtype"])
        start, nbytes = base + s["offset"], s["nbytes"]
        if s["offset"] < 0 or nbytes < 0 or start % dt.itemsize or nbytes % dt.itemsize or start + nbytes > size:
            raise _bad(path, f"section {name} at {start}+{nbytes} does not fit a file of {size} bytes")
        if want is not None and nbytes != want * dt.itemsize:
            raise _bad(path, f"section {name} holds {nbytes // dt.itemsize} values, not {want}")
        return np.frombuffer(mm, dtype=dt, count=nbytes // dt.itemsize, offset=start)

    arrays = {name: section(name, allowed, {"key_offsets": count + 1, "keys": None}.get(name, count))
              for name, allowed in _DTYPES.items()}
    tree = _load_tree(path, doc, count, section)
    off, nkeys = arrays["key_offsets"], len(arrays["keys"])
    if int(off[0]) != 0 or int(off[-1]) != nkeys:
        raise _bad(path, f"key offsets span {int(off[0])}..{int(off[-1])}, the keys {nkeys} bytes")
    for a in range(0, count, _CHUNK):   # every key at least its NUL byte: strictly increasing
        part = off[a:a + _CHUNK + 1]
        if not bool(np.all(part[1:] > part[:-1])):
            raise _bad(path, "key offsets not increasing")
    keys = Keys(mm, off, base + table["keys"]["offset"])
    m = Manifest(uri=uri, keys=keys, sizes=arrays["sizes"], labels=arrays["labels"], classes=tuple(classes),
                 created=created, tree=tree)
    m._derived["fingerprint"] = fp
    m._derived["digest_index"] = (arrays["digests"], arrays["digest_order"])
    if verify and m.compute_fingerprint() != fp:
        raise _bad(path, "its content does not match its fingerprint")
    return m


def _load_tree(path: str, doc: dict, count: int, section: Callable) -> Tree | None:
    """The folders and file attributes of a v2 file, if it holds them (``folders`` in its header)."""
    folders = doc.get("folders")
    if folders is None:
        return None
    if not (isinstance(folders, int) and folders >= 0):
        raise _bad(path, f"folders {folders!r} in the header")
    per = {"files": count, "dirs": folders}
    arrays = {name: section(name, allowed, per[_TREE_PER[name][0]] * _TREE_PER[name][1] if _TREE_PER[name]
                            else (folders + 1 if name == "dir_key_offsets" else None))
              for name, allowed in _TREE_SECTIONS.items()}
    try:
        return Tree.from_sections(arrays)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"folder records: {e}") from e
