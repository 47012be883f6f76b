"""Test kit shipped with clairvoyant: emulated slow storage, synthetic data, a sample ledger."""

from .emulated import Counters, EmulatedStore
from .synthetic import make_dataset, synth_image

__all__ = ["EmulatedStore", "Counters", "make_dataset", "synth_image"]
