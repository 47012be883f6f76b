"""Drop-in PyTorch samplers that draw clairvoyant's order and tell a `clairvoyant mount` about it
(docs/mount.md): swap ``torch.utils.data.DistributedSampler`` for
``clairvoyant.torch.DistributedSampler(..., mount=MNT)``; and ``pil_loader``, torchvision's image
loader without a request to the mount's daemon per file (``ImageFolder(root, loader=pil_loader)``)."""

from .loaders import pil_loader, read_file
from .samplers import DistributedSampler, RandomSampler

__all__ = ["DistributedSampler", "RandomSampler", "pil_loader", "read_file"]
