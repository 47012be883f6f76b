"""POLICY, pure: whether compressed staging pays, and what the plan counts for a compressed entry.

Compressing what is staged lets a tier hold more of the data set (JPEGs and other compressed media:
no gain; float or integer fields: often 1.5-3x), at the CPU cost of compressing each staged sample
once and inflating it at each read from the tier. ``pays`` keeps compression where a measured
sample of the data set shrinks by ``MIN_RATIO`` or more. The plan then counts each sample's entry
as its size over the measured ratio (``stored_sizes``): where the ratio over-promises for some
samples, the tier's ledger, which counts the bytes written, stays the bound (a sample that does
not fit is read from the source, as ever).
"""

from __future__ import annotations

import math

import numpy as np

MIN_RATIO = 1.15   # "auto" compresses where a measured sample shrinks by 15% or more
SAMPLE = 16        # samples "auto" measures (spread over the data set)
SAMPLE_BYTES = 64 << 20   # ... and no more bytes than this (but one sample, however large)
MAX_RATIO = 1000.0


def pays(raw: int, stored: int) -> bool:
    """Whether a measured sample of ``raw`` bytes, ``stored`` once compressed, is worth compressing."""
    return stored > 0 and raw / stored >= MIN_RATIO


def stored_size(size: int, ratio: float, trailer: int) -> int:
    """``stored_sizes`` of one sample (what the tier reserves for it where it compresses)."""
    return size + trailer if ratio <= 1.0 else math.ceil(size / ratio) + trailer


def stored_sizes(sizes: np.ndarray, ratio: float, trailer: int) -> np.ndarray:
    """What the plan counts per sample: its size over ``ratio`` (rounded up), plus the trailer."""
    sizes = np.asarray(sizes)
    if ratio <= 1.0:
        return sizes + sizes.dtype.type(trailer)
    return (np.ceil(sizes.astype(np.float64) / ratio).astype(sizes.dtype) + sizes.dtype.type(trailer))


def raw_capacity(capacity: int, ratio: float) -> int:
    """The raw bytes of the data set a tier of ``capacity`` bytes holds where what it stages
    shrinks by ``ratio`` (what ``clairvoyant plan`` and ``simulate`` count with
    ``--compress-ratio``: the capacity only; the CPU to compress and inflate is not modelled)."""
    if not 1.0 <= ratio <= MAX_RATIO:   # (also refuses nan and inf)
        from ..errors import ConfigError
        raise ConfigError(f"--compress-ratio {ratio!r}: give the raw bytes over the stored ones, from 1 to "
                          f"{MAX_RATIO:g} (e.g. 2.2)")
    return int(capacity * ratio)


def sample_indices(num_samples: int, k: int = SAMPLE) -> list[int]:
    """``k`` samples spread evenly over the data set (the same on every rank)."""
    if num_samples <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, num_samples - 1, min(k, num_samples))})
