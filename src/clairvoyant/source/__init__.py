"""Sources: where the bytes live. ``as_source`` accepts a path or a source object."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError
from .base import Source
from .posix import PosixSource

__all__ = ["Source", "PosixSource", "as_source"]


def as_source(obj: Any) -> Source:
    """A directory path becomes a :class:`PosixSource`; a source object is returned as is."""
    if isinstance(obj, (str, os.PathLike)):
        return PosixSource(obj)
    if isinstance(obj, Source):
        return obj
    raise ConfigError(
        f"cannot use {obj!r} as a data source: pass a directory path or an object with "
        "`uri`, `scan()` and `read(key)` (see clairvoyant.source.Source)")
