"""The reader worker process: read staged files, decode, collate into a shared slot.

Messages in: ``(k, slot, items, skip)`` with ``items = [(key, path, size, label), ...]``,
or ``None`` to stop. Messages out: ``("ok", k, slot, spec, size, skipped)`` or
``("err", k, slot, kind, key, message, traceback)``. Only our own small tuples cross
the pipe; batch data travels in the slot.
"""

from __future__ import annotations

import ctypes
import signal
import traceback
from typing import Any, Callable

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
                collate_fn: Callable | None) -> None:
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
        conn.send(_load_batch(k, slot_id, items, skip, slots, decode, collate))


def _load_batch(k, slot_id, items, skip, slots, decode, collate) -> tuple:
    samples, skipped = [], []
    for key, path, size, label in items:
        try:
            data = read_file(path, size)
        except OSError as e:
            return ("err", k, slot_id, "read", key, f"cannot read staged copy {path}: {e}", traceback.format_exc())
        try:
            sample = decode(data)
        except Exception as e:
            if skip:
                skipped.append((key, f"{type(e).__name__}: {e}"))
                continue
            return ("err", k, slot_id, "decode", key, f"{type(e).__name__}: {e}", traceback.format_exc())
        samples.append((sample, label))
    if not samples:
        return ("err", k, slot_id, "empty", items[0][0] if items else "",
                f"all {len(items)} samples of the batch were skipped", "")
    try:
        spec, size = pack(collate(samples), slots[slot_id])
    except Exception as e:
        return ("err", k, slot_id, "collate", items[0][0], f"{type(e).__name__}: {e}", traceback.format_exc())
    return ("ok", k, slot_id, spec, size, skipped)
