"""A synthetic ImageNet-like data set: JPEGs that compress like photographs.

Each image is a sum of a few coloured low-frequency waves (the scene), a
blocky mid-frequency texture and sensor-like noise; at quality 90 a 256x256
image is about 30 KB, close to ImageNet's average.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from typing import Callable

import numpy as np

_DONE = ".complete.json"


def synth_image(rng: np.random.Generator, size: int = 256) -> np.ndarray:
    t = np.linspace(0.0, 1.0, size, dtype=np.float32)
    img = np.full((size, size, 3), 128.0, np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.5, 6.0, 2)
        px, py = rng.uniform(0, 2 * np.pi, 2)
        a = rng.uniform(25, 55)
        # sin(x + y) = sin x cos y + cos x sin y: two outer products, cheap
        sx, cx = np.sin(2 * np.pi * fx * t + px), np.cos(2 * np.pi * fx * t + px)
        sy, cy = np.sin(2 * np.pi * fy * t + py), np.cos(2 * np.pi * fy * t + py)
        img[..., c] += a * (np.outer(cy, sx) + np.outer(sy, cx))
    coarse = rng.integers(-22, 23, (size // 4, size // 4, 3)).astype(np.float32)
    img += np.repeat(np.repeat(coarse, 4, axis=0), 4, axis=1)
    img += rng.integers(-16, 17, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_dataset(root: str, num_images: int, *, num_classes: int = 100, size: int = 256, quality: int = 90,
                 seed: int = 0, progress: Callable[[int], None] | None = None) -> str:
    """Create (once) an ImageFolder tree of ``num_images`` JPEGs under ``root``; return ``root``.

    A marker file records a finished set, so an interrupted generation starts over
    instead of leaving a half-made data set that looks whole.
    """
    from PIL import Image

    marker = os.path.join(root, _DONE)
    want = {"num_images": num_images, "num_classes": num_classes, "size": size, "quality": quality, "seed": seed}
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == want:
                return root
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    rng = np.random.default_rng(seed)
    for c in range(num_classes):
        os.makedirs(os.path.join(root, f"class_{c:04d}"))
    for i in range(num_images):
        buf = io.BytesIO()
        Image.fromarray(synth_image(rng, size)).save(buf, format="JPEG", quality=quality)
        with open(os.path.join(root, f"class_{i % num_classes:04d}", f"img_{i:07d}.jpg"), "wb") as f:
            f.write(buf.getvalue())
        if progress is not None:
            progress(1)
    with open(marker, "w") as f:
        json.dump(want, f)
    return root
