"""RunOptions: the options one epoch's run takes from the Loader, grouped and frozen."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from clairvoyant import ConfigError, Loader
from clairvoyant.load.options import RunOptions


def test_defaults_are_the_loaders():
    """A run made with the defaults behaves as a Loader made with its own (control: a changed
    Loader default would fail here)."""
    loader = inspect.signature(Loader).parameters
    o = RunOptions(num_workers=1, stage_threads=4)
    assert (o.prefetch, o.lookahead, o.mp_context) == tuple(loader[n].default for n in
                                                            ("prefetch", "lookahead", "mp_context"))
    assert o.skip_errors is (loader["on_error"].default == "skip") and o.peer_wait == 0.0


def test_frozen_and_checked():
    o = RunOptions(num_workers=2, stage_threads=3, prefetch=np.int64(4))   # NumPy integers, as the Loader takes
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.lookahead = 2
    for bad in ({"num_workers": 0}, {"stage_threads": True}, {"lookahead": 1.5}, {"peer_wait": -1.0},
                {"peer_wait": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RunOptions(**{"num_workers": 1, "stage_threads": 1, **bad})
