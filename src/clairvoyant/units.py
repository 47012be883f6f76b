"""Parsing and printing of byte sizes ("64KiB", "1.5GB", 4096)."""

from __future__ import annotations

import re

from .errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str, *, what: str = "size") -> int:
    """Return ``value`` in bytes; strings take SI (kB, MB) or IEC (KiB, MiB) units."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a number of bytes or a string like '64KiB', not {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{what} must not be negative, got {value!r}")
        return int(value)
    m = _RE.match(str(value))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ConfigError(
            f"{what}={value!r} is not a size: use bytes or a number with a unit "
            "(B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """Human-readable IEC size: 1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
