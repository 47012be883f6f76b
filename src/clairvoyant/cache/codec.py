"""MECHANISM: compressed staging's codecs, and the entries they write (cache/entry.py's formats).

``Loader(compress="zstd")`` (``pip install clairvoyant[compress]``) or ``"zlib"`` (the standard
library's; slower, weaker) stores the local tier's entries compressed, each one only where that
saves at least ``MIN_SAVING`` of it (else as it is): the tier's capacity then counts the bytes
written, so more of the data set fits. ``"auto"`` measures the data set first (``measure``: a
few samples compressed) and compresses where plan/compression.py says it pays. A compressed
entry's trailer says which codec wrote it, so readers need no setting (cache/entry.py inflates it).

Compressors are per thread (zstd's are not to be shared between threads).
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable

import xxhash

from ..errors import ConfigError
from .entry import TRAILER, ZLIB, ZSTD, seal

MIN_SAVING = 0.03   # an entry is stored compressed only where that saves 3% of it or more
ZSTD_LEVEL = 1      # fast: staging must keep up with the readers
ZLIB_LEVEL = 1
CHOICES = ("auto", "zstd", "zlib", None)


@dataclass(frozen=True)
class Codec:
    """A codec of compressed staging: its ``name`` and the trailer ``magic`` of its entries."""

    name: str
    magic: bytes

    def compress(self, data: bytes | memoryview) -> bytes:
        if self.magic == ZSTD:
            return _zstd_compressor().compress(data)
        return zlib.compress(data, ZLIB_LEVEL)

    def __reduce__(self):   # (sent to worker processes by name: nothing else to carry)
        return (codec, (self.name,))


_local = threading.local()


def _zstd_compressor():
    c = getattr(_local, "zstd", None)
    if c is None:
        import zstandard
        c = _local.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return c


def zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def codec(name: str | None) -> Codec | None:
    """The codec named (None: none); a ConfigError naming what to do for one that cannot run here."""
    if name is None:
        return None
    if name == "zstd":
        if not zstd_available():
            raise ConfigError("compress='zstd' needs the zstandard package: pip install 'clairvoyant[compress]' "
                              "(or compress='zlib', slower)")
        return Codec("zstd", ZSTD)
    if name == "zlib":
        return Codec("zlib", ZLIB)
    raise ConfigError(f"compress={name!r}: choose 'auto', 'zstd', 'zlib' or None")


def best_available() -> Codec:
    """The codec "auto" tries: zstd where it is installed, else zlib."""
    return codec("zstd" if zstd_available() else "zlib")


def entry_parts(data: bytes | memoryview, mtime_ns: int, how: Codec | None) -> tuple[bytes | memoryview, bytes]:
    """The bytes an entry of ``data`` stores and its trailer: compressed by ``how`` where that
    saves ``MIN_SAVING`` or more, else as they are."""
    if how is not None and len(data) > TRAILER.size:
        packed = how.compress(data)
        if len(packed) <= (1 - MIN_SAVING) * len(data):
            return packed, TRAILER.pack(how.magic, xxhash.xxh3_64_intdigest(data), int(mtime_ns), len(data))
    return data, seal(data, mtime_ns)


def measure(samples: Iterable[bytes], how: Codec) -> tuple[int, int]:
    """``(raw, stored)`` bytes of ``samples`` as the local tier would keep them with ``how``
    (each entry compressed only where that pays, as ``entry_parts`` decides)."""
    raw = stored = 0
    for data in samples:
        raw += len(data)
        stored += len(entry_parts(data, 0, how)[0])
    return raw, stored


def choose(compress: str | None, sample: Callable[[], list[bytes]]) -> tuple[Codec | None, float]:
    """The codec for ``compress`` and the data set's measured ratio (raw / stored, 1.0 where not
    measured): "auto" compresses ``sample()`` and keeps the codec only where plan/compression.py
    says it pays; a named codec is measured the same way (its ratio plans the tier) and kept."""
    from ..plan.compression import pays
    if compress not in CHOICES:
        raise ConfigError(f"compress={compress!r}: choose 'auto', 'zstd', 'zlib' or None")
    if compress is None:
        return None, 1.0
    how = best_available() if compress == "auto" else codec(compress)
    raw, stored = measure(sample(), how)
    ratio = raw / stored if stored else 1.0
    if compress == "auto" and not pays(raw, stored):
        return None, 1.0
    return how, ratio
