"""What a tier holds, as data the plan functions pass around: sample -> entry bytes.

``Residents`` is a read-only mapping backed by two sorted arrays, so that a plan
over millions of samples carries what each node holds from one epoch to the
next without a Python object per sample. It compares equal to a ``dict`` with
the same items, and any mapping converts to it (``Residents.of``).
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np


def _ints(a: np.ndarray | None) -> np.ndarray:
    """int32 or int64 as given (a plan over millions of samples keeps them at 4 bytes), else int64."""
    if a is None:
        return np.zeros(0, np.int64)
    a = np.asarray(a)
    return a if a.dtype in (np.int32, np.int64) else a.astype(np.int64)


class Residents(Mapping[int, int]):
    """Samples (ascending, unique) and the bytes each takes in the tier (int32 or int64 arrays)."""

    __slots__ = ("samples", "sizes")

    def __init__(self, samples: np.ndarray | None = None, sizes: np.ndarray | None = None) -> None:
        s, z = _ints(samples), _ints(sizes)
        if s.shape != z.shape or s.ndim != 1:
            raise ValueError(f"give one size per sample: {s.shape} samples, {z.shape} sizes")
        if len(s) > 1 and not (s[1:] > s[:-1]).all():
            order = np.argsort(s, kind="stable")
            s, z = s[order], z[order]
            if not (s[1:] > s[:-1]).all():
                raise ValueError("a sample is listed twice among the residents")
        self.samples, self.sizes = s, z

    @classmethod
    def of(cls, residents: Mapping[int, int] | None) -> Residents:
        if isinstance(residents, Residents):
            return residents
        if not residents:
            return cls()
        return cls(np.fromiter(residents.keys(), np.int64, len(residents)),
                   np.fromiter(residents.values(), np.int64, len(residents)))

    def __len__(self) -> int:
        return len(self.samples)

    def _find(self, sample: object) -> int:
        try:
            k = int(sample)   # type: ignore[call-overload]
        except (TypeError, ValueError):
            return -1
        i = int(np.searchsorted(self.samples, k))
        return i if i < len(self.samples) and int(self.samples[i]) == k else -1

    def __getitem__(self, sample: int) -> int:
        i = self._find(sample)
        if i < 0:
            raise KeyError(sample)
        return int(self.sizes[i])

    def __contains__(self, sample: object) -> bool:
        return self._find(sample) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.samples.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Residents):
            return np.array_equal(self.samples, other.samples) and np.array_equal(self.sizes, other.sizes)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Residents({len(self)} samples, {int(self.sizes.sum())} bytes)"

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())


class ClusterResidents(Sequence[Residents]):
    """Every node's residents as one pair of arrays, node by node (``cuts[n]:cuts[n + 1]``): what
    the cluster plan hands from one epoch to the next without a copy per node. Indexing gives
    node n's ``Residents`` (views)."""

    __slots__ = ("samples", "sizes", "cuts")

    def __init__(self, samples: np.ndarray, sizes: np.ndarray, cuts: np.ndarray) -> None:
        self.samples, self.sizes = _ints(samples), _ints(sizes)
        self.cuts = np.asarray(cuts, dtype=np.int64)
        if self.samples.shape != self.sizes.shape or len(self.cuts) < 1 or self.cuts[0] != 0 \
                or self.cuts[-1] != len(self.samples) or (np.diff(self.cuts) < 0).any():
            raise ValueError("cuts must run from 0 to the number of residents, ascending, one size per sample")

    @classmethod
    def of(cls, per_node: Sequence[Mapping[int, int]]) -> ClusterResidents:
        if isinstance(per_node, ClusterResidents):
            return per_node
        parts = [Residents.of(r) for r in per_node]
        cuts = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(r) for r in parts], out=cuts[1:])
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), cuts)
        return cls(np.concatenate([r.samples for r in parts]), np.concatenate([r.sizes for r in parts]), cuts)

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def __getitem__(self, n):   # type: ignore[override]
        if isinstance(n, slice):
            return tuple(self[i] for i in range(*n.indices(len(self))))
        n = range(len(self))[n]
        a, b = int(self.cuts[n]), int(self.cuts[n + 1])
        return Residents(self.samples[a:b], self.sizes[a:b])

    def __repr__(self) -> str:
        return f"ClusterResidents({len(self)} nodes, {len(self.samples)} samples)"
