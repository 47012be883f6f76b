"""A script ported from torch's DataLoader may pass its keywords as they were (load/given.py
``dataloader_keywords``): the Loader takes the ones it has under other names, says what to do for
the ones it does otherwise, and still refuses a typo. Each check has a control."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from clairvoyant import ConfigError, Loader
from clairvoyant.load.given import dataloader_keywords


def test_the_dataloaders_names_for_the_loaders_options_are_taken():
    """``prefetch_factor`` is ``prefetch``; ``multiprocessing_context``, a name or a context, is
    ``mp_context``; ``in_order=True`` holds as it is. Control: without them, the Loader's own."""
    mine = {"prefetch": 2, "mp_context": "fork"}
    assert dataloader_keywords({}, **mine) == mine   # control
    assert dataloader_keywords({"prefetch_factor": 4}, **mine)["prefetch"] == 4
    assert dataloader_keywords({"multiprocessing_context": mp.get_context("spawn")}, **mine)["mp_context"] == "spawn"
    assert dataloader_keywords({"multiprocessing_context": "forkserver", "in_order": True}, **mine) == \
        {"prefetch": 2, "mp_context": "forkserver"}
    with pytest.raises(ConfigError, match="both given"):   # given both ways, differing
        dataloader_keywords({"prefetch_factor": 4}, prefetch=3, mp_context="fork")
    assert dataloader_keywords({"prefetch_factor": 3}, prefetch=3, mp_context="fork")["prefetch"] == 3


@pytest.mark.parametrize("name, value, advice", [
    ("sampler", object(), "loader.set_epoch"),
    ("batch_sampler", object(), "batch_size="),
    ("generator", object(), "seed="),
    ("timeout", 30, "WorkerDied"),
    ("pin_memory_device", "cuda", "device="),
    ("in_order", False, "in order"),
])
def test_what_the_loader_does_otherwise_says_what_to_do(name, value, advice):
    with pytest.raises(ConfigError, match=advice):
        dataloader_keywords({name: value}, prefetch=2, mp_context="fork")


def test_a_typo_is_still_a_type_error(dataset, tmp_path):
    """``num_worker=2`` (a typo of ``num_workers``) is a TypeError naming it, before anything is set
    up. Control: a Loader given the DataLoader's ``prefetch_factor`` is made with it."""
    with pytest.raises(TypeError, match="num_worker"):
        Loader(dataset, batch_size=8, num_worker=2, local_dir=str(tmp_path / "a"))
    with Loader(dataset, batch_size=8, num_workers=1, prefetch_factor=3, local_dir=str(tmp_path / "b")) as ld:
        assert ld.options.prefetch == 3
        assert sum(len(y) for _, y in ld) == 96
    with pytest.raises(ConfigError, match="set_epoch"):
        Loader(dataset, batch_size=8, sampler=object(), local_dir=str(tmp_path / "c"))
