"""What the caller gives the Loader, taken apart before anything is set up: a torchvision-style
dataset's files, labels and transforms (``from_dataset``), and what a dataset without files may not
be given (``check_without_files``). Each raises a ConfigError that says what to pass instead."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any, Callable

from ..errors import ConfigError
from ..source import DatasetPort
from .options import LoaderOptions

log = logging.getLogger("clairvoyant")


def from_dataset(ds: Any, decode: Callable | None, transform: Callable | None,
                 target_transform: Callable | None) -> tuple[Any, Callable | None, Callable | None]:
    """``(source, transform, target_transform)`` of a torchvision-style dataset: its files and labels
    as the source, its transforms unless the Loader was given them (given twice: an error), and a
    ``decode=`` required where its own loader is not PIL's (staged bytes cannot be handed to it)."""
    port = DatasetPort(ds)
    for name, mine, theirs in (("transform", transform, port.transform),
                               ("target_transform", target_transform, port.target_transform)):
        if mine is not None and theirs is not None:
            raise ConfigError(f"{name} is given twice, to the Loader and to dataset {port.name}: pass it once")
    if not port.pil and decode is None:
        raise ConfigError(
            f"dataset {port.name} opens its files with its own loader ({port.loader_name}), which "
            "clairvoyant cannot call on staged bytes: pass decode= a function from a file's bytes to "
            "what that loader returns")
    return (port.source, transform if transform is not None else port.transform,
            target_transform if target_transform is not None else port.target_transform)


def check_without_files(source: Any, *, decode: Callable | None, transform: Callable | None,
                        target_transform: Callable | None, compress: str | None, cluster: bool | str) -> None:
    """A dataset with no files makes each sample with its own ``__getitem__`` in the readers: no
    step of the Loader's applies to it and nothing is staged (said once in the log)."""
    given = [n for n, v in (("decode", decode), ("transform", transform), ("target_transform", target_transform))
             if v is not None]
    if given:
        raise ConfigError(f"{given[0]}= is given, but dataset {source.name} makes its samples with its own "
                          f"__getitem__: apply it there (e.g. the dataset's transform=), and leave {given[0]}= out")
    if compress is not None or cluster is True:
        raise ConfigError(f"dataset {source.name} has no files to stage: leave "
                          f"{'compress=' if compress is not None else 'cluster=True'} out")
    log.warning("clairvoyant: dataset %s has no files (no `samples` list, not a path): its %d samples are made by "
                "its __getitem__ in the reader processes, in the plan's order; nothing is staged",
                source.name, source.count)


# torch's DataLoader keywords a ported script may still pass: the Loader's name for each it takes,
# and what to do instead for each it does otherwise
DATALOADER_NAMES = {"prefetch_factor": "prefetch", "multiprocessing_context": "mp_context"}
# (the Loader's own defaults of those: a value other than its default was given to the Loader)
LOADER_DEFAULTS = {f.name: f.default for f in fields(LoaderOptions) if f.name in DATALOADER_NAMES.values()}
DATALOADER_INSTEAD = {
    "sampler": "the Loader orders and splits every epoch itself (seed=, shuffle=; the ranks from the launcher): "
               "drop the sampler and call loader.set_epoch(epoch) where the script called sampler.set_epoch(epoch)",
    "batch_sampler": "the Loader makes its batches itself (batch_size=, drop_last=, seed=, shuffle=): drop it",
    "generator": "the Loader's order comes from seed= (an int): pass seed= instead",
    "timeout": "the Loader does not wait on a reader in silence (a reader that dies is a WorkerDied at once; a "
               "slow store shows in stats()['verdict']): drop it",
    "pin_memory_device": "pass device= (batches arrive there, uint8 converted on it where it can)",
}


def dataloader_keywords(given: dict[str, Any], **mine: Any) -> dict[str, Any]:
    """The Loader's keywords ``mine`` (``prefetch``, ``mp_context``) with torch DataLoader keywords
    ``given`` (a script ported as it was) taken in: ``prefetch_factor`` and
    ``multiprocessing_context`` (a name or a context) under the Loader's names (given both ways
    and differing: a ConfigError), ``in_order=True`` as it is (batches come in order); a
    ConfigError saying what to do for one the Loader does otherwise (``sampler``, ...), a
    TypeError for any other name (a typo stays an error)."""
    out = dict(mine)
    for name, value in given.items():
        if name in DATALOADER_INSTEAD:
            raise ConfigError(f"{name}= is a DataLoader argument the Loader does not take: {DATALOADER_INSTEAD[name]}")
        if name == "in_order":
            if not value:
                raise ConfigError("in_order=False: the Loader yields every batch in order; drop it")
        elif name in DATALOADER_NAMES:
            if name == "multiprocessing_context" and not isinstance(value, str):
                value = value.get_start_method()   # (a context object, as mp.get_context("spawn") gives)
            ours = DATALOADER_NAMES[name]
            if out[ours] not in (value, LOADER_DEFAULTS[ours]):
                raise ConfigError(f"{ours}={out[ours]!r} and the DataLoader's {name}={value!r} are both given: "
                                  "pass one")
            out[ours] = value
        else:
            raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")
    return out
