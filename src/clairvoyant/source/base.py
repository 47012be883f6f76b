"""The contract every data source fulfils: list once, read one sample by key.

A source is where the bytes live (a POSIX directory on a shared file system,
an emulated slow store, later object stores). Keys are relative POSIX paths.
Sources must be picklable so that reader processes can use them.
"""

from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable


@runtime_checkable
class Source(Protocol):
    """Where samples live. ``uri`` is a stable identity used to find the
    persisted manifest and the node-local cache of this source."""

    uri: str

    def scan(self) -> Iterator[tuple[str, int]]:
        """Walk the source once, yielding ``(key, size_in_bytes)`` for every sample."""
        ...

    def read(self, key: str) -> bytes:
        """Return the whole content of sample ``key``; raise SampleReadError if it cannot be read."""
        ...
