"""A drop-in for torchvision's ``default_loader``/``pil_loader`` that costs no extra request per
file on a FUSE mount (``clairvoyant mount``, s3fs, gcsfuse...).

Python before 3.14 asks ``isatty()`` of every file ``open(path, "rb")`` opens buffered; that
ioctl reaches a FUSE daemon on every open, answered or not (docs/mount.md: 38 us against 16 us
per cached file through the mount). Reading the file whole through an unbuffered handle asks
nothing, and decoding from memory makes PIL's many small reads free.
"""

from __future__ import annotations

import io
import os

from PIL import Image


def read_file(path: str | os.PathLike) -> bytes:
    """The whole file at ``path``, read through an unbuffered handle (no ``isatty`` request)."""
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def pil_loader(path: str | os.PathLike) -> Image.Image:
    """``torchvision.datasets.folder.pil_loader`` without its request per file on FUSE:
    ``ImageFolder(root, loader=clairvoyant.torch.pil_loader)``. The image in RGB, decoded from
    the file's bytes."""
    with Image.open(io.BytesIO(read_file(path))) as img:
        return img.convert("RGB")
