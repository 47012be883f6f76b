"""The default decoder: image bytes (JPEG, PNG, ...) to a uint8 HWC RGB array."""

from __future__ import annotations

import io

import numpy as np


def decode_image(data: bytes) -> np.ndarray:
    """Decode with Pillow; grey and palette images become RGB so that batches stack."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if img.mode != "RGB":
            img = img.convert("RGB")
        return np.asarray(img)
