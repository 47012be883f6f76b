"""The whole exception hierarchy of clairvoyant.

Every error derives from :class:`ClairvoyantError` and also from the builtin
that existing ``except`` clauses expect (``ValueError``, ``OSError``, ...).
Messages name the path or sample involved and say what to do next.
"""

from __future__ import annotations


class ClairvoyantError(Exception):
    """Root of every error raised by clairvoyant."""


def describe(obj: object, limit: int = 80) -> str:
    """``obj`` named in one short line for a message: its repr where that is one line, else the first
    line of its repr (a dataset's runs over many) with its type's name; cut at ``limit`` characters."""
    if isinstance(obj, (str, bytes)) or hasattr(obj, "__fspath__"):
        text = repr(obj)
    else:
        try:
            lines = repr(obj).strip().splitlines()
        except Exception:   # a repr that fails must not hide the error being reported
            lines = []
        first, name = (lines[0].strip() if lines else ""), type(obj).__name__
        text = first if len(lines) == 1 or name in first else f"{name} {first}".strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ConfigError(ClairvoyantError, ValueError):
    """An argument or option is out of range or inconsistent."""


class SourceError(ClairvoyantError, OSError):
    """The data source cannot be listed or read."""


class SourceNotFound(SourceError, FileNotFoundError):
    """The source path does not exist."""


class EmptySourceError(SourceError):
    """The source holds no samples."""


class SampleReadError(SourceError):
    """One sample of the source cannot be read."""


class SourceChanged(SourceError):
    """A sample on the source no longer matches the persisted manifest."""


class NotASource(ConfigError, TypeError):
    """An object given as a data source lacks what every source has (``uri``, ``scan``, ``read``)."""


class ManifestError(ClairvoyantError, ValueError):
    """A persisted manifest is malformed or belongs to another source."""


class CacheError(ClairvoyantError, OSError):
    """The node-local cache directory cannot be used."""


class LocalDirNotWritable(CacheError, PermissionError):
    """``local_dir`` cannot be created or written, or is unsafe to share."""


class LocalStorageFull(CacheError):
    """The node-local device ran out of space while staging."""


class DecodeError(ClairvoyantError, ValueError):
    """A sample's bytes could not be decoded."""


class WorkerError(ClairvoyantError, RuntimeError):
    """A reader worker raised an exception."""


class WorkerDied(WorkerError):
    """A reader worker process exited unexpectedly (killed, crashed)."""


class CorruptEntry(CacheError):
    """A cached entry fails its checksum or is truncated (it is discarded and fetched again)."""


class PeerLost(ClairvoyantError, RuntimeError):
    """A rank of the job is gone (killed, crashed, its node lost) where every rank must take part:
    the cluster cache's exchange at the start of an epoch. Within an epoch a lost peer costs only
    reads from the shared store; starting the next one needs every rank. ``ranks``: those that did
    not take part, where known."""

    def __init__(self, message: str, ranks: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(int(r) for r in ranks)

    def __reduce__(self):   # (pickled with its ranks: ``args`` holds the message alone)
        return type(self), (str(self), self.ranks)

    @classmethod
    def of_gather(cls, missing: list[int], size: int, happened: str, then: str = "") -> PeerLost:
        """A gather that ranks ``missing`` (empty: unknown) of ``size`` did not complete
        (``happened`` says how), with what to do (``then``: a backend's addition)."""
        who = f"rank(s) {missing}" if missing else "a rank"
        return cls(f"{who} of this job's {size} {happened}: the cluster cache plans every epoch with every rank. "
                   "Save the loader's state_dict() with your checkpoint and restart the job on the ranks that are "
                   "left (the loader resumes elastically at its position; docs/user-guide.md), or pass "
                   f"cluster=False to run node by node{then}", missing)
