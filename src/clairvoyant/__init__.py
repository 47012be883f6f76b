"""clairvoyant: a data loader that stages what training will read next.

The shuffled order of every epoch is a function of a seed and the epoch, so the
loader knows its future: it copies upcoming samples from slow shared storage to
node-local storage while reader processes build batches from the local copy.
"""

from .errors import (CacheError, ClairvoyantError, ConfigError, DecodeError, EmptySourceError,
                     LocalDirNotWritable, LocalStorageFull, ManifestError, SampleReadError, SourceChanged,
                     SourceError, SourceNotFound, WorkerDied, WorkerError)
from .load.loader import Loader
from .manifest import Manifest
from .source import PosixSource, Source

__version__ = "0.1.0"

__all__ = [
    "Loader", "Manifest", "Source", "PosixSource",
    "ClairvoyantError", "ConfigError", "SourceError", "SourceNotFound", "EmptySourceError",
    "SampleReadError", "SourceChanged", "ManifestError", "CacheError", "LocalDirNotWritable",
    "LocalStorageFull", "DecodeError", "WorkerError", "WorkerDied",
]
