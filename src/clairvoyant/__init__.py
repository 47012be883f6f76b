"""clairvoyant: a data loader that stages what training will read next.

The shuffled order of every epoch is a function of a seed and the epoch, so the
loader knows its future: it copies upcoming samples from slow shared storage to
node-local storage while reader processes build batches from the local copy.
"""

from .errors import (CacheError, ClairvoyantError, ConfigError, DecodeError, EmptySourceError,
                     LocalDirNotWritable, LocalStorageFull, ManifestError, NotASource, PeerLost, SampleReadError,
                     SourceChanged, SourceError, SourceNotFound, WorkerDied, WorkerError)
from .load.loader import Loader
from .load.seeding import ReaderInfo, get_worker_info
from .manifest import Manifest
from .source import ListedSource, PosixSource, Source, list_file_source

__version__ = "0.1.0"

__all__ = [
    "Loader", "Manifest", "Source", "PosixSource", "ListedSource", "list_file_source",
    "get_worker_info", "ReaderInfo",
    "ClairvoyantError", "ConfigError", "NotASource", "SourceError", "SourceNotFound", "EmptySourceError",
    "SampleReadError", "SourceChanged", "ManifestError", "CacheError", "LocalDirNotWritable",
    "LocalStorageFull", "DecodeError", "WorkerError", "WorkerDied", "PeerLost",
]
