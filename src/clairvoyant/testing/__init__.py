"""Test kit shipped with clairvoyant: emulated slow storage, synthetic data, a sample ledger."""

from .emulated import Counters, EmulatedStore
from .fusestore import FuseStore, drop_pages, fuse_available
from .loopback import LoopbackLink
from .synthetic import make_dataset, synth_image

__all__ = ["EmulatedStore", "Counters", "FuseStore", "drop_pages", "fuse_available", "LoopbackLink", "make_dataset",
           "synth_image"]
