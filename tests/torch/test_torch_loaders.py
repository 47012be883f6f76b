"""clairvoyant.torch.pil_loader: torchvision's image loader, read through an unbuffered handle.
The same pixels as PIL reading the file itself (a JPEG and a grayscale PNG, converted to RGB),
and the file opened with buffering=0, which asks no isatty() (an ioctl that reaches a FUSE
daemon on every buffered open before Python 3.14)."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
from PIL import Image

from clairvoyant.torch import loaders, pil_loader, read_file


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    jpg, png = tmp_path / "a.jpg", tmp_path / "b.png"
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(jpg, quality=90)
    Image.fromarray(rng.integers(0, 255, (20, 16), dtype=np.uint8), mode="L").save(png)
    return jpg, png


def reference(path) -> np.ndarray:   # torchvision's pil_loader, as it reads a file
    with open(path, "rb") as f:
        return np.asarray(Image.open(f).convert("RGB"))


def test_the_same_pixels_as_pil_reading_the_file(images):
    jpg, png = images
    for p in images:
        got = pil_loader(str(p))
        assert got.mode == "RGB" and np.array_equal(np.asarray(got), reference(p))
    assert not np.array_equal(np.asarray(pil_loader(jpg))[:16, :16], reference(png)[:16, :16])   # control
    assert read_file(jpg) == jpg.read_bytes()


def test_the_file_is_opened_unbuffered(images, monkeypatch):
    seen = []
    real = builtins.open

    def spy(path, mode="r", buffering=-1, *a, **kw):
        seen.append(buffering)
        return real(path, mode, buffering, *a, **kw)

    monkeypatch.setattr(loaders, "open", spy, raising=False)
    pil_loader(images[0])
    assert seen == [0]
    seen.clear()
    with spy(images[0], "rb") as f:   # control: torchvision's open(path, "rb") is buffered
        f.read()
    assert seen == [-1]
