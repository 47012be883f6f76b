"""The format of one cached sample: its bytes, then a 32-byte trailer.

The trailer holds a magic tag, the xxh3-64 checksum of the sample's bytes (taken
when the sample was staged, verified on every read: about 2 us per 100 KB), the
source file's modification time in ns and the sample's size, so a changed source
is recognised and a corrupt or truncated entry is never served. The trailer is
written with the bytes in one atomic publish, so an entry is whole or absent.

The magic says how the bytes are stored: ``CVENTRY1`` as they are (the entry is
the size plus 32 bytes: what the mount's daemon and the C stager take, and
nothing else), ``CVENTRZ1`` compressed with zstd, ``CVENTRD1`` with zlib
(compressed staging, ``Loader(compress=...)``: the entry is shorter than the
sample). A compressed entry is inflated within the sample's size, never further,
and its checksum is the inflated bytes', so a damaged one is refused as any
other is.
"""

from __future__ import annotations

import struct
import threading
import zlib

import xxhash

from ..errors import CorruptEntry
from .extents import read_at, read_entry

TRAILER = struct.Struct("<8sQqQ")
MAGIC = b"CVENTRY1"
ZSTD, ZLIB = b"CVENTRZ1", b"CVENTRD1"   # a compressed entry (cache/codec.py)


def entry_size(size: int) -> int:
    """Bytes an entry of a ``size``-byte sample occupies (what capacities count)."""
    return size + TRAILER.size


def seal(data: bytes | memoryview, mtime_ns: int) -> bytes:
    """The trailer to write after ``data``."""
    return TRAILER.pack(MAGIC, xxhash.xxh3_64_intdigest(data), int(mtime_ns), len(data))


def unseal(blob: bytes, size: int, where: str) -> bytes:
    """The sample's bytes from a whole entry, checked (and inflated, if it is stored compressed);
    CorruptEntry if anything is off."""
    if len(blob) != entry_size(size) and len(blob) >= TRAILER.size:
        magic = bytes(blob[len(blob) - TRAILER.size:len(blob) - TRAILER.size + 8])
        if magic in (ZSTD, ZLIB):
            return _inflated(blob, magic, size, where)
    if len(blob) != entry_size(size):
        raise CorruptEntry(f"cached entry {where} is {len(blob)} bytes, expected {entry_size(size)}: truncated")
    magic, checksum, _, n = TRAILER.unpack_from(blob, size)
    if magic != MAGIC or n != size:
        raise CorruptEntry(f"cached entry {where} has no valid trailer")
    data = blob[:size]
    if xxhash.xxh3_64_intdigest(data) != checksum:
        raise CorruptEntry(f"cached entry {where} fails its checksum")
    return data


_local = threading.local()   # a zstd decompressor per thread


def inflate(magic: bytes, payload: bytes | memoryview, size: int) -> bytes:
    """The ``size`` bytes a compressed entry's ``payload`` holds, by the codec its ``magic`` names
    (cache/codec.py wrote it); never more are made, so a damaged or hostile stream cannot make it
    allocate more than the sample."""
    if magic == ZSTD:
        import zstandard
        declared = zstandard.frame_content_size(payload)   # (zstd inflates to what the frame declares,
        if declared != size:                                # whatever the bound: so that is checked first)
            raise ValueError(f"the frame declares {declared} bytes, not the sample's {size}")
        d = getattr(_local, "unzstd", None)
        if d is None:
            d = _local.unzstd = zstandard.ZstdDecompressor()
        return d.decompress(payload, max_output_size=size)
    if magic == ZLIB:
        d = zlib.decompressobj()
        out = d.decompress(payload, size)
        if d.unconsumed_tail or not d.eof:
            raise ValueError("the stream holds more than the sample, or ends early")
        return out
    raise ValueError(f"no codec for {magic!r}")


def _inflated(blob: bytes, magic: bytes, size: int, where: str) -> bytes:
    _, checksum, _, n = TRAILER.unpack_from(blob, len(blob) - TRAILER.size)
    if n != size or len(blob) - TRAILER.size >= size:
        raise CorruptEntry(f"cached entry {where} is a compressed entry of {n} bytes, expected {size}")
    try:
        data = inflate(magic, memoryview(blob)[:len(blob) - TRAILER.size], size)
    except Exception as e:   # (the codec's own errors: a damaged stream)
        raise CorruptEntry(f"cached entry {where} does not inflate: {type(e).__name__}: {e}") from None
    if len(data) != size or xxhash.xxh3_64_intdigest(data) != checksum:
        raise CorruptEntry(f"cached entry {where} fails its checksum")
    return data


def holds(loc, size: int) -> bool:
    """Whether the entry at ``loc`` (an extents.Loc) is one of a ``size``-byte sample: as it is
    (its length says so), or compressed (its trailer says so: one read of 32 bytes)."""
    if loc.length == entry_size(size):
        return True
    if loc.length >= entry_size(size) or loc.length <= TRAILER.size:
        return False
    t = _trailer(loc)
    return t is not None and t[2] == size


def compressed(magic: bytes) -> bool:
    """Whether an entry with this trailer magic stores its sample compressed."""
    return magic in (ZSTD, ZLIB)


def _trailer(loc) -> tuple[int, int, int] | None:
    """``(checksum, mtime_ns, size)`` recorded in the entry at ``loc`` (an extents.Loc), or None if
    absent or malformed."""
    if loc is None or loc.length < TRAILER.size:
        return None
    try:
        raw = read_at(loc.path, loc.offset + loc.length - TRAILER.size, TRAILER.size)
    except FileNotFoundError:
        return None
    if len(raw) < TRAILER.size:
        return None
    magic, checksum, mtime_ns, n = TRAILER.unpack(raw)
    stored = loc.length - TRAILER.size
    if not ((magic == MAGIC and n == stored) or (compressed(magic) and stored < n)):
        return None
    return checksum, mtime_ns, n


def read_trailer(loc) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` recorded in the entry at ``loc``, or None if absent or malformed."""
    t = _trailer(loc)
    return None if t is None else (t[2], t[1])


def recorded_checksum(loc) -> int | None:
    """The checksum recorded in the entry at ``loc`` (what was staged), or None if absent or
    malformed."""
    t = _trailer(loc)
    return None if t is None else t[0]


def read_sample(loc, size: int | None = None) -> bytes:
    """THE way an entry is read and verified (the readers, a peer's serve, the cluster mount, the
    checks): the sample's bytes from the entry at ``loc``, checked and inflated. ``size``: the
    sample's listed size (None: the size its trailer records). CorruptEntry if anything is off;
    OSError (FileNotFoundError: evicted meanwhile) if it cannot be read."""
    blob = read_entry(loc)
    where = f"{loc.path}@{loc.offset}"
    if size is None:
        if len(blob) < TRAILER.size:
            raise CorruptEntry(f"cached entry {where} is truncated")
        magic, _, _, n = TRAILER.unpack_from(blob, len(blob) - TRAILER.size)
        size = n if compressed(magic) else loc.length - TRAILER.size
    return unseal(blob, size, where)


def check_entry(loc) -> str | None:
    """None if the entry at ``loc`` is whole and matches its checksum, else what is wrong."""
    try:
        read_sample(loc)
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    except CorruptEntry as e:
        return str(e).split(": ", 1)[-1] if ": " in str(e) else str(e)
    return None
