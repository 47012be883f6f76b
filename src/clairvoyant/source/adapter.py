"""The one place a user's own source object, duck-typed rather than derived from :class:`Source`,
is taken in: it is checked for what every source needs (``uri``, ``scan``, ``read``) and seen
through the declared interface, its own capabilities where it has them, the defaults elsewhere.
Nothing past this edge probes a source for what it has.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from ..errors import NotASource, describe
from .base import Source
from .indexed import is_map_dataset

REQUIRED = ("uri", "scan", "read")


def missing(obj: Any) -> list[str]:
    """What ``obj`` lacks of ``uri`` (a string), ``scan()`` and ``read(key)``."""
    out = []
    if not isinstance(getattr(obj, "uri", None), str):
        out.append("uri (a string)")
    for name in ("scan", "read"):
        if not callable(getattr(obj, name, None)):
            out.append(f"{name}()")
    return out


def adapt(obj: Any) -> Source:
    """``obj`` itself if it is a :class:`Source`, else an :class:`AdaptedSource` over it; raise
    :class:`NotASource` naming what it lacks."""
    if isinstance(obj, Source):
        return obj
    lacks = missing(obj)
    if lacks and callable(getattr(obj, "__iter__", None)) and not is_map_dataset(obj):
        raise NotASource(
            f"cannot use {describe(obj)} as a data source: it is iterable only (an IterableDataset, a generator), "
            "so it has no order to plan ahead of training. Pass a map-style dataset (`__getitem__` and `__len__`), "
            "a path, or a source object")
    if lacks:
        raise NotASource(
            f"cannot use {describe(obj)} as a data source: it has no {', '.join(lacks)}. Pass a directory path, a "
            "list file (.csv, .jsonl), a map-style dataset (`__getitem__` and `__len__`, as PyTorch's "
            "DataLoader takes), or an object with `uri`, `scan()` and `read(key)` (best: a subclass of "
            "clairvoyant.Source)")
    return AdaptedSource(obj)


class AdaptedSource(Source):
    """A duck-typed source object through the :class:`Source` interface. Its optional
    capabilities (``read_versioned``, ``version``, ``head``, ``labels``, ``classes``, ``root``,
    ``walks_folders``, ``has_fields``/``fields_of``, ``use_manifest``) are its own where it has
    them, the interface's defaults where it has not; any other attribute is the object's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"AdaptedSource({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        # only for what the interface does not declare (a directory source's walk_tree, ...)
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _own(self, name: str) -> Any:
        return getattr(self.inner, name, None)

    @property
    def uri(self) -> str:  # type: ignore[override]
        return self.inner.uri

    @property
    def labels(self) -> Mapping[str, int] | None:  # type: ignore[override]
        return self._own("labels")

    @property
    def classes(self) -> Sequence[str]:  # type: ignore[override]
        return self._own("classes") or ()

    @property
    def root(self) -> str | None:  # type: ignore[override]
        return self._own("root")

    @property
    def walks_folders(self) -> bool:  # type: ignore[override]
        return bool(self._own("walks_folders"))

    @property
    def has_fields(self) -> bool:  # type: ignore[override]
        return bool(self._own("has_fields"))

    @property
    def versioned(self) -> bool:
        return self._own("version") is not None

    def scan(self) -> Iterator[tuple[str, int]]:
        return self.inner.scan()

    def read(self, key: str) -> bytes:
        return self.inner.read(key)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        own = self._own("read_versioned")
        return own(key) if own is not None else (self.inner.read(key), 0)

    def version(self, key: str) -> tuple[int, int] | None:
        own = self._own("version")
        return own(key) if own is not None else None

    def head(self, key: str) -> int | None:
        if self.versioned:   # its version first, as a directory source's stat
            return super().head(key)
        own = self._own("head")
        return own(key) if own is not None else None

    def fields_of(self, key: str) -> dict:
        return self.inner.fields_of(key) if self.has_fields else {}

    def use_manifest(self, manifest: Any) -> None:
        own = self._own("use_manifest")
        if own is not None:
            own(manifest)
