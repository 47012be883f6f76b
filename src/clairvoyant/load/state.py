"""POLICY, pure: the Loader's saved state (``Loader.state_dict``): its format, and the epoch and global
position a saved state resumes at.

Version 2 saves the epoch's global position itself (a prefix of the epoch's order consumed by all
ranks together); version 1 saved the batches every rank of the saving job had done, turned here into
that position (plan/partition.py). The data, seed and shuffle must be the same; the world size and
the batch size may change (elastic resume). Every fault is a ``ConfigError`` that says what to pass.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..plan import num_batches, position_after

STATE_FORMAT = "clairvoyant-loader-state"


def check_format(state: Any) -> None:
    """ConfigError unless ``state`` is a Loader state of a version this clairvoyant reads (1 or 2)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ConfigError("not a clairvoyant loader state: pass what Loader.state_dict() returned")
    if state.get("version") not in (1, 2):
        raise ConfigError(f"loader state version {state.get('version')!r} is unknown to this clairvoyant "
                          "(it reads 1 and 2): pass what Loader.state_dict() returned, or upgrade clairvoyant")


def resume_point(state: dict, mine: dict, n: int) -> tuple[int, int]:
    """(epoch, global position) that ``state`` (checked by :func:`check_format`) resumes at, for a
    loader of ``n`` samples whose own state is ``mine``."""
    for key in ("seed", "shuffle", "num_samples", "manifest"):
        if state.get(key) != mine[key]:
            raise ConfigError(
                f"the saved state has {key}={state.get(key)!r} but this loader has {mine[key]!r}: "
                "resume with the same data, seed and shuffle (world size and batch size may change)")
    try:
        if state["version"] == 1:   # batches done by every rank of the saving job
            w, b = int(state["world_size"]), int(state["batch_size"])
            position = position_after(n, 0, int(state["batches_done"]), b, w,
                                      num_batches(-(-n // w), b, bool(state["drop_last"])))
        else:
            position = int(state["position"])
        epoch = int(state["epoch"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"the saved loader state is incomplete ({e!r}): pass what Loader.state_dict() "
                          "returned") from e
    if not 0 <= position <= n or epoch < 0:
        raise ConfigError(f"the saved position {position} of epoch {epoch} is outside [0, {n}]")
    return epoch, position
