"""RunOptions: the options one epoch's run takes from the Loader, grouped and frozen."""

from __future__ import annotations

import dataclasses
import inspect
import re

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


def test_the_loaders_arguments_are_checked_once_by_the_run_options(tmp_path, dataset):
    """The Loader's num_workers, stage_threads, prefetch and lookahead, now checked by RunOptions
    only (issue 31: they were checked twice), are refused with the messages the Loader gave,
    naming its other choices. Control: good values pass and reach the run."""
    for kw, said in (({"num_workers": 0}, "num_workers must be an integer >= 1 or None"),
                     ({"stage_threads": 0}, "stage_threads must be an integer >= 1 or 'auto'"),
                     ({"prefetch": 0}, "prefetch must be an integer >= 1"),
                     ({"lookahead": 1.5}, "lookahead must be an integer >= 1")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            Loader(dataset, local_dir=str(tmp_path), **kw)
    with Loader(dataset, local_dir=str(tmp_path), num_workers=1, stage_threads=2, prefetch=1, lookahead=3) as ld:
        assert ld._run_options().lookahead == 3


def test_the_loaders_own_options_are_one_frozen_object_read_from_there(tmp_path, dataset):
    """LoaderOptions: the Loader's choices checked once (a bad value before anything is set up) and
    read from there; the attributes of the same names are its, read-only. Control: the defaults are
    Loader's own signature's."""
    from clairvoyant.load.options import LoaderOptions
    loader = inspect.signature(Loader).parameters
    o = LoaderOptions()
    assert all(getattr(o, f.name) == loader[f.name].default for f in dataclasses.fields(o))
    for bad, said in (({"batch_size": 0}, "batch_size"), ({"seed": -1}, "seed"), ({"on_error": "x"}, "on_error"),
                      ({"stage_threads": "fast"}, "stage_threads"), ({"batch_size": True}, "batch_size"),
                      ({"mp_context": "spawn"}, "mp_context")):
        with pytest.raises(ConfigError, match=said):
            LoaderOptions(**bad)
    with Loader(dataset, batch_size=np.int64(4), local_dir=str(tmp_path), num_workers=1, shuffle=0,
                on_error="skip") as ld:
        assert (ld.batch_size, type(ld.batch_size), ld.shuffle, ld.on_error) == (4, int, False, "skip")
        assert ld.options.run(1, 2).skip_errors and ld._run_options().skip_errors
        with pytest.raises(AttributeError):
            ld.batch_size = 8   # one place holds it
