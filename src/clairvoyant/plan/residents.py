"""What a tier holds, as data the plan functions pass around: sample -> entry bytes.

``Residents`` is a read-only mapping backed by two sorted arrays, so that a plan
over millions of samples carries what each node holds from one epoch to the
next without a Python object per sample. It compares equal to a ``dict`` with
the same items, and any mapping converts to it (``Residents.of``).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np


class Residents(Mapping[int, int]):
    """Samples (ascending, unique) and the bytes each takes in the tier."""

    __slots__ = ("samples", "sizes")

    def __init__(self, samples: np.ndarray | None = None, sizes: np.ndarray | None = None) -> None:
        s = np.zeros(0, np.int64) if samples is None else np.asarray(samples, dtype=np.int64)
        z = np.zeros(0, np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
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
