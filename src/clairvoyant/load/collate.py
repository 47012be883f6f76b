"""Default collation, in NumPy, of a list of samples into a batch (PyTorch's default_collate rules).

Arrays and tensors of any dtype (uint8 images, float tensors from transforms)
stack along a new first axis lazily: each sample is written straight into its
place in the shared-memory batch, the one copy collation needs. PIL images
(a transform that ends without ToTensor) stack as uint8 arrays. Ints become an
int64 array, floats a float64 array, tuples, lists and dicts collate field by
field, anything else stays a list.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from .transport import Stack, is_pil_image


def default_collate(samples: Sequence[Any]) -> Any:
    first = samples[0]
    if isinstance(first, np.ndarray) or (type(first).__module__.startswith("torch") and hasattr(first, "numpy")):
        return Stack([s if isinstance(s, np.ndarray) else s.detach().cpu().numpy() for s in samples])
    if is_pil_image(first):
        return Stack([np.asarray(s) for s in samples])
    if isinstance(first, (bool, np.bool_)):
        return np.array(samples, dtype=np.bool_)
    if isinstance(first, numbers.Integral):
        return np.array(samples, dtype=np.int64)
    if isinstance(first, numbers.Real):
        return np.array(samples, dtype=np.float64)
    if isinstance(first, tuple):
        return tuple(default_collate(list(field)) for field in zip(*samples))
    if isinstance(first, list):
        return [default_collate(list(field)) for field in zip(*samples)]
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    return list(samples)
