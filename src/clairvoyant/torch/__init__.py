"""Drop-in PyTorch samplers that draw clairvoyant's order and tell a `clairvoyant mount` about it
(docs/mount.md): swap ``torch.utils.data.DistributedSampler`` for
``clairvoyant.torch.DistributedSampler(..., mount=MNT)``."""

from .samplers import DistributedSampler, RandomSampler

__all__ = ["DistributedSampler", "RandomSampler"]
