"""The default decoder's fast path: JPEGs decoded straight into their places in the batch.

When a reader runs the default NumPy decoder with no transform and the default
collation, and every image of a batch is a JPEG of one size, each is decoded by
libjpeg-turbo directly into the shared-memory slot, in the layout ``pack``
gives ``default_collate([(image, label), ...])``. That saves allocating a
decoded copy per image and the copy collation makes (about 20-40 us per
256x256 image here, a tenth of its decode). Anything else (another decoder, a
PNG, mixed sizes, a corrupt JPEG) takes the general path, which gives the same
batch and the same errors.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import xxhash

from .decode import decode_image
from .transport import _ALIGN, Slot

try:
    import simplejpeg as _simplejpeg
except ImportError:   # optional: the general path decodes everything
    _simplejpeg = None

_JPEG_MAGIC = b"\xff\xd8\xff"


def eligible(spec: Any) -> bool:
    """Whether a reader's batches may take this path (the batch itself is checked later)."""
    return (_simplejpeg is not None and spec.decode is decode_image and spec.transform is None
            and spec.target_transform is None and not spec.source.has_fields)


def decode_batch(blobs: Sequence[bytes], labels: Sequence[int], slot: Slot,
                 digests: bool = False) -> tuple[Any, int, list[int] | None] | None:
    """Decode ``blobs`` into ``slot`` as ``pack`` would lay out (images, labels); return what
    ``pack`` returns, or None (the slot's contents then undefined) if the batch does not qualify."""
    if not blobs:
        return None
    try:
        shapes = {_simplejpeg.decode_jpeg_header(b)[:2] if b[:3] == _JPEG_MAGIC else None for b in blobs}
    except ValueError:
        return None
    if len(shapes) != 1 or None in shapes:
        return None
    (h, w), = shapes
    n = len(blobs)
    img_bytes = n * h * w * 3
    lab_off = (img_bytes + _ALIGN - 1) // _ALIGN * _ALIGN
    size = lab_off + (n * 8 + _ALIGN - 1) // _ALIGN * _ALIGN
    buf = slot.buffer(size, grow=True)
    images = np.ndarray((n, h, w, 3), dtype=np.uint8, buffer=buf, offset=0)
    try:
        for i, b in enumerate(blobs):
            _simplejpeg.decode_jpeg(b, colorspace="RGB", buffer=images[i])
    except (ValueError, TypeError):   # a variant it declines: the general path (Pillow) decides
        return None
    lab = np.ndarray((n,), dtype=np.int64, buffer=buf, offset=lab_off)
    lab[...] = labels
    spec = ("t", [("a", images.dtype.str, [n, h, w, 3], 0), ("a", lab.dtype.str, [n], lab_off)])
    leaves = [xxhash.xxh3_64_intdigest(images.data), xxhash.xxh3_64_intdigest(lab.data)] if digests else None
    return spec, size, leaves
