"""A map-style dataset with no files behind it: torchvision's ``FakeData``, tensors in memory, a
dataset that synthesises its samples. There is nothing to stage: its samples are made, not read.

The Loader plans such a dataset as any source (the order per epoch and rank, ``len()``, resume,
the readers' seeding, the verdict) and its reader processes, forked as PyTorch's DataLoader forks
its workers, call the dataset's ``__getitem__`` in the plan's order: what it returns is the
sample, collated as it is (an ``(image, target)`` pair, a dict, one tensor). Keys are the indices,
zero-padded so that their sorted order is the index order. The tiers hold nothing
(``made_in_reader``: the Loader opens them empty and says so once in its log).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

from ..errors import SampleReadError
from .base import Source


def is_map_dataset(obj: Any) -> bool:
    """Shaped like a PyTorch map-style dataset: ``__getitem__`` and ``__len__``, and not a path, a
    string or a source object (those are read as files)."""
    if isinstance(obj, (str, bytes, Source)) or hasattr(obj, "__fspath__"):
        return False
    kind = type(obj)
    return callable(getattr(kind, "__getitem__", None)) and callable(getattr(kind, "__len__", None))


class IndexedDataset(Source):
    """The samples of a map-style dataset ``dataset``, made by its ``__getitem__`` in the readers."""

    made_in_reader = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.count = len(dataset)
        self.name = type(dataset).__name__
        self._width = len(str(max(self.count - 1, 0)))
        kind = type(dataset)
        # the identity names the class and the length (the manifest holds only the indices)
        ident = f"{kind.__module__}.{kind.__qualname__}/{self.count}"
        self.uri = f"dataset+memory://{kind.__qualname__}/{self.count}#{hashlib.sha1(ident.encode()).hexdigest()[:12]}"

    def __repr__(self) -> str:
        return f"IndexedDataset({self.name}, {self.count} samples)"

    def key(self, index: int) -> str:
        return f"{index:0{self._width}d}"

    def scan(self) -> Iterator[tuple[str, int]]:
        for i in range(self.count):
            yield self.key(i), 0

    def item(self, key: str) -> Any:
        """Sample ``key``: what the dataset's ``__getitem__`` returns for its index."""
        try:
            index = int(key)
        except ValueError:
            raise SampleReadError(f"{key!r} is not an index of dataset {self.name}") from None
        return self.dataset[index]

    def read(self, key: str) -> bytes:
        raise SampleReadError(f"dataset {self.name} has no files: sample {key!r} is made by its __getitem__ in the "
                              "readers (IndexedDataset.item), not read as bytes")
