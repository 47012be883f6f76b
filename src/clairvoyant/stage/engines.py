"""POLICY of mechanism: the one place that picks the engine staging files into the local tier,
for both front doors.

Two engines keep one contract (``submit``, ``submit_many``, ``in_flight``, ``limit``, ``load``, ``close``; each job told
once, as a ``native_files.Done``, after its entry is published or given up; ``on_batch`` after each
batch): C threads (``native_files.NativeStager``, ``cache/_stager.c``) and their twin on Python
threads (``thread_files.ThreadStager``). Both write an entry the one way (reserve, write, publish
many: cache/local.py ``write``).

The C engine is chosen where it is built, ``CLAIRVOYANT_NATIVE_STAGE`` is not ``0`` (a comparison,
or a fault of the native engine), the files are plain files under ``root`` (a local POSIX source,
not a charged or remote store) and the tier stores entries as they are (the C threads do not
compress). Otherwise the Python twin, where the caller has no Python staging of its own: the mount
always takes an engine; the Loader's own staging threads (stage/engine.py) stage what no engine
takes.
"""

from __future__ import annotations

import os
from typing import Callable, Union

from ..cache.local import LocalStore
from .native_files import Capacity, Done, NativeStager, available
from .thread_files import ThreadStager

FileEngine = Union[NativeStager, ThreadStager]


def native_applies(store: LocalStore, plain_files: bool) -> bool:
    """Whether the C engine stages these files (module docstring)."""
    return (available() and os.environ.get("CLAIRVOYANT_NATIVE_STAGE", "1") != "0" and plain_files
            and store.codec is None)


def file_engine(store: LocalStore, capacity: Capacity, root: str, handoff: str | None, threads: int,
                on_done: Callable[[Done], None], on_batch: Callable[[], None] | None = None, *,
                most: int | None = None) -> FileEngine:
    """The mount's engine staging files of ``root`` into ``store`` within ``capacity``, ``threads``
    files at once of at most ``most`` (``limit`` moves it): the C threads where they apply, else
    the Python threads. (The Loader asks ``native_applies`` itself: what the C threads do not take,
    its own staging threads stage.)"""
    engine = NativeStager if native_applies(store, True) else ThreadStager
    return engine(store, capacity, root, handoff, threads, on_done, on_batch, most=most)
