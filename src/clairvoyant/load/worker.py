"""The reader worker process: read staged files, decode, collate into a shared slot.

Messages in: ``(k, slot, items, skip)`` with ``items = [(key, path, size, label, data,
from_source), ...]`` (``data``: the sample's bytes, from the RAM window; ``path``: a cached
entry; ``from_source``: read it from the source here), or ``None`` to stop. Messages out:
``("ok", k, slot, spec, size, skipped, repaired, (read_s, decode_s, collate_s))`` or ``("err", k, slot, kind, key, message,
traceback)``. Only our own small tuples cross the pipe; batch data travels in the slot.

Every cached entry is checked against its checksum as it is read. An entry that
is corrupt, truncated or gone is never decoded: the sample is read from the
source instead and reported in ``repaired`` (position, reason), and the
training process has the entry removed.
"""

from __future__ import annotations

import ctypes
import signal
import time
import traceback
from typing import Any, Callable

from ..cache.entry import entry_size, unseal
from ..errors import CorruptEntry
from ..fileio import read_file
from .collate import default_collate
from .transport import Slot, pack


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(wid: int, conn, slots: list[Slot], decode: Callable[[bytes], Any],
                collate_fn: Callable | None, source) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the training process
    _die_with_parent()
    collate = collate_fn or default_collate
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        k, slot_id, items, skip = msg
        conn.send(_load_batch(k, slot_id, items, skip, slots, decode, collate, source))


def _read(path: str | None, key: str, size: int, source, data: bytes | None,
          from_source: bool) -> tuple[bytes, str | None]:
    """The sample's bytes, and why the cached entry could not be used (None if it was)."""
    if data is not None:
        return data, None
    if from_source or path is None:
        return source.read(key), None
    try:
        return unseal(read_file(path, entry_size(size)), size, path), None
    except FileNotFoundError:
        why = "gone"
    except CorruptEntry as e:
        why = str(e)
    return source.read(key), why


def _load_batch(k, slot_id, items, skip, slots, decode, collate, source) -> tuple:
    samples, skipped, repaired = [], [], []
    clock = time.perf_counter
    read_s = decode_s = 0.0
    for j, (key, path, size, label, given, from_source) in enumerate(items):
        t0 = clock()
        try:
            data, why = _read(path, key, size, source, given, from_source)
        except Exception as e:
            if skip:
                skipped.append((key, f"{type(e).__name__}: {e}"))
                continue
            return ("err", k, slot_id, "read", key, f"cannot read sample {key!r}: {e}", traceback.format_exc())
        if why is not None:
            repaired.append((j, why))
        t1 = clock()
        read_s += t1 - t0
        try:
            sample = decode(data)
        except Exception as e:
            if skip:
                skipped.append((key, f"{type(e).__name__}: {e}"))
                continue
            return ("err", k, slot_id, "decode", key, f"{type(e).__name__}: {e}", traceback.format_exc())
        samples.append((sample, label))
        decode_s += clock() - t1
    if not samples:
        return ("err", k, slot_id, "empty", items[0][0] if items else "",
                f"all {len(items)} samples of the batch were skipped", "")
    t2 = clock()
    try:
        spec, size = pack(collate(samples), slots[slot_id])
    except Exception as e:
        return ("err", k, slot_id, "collate", items[0][0], f"{type(e).__name__}: {e}", traceback.format_exc())
    return ("ok", k, slot_id, spec, size, skipped, repaired, (read_s, decode_s, clock() - t2))
